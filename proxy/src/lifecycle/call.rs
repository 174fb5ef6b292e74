//! Phases 5 and 6 of the request lifecycle: the upstream exchange. In: the request parts
//! after routing and filters, the picked endpoint, and the route's timeouts and retries. Out: the
//! upstream's response with response filters applied, or the status a failure maps to
//! (timeout → 504, connect/reset → 502, body over the limit → 413, body too slow → 408, a
//! request body that broke its framing → 400). Upgrades (WebSocket)
//! are forwarded over HTTP/1.1 and the two upgraded connections spliced.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Response, StatusCode, Version};
use http_body_util::BodyExt;
use hyper::body::Body;
use tollgate_api::{BackendProtocol, Cors, HeaderModifier, Retry};

use crate::downstream::client_body::ClientBody;
use crate::downstream::pace::BodyPace;
use crate::lifecycle::answer::{close_after, status};
use crate::lifecycle::body::{BodyFault, LimitedBody, ProxyBody, empty, full};
use crate::lifecycle::filters;
use crate::lifecycle::forward::{self, Added, TrailerFilter};
use crate::lifecycle::mirror::{self, MAX_HELD_BODY, MirrorRequest};
use crate::lifecycle::retry::{Retrier, RetryReason};
use crate::metrics::UpstreamErrorKind;
use crate::state::{Shared, Snapshot};
use crate::upgrade::OnUpgrade;
use crate::upstream::outlier::Outcome;
use crate::upstream::pool::{PooledBody, UpstreamError};
use crate::upstream::{Balancer, EndpointGuard, EndpointState, request_uri};

/// Phase 5, call: body, mirrors and the upstream exchange, tried again as the rule's
/// retries allow (module `retry`).
pub(crate) struct Call<'a> {
    pub shared: &'a Arc<Shared>,
    pub snapshot: &'a Snapshot,
    pub protocol: BackendProtocol,
    /// The backend's endpoints: a retry picks its endpoint here.
    pub balancer: &'a Balancer,
    pub path_and_query: &'a str,
    pub mirrors: &'a [&'a str],
    /// Set by the request body past the limit or when too slow; `None` for a bodiless
    /// request.
    pub fault: Option<&'a Arc<BodyFault>>,
    /// How long and how slowly the client may send the request body.
    pub body_pace: BodyPace,
    /// Most bytes of the request body (413 beyond): the connection's limit.
    pub max_body_bytes: u64,
    pub backend_timeout: Option<Duration>,
    /// The route forwards request trailers (filtered).
    pub request_trailers: bool,
    /// The rule's retries; `None`: one attempt.
    pub retry: Option<&'a Retry>,
    /// The request's trace: each attempt is a client span and carries its `traceparent`.
    pub trace: Option<&'a crate::otel::RequestTrace>,
}

/// The request body as the attempts send it.
enum Prepared {
    /// Held whole (none, or a small declared length): it can be sent more than once.
    Held(Bytes),
    /// Streamed from the client: sent once.
    Streaming(ProxyBody),
}

impl Call<'_> {
    /// Sends the request with the fields `added` (see [`crate::lifecycle::ctx::RequestCtx::upstream_head`])
    /// to `guard`'s endpoint, and again, as the rule's retries allow, to the endpoint a
    /// retry picks (left in `guard`); each retry goes into `retried`. The parts are borrowed,
    /// not moved, down to the exchange: each move of them (224 bytes) into a future was a
    /// `memcpy` (see [`crate::upstream::pool::EndpointPool::send_parts`]).
    pub async fn send(
        &self,
        parts: &mut Parts,
        body: ClientBody,
        added: &Added<'_>,
        guard: &mut EndpointGuard,
        retried: &mut Vec<Retried>,
    ) -> Result<Response<PooledBody>, Failure> {
        let none = Added::default();
        let added = if self.mirrors.is_empty() {
            added
        } else {
            // Mirrors copy the request's map: the fields go into it.
            added.insert_into(&mut parts.headers);
            &none
        };
        let held = match self.prepare_body(body, parts).await? {
            Prepared::Streaming(body) => {
                let seen = Seen::default();
                return self
                    .attempt(guard.endpoint(), parts, body, added, &seen)
                    .await;
            }
            Prepared::Held(held) => held,
        };
        let held_seen = Seen {
            body_whole: true,
            ..Seen::default()
        };
        let Some(policy) = self.retry else {
            return self
                .attempt(guard.endpoint(), parts, held_body(&held), added, &held_seen)
                .await;
        };
        // Boxed: the retries' state (waits, copies) is a future of its own, which a request
        // on a route without retries never carries (its future is moved whole).
        Box::pin(self.send_retrying(parts, &held, added, guard, retried, policy, held_seen)).await
    }

    /// The attempts of a request under the rule's retries (see [`Self::send`]).
    #[allow(clippy::too_many_arguments)]
    async fn send_retrying(
        &self,
        parts: &mut Parts,
        held: &Bytes,
        added: &Added<'_>,
        guard: &mut EndpointGuard,
        retried: &mut Vec<Retried>,
        policy: &Retry,
        held_seen: Seen,
    ) -> Result<Response<PooledBody>, Failure> {
        let mut seen = held_seen;
        let mut retrier = Retrier::new(policy, &parts.method);
        // The breaker's `maxRetries` slot of the retry in flight.
        let mut _slot = None;
        loop {
            let result = if retrier.exhausted() {
                self.attempt(guard.endpoint(), parts, held_body(held), added, &seen)
                    .await
            } else {
                // The exchange takes the head's fields (and h2c the whole head): a copy goes,
                // the original stays for the next attempt.
                let mut copy = copy_parts(parts);
                self.attempt(guard.endpoint(), &mut copy, held_body(held), added, &seen)
                    .await
            };
            seen.status = result.as_ref().ok().map(|r| r.status().as_u16());
            let reason = match &result {
                Ok(resp) => retrier.after_answer(resp.status()),
                Err(f) => retrier.after_failure(f),
            };
            let Some(reason) = reason else {
                return result;
            };
            if let Some(budget) = &self.balancer.budget
                && !budget.retry()
            {
                self.shared.metrics.backend().retry_budget_exhausted();
                return result;
            }
            if let Some(breaker) = &self.balancer.breaker {
                match breaker.retry() {
                    Ok(slot) => _slot = Some(slot),
                    Err(limit) => {
                        self.shared
                            .metrics
                            .backend()
                            .circuit_breaker_rejected(limit);
                        return result;
                    }
                }
            }
            // An answer not taken closes its connection; a failed one is already gone.
            drop(result);
            self.shared.metrics.backend().upstream_retry(reason);
            retried.push(Retried {
                upstream: guard.endpoint().addr,
                reason,
            });
            tokio::time::sleep(retrier.next()).await;
            let tried: Vec<SocketAddr> = retried.iter().map(|r| r.upstream).collect();
            if let Some(next) = self.balancer.pick_untried(&tried) {
                *guard = next;
            }
            // h2c picks its connection by the URI's authority. The same path and query
            // made a URI for the first endpoint, so it makes one for this one.
            if let Ok(uri) = request_uri(
                self.protocol,
                &guard.endpoint().authority,
                self.path_and_query,
                &parts.uri,
            ) {
                parts.uri = uri;
            }
        }
    }

    /// One upstream exchange, under the rule's backend timeout.
    async fn attempt(
        &self,
        endpoint: &EndpointState,
        parts: &mut Parts,
        body: ProxyBody,
        added: &Added<'_>,
        seen: &Seen,
    ) -> Result<Response<PooledBody>, Failure> {
        let traced;
        let (span, added) = match self.trace {
            Some(t) => {
                let (span, traceparent) = t.begin_attempt(&mut parts.headers);
                traced = added.with_traceparent(traceparent);
                (Some(span), &traced)
            }
            None => (None, added),
        };
        let call = self
            .shared
            .upstream
            .send_parts(self.protocol, endpoint, parts, body, added);
        let resp = match self.backend_timeout {
            Some(d) => match tokio::time::timeout(d, call).await {
                Ok(r) => r.map_err(Failure::Upstream),
                Err(_) => Err(Failure::Timeout),
            },
            None => call.await.map_err(Failure::Upstream),
        };
        // An HTTP/2 body's total deadline ends with the answer's start (module `pace`).
        if resp.is_ok()
            && let Some(fault) = self.fault
        {
            fault.answered();
        }
        if self.balancer.settings.outlier.is_some() {
            self.record(endpoint, &resp, seen);
        }
        if let (Some(t), Some(span)) = (self.trace, span) {
            let outcome = match &resp {
                Ok(r) => Ok(r.status().as_u16()),
                Err(Failure::Timeout) => Err("timeout"),
                Err(Failure::BodyRead) => Err("request_body"),
                Err(Failure::Upstream(_)) => Err("upstream"),
            };
            t.end_attempt(span, endpoint.addr, outcome);
        }
        resp
    }

    /// Counts an attempt's outcome for outlier detection: an answer by its status, a failed
    /// connection as a local failure, a backend timeout too when the whole body had been
    /// sent (a client trickling its body can outlast the timeout itself). A client's own body
    /// failing (too large, too slow, broken) is not the endpoint's fault and does not count;
    /// nor is a retry answered with the status the attempt before it got on another endpoint
    /// (the request, not the endpoint, is then the likely cause: one request a backend always
    /// answers 500 must not eject every endpoint it is retried on).
    fn record(
        &self,
        endpoint: &EndpointState,
        resp: &Result<Response<PooledBody>, Failure>,
        seen: &Seen,
    ) {
        let outcome = match resp {
            Ok(r) if r.status().is_server_error() && seen.status == Some(r.status().as_u16()) => {
                return;
            }
            Ok(r) => Outcome::Answered(r.status().as_u16()),
            Err(Failure::BodyRead) => return,
            Err(_)
                if self
                    .fault
                    .is_some_and(|f| f.too_large() || f.cut().is_some() || f.client()) =>
            {
                return;
            }
            Err(Failure::Timeout) if !seen.body_whole => return,
            Err(Failure::Upstream(_) | Failure::Timeout) => Outcome::Local,
        };
        if self.balancer.record(endpoint, outcome) {
            self.shared.metrics.backend().upstream_ejection();
            self.balancer
                .report_ejection(endpoint, &self.shared.metrics);
        }
    }

    /// Holds the body whole where mirrors or retries need it and it is small and declared,
    /// and starts any mirrors; otherwise streams it.
    async fn prepare_body(&self, body: ClientBody, parts: &Parts) -> Result<Prepared, Failure> {
        let fault = || self.fault.cloned().unwrap_or_default();
        let limited = |body| {
            let metrics = self.shared.metrics.clone();
            let body =
                LimitedBody::new(body, self.max_body_bytes, self.body_pace, fault(), metrics);
            if self.request_trailers {
                body.with_trailers(TrailerFilter::new(&parts.headers))
                    .boxed()
            } else {
                body.boxed()
            }
        };
        if body.is_end_stream() {
            self.mirror(parts, Bytes::new());
            return Ok(Prepared::Held(Bytes::new()));
        }
        // Held for retries only where no trailers would be lost by holding it.
        let hold = !self.mirrors.is_empty() || (self.retry.is_some() && !self.request_trailers);
        let small = body.size_hint().exact().is_some_and(|n| n <= MAX_HELD_BODY);
        if !hold || !small {
            if !self.mirrors.is_empty() {
                tracing::debug!("request body streams; not mirrored");
            }
            return Ok(Prepared::Streaming(limited(body)));
        }
        let bytes = limited(body)
            .collect()
            .await
            .map_err(|_| Failure::BodyRead)?
            .to_bytes();
        self.mirror(parts, bytes.clone());
        Ok(Prepared::Held(bytes))
    }

    /// Starts the route's mirrors, if any, with the request and its held body.
    fn mirror(&self, parts: &Parts, body: Bytes) {
        if self.mirrors.is_empty() {
            return;
        }
        // Traced, a copy carries the trace as the primary request does (the client's
        // `traceparent` replaced, its `tracestate` only when it belongs to that trace), never
        // the client's fields as they came.
        let traced = self.trace.map(|t| {
            let mut headers = parts.headers.clone();
            t.propagate(&mut headers);
            headers
        });
        mirror::spawn(
            self.shared,
            self.snapshot,
            self.mirrors,
            &MirrorRequest {
                method: &parts.method,
                path_and_query: self.path_and_query,
                headers: traced.as_ref().unwrap_or(&parts.headers),
                body,
            },
        );
    }
}

/// What outlier detection must know of the attempts before one.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    /// The body was held (or there was none): sent whole before any answer was awaited.
    body_whole: bool,
    /// The status the attempt before answered with.
    status: Option<u16>,
}

/// One retry, for the access log: the endpoint that failed and how.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retried {
    pub upstream: SocketAddr,
    pub reason: RetryReason,
}

/// A held body as one attempt sends it.
fn held_body(held: &Bytes) -> ProxyBody {
    if held.is_empty() {
        empty()
    } else {
        full(held.clone())
    }
}

/// A copy of a request head for one attempt (no extensions: an upgrade is never retried).
fn copy_parts(parts: &Parts) -> Parts {
    let mut req = http::Request::new(());
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = parts.uri.clone();
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers.clone();
    req.into_parts().0
}

/// Phase 6: hop-by-hop removal, response header edits, CORS decoration, upgrade splice.
pub(crate) fn response_filters(
    mut resp: Response<PooledBody>,
    response_mods: &[&HeaderModifier],
    cors: &[&Cors],
    origin: Option<&HeaderValue>,
    client_upgrade: Option<OnUpgrade>,
    held: Option<crate::upstream::breaker::Admission>,
) -> Response<ProxyBody> {
    let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    let upgraded = switching && client_upgrade.is_some();
    // The upstream side's connection rides in the answer (module `h1`); without it (an
    // answer of another client) nothing is spliced and the client's side just closes.
    if switching
        && let Some(client_side) = client_upgrade
        && let Some(upstream_side) = resp.extensions_mut().remove::<OnUpgrade>()
    {
        splice(client_side, upstream_side, held);
    }
    let (mut rp, body) = resp.into_parts();
    if upgraded || !body.clean_head() {
        forward::strip_hop_by_hop(&mut rp.headers, upgraded);
    }
    rp.version = Version::HTTP_11;
    for m in response_mods {
        filters::modify_headers(m, &mut rp.headers);
    }
    for c in cors {
        filters::cors_decorate(c, origin, &mut rp.headers);
    }
    Response::from_parts(rp, body.boxed())
}

/// Why an upstream exchange produced no response.
pub(crate) enum Failure {
    Timeout,
    BodyRead,
    Upstream(UpstreamError),
}

pub(crate) fn failure_response(
    shared: &Shared,
    f: Failure,
    fault: Option<&BodyFault>,
) -> Response<ProxyBody> {
    if fault.is_some_and(BodyFault::too_large) {
        return status(StatusCode::PAYLOAD_TOO_LARGE);
    }
    // Too slow (idle, below the rate, past the deadline): as nginx answers a body that
    // stops, 408. The upstream request was reset when the body failed.
    if fault.is_some_and(|f| f.cut().is_some()) {
        return status(StatusCode::REQUEST_TIMEOUT);
    }
    if fault.is_some_and(BodyFault::client) {
        return close_after(status(StatusCode::BAD_REQUEST));
    }
    let (kind, code) = match f {
        Failure::Timeout => (UpstreamErrorKind::Timeout, StatusCode::GATEWAY_TIMEOUT),
        Failure::BodyRead => return status(StatusCode::BAD_REQUEST),
        Failure::Upstream(e) if e.is_tls() => {
            tracing::debug!(error = %e, "upstream TLS handshake failed");
            (UpstreamErrorKind::Tls, StatusCode::BAD_GATEWAY)
        }
        Failure::Upstream(e) if e.is_connect() => {
            (UpstreamErrorKind::Connect, StatusCode::BAD_GATEWAY)
        }
        Failure::Upstream(e) => {
            tracing::debug!(error = %e, "upstream request failed");
            (UpstreamErrorKind::Reset, StatusCode::BAD_GATEWAY)
        }
    };
    shared.metrics.upstream_error(kind);
    status(code)
}

/// Joins the client's (module `h1serve`) and the upstream's (module `h1`) upgraded
/// connections in a detached task.
fn splice(
    client: OnUpgrade,
    upstream: OnUpgrade,
    held: Option<crate::upstream::breaker::Admission>,
) {
    tokio::spawn(async move {
        // Released when the tunnel ends.
        let _held = held;
        let (mut client, mut upstream) = match tokio::try_join!(client, upstream) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(error = %e, "upgrade failed");
                return;
            }
        };
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    });
}
