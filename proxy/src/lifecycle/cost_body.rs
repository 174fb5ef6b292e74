//! Rate-limit costs read from a response body (`cost.response` reading `response.body`).
//!
//! In: a response whose request a limit admitted with such a cost ([`BodyCost`]: the limit,
//! its counter's key, the response's status and headers). Out: the same response, its body
//! going to the client frame by frame as it arrives (never held back), a copy of its bytes
//! kept up to the largest cap of the limits ([`CostBody`]); when the body ends it is parsed as
//! JSON and each limit counts its cost, before the end of the body reaches the client, so the
//! client's next request sees the count.
//!
//! What is counted when the body cannot be read:
//! - a `Content-Encoding` other than `identity` (gzip, br: not decoded here), a
//!   `text/event-stream` body, or no body at all (HEAD, 204, 304): counted at once, without
//!   `response.body` (an expression reading it fails: a cost error, counting 1);
//! - a body over a limit's cap, or not JSON (serde_json's recursion limit refuses JSON nested
//!   deeper than 128): that limit's expression sees no `response.body`;
//! - the upstream aborting mid-body: the body is incomplete, counted without it;
//! - the client hanging up mid-body: the upstream's body is read on to its end in the
//!   background (up to the cap, for at most [`DRAIN_LIMIT`]) and counted from it, so hanging
//!   up early does not make a request cheaper.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use http::{HeaderMap, Response};
use http_body_util::BodyExt as _;
use hyper::body::{Body, Frame, SizeHint};
use tokio::task::JoinHandle;

use crate::lifecycle::body::{BoxError, ProxyBody};
use crate::lifecycle::policy::ratelimit::{CompiledLimit, RateLimiter};

/// How long the body of a response whose client hung up is read on for its cost.
pub(crate) const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// One limit's cost to count from a response body.
pub(crate) struct BodyCost {
    pub limiter: RateLimiter,
    pub limit: CompiledLimit,
    pub key: String,
    /// The most bytes of the body this limit reads.
    pub cap: usize,
}

/// The costs of one response and what they read besides the body.
struct Costs {
    costs: Vec<BodyCost>,
    status: u16,
    headers: HeaderMap,
}

impl Costs {
    /// Counts every cost, on `body` when it was read whole (`None`: not read).
    async fn count(self, body: Option<Vec<u8>>) {
        let parsed = body
            .as_deref()
            .map(|b| (b.len(), serde_json::from_slice::<serde_json::Value>(b)));
        for c in &self.costs {
            let json = match &parsed {
                Some((len, Ok(v))) if *len <= c.cap => Some(v),
                _ => None,
            };
            c.limiter
                .add_response_cost(&c.limit, &c.key, self.status, &self.headers, json)
                .await;
        }
    }
}

/// Whether a response's body can be read as JSON for a cost: not encoded, not a stream of
/// events.
fn readable(headers: &HeaderMap) -> bool {
    let encoded = headers
        .get_all(CONTENT_ENCODING)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    let events = headers.get(CONTENT_TYPE).is_some_and(|v| {
        v.to_str().is_ok_and(|t| {
            t.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        })
    });
    !encoded && !events
}

/// Counts `costs` from `resp`'s body: at once when it cannot be read (see the module
/// documentation), else by wrapping the body in a [`CostBody`].
pub(crate) async fn count_from_body(resp: &mut Response<ProxyBody>, costs: Vec<BodyCost>) {
    let costs = Costs {
        costs,
        status: resp.status().as_u16(),
        headers: resp.headers().clone(),
    };
    if resp.body().is_end_stream() || !readable(resp.headers()) {
        costs.count(None).await;
        return;
    }
    let cap = costs.costs.iter().map(|c| c.cap).max().unwrap_or(0);
    let inner = std::mem::replace(resp.body_mut(), crate::lifecycle::body::empty());
    *resp.body_mut() = CostBody {
        inner: Some(inner),
        kept: Kept {
            bytes: Vec::new(),
            cap,
            over: false,
        },
        costs: Some(costs),
        counting: None,
    }
    .boxed();
}

/// A copy of a body's bytes, up to a cap.
struct Kept {
    bytes: Vec<u8>,
    cap: usize,
    /// More than `cap` bytes came: `bytes` was dropped.
    over: bool,
}

impl Kept {
    fn keep(&mut self, data: &Bytes) {
        if self.over {
            return;
        }
        if self.bytes.len() + data.len() > self.cap {
            self.over = true;
            self.bytes = Vec::new();
        } else {
            self.bytes.extend_from_slice(data);
        }
    }

    /// What was read, when it is the whole body.
    fn whole(&mut self) -> Option<Vec<u8>> {
        (!self.over).then(|| std::mem::take(&mut self.bytes))
    }
}

/// A response body that keeps a copy of its bytes (up to the cap) and counts the costs when
/// it ends, before ending.
struct CostBody {
    /// `None` once handed to a drain.
    inner: Option<ProxyBody>,
    kept: Kept,
    /// `None` once counting has started.
    costs: Option<Costs>,
    /// The count in progress; the body ends when it is done.
    counting: Option<JoinHandle<()>>,
}

impl CostBody {
    /// Starts counting on `body`.
    fn start(&mut self, body: Option<Vec<u8>>) {
        if let Some(costs) = self.costs.take() {
            self.counting = Some(tokio::spawn(costs.count(body)));
        }
    }
}

impl Body for CostBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(counting) = this.counting.as_mut() {
            // A count that panicked is no reason to fail the body.
            return match Pin::new(counting).poll(cx) {
                Poll::Ready(_) => {
                    this.counting = None;
                    Poll::Ready(None)
                }
                Poll::Pending => Poll::Pending,
            };
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.kept.keep(data);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                let body = this.kept.whole();
                this.start(body);
                if this.counting.is_none() {
                    return Poll::Ready(None);
                }
                self.poll_frame(cx)
            }
            Poll::Ready(Some(Err(e))) => {
                // The upstream aborted: the body is incomplete, counted without it.
                this.start(None);
                Poll::Ready(Some(Err(e)))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.costs.is_none() && self.counting.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for CostBody {
    fn drop(&mut self) {
        let (Some(costs), Some(inner)) = (self.costs.take(), self.inner.take()) else {
            return;
        };
        // The client hung up before the end: read the rest for the cost.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let drain = Drain {
            inner,
            kept: std::mem::replace(
                &mut self.kept,
                Kept {
                    bytes: Vec::new(),
                    cap: 0,
                    over: true,
                },
            ),
        };
        runtime.spawn(async move {
            let body = tokio::time::timeout(DRAIN_LIMIT, drain.read())
                .await
                .ok()
                .flatten();
            costs.count(body).await;
        });
    }
}

/// The rest of a body whose client left, read for its cost.
struct Drain {
    inner: ProxyBody,
    kept: Kept,
}

impl Drain {
    /// The whole body, or `None` when it fails or passes the cap (read no further).
    async fn read(mut self) -> Option<Vec<u8>> {
        while !self.kept.over {
            let Some(frame) = self.inner.frame().await else {
                return self.kept.whole();
            };
            if let Ok(data) = frame.ok()?.into_data() {
                self.kept.keep(&data);
            }
        }
        None
    }
}
