//! Upgraded connections (RFC 9110 §7.8: `101 Switching Protocols`; and CONNECT tunnels),
//! handed from the HTTP/1 connection that carried the exchange to the splice that joins the
//! client's side to the upstream's. In: a connection's socket and the bytes read past the
//! head, once the exchange is over. Out: [`Upgraded`], one byte stream that reads those bytes
//! first.
//!
//! Each side puts an [`OnUpgrade`] in the message's extensions (the server side in the
//! request's, the upstream side in the answer's) and keeps the [`Pending`] half; when the
//! 101 (or the CONNECT's 2xx) has been written or read, it gives its socket to
//! [`Pending::fulfil`]. A side that ends without upgrading drops [`Pending`], and the
//! [`OnUpgrade`] future fails.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

/// A socket an upgrade may take: TCP, TLS over TCP, or anything else a test drives.
pub(crate) trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// An upgraded connection: the bytes read past the head first, then the socket.
pub(crate) struct Upgraded {
    read: Bytes,
    io: Box<dyn Io>,
    /// The connection's place in its client's count (ClientPolicy
    /// `maxConnectionsPerClient`), given back when the socket closes, wherever it went.
    _slot: Option<crate::downstream::per_client::Slot>,
}

impl std::fmt::Debug for Upgraded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upgraded")
            .field("read", &self.read.len())
            .finish_non_exhaustive()
    }
}

impl Upgraded {
    pub(crate) fn new(io: impl Io, read: Bytes) -> Self {
        Self {
            read,
            io: Box::new(io),
            _slot: None,
        }
    }

    /// [`Upgraded::new`], holding `slot` as long as the socket lives.
    pub(crate) fn holding(
        io: impl Io,
        read: Bytes,
        slot: crate::downstream::per_client::Slot,
    ) -> Self {
        Self {
            read,
            io: Box::new(io),
            _slot: Some(slot),
        }
    }
}

impl AsyncRead for Upgraded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.read.is_empty() {
            let n = self.read.len().min(buf.remaining());
            buf.put_slice(&self.read[..n]);
            self.read.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Upgraded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
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

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The half of an upgrade the connection keeps.
#[derive(Debug)]
pub(crate) struct Pending(oneshot::Sender<Upgraded>);

/// The half of an upgrade the message carries: resolves to the connection once upgraded.
/// Clone because a message's extensions must be (as hyper's `OnUpgrade` is); clones share
/// the one connection, which the first to wait for it after the switch takes. The lock is
/// taken only when an upgrade is awaited, never per request.
#[derive(Debug, Clone)]
pub(crate) struct OnUpgrade(Arc<Mutex<Option<oneshot::Receiver<Upgraded>>>>);

/// A new pair.
pub(crate) fn pending() -> (Pending, OnUpgrade) {
    let (tx, rx) = oneshot::channel();
    (Pending(tx), OnUpgrade(Arc::new(Mutex::new(Some(rx)))))
}

impl Pending {
    /// The exchange is over and switched: the connection goes to whoever waits on it.
    pub(crate) fn fulfil(self, upgraded: Upgraded) {
        let _ = self.0.send(upgraded);
    }
}

/// The connection ended without the upgrade.
#[derive(Debug, thiserror::Error)]
#[error("the connection was not upgraded")]
pub(crate) struct NotUpgraded;

impl Future for OnUpgrade {
    type Output = Result<Upgraded, NotUpgraded>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Nothing panics while the lock is held; a poisoned receiver is still a receiver.
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // Taken by another clone already: a receiver must not be polled past its end.
        let Some(rx) = slot.as_mut() else {
            return Poll::Ready(Err(NotUpgraded));
        };
        let got = std::task::ready!(Pin::new(rx).poll(cx));
        *slot = None;
        Poll::Ready(got.map_err(|_| NotUpgraded))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[tokio::test]
    async fn the_bytes_read_past_the_head_come_first() {
        let (a, mut b) = tokio::io::duplex(64);
        let (pending, on) = pending();
        pending.fulfil(Upgraded::new(a, Bytes::from_static(b"early ")));
        let mut up = on.await.unwrap();
        b.write_all(b"late").await.unwrap();
        drop(b);
        let mut got = String::new();
        up.read_to_string(&mut got).await.unwrap();
        assert_eq!(got, "early late");
    }

    #[tokio::test]
    async fn a_connection_that_ends_without_upgrading_fails_the_wait() {
        let (pending, on) = pending();
        drop(pending);
        assert!(on.await.is_err());
    }
}
