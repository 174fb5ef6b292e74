//! Storing an answer while it streams. In: the client's body of a storable answer, the
//! entry it becomes and the lead of its key. Out: the same frames, unchanged and unbuffered
//! for the client; a copy of the data, up to the rule's `maxEntryBytes`, stored when the
//! body ends whole. A larger body, trailers or a broken body store nothing; the lead (and
//! with it the waiters) is released when the body ends or is dropped.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};

use super::flight::Lead;
use super::{HttpCache, Slot};
use crate::lifecycle::body::{BoxError, ProxyBody};

/// Where a whole body goes: the entry (its `body` filled at the end) under `key`, and the
/// Vary marker to store beside it.
pub(super) struct Pending {
    pub cache: std::sync::Arc<HttpCache>,
    pub key: String,
    pub entry: super::entry::Entry,
    pub vary: Option<(String, Slot)>,
    pub lead: Option<Lead>,
    pub max: usize,
    /// The store's generation when the fetch began (a purge or swap since: not stored).
    pub generation: u64,
}

/// The client's body, copied into the store as it passes.
pub(super) struct StoreBody {
    inner: ProxyBody,
    buf: BytesMut,
    /// `None` once stored or given up.
    pending: Option<Pending>,
}

impl StoreBody {
    pub(super) fn new(inner: ProxyBody, pending: Pending) -> Self {
        Self {
            inner,
            buf: BytesMut::new(),
            pending: Some(pending),
        }
    }

    fn store(&mut self) {
        if let Some(p) = self.pending.take() {
            let mut entry = p.entry;
            entry.body = std::mem::take(&mut self.buf).freeze();
            if let Some((k, marker)) = p.vary {
                p.cache.insert(p.generation, k, marker);
            }
            p.cache
                .insert(p.generation, p.key, Slot::Entry(std::sync::Arc::new(entry)));
            drop(p.lead);
        }
    }
}

impl Drop for StoreBody {
    /// A body that was whole before anyone polled it (HEAD, 204, an empty 200) is stored
    /// when the answer is done with it.
    fn drop(&mut self) {
        if self.pending.is_some() && self.inner.is_end_stream() {
            self.store();
        }
    }
}

impl Body for StoreBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            Some(Ok(f)) => match f.data_ref() {
                Some(data) => {
                    if let Some(p) = &this.pending {
                        if this.buf.len() + data.len() > p.max {
                            // Too large: stream on, store nothing.
                            this.pending = None;
                            this.buf = BytesMut::new();
                        } else {
                            this.buf.extend_from_slice(data);
                        }
                    }
                }
                // Trailers are not stored: the entry would answer without them.
                None => this.pending = None,
            },
            Some(Err(_)) => this.pending = None,
            None => this.store(),
        }
        if this.pending.is_some() && this.inner.is_end_stream() {
            this.store();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
