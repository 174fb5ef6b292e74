//! The socket under an upstream HTTP/1.1 connection (module `h1`): plain TCP, or TLS over TCP
//! for a backend a BackendTLSPolicy names (module `tls`). In: a connected stream. Out: one
//! type the codec reads and writes without knowing which, and [`UpstreamIo::is_idle_usable`]
//! for the pool's check of an idle connection.
//!
//! An enum rather than a type parameter: the connection type stays one type through the pool,
//! the response body and the upgrade hand-off, and a plain connection pays one predictable
//! branch per poll, no allocation (the TLS stream is boxed, so the enum stays the size of a
//! `TcpStream` and plain connections do not carry TLS's buffers inline).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A connection's byte stream.
#[derive(Debug)]
pub(crate) enum UpstreamIo {
    /// Plaintext.
    Plain(TcpStream),
    /// TLS, handshake done.
    Tls(Box<TlsStream<TcpStream>>),
}

impl UpstreamIo {
    /// False when the upstream closed the connection (or sent something unasked) while it
    /// was idle. A plain socket costs no system call unless it became readable since the
    /// last read (see `h1::Conn::is_usable`). A TLS stream is polled once with a waker that
    /// does nothing: records that carry no data (a TLS 1.3 session ticket, a key update) are
    /// consumed by rustls and leave it usable; application data, a close_notify, EOF or an
    /// error make it unusable. A poll that the task's cooperative budget refuses reads as
    /// "nothing there", as for plain sockets: the exchange then finds a dead connection
    /// before writing (and the pool takes another) or after (and the request is retried
    /// when that is safe).
    pub(crate) fn is_idle_usable(&mut self) -> bool {
        match self {
            Self::Plain(s) => matches!(
                s.try_read(&mut [0u8; 1]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock
            ),
            Self::Tls(s) => {
                let mut byte = [0u8; 1];
                let mut buf = ReadBuf::new(&mut byte);
                let mut cx = Context::from_waker(Waker::noop());
                matches!(
                    Pin::new(&mut **s).poll_read(&mut cx, &mut buf),
                    Poll::Pending
                )
            }
        }
    }
}

impl AsyncRead for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}
