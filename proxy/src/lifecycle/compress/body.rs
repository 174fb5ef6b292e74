//! The compressed body. In: the upstream's response body, frame by frame. Out: the same
//! body in one content coding, each upstream frame compressed and flushed as it arrives
//! (a server-sent event is never held back for the next), the coding's end after the last
//! frame, trailers after that. An upstream body that fails passes its error on as it is,
//! so the client's response ends the way it ends uncompressed (HTTP/1: the connection
//! closes before the last chunk; HTTP/2: the stream is reset).
//!
//! The encoders are async-compression's, writing into a `Vec` that never makes them wait;
//! levels and windows are fixed low (see [`Encoder::new`]) so a stream's memory is bounded.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use async_compression::Level;
use async_compression::tokio::write::{BrotliEncoder, GzipEncoder, ZstdEncoder};
use bytes::Bytes;
use http::HeaderMap;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::AsyncWrite;
use tollgate_api::client::Encoding;

use crate::lifecycle::body::{BoxError, ProxyBody};
use crate::metrics::CompressionCounters;

/// gzip's default level: 5 of 9, most of level 6's ratio for less CPU.
const GZIP_LEVEL: i32 = 5;
/// Brotli quality 4 of 11 (the fastest with its own hasher for text) and a 256 KiB window.
const BROTLI_QUALITY: i32 = 4;
const BROTLI_WINDOW_LOG: i32 = 18;
/// zstd level 3 (its default) with a 256 KiB window rather than the 2 MiB level 3 picks.
const ZSTD_LEVEL: i32 = 3;
const ZSTD_WINDOW_LOG: u32 = 18;

/// The levels a port's encoders use: gzip's from its ClientPolicy (1 to 9, the compiler
/// checks; clamped here too), brotli's and zstd's fixed so a stream's memory stays bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Levels {
    gzip: i32,
}

impl Levels {
    pub(crate) fn new(gzip: Option<u8>) -> Self {
        Self {
            gzip: gzip.map_or(GZIP_LEVEL, |l| i32::from(l.clamp(1, 9))),
        }
    }
}

impl Default for Levels {
    fn default() -> Self {
        Self::new(None)
    }
}

/// One response's encoder, writing into its own buffer (brotli's state is boxed: 5.6 KB
/// inline).
enum Encoder {
    Gzip(GzipEncoder<Vec<u8>>),
    Br(Box<BrotliEncoder<Vec<u8>>>),
    Zstd(ZstdEncoder<Vec<u8>>),
}

impl Encoder {
    fn new(e: Encoding, levels: Levels) -> Self {
        match e {
            Encoding::Gzip => Self::Gzip(GzipEncoder::with_quality(
                Vec::new(),
                Level::Precise(levels.gzip),
            )),
            Encoding::Br => Self::Br(Box::new(BrotliEncoder::with_params(
                Vec::new(),
                async_compression::brotli::EncoderParams::default()
                    .quality(Level::Precise(BROTLI_QUALITY))
                    .window_size(BROTLI_WINDOW_LOG)
                    .text_mode(),
            ))),
            Encoding::Zstd => Self::Zstd(ZstdEncoder::with_quality_and_params(
                Vec::new(),
                Level::Precise(ZSTD_LEVEL),
                &[async_compression::zstd::CParameter::window_log(
                    ZSTD_WINDOW_LOG,
                )],
            )),
        }
    }

    fn io(&mut self) -> Pin<&mut (dyn AsyncWrite + Send + Unpin)> {
        match self {
            Self::Gzip(w) => Pin::new(w),
            Self::Br(w) => Pin::new(w),
            Self::Zstd(w) => Pin::new(w),
        }
    }

    /// What the encoder has written so far, taken.
    fn take(&mut self) -> Bytes {
        let out = match self {
            Self::Gzip(w) => w.get_mut(),
            Self::Br(w) => w.get_mut(),
            Self::Zstd(w) => w.get_mut(),
        };
        Bytes::from(std::mem::take(out))
    }

    /// Compresses `data` and flushes it: the bytes that decode to all of it.
    fn feed(&mut self, mut data: &[u8]) -> io::Result<Bytes> {
        let mut cx = Context::from_waker(Waker::noop());
        while !data.is_empty() {
            match ready(self.io().poll_write(&mut cx, data))? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => data = &data[n..],
            }
        }
        ready(self.io().poll_flush(&mut cx))?;
        Ok(self.take())
    }

    /// Ends the coding: its last bytes.
    fn finish(&mut self) -> io::Result<Bytes> {
        let mut cx = Context::from_waker(Waker::noop());
        ready(self.io().poll_shutdown(&mut cx))?;
        Ok(self.take())
    }
}

/// The encoders write into a `Vec`, which never waits: a `Pending` would be a bug, reported
/// as an error rather than a hang.
fn ready<T>(p: Poll<io::Result<T>>) -> io::Result<T> {
    match p {
        Poll::Ready(r) => r,
        Poll::Pending => Err(io::Error::other("a compression encoder waited on a buffer")),
    }
}

/// A response body compressed as it streams.
pub(crate) struct CompressBody {
    inner: ProxyBody,
    /// `None` once the coding has ended.
    encoder: Option<Encoder>,
    /// Trailers that came after the last data: sent once the coding's end has gone.
    trailers: Option<HeaderMap>,
    counters: CompressionCounters,
    bytes_in: u64,
    bytes_out: u64,
}

impl CompressBody {
    pub(crate) fn new(
        inner: ProxyBody,
        e: Encoding,
        levels: Levels,
        counters: CompressionCounters,
    ) -> Self {
        counters.response();
        Self {
            inner,
            encoder: Some(Encoder::new(e, levels)),
            trailers: None,
            counters,
            bytes_in: 0,
            bytes_out: 0,
        }
    }

    fn out(&mut self, data: Bytes) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.bytes_out += data.len() as u64;
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    /// Ends the coding; its last bytes, unless there are none.
    fn finish(&mut self) -> Option<io::Result<Bytes>> {
        let mut encoder = self.encoder.take()?;
        Some(encoder.finish())
    }
}

impl Body for CompressBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            let Some(encoder) = this.encoder.as_mut() else {
                return match this.trailers.take() {
                    Some(t) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
                    None => Poll::Ready(None),
                };
            };
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => {
                    // Cut short: the client sees the upstream's break, not a whole coding.
                    this.encoder = None;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(Some(Ok(frame))) => frame,
                Poll::Ready(None) => match this.finish() {
                    Some(Ok(last)) => return this.out(last),
                    Some(Err(e)) => return Poll::Ready(Some(Err(Box::new(e)))),
                    None => continue,
                },
            };
            match frame.into_data() {
                Ok(data) if data.is_empty() => {}
                Ok(data) => {
                    this.bytes_in += data.len() as u64;
                    match encoder.feed(&data) {
                        Ok(out) if out.is_empty() => {}
                        Ok(out) => return this.out(out),
                        Err(e) => {
                            this.encoder = None;
                            return Poll::Ready(Some(Err(Box::new(e))));
                        }
                    }
                }
                Err(frame) => {
                    // Trailers end the body: the coding ends first.
                    this.trailers = frame.into_trailers().ok();
                    match this.finish() {
                        Some(Ok(last)) => return this.out(last),
                        Some(Err(e)) => return Poll::Ready(Some(Err(Box::new(e)))),
                        None => {}
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.encoder.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        // The length is unknown until the end: HTTP/1 sends chunks, HTTP/2 no length.
        SizeHint::default()
    }
}

impl Drop for CompressBody {
    fn drop(&mut self) {
        self.counters.bytes(self.bytes_in, self.bytes_out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident bytes of this process (Linux).
    fn rss() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages: u64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        pages * 4096
    }

    /// Resident memory per compressed stream, bounded by the fixed windows; run by hand
    /// (alone, so no other test moves the figure):
    /// `cargo test -p tollgate-proxy --lib memory_per_stream -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn memory_per_stream() {
        let text: Vec<u8> = (0..40_000)
            .flat_map(|i| format!(r#"{{"id":{i},"name":"item {i}","ok":true}},"#).into_bytes())
            .collect();
        for e in Encoding::ALL {
            let before = rss();
            let mut live: Vec<Encoder> = (0..20)
                .map(|_| Encoder::new(e, Levels::default()))
                .collect();
            for enc in &mut live {
                for chunk in text.chunks(16 * 1024) {
                    let _ = enc.feed(chunk).unwrap();
                }
            }
            let per = (rss().saturating_sub(before)) / 20;
            println!(
                "{}: {} KiB resident per stream after {} KiB",
                e.as_str(),
                per / 1024,
                text.len() / 1024
            );
            drop(live);
        }
    }
}
