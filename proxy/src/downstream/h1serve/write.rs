//! Answers on our HTTP/1 server. In: the service's response, what the request asked of it
//! ([`RequestShape`]: HEAD, HTTP/1.0) and whether the connection closes after it. Out: its
//! head and body on the socket, framed by `tollgate_h1::encode` (length, chunks, or the
//! close for an HTTP/1.0 client), and whether the connection can serve another request.
//!
//! While the body is awaited, the request's body (if still read) goes on being read for the
//! service ([`Reader::drive`]): an upstream may answer before it has the whole request.

use std::io;
use std::pin::pin;
use std::task::Poll;

use bytes::BytesMut;
use hyper::body::Body;
use hyper::ext::ReasonPhrase;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tollgate_h1::body::Framing;
use tollgate_h1::encode::{self, BodyShape, RequestShape};

use crate::downstream::h1_body::Reader;
use crate::lifecycle::service::ProxyResponse;

/// Response bytes gathered before they are written while the body still comes.
pub(super) const WRITE_HIGH: usize = 64 * 1024;

/// What the request asked of its answer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answer {
    pub(super) request: RequestShape,
    /// The connection closes after this answer (`connection: close` on it).
    pub(super) close: bool,
    /// The client asked for trailers (`TE: trailers`): a chunked answer carries them.
    pub(super) trailers: bool,
    /// Only the head goes out (a `101`, or a CONNECT's 2xx: a tunnel follows).
    pub(super) head_only: bool,
}

/// Writes the response; `Ok(true)` when the connection can serve another request.
pub(super) async fn write_response<I>(
    io: &mut I,
    wbuf: &mut Vec<u8>,
    resp: ProxyResponse,
    answer: Answer,
    mut reader: Option<&mut Reader>,
    rbuf: &mut BytesMut,
) -> io::Result<bool>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let (parts, body) = resp.into_parts();
    wbuf.clear();
    let reason = parts
        .extensions
        .get::<ReasonPhrase>()
        .map(ReasonPhrase::as_bytes);
    let shape = BodyShape {
        end: body.is_end_stream() || answer.head_only,
        exact: body.size_hint().exact(),
    };
    let (framing, asked_close) =
        encode::response_head(&parts, reason, shape, answer.request, answer.close, wbuf);
    let mut reusable = !asked_close;
    if framing == Framing::Length(0) || answer.head_only {
        drop(body);
        io.write_all(wbuf).await?;
        return Ok(reusable);
    }
    let mut body = pin!(body);
    let mut remaining = match framing {
        Framing::Length(n) => n,
        _ => u64::MAX,
    };
    let mut trailers = None;
    // Whether the head has gone out: a body that fails before it gets no answer at all.
    let mut flushed = false;
    loop {
        // Poll once; when the body is not ready, what is gathered goes out before waiting.
        let polled = std::future::poll_fn(|cx| Poll::Ready(body.as_mut().poll_frame(cx))).await;
        let frame = match polled {
            Poll::Ready(f) => f,
            Poll::Pending => {
                if !wbuf.is_empty() {
                    io.write_all(wbuf).await?;
                    wbuf.clear();
                    flushed = true;
                }
                std::future::poll_fn(|cx| {
                    if let Some(r) = reader.as_deref_mut() {
                        r.drive(cx, io, rbuf, true);
                    }
                    body.as_mut().poll_frame(cx)
                })
                .await
            }
        };
        match frame {
            None => break,
            Some(Err(e)) => {
                // Cut short: the client must not take it for whole. Before the head went
                // out, nothing goes (as hyper's server did): the client sees the close.
                tracing::debug!(error = %e, "response body failed");
                if flushed && !wbuf.is_empty() {
                    io.write_all(wbuf).await?;
                }
                return Ok(false);
            }
            Some(Ok(frame)) => {
                let data = match frame.into_data() {
                    Ok(data) => data,
                    Err(frame) => {
                        // Trailers: only to a client that asked for them, in chunks.
                        if answer.trailers && framing == Framing::Chunked {
                            trailers = frame.into_trailers().ok();
                        }
                        continue;
                    }
                };
                if data.is_empty() {
                    continue;
                }
                match framing {
                    Framing::Chunked => {
                        encode::chunk_size(data.len(), wbuf);
                        wbuf.extend_from_slice(&data);
                        wbuf.extend_from_slice(b"\r\n");
                    }
                    Framing::Close => wbuf.extend_from_slice(&data),
                    Framing::Length(_) => {
                        let n = usize::try_from(remaining).unwrap_or(usize::MAX);
                        if data.len() > n {
                            // More than the length said: send what it said, then close.
                            wbuf.extend_from_slice(&data[..n]);
                            remaining = 0;
                            reusable = false;
                        } else {
                            wbuf.extend_from_slice(&data);
                            remaining -= data.len() as u64;
                        }
                    }
                }
                if wbuf.len() >= WRITE_HIGH {
                    io.write_all(wbuf).await?;
                    wbuf.clear();
                    flushed = true;
                }
            }
        }
    }
    match framing {
        Framing::Chunked => match trailers {
            Some(fields) if !fields.is_empty() => {
                wbuf.extend_from_slice(b"0\r\n");
                for (name, value) in &fields {
                    wbuf.extend_from_slice(name.as_str().as_bytes());
                    wbuf.extend_from_slice(b": ");
                    wbuf.extend_from_slice(value.as_bytes());
                    wbuf.extend_from_slice(b"\r\n");
                }
                wbuf.extend_from_slice(b"\r\n");
            }
            _ => wbuf.extend_from_slice(encode::LAST_CHUNK),
        },
        Framing::Close => reusable = false,
        // Shorter than its length: the connection ends the message.
        _ if remaining != 0 => reusable = false,
        _ => {}
    }
    if !wbuf.is_empty() {
        io.write_all(wbuf).await?;
    }
    Ok(reusable)
}
