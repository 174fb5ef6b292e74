//! The response body of a gRPC-Web call. In: a gRPC backend's body (length-prefixed
//! messages, then HTTP/2 trailers). Out: the messages as they come, then the trailers as one
//! more message whose flag byte is 0x80 and whose payload is `name: value\r\n` lines (the
//! names lower-case, as HTTP/2 has them), which is how gRPC-Web carries trailers over any
//! HTTP version (a browser cannot read HTTP trailers). For `application/grpc-web-text` each
//! chunk is base64-encoded on its own, padded: the protocol lets a server flush that way, so
//! a streamed message goes out as soon as it comes, with nothing held back.
//!
//! The trailers' `grpc-status` is put in the [`StatusSlot`] the access log reads, since no
//! trailers reach the end of the chain.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::{BufMut as _, Bytes, BytesMut};
use http::HeaderMap;
use hyper::body::{Body, Frame, SizeHint};

use crate::error::BoxError;
use crate::lifecycle::body::ProxyBody;
use crate::lifecycle::grpc;

/// The flag byte of a gRPC-Web trailer frame (uncompressed).
const TRAILER_FLAG: u8 = 0x80;

/// Where the `grpc-status` of a translated answer's trailers lands for the access log;
/// `u32::MAX` until one is seen.
#[derive(Debug)]
pub(crate) struct StatusSlot(AtomicU32);

impl Default for StatusSlot {
    fn default() -> Self {
        Self(AtomicU32::new(u32::MAX))
    }
}

impl StatusSlot {
    pub fn get(&self) -> Option<u32> {
        Some(self.0.load(Ordering::Acquire)).filter(|s| *s != u32::MAX)
    }

    fn set(&self, status: u32) {
        self.0.store(status, Ordering::Release);
    }
}

/// The trailers as a gRPC-Web trailer frame.
pub(crate) fn trailer_frame(trailers: &HeaderMap) -> Bytes {
    let len: usize = trailers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum();
    let mut out = BytesMut::with_capacity(5 + len);
    out.put_u8(TRAILER_FLAG);
    // A header block this long never reaches us: the HTTP/2 layer bounds it far below.
    out.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    for (name, value) in trailers {
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    out.freeze()
}

/// A gRPC answer's body in gRPC-Web form ([module docs](self)).
pub(crate) struct ResponseBody {
    inner: ProxyBody,
    text: bool,
    status: Option<Arc<StatusSlot>>,
}

impl ResponseBody {
    pub fn new(inner: ProxyBody, text: bool, status: Option<Arc<StatusSlot>>) -> Self {
        Self {
            inner,
            text,
            status,
        }
    }

    fn out(&self, data: Bytes) -> Bytes {
        if self.text {
            Bytes::from(STANDARD.encode(&data))
        } else {
            data
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => frame,
                other => return other,
            };
            let frame = match frame.into_data() {
                Ok(d) if d.is_empty() => continue,
                Ok(d) => return Poll::Ready(Some(Ok(Frame::data(this.out(d))))),
                Err(frame) => frame,
            };
            if let Ok(trailers) = frame.into_trailers() {
                if let (Some(slot), Some(s)) = (&this.status, grpc::status_of(&trailers)) {
                    slot.set(s);
                }
                let framed = trailer_frame(&trailers);
                return Poll::Ready(Some(Ok(Frame::data(this.out(framed)))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt as _, StreamBody};

    use super::*;

    fn upstream(frames: Vec<Frame<Bytes>>) -> ProxyBody {
        let stream = futures_util::stream::iter(frames.into_iter().map(Ok::<_, BoxError>));
        StreamBody::new(stream).boxed()
    }

    fn trailers() -> HeaderMap {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", "5".parse().unwrap());
        t.insert("grpc-message", "no such thing".parse().unwrap());
        t
    }

    #[tokio::test]
    async fn trailers_become_the_last_message() {
        let slot = Arc::new(StatusSlot::default());
        let body = ResponseBody::new(
            upstream(vec![
                Frame::data(Bytes::from_static(b"\0\0\0\0\x01a")),
                Frame::trailers(trailers()),
            ]),
            false,
            Some(slot.clone()),
        );
        let out = body.collect().await.unwrap();
        assert!(out.trailers().is_none());
        let lines = b"grpc-status: 5\r\ngrpc-message: no such thing\r\n";
        let mut want = b"\0\0\0\0\x01a\x80\0\0\0".to_vec();
        want.push(u8::try_from(lines.len()).unwrap());
        want.extend_from_slice(lines);
        assert_eq!(&out.to_bytes()[..], &want[..]);
        assert_eq!(slot.get(), Some(5));
    }

    #[tokio::test]
    async fn text_encodes_each_chunk_padded() {
        let body = ResponseBody::new(
            upstream(vec![
                Frame::data(Bytes::from_static(b"\0\0\0\0\x01a")),
                Frame::trailers(HeaderMap::new()),
            ]),
            true,
            None,
        );
        let out = body.collect().await.unwrap().to_bytes();
        // Each chunk on its own: "AAAAAAFh" (6 bytes), then the empty trailer frame.
        assert_eq!(&out[..], b"AAAAAAFhgAAAAAA=");
    }
}
