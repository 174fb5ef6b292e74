//! The request framing checks of module `framing` on connections hyper's server reads (HTTP/1
//! over TLS, and plain connections [`crate::h1serve`] handed over). In: the bytes read off
//! the connection, on their way to hyper. Out: the same bytes; or, at a head that
//! [`check_request_head`] refuses, a NUL byte in its place and then the end of the stream, so
//! hyper's parser fails on it, answers 400 and closes the connection.
//!
//! Why: hyper's parser takes a bare LF as a line end, and a `Content-Length` beside
//! `Transfer-Encoding` as chunks (dropping the length from the fields it hands over), so the
//! service cannot see either. This follows the connection's messages (each head with
//! httparse, as hyper does; bodies by their length or chunks) to find each head whole, and
//! checks it before hyper has its last byte.
//!
//! Over TLS, a refused head that is the connection's first gets no 400: the connection just
//! closes (hyper's first-message error path there writes nothing); either way nothing of it
//! goes upstream.
//!
//! It stops following (and passes everything on unlooked-at) at what hyper will refuse itself
//! (a head httparse cannot parse, a chunk line it cannot read), and at an upgrade or CONNECT,
//! whose bytes after the head may be a tunnel's.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use tollgate_h1::framing::check_request_head;
use tollgate_h1::parse_decimal;

/// Most header fields a followed head may carry (hyper's default): a head with more is
/// hyper's to refuse.
const MAX_HEADERS: usize = 100;
/// Longest head or chunk line kept while it is incomplete; past it, hyper refuses the head
/// (431) or the chunk line, and following stops.
const MAX_KEPT: usize = 64 * 1024;

/// Where the request stream stands.
#[derive(Debug)]
enum State {
    /// In a head: its bytes so far.
    Head(Vec<u8>),
    /// In a body framed by length: bytes to go.
    Length(u64),
    /// In a chunked body.
    Chunked(Chunk),
    /// Not following any more: everything passes.
    Off,
    /// A head was refused: the stream has ended for hyper.
    Refused,
}

#[derive(Debug)]
enum Chunk {
    /// A chunk-size line: its bytes so far.
    Size(Vec<u8>),
    /// Chunk data to go, then its CRLF (2 bytes).
    Data(u64),
    /// Trailer section: the current line so far.
    Trailers(Vec<u8>),
}

/// What the bytes just read held.
enum Verdict {
    /// All may go on.
    Pass,
    /// A head was refused; its bytes in this read start here.
    Refuse(usize),
}

/// A connection whose request heads are checked before hyper reads them (see the module).
#[derive(Debug)]
pub(crate) struct Gated<I> {
    io: I,
    state: State,
}

impl<I> Gated<I> {
    /// Follows the requests on `io` when `on`; else passes everything (HTTP/2).
    pub fn new(io: I, on: bool) -> Self {
        let state = if on {
            State::Head(Vec::new())
        } else {
            State::Off
        };
        Self { io, state }
    }

    /// Follows `data`, the bytes just read.
    fn feed(&mut self, data: &[u8]) -> Verdict {
        let mut at = 0;
        while at < data.len() {
            let rest = &data[at..];
            match &mut self.state {
                State::Off | State::Refused => return Verdict::Pass,
                State::Head(buf) => {
                    // Parsed where it lies when it begins in this read (no copy); kept only
                    // while incomplete.
                    let before = buf.len();
                    let verdict = if before == 0 {
                        head(rest)
                    } else {
                        buf.extend_from_slice(rest);
                        head(buf)
                    };
                    match verdict {
                        Head::Partial if before + rest.len() <= MAX_KEPT => {
                            if before == 0 {
                                buf.extend_from_slice(rest);
                            }
                            return Verdict::Pass;
                        }
                        Head::Partial | Head::Off => self.state = State::Off,
                        Head::Refused => {
                            self.state = State::Refused;
                            return Verdict::Refuse(at);
                        }
                        Head::Next(len, next) => {
                            at += len - before;
                            self.state = next;
                        }
                    }
                }
                State::Length(n) => {
                    let take = usize::try_from(*n).map_or(rest.len(), |n| n.min(rest.len()));
                    *n -= take as u64;
                    at += take;
                    if *n == 0 {
                        self.state = State::Head(Vec::new());
                    }
                }
                State::Chunked(chunk) => match chunked(chunk, rest) {
                    Some((used, done)) => {
                        at += used;
                        if done {
                            self.state = State::Head(Vec::new());
                        }
                    }
                    None => self.state = State::Off,
                },
            }
        }
        Verdict::Pass
    }
}

/// What a head buffer holds.
enum Head {
    Partial,
    /// Not a head this follows (hyper refuses it, or it upgrades).
    Off,
    Refused,
    /// A whole head of this many bytes, and what follows it.
    Next(usize, State),
}

fn head(buf: &[u8]) -> Head {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Head::Partial,
        Err(_) => return Head::Off,
    };
    if check_request_head(&buf[..len], req.headers).is_err() {
        return Head::Refused;
    }
    if req.method == Some("CONNECT") {
        return Head::Off;
    }
    let mut next = State::Head(Vec::new());
    for f in req.headers.iter() {
        if f.name.eq_ignore_ascii_case("upgrade") {
            return Head::Off;
        }
        if f.name.eq_ignore_ascii_case("transfer-encoding") {
            next = State::Chunked(Chunk::Size(Vec::new()));
        } else if f.name.eq_ignore_ascii_case("content-length") {
            // Checked above: one plain number.
            match parse_decimal(f.value.trim_ascii()) {
                Some(0) => {}
                Some(n) => next = State::Length(n),
                None => return Head::Off,
            }
        }
    }
    Head::Next(len, next)
}

/// Follows a chunked body over `data`: the bytes used, and whether the body ended; `None`
/// when it cannot be followed (hyper refuses it).
fn chunked(chunk: &mut Chunk, data: &[u8]) -> Option<(usize, bool)> {
    let mut at = 0;
    while at < data.len() {
        match chunk {
            Chunk::Size(line) => {
                let Some(text) = line_of(line, data, &mut at)? else {
                    return Some((at, false));
                };
                let digits = text.split(|&b| b == b';').next()?.trim_ascii();
                let size = u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()?;
                *chunk = match size {
                    0 => Chunk::Trailers(Vec::new()),
                    n => Chunk::Data(n.checked_add(2)?),
                };
            }
            Chunk::Trailers(line) => {
                let Some(text) = line_of(line, data, &mut at)? else {
                    return Some((at, false));
                };
                if text.is_empty() {
                    return Some((at, true));
                }
            }
            Chunk::Data(n) => {
                let rest = data.len() - at;
                let take = usize::try_from(*n).map_or(rest, |n| n.min(rest));
                *n -= take as u64;
                at += take;
                if *n == 0 {
                    *chunk = Chunk::Size(Vec::new());
                }
            }
        }
    }
    Some((at, false))
}

/// One line of `data` from `at` on, joined to what `line` kept: `Some(Some(text))` without its
/// CRLF when it ended (`line` emptied), `Some(None)` when `data` ran out first (kept), `None`
/// when it is too long or ends in a bare LF.
fn line_of(line: &mut Vec<u8>, data: &[u8], at: &mut usize) -> Option<Option<Vec<u8>>> {
    let Some(nl) = data[*at..].iter().position(|&b| b == b'\n') else {
        line.extend_from_slice(&data[*at..]);
        *at = data.len();
        return (line.len() <= MAX_KEPT).then_some(None);
    };
    line.extend_from_slice(&data[*at..*at + nl + 1]);
    *at += nl + 1;
    let mut text = std::mem::take(line);
    if !text.ends_with(b"\r\n") {
        return None;
    }
    text.truncate(text.len() - 2);
    Some(Some(text))
}

impl<I: AsyncRead + Unpin> AsyncRead for Gated<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if matches!(self.state, State::Refused) {
            return Poll::Ready(Ok(()));
        }
        let start = buf.filled().len();
        std::task::ready!(Pin::new(&mut self.io).poll_read(cx, buf))?;
        if matches!(self.state, State::Off) {
            return Poll::Ready(Ok(()));
        }
        if let Verdict::Refuse(at) = self.feed(&buf.filled()[start..]) {
            // A NUL where the refused head's bytes begin: hyper's parser fails on it (400).
            let cut = start + at;
            buf.filled_mut()[cut] = 0;
            buf.set_filled(cut + 1);
            tracing::debug!("request refused: framing");
        }
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Gated<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `parts` as separate reads; the index of the read refused, and where.
    fn run(parts: &[&[u8]]) -> Option<(usize, usize)> {
        let mut g = Gated::new((), true);
        for (i, p) in parts.iter().enumerate() {
            if let Verdict::Refuse(at) = g.feed(p) {
                return Some((i, at));
            }
        }
        None
    }

    #[test]
    fn follows_bodies_to_the_next_head() {
        let clean: &[u8] = b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nLF\n\nx\
            POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;e=1\r\n\n\n\n\r\n0\r\nt: 1\r\n\r\n\
            GET / HTTP/1.1\r\n\r\n";
        assert_eq!(run(&[clean]), None);
        // The same, a byte at a time.
        let bytes: Vec<&[u8]> = clean.chunks(1).collect();
        assert_eq!(run(&bytes), None);
    }

    #[test]
    fn refuses_at_the_head_that_breaks_the_rules() {
        let first: &[u8] = b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\nok";
        let bad: &[u8] = b"GET / HTTP/1.1\nHost: a\r\n\r\n";
        assert_eq!(run(&[&[first, bad].concat()]), Some((0, first.len())));
        assert_eq!(run(&[first, &bad[..5], &bad[5..]]), Some((2, 0)));
        let both = b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(run(&[both]), Some((0, 0)));
    }

    #[test]
    fn stops_following_at_an_upgrade_or_what_hyper_refuses() {
        let up: &[u8] = b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\nGET / HTTP/1.1\n\n";
        assert_eq!(run(&[up]), None);
        assert_eq!(
            run(&[b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"GET / HTTP/1.1\n\n"]),
            None
        );
    }
}
