//! Message bodies: how one is framed, and [`Decoder`], which takes it off the read buffer
//! (RFC 9112 §6, §7.1). In: body bytes at the front of the buffer. Out: data frames, then
//! the trailer fields of a chunked body, then its end.
//!
//! What a chunked body may hold: chunk-size lines of 1 to 16 hex digits, then optional spaces
//! or tabs and extensions (`;...`) without control bytes, in at most [`MAX_CHUNK_LINE`]
//! bytes; each chunk's data followed by CRLF; trailer fields in at most [`MAX_TRAILERS`]
//! bytes. Anything else is an [`Error`], and the connection cannot go on.

use bytes::{Buf as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::Frame;

use crate::{Error, MAX_HEADERS, find};

/// Longest chunk-size line (with extensions).
pub const MAX_CHUNK_LINE: usize = 4096;
/// Most bytes of trailer fields.
pub const MAX_TRAILERS: usize = 64 * 1024;

/// How a body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Exactly this many bytes (0: no body).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Everything until the sender closes the connection (answers only).
    Close,
}

/// Where the reading of a body stands.
#[derive(Debug)]
pub enum Decoder {
    /// This many bytes to go.
    Length(u64),
    Chunked(Chunk),
    /// Everything until the peer closes.
    Close,
    /// Read to the end.
    Done,
}

/// Where a chunked body stands.
#[derive(Debug)]
pub enum Chunk {
    /// Expecting a chunk-size line.
    Size,
    /// This many bytes of the chunk to go.
    Data(u64),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// Past the last chunk: trailer fields, then an empty line.
    Trailers,
}

/// What one step of decoding gave.
#[derive(Debug)]
pub enum Step {
    Frame(Frame<Bytes>),
    /// The body ended.
    End,
    /// The buffer holds too little: read more.
    More,
}

/// The end of a chunked body without trailers, right after a chunk's data.
const LAST_CHUNK: &[u8] = b"\r\n0\r\n\r\n";

impl Decoder {
    /// The decoder of a body framed so.
    pub fn new(framing: Framing) -> Self {
        match framing {
            Framing::Length(0) => Self::Done,
            Framing::Length(n) => Self::Length(n),
            Framing::Chunked => Self::Chunked(Chunk::Size),
            Framing::Close => Self::Close,
        }
    }

    /// The body has been read to its end.
    pub fn is_done(&self) -> bool {
        matches!(self, Self::Done | Self::Length(0))
    }

    /// Bytes still to come, when known.
    pub fn remaining(&self) -> Option<u64> {
        match self {
            Self::Length(n) => Some(*n),
            Self::Done => Some(0),
            _ => None,
        }
    }

    /// One step over what `buf` holds. At EOF the caller ends a [`Decoder::Close`] body
    /// itself; for any other an EOF cut the body short.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Step, Error> {
        let step = match self {
            Self::Done | Self::Length(0) => Step::End,
            Self::Length(rest) => take_data(buf, rest),
            Self::Close if buf.is_empty() => Step::More,
            Self::Close => Step::Frame(Frame::data(buf.split().freeze())),
            Self::Chunked(chunk) => decode_chunk(buf, chunk)?,
        };
        match &step {
            Step::End => *self = Self::Done,
            Step::Frame(_) => {
                let ended = match self {
                    Self::Length(0) | Self::Chunked(Chunk::Trailers) => true,
                    // The last chunk often arrives with the body's end: taken now, so the
                    // end is known (and the connection free) without another read.
                    Self::Chunked(Chunk::DataEnd) if buf[..] == *LAST_CHUNK => {
                        buf.clear();
                        true
                    }
                    _ => false,
                };
                if ended {
                    *self = Self::Done;
                }
            }
            Step::More => {}
        }
        Ok(step)
    }

    /// For an answer whose chunked body starts in the same read as its head: checks the
    /// first chunk-size line if it is whole, so a broken one is refused with the head.
    pub fn check_first_chunk(&self, buf: &[u8]) -> Result<(), Error> {
        if matches!(self, Self::Chunked(Chunk::Size))
            && let Some(end) = find(buf, b"\r\n")
        {
            parse_chunk_size(&buf[..end])?;
        }
        Ok(())
    }
}

/// Up to `rest` bytes of body from `buf`.
fn take_data(buf: &mut BytesMut, rest: &mut u64) -> Step {
    if buf.is_empty() {
        return Step::More;
    }
    let n = usize::try_from(*rest).map_or(buf.len(), |r| r.min(buf.len()));
    *rest -= n as u64;
    Step::Frame(Frame::data(buf.split_to(n).freeze()))
}

/// One step of chunked decoding over what `buf` holds.
fn decode_chunk(buf: &mut BytesMut, chunk: &mut Chunk) -> Result<Step, Error> {
    loop {
        match chunk {
            Chunk::Size => {
                let Some(line) = take_line(buf, MAX_CHUNK_LINE)? else {
                    return Ok(Step::More);
                };
                let size = parse_chunk_size(&line)?;
                *chunk = if size == 0 {
                    Chunk::Trailers
                } else {
                    Chunk::Data(size)
                };
            }
            Chunk::Data(rest) => {
                let step = take_data(buf, rest);
                if *rest == 0 {
                    *chunk = Chunk::DataEnd;
                }
                return Ok(step);
            }
            Chunk::DataEnd => {
                if buf.len() < 2 {
                    return Ok(Step::More);
                }
                if &buf[..2] != b"\r\n" {
                    return Err(Error::Invalid("chunk not followed by CRLF"));
                }
                buf.advance(2);
                *chunk = Chunk::Size;
            }
            Chunk::Trailers => {
                if buf.starts_with(b"\r\n") {
                    buf.advance(2);
                    return Ok(Step::End);
                }
                let Some(end) = find(buf, b"\r\n\r\n") else {
                    if buf.len() > MAX_TRAILERS {
                        return Err(Error::Invalid("trailers too large"));
                    }
                    return Ok(Step::More);
                };
                let section = buf.split_to(end + 4).freeze();
                let trailers = parse_trailers(&section)?;
                return Ok(Step::Frame(Frame::trailers(trailers)));
            }
        }
    }
}

/// Takes one CRLF-ended line off `buf` (without the CRLF); `None` until it is complete.
fn take_line(buf: &mut BytesMut, max: usize) -> Result<Option<BytesMut>, Error> {
    match find(buf, b"\r\n") {
        Some(i) => {
            let line = buf.split_to(i);
            buf.advance(2);
            Ok(Some(line))
        }
        None if buf.len() > max => Err(Error::Invalid("chunk-size line too long")),
        None => Ok(None),
    }
}

/// A chunk-size line: hex digits, then optional spaces or tabs before extensions (`;...`),
/// which may hold no control byte.
pub fn parse_chunk_size(line: &[u8]) -> Result<u64, Error> {
    let digits = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    let rest = &line[digits..];
    let rest = &rest[rest
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(rest.len())..];
    // Extensions hold no control byte (a bare CR or LF there is read as a line end by
    // some, RFC 9112 §7.1.1); a tab is whitespace.
    if digits == 0
        || digits > 16
        || !(rest.is_empty() || rest[0] == b';')
        || rest.iter().any(|&b| (b < b' ' && b != b'\t') || b == 0x7f)
    {
        return Err(Error::Invalid("chunk size"));
    }
    line[..digits].iter().try_fold(0u64, |n, &b| {
        let d = (b as char)
            .to_digit(16)
            .ok_or(Error::Invalid("chunk size"))?;
        Ok((n << 4) | u64::from(d))
    })
}

/// Trailer fields (ending with the empty line).
fn parse_trailers(section: &Bytes) -> Result<HeaderMap, Error> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    match httparse::parse_headers(section, &mut fields) {
        Ok(httparse::Status::Complete((_, parsed))) => {
            let mut map = HeaderMap::with_capacity(parsed.len());
            for f in parsed {
                let name = HeaderName::from_bytes(f.name.as_bytes())
                    .map_err(|_| Error::Invalid("trailer field name"))?;
                let value = HeaderValue::from_maybe_shared(section.slice_ref(f.value))
                    .map_err(|_| Error::Invalid("trailer field value"))?;
                map.append(name, value);
            }
            Ok(map)
        }
        _ => Err(Error::Invalid("malformed trailers")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole body `raw` decodes to under `framing`, or the first error.
    fn decode_all(framing: Framing, raw: &[u8]) -> Result<(Vec<u8>, Option<HeaderMap>), Error> {
        let mut d = Decoder::new(framing);
        let mut buf = BytesMut::from(raw);
        let (mut data, mut trailers) = (Vec::new(), None);
        loop {
            match d.decode(&mut buf)? {
                Step::Frame(f) => match f.into_data() {
                    Ok(b) => data.extend_from_slice(&b),
                    Err(f) => trailers = f.into_trailers().ok(),
                },
                Step::End => return Ok((data, trailers)),
                Step::More if d.is_done() => return Ok((data, trailers)),
                Step::More => return Err(Error::Invalid("incomplete")),
            }
            if d.is_done() {
                return Ok((data, trailers));
            }
        }
    }

    #[test]
    fn lengths_and_chunks_decode() {
        assert_eq!(decode_all(Framing::Length(3), b"abcdef").unwrap().0, b"abc");
        let (data, trailers) = decode_all(
            Framing::Chunked,
            b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: 1\r\n\r\n",
        )
        .unwrap();
        assert_eq!(data, b"abcde");
        assert_eq!(trailers.unwrap()["t"], "1");
        assert_eq!(
            decode_all(Framing::Chunked, b"1\r\na\r\n0\r\n\r\n")
                .unwrap()
                .0,
            b"a"
        );
    }

    #[test]
    fn broken_chunks_are_refused() {
        for raw in [
            &b"g\r\n"[..],
            b"1\r\nab\r\n",
            b"1\nab",
            b"1;\rx\r\na\r\n",
            b"+1\r\na\r\n",
            b"11111111111111111\r\n",
        ] {
            assert!(decode_all(Framing::Chunked, raw).is_err(), "{raw:?}");
        }
    }

    #[test]
    fn chunk_sizes_parse_or_fail() {
        assert_eq!(parse_chunk_size(b"1a").ok(), Some(26));
        assert_eq!(parse_chunk_size(b"FF;name=value").ok(), Some(255));
        assert_eq!(parse_chunk_size(b"0 ").ok(), Some(0));
        assert_eq!(parse_chunk_size(b"ffffffffffffffff").ok(), Some(u64::MAX));
        assert_eq!(parse_chunk_size(b"5 \t;a=b").ok(), Some(5));
        for bad in [
            &b""[..],
            b";x",
            b"1g",
            b"fffffffffffffffff",
            b"-1",
            b"5 junk",
            b"5;a\nb",
            b"5;a\rb",
            b"5;a\x00",
        ] {
            assert!(parse_chunk_size(bad).is_err(), "{bad:?}");
        }
    }
}
