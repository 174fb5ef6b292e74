//! The request body of a gRPC-Web call, on its way to a gRPC backend. In: the client's body
//! (binary frames, or their base64 text for `application/grpc-web-text`). Out: the same
//! length-prefixed messages as gRPC sends them, checked as they pass:
//!
//! - base64 is decoded four characters at a time; a client may pad each chunk it sends
//!   (`QQ==QkM=`), so a padded group ends one run and the next starts afresh; at most three
//!   characters wait for the next chunk, so nothing grows with the body;
//! - each message header is read (flag 0 or 1, compressed; a trailer frame, 0x80, has no
//!   place in a request) and a message declaring more bytes than the body may carry is
//!   refused before its bytes arrive ([`BodyTooLarge`]: 413, `RESOURCE_EXHAUSTED`);
//! - a body that ends inside a message or a base64 group is an error, not a short message.
//!
//! Every refusal is an error of the body, which cuts the upstream request; the gateway then
//! answers the client (module `body` records why). Request trailers do not exist in
//! gRPC-Web and are dropped.

use std::pin::Pin;
use std::task::{Context, Poll};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use crate::error::BoxError;
use crate::lifecycle::body::BodyTooLarge;

/// Why a gRPC-Web request body was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum DecodeError {
    #[error("gRPC-Web text body is not valid base64")]
    BadBase64,
    #[error("gRPC-Web body ends inside a base64 group")]
    TruncatedBase64,
    #[error("gRPC-Web message has flags {0:#04x} (only 0 or 1 in a request)")]
    BadFlag(u8),
    #[error("gRPC-Web body ends inside a message")]
    TruncatedMessage,
}

/// The message framing of a request body, read as bytes pass.
#[derive(Debug, Default)]
pub(crate) struct Framing {
    header: [u8; 5],
    /// Header bytes read of the message being read (0 between messages).
    got: usize,
    /// Payload bytes still to come of the current message.
    left: u64,
}

/// What [`Framing::feed`] refuses.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FrameFault {
    Bad(DecodeError),
    /// A message longer than the body may be.
    TooLarge,
}

impl Framing {
    /// Reads `data`; messages may declare at most `max` bytes.
    pub fn feed(&mut self, mut data: &[u8], max: u64) -> Result<(), FrameFault> {
        while !data.is_empty() {
            if self.left > 0 {
                let n = usize::try_from(self.left)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                self.left -= n as u64;
                data = &data[n..];
                continue;
            }
            self.header[self.got] = data[0];
            self.got += 1;
            data = &data[1..];
            if self.got == self.header.len() {
                self.got = 0;
                let flag = self.header[0];
                if flag & !1 != 0 {
                    return Err(FrameFault::Bad(DecodeError::BadFlag(flag)));
                }
                let len = u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]);
                if u64::from(len) > max {
                    return Err(FrameFault::TooLarge);
                }
                self.left = u64::from(len);
            }
        }
        Ok(())
    }

    /// The body ended: between two messages, or not.
    pub fn end(&self) -> Result<(), DecodeError> {
        if self.got != 0 || self.left != 0 {
            return Err(DecodeError::TruncatedMessage);
        }
        Ok(())
    }
}

/// Base64 text decoded chunk by chunk, each chunk possibly padded.
#[derive(Debug, Default)]
pub(crate) struct Text {
    pending: [u8; 3],
    held: usize,
}

impl Text {
    /// The bytes the complete groups of what came so far stand for.
    pub fn decode(&mut self, chunk: &[u8]) -> Result<Vec<u8>, DecodeError> {
        let mut input = Vec::with_capacity(self.held + chunk.len());
        input.extend_from_slice(&self.pending[..self.held]);
        input.extend_from_slice(chunk);
        let whole = input.len() / 4 * 4;
        let rest = input.len() - whole;
        self.pending[..rest].copy_from_slice(&input[whole..]);
        self.held = rest;
        let mut out = Vec::with_capacity(whole / 4 * 3);
        let mut start = 0;
        for end in (4..=whole).step_by(4) {
            // A padded group ends a run: the next group starts a new one.
            if input[end - 1] == b'=' {
                decode_run(&input[start..end], &mut out)?;
                start = end;
            }
        }
        decode_run(&input[start..whole], &mut out)?;
        Ok(out)
    }

    /// The text ended: on a group boundary, or not.
    pub fn end(&self) -> Result<(), DecodeError> {
        if self.held != 0 {
            return Err(DecodeError::TruncatedBase64);
        }
        Ok(())
    }
}

fn decode_run(run: &[u8], out: &mut Vec<u8>) -> Result<(), DecodeError> {
    if run.is_empty() {
        return Ok(());
    }
    STANDARD
        .decode_vec(run, out)
        .map_err(|_| DecodeError::BadBase64)
}

/// A gRPC-Web request body as gRPC ([module docs](self)).
#[derive(Debug)]
pub(crate) struct RequestBody<B> {
    inner: B,
    /// `Some` for `application/grpc-web-text`.
    text: Option<Text>,
    framing: Framing,
    /// The most bytes a message may declare: the body limit of the route or port.
    max: u64,
    ended: bool,
}

impl<B> RequestBody<B> {
    pub fn new(inner: B, text: bool, max: u64) -> Self {
        Self {
            inner,
            text: text.then(Text::default),
            framing: Framing::default(),
            max,
            ended: false,
        }
    }

    fn check(&mut self, data: Bytes) -> Result<Bytes, BoxError> {
        let data = match self.text.as_mut() {
            Some(t) => Bytes::from(t.decode(&data)?),
            None => data,
        };
        match self.framing.feed(&data, self.max) {
            Ok(()) => Ok(data),
            Err(FrameFault::Bad(e)) => Err(Box::new(e)),
            Err(FrameFault::TooLarge) => Err(Box::new(BodyTooLarge)),
        }
    }

    fn finish(&self) -> Result<(), DecodeError> {
        if let Some(t) = &self.text {
            t.end()?;
        }
        self.framing.end()
    }
}

impl<B> Body for RequestBody<B>
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => frame,
                Poll::Ready(None) => {
                    this.ended = true;
                    return Poll::Ready(this.finish().err().map(|e| Err(e.into())));
                }
            };
            // gRPC-Web has no request trailers.
            let Ok(data) = frame.into_data() else {
                continue;
            };
            match this.check(data) {
                // A chunk of fewer than four base64 characters decodes to nothing yet.
                Ok(d) if d.is_empty() => continue,
                Ok(d) => return Poll::Ready(Some(Ok(Frame::data(d)))),
                Err(e) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || (self.inner.is_end_stream() && self.finish().is_ok())
    }

    fn size_hint(&self) -> SizeHint {
        if self.text.is_some() {
            // The decoded length is not the text's.
            return SizeHint::default();
        }
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(flag: u8, msg: &[u8]) -> Vec<u8> {
        let mut f = vec![flag];
        f.extend_from_slice(&u32::try_from(msg.len()).unwrap().to_be_bytes());
        f.extend_from_slice(msg);
        f
    }

    #[test]
    fn text_decodes_across_chunks_and_per_chunk_padding() {
        let mut t = Text::default();
        // "A" padded, then "BC" split mid-group.
        assert_eq!(t.decode(b"QQ==Qk").unwrap(), b"A");
        assert_eq!(t.decode(b"M=").unwrap(), b"BC");
        assert!(t.end().is_ok());
        let mut t = Text::default();
        assert_eq!(t.decode(b"Q").unwrap(), b"");
        assert_eq!(t.decode(b"UJD").unwrap(), b"ABC");
        assert_eq!(t.decode(b"QQ").unwrap(), b"");
        assert_eq!(t.end(), Err(DecodeError::TruncatedBase64));
    }

    #[test]
    fn text_refuses_what_is_not_base64() {
        for bad in [&b"QQ=x"[..], b"Q Q=", b"=QQQ", b"****", b"QQ==\r\n"] {
            let mut t = Text::default();
            let r = t.decode(bad).and_then(|_| t.end());
            assert!(r.is_err(), "{bad:?}");
        }
    }

    #[test]
    fn framing_reads_messages_split_anywhere() {
        let mut body = frame(0, b"hello");
        body.extend(frame(1, b""));
        body.extend(frame(0, b"xy"));
        for cut in 0..body.len() {
            let mut f = Framing::default();
            f.feed(&body[..cut], 100).unwrap();
            f.feed(&body[cut..], 100).unwrap();
            assert!(f.end().is_ok(), "cut at {cut}");
        }
        let mut f = Framing::default();
        f.feed(&body[..body.len() - 1], 100).unwrap();
        assert_eq!(f.end(), Err(DecodeError::TruncatedMessage));
    }

    /// Messages, base64-encoded piece by piece (padded each), cut at random places: the
    /// decoded body is the messages; random bytes are refused or decoded, never a panic.
    #[test]
    fn random_pieces_and_cuts_decode_and_garbage_never_panics() {
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..300 {
            let mut body = Vec::new();
            let mut text = Vec::new();
            for _ in 0..rng.usize(1..5) {
                let m: Vec<u8> = (0..rng.usize(0..40)).map(|_| rng.u8(..)).collect();
                let f = frame(rng.u8(0..2), &m);
                text.extend(STANDARD.encode(&f).into_bytes());
                body.extend(f);
            }
            let (mut t, mut framing, mut out) = (Text::default(), Framing::default(), Vec::new());
            let mut rest = &text[..];
            while !rest.is_empty() {
                let n = rng.usize(1..=rest.len());
                let d = t.decode(&rest[..n]).unwrap();
                framing.feed(&d, 1 << 20).unwrap();
                out.extend(d);
                rest = &rest[n..];
            }
            assert!(t.end().is_ok() && framing.end().is_ok());
            assert_eq!(out, body);

            let junk: Vec<u8> = (0..rng.usize(0..64)).map(|_| rng.u8(..)).collect();
            let (mut t, mut framing) = (Text::default(), Framing::default());
            if let Ok(d) = t.decode(&junk) {
                let _ = framing.feed(&d, 1 << 20);
            }
            let _ = Framing::default().feed(&junk, 1 << 20);
        }
    }

    #[test]
    fn framing_refuses_trailer_frames_and_oversized_messages() {
        let mut f = Framing::default();
        assert_eq!(
            f.feed(&frame(0x80, b""), 100),
            Err(FrameFault::Bad(DecodeError::BadFlag(0x80)))
        );
        let mut f = Framing::default();
        assert_eq!(
            f.feed(&[0, 0xff, 0xff, 0xff, 0xff], 100),
            Err(FrameFault::TooLarge)
        );
        let mut f = Framing::default();
        assert!(f.feed(&frame(0, &[7; 100]), 100).is_ok());
    }
}
