//! Storing an answer while it streams. In: the client's body of a storable answer, the
//! entry it becomes and the lead of its key. Out: the same frames, unchanged and unbuffered
//! for the client; a copy of the data, up to the rule's `maxEntryBytes`, stored when the
//! body ends whole. A larger body, trailers or a broken body store nothing; the lead (and
//! with it the waiters) is released when the body ends or is dropped. The copies of all
//! answers being stored at once take no more than the store's buffering bound (a quarter
//! of its memory bound; the declared length is taken when the answer starts, the rest as it
//! comes): an answer beyond it streams through unstored and is counted.

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
    /// The answer's declared length.
    pub declared: Option<u64>,
}

/// The client's body, copied into the store as it passes.
pub(super) struct StoreBody {
    inner: ProxyBody,
    buf: BytesMut,
    /// `None` once stored or given up.
    pending: Option<Pending>,
    /// Bytes of the buffering bound taken (given back when stored or given up).
    reserved: u64,
    cache: std::sync::Arc<HttpCache>,
}

impl StoreBody {
    pub(super) fn new(inner: ProxyBody, pending: Pending) -> Self {
        let mut body = Self {
            inner,
            buf: BytesMut::new(),
            reserved: 0,
            pending: None,
            cache: pending.cache.clone(),
        };
        let first = pending.declared.unwrap_or(0);
        if pending.cache.reserve(first) {
            body.reserved = first;
            body.pending = Some(pending);
        } else {
            pending.cache.metrics.buffer_full.inc();
        }
        body
    }

    /// Room for `len` bytes in the copy, taken from the bound if need be; `false` when
    /// the bound is reached (the copy is then given up, and counted).
    fn room(&mut self, len: u64) -> bool {
        let Some(p) = &self.pending else {
            return false;
        };
        if len <= self.reserved {
            return true;
        }
        if p.cache.reserve(len - self.reserved) {
            self.reserved = len;
            return true;
        }
        p.cache.metrics.buffer_full.inc();
        false
    }

    /// Stops copying: the buffer and its share of the bound go.
    fn give_up(&mut self) {
        self.pending = None;
        self.buf = BytesMut::new();
        self.release();
    }

    fn release(&mut self) {
        self.cache.release(std::mem::take(&mut self.reserved));
    }

    fn store(&mut self) {
        if let Some(p) = self.pending.take() {
            let mut entry = p.entry;
            let buf = std::mem::take(&mut self.buf);
            // The buffer grew by doubling: what it holds beyond the body would be memory the
            // entry's weight does not count.
            entry.body = if buf.capacity() > buf.len() + buf.len() / 8 {
                Bytes::copy_from_slice(&buf)
            } else {
                buf.freeze()
            };
            entry.weight = entry.measure();
            if let Some((k, marker)) = p.vary {
                p.cache.insert(p.generation, k, marker);
            }
            p.cache
                .insert(p.generation, p.key, Slot::Entry(std::sync::Arc::new(entry)));
            drop(p.lead);
            self.release();
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
        self.release();
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
                        let len = this.buf.len() + data.len();
                        if len > p.max || !this.room(len as u64) {
                            // Too large, or too much being stored at once: stream on,
                            // store nothing.
                            this.give_up();
                        } else {
                            this.buf.extend_from_slice(data);
                        }
                    }
                }
                // Trailers are not stored: the entry would answer without them.
                None => this.give_up(),
            },
            Some(Err(_)) => this.give_up(),
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
