//! The request lifecycle. In: one request from a connection ([`ConnCtx`]). Out: its response,
//! produced by named phases over the snapshot loaded once for it:
//!
//! 0. `intake::front_door`: one normalized authority and path (module `normalize`), or 400
//!    for an ambiguous request (several Hosts, HTTP/1.1 without Host, a bad port or path);
//!    the client's hop-by-hop fields and field names with `_` removed (`forward::strip_client`).
//! 1. `check_limits`: header block over `max_header_bytes` → 431, declared body over
//!    `max_body_bytes` → 413.
//! 2. `route`: the router over (listener port, host, method, target, headers) → 404; then
//!    the route's policies (module `policy::enforce`): authentication (X.509 with the
//!    connection's verified client certificate) → 401, authorization → 403, rate limit →
//!    429 (CORS preflights on a CORS route skip them).
//! 3. `request_filters`: the rule's filters in order (header edits, redirect, rewrite,
//!    mirror, CORS); a redirect or preflight answers here.
//! 4. `pick_backend`: weighted pick (unresolved → 500), backend filters, endpoint (none → 503).
//! 5. `UpstreamHead::apply` then `Call::send` (module `call`): header hygiene, mirrors, the
//!    upstream call under the request and backend timeouts (→ 504), connection failures →
//!    502, body over the limit → 413; upgrades spliced.
//! 6. `response_filters` (module `call`): hop-by-hop removal, response header edits, CORS.
//!
//! The gateway's own error answers to a gRPC client go out as gRPC statuses (module `grpc`).
//! Every answer gets `X-Request-Id`, and is counted and logged when its body finishes
//! ([`Completion`]). The request keeps its snapshot `Arc` to the end, across any swap.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::header::ORIGIN;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::Body as _;
use tollgate_api::{BackendProtocol, Cors, Filter, HeaderModifier};

use crate::access_log::{AccessRecord, rfc3339};
use crate::downstream::client_body::ClientBody;
use crate::downstream::conn::ConnCtx;
use crate::downstream::pace::{BodyPace, Cut};
use crate::lifecycle::answer::{close_after, status, with_empty_body};
use crate::lifecycle::body::{BodyFault, OnComplete, ProxyBody, TrackedBody, full};
use crate::lifecycle::call::{Call, Failure, UpstreamHead, failure_response, response_filters};
use crate::lifecycle::filters::{self, RequestView};
use crate::lifecycle::forward;
use crate::lifecycle::forward::X_REQUEST_ID;
use crate::lifecycle::grpc;
use crate::lifecycle::intake;
use crate::lifecycle::mirror;
use crate::lifecycle::normalize::PathOptions;
use crate::lifecycle::policy::enforce::RequestInfo;
use crate::metrics::{RouteMetrics, UpstreamErrorKind};
use crate::state::{Shared, Snapshot};
use crate::upgrade::OnUpgrade;
use crate::upstream::{Balancer, EndpointGuard};

/// The response type of the service.
pub(crate) type ProxyResponse = Response<TrackedBody<Completion>>;

/// Per-request state that outlives the handler: reported when the response body ends.
#[derive(Debug)]
pub(crate) struct Completion {
    shared: Arc<Shared>,
    start: Instant,
    status: u16,
    route: Option<Arc<str>>,
    metrics: Arc<RouteMetrics>,
    request_id: HeaderValue,
    guard: Option<EndpointGuard>,
    /// The answer is the upstream's (every other one is the gateway's own).
    upstream_answered: bool,
    /// What only the access log needs; `None` (nothing copied, no clock read) when it is off.
    log: Option<Box<LogFields>>,
}

/// The request as the access log reports it.
#[derive(Debug)]
struct LogFields {
    started_at: SystemTime,
    method: Method,
    uri: Uri,
    host: String,
    peer: SocketAddr,
    /// A gRPC call: its status is read from the answer's head or trailers.
    grpc: bool,
    grpc_status: Option<u32>,
    /// The request body's fault, read when the answer ends: why a slow body was cut.
    fault: Option<Arc<BodyFault>>,
}

impl OnComplete for Completion {
    fn complete(self, bytes: u64) {
        let elapsed = self.start.elapsed();
        self.metrics.observe(self.status, elapsed.as_secs_f64());
        if let Some(log) = self.log {
            self.shared.access_log.log(AccessRecord {
                time: rfc3339(log.started_at),
                method: log.method.to_string(),
                host: log.host,
                path: log.uri.path().to_owned(),
                status: self.status,
                duration_ms: elapsed.as_secs_f64() * 1000.0,
                route: self.route.map(|r| r.to_string()),
                upstream: self.guard.as_ref().map(|g| g.endpoint().addr.to_string()),
                bytes,
                request_id: String::from_utf8_lossy(self.request_id.as_bytes()).into_owned(),
                peer: log.peer.to_string(),
                grpc_status: log.grpc_status,
                client_timeout: log
                    .fault
                    .as_deref()
                    .and_then(BodyFault::cut)
                    .map(Cut::as_str),
            });
        }
    }

    fn trailers(&mut self, trailers: &HeaderMap) {
        if let Some(log) = self.log.as_mut()
            && log.grpc
            && log.grpc_status.is_none()
        {
            log.grpc_status = grpc::status_of(trailers);
        }
    }
}

/// Filters collected on the way in that act on the way out, and rewrites to apply.
#[derive(Debug, Default)]
struct Plan<'s> {
    response_mods: Vec<&'s HeaderModifier>,
    cors: Vec<&'s Cors>,
    mirrors: Vec<&'s str>,
    host: Option<String>,
    path_and_query: Option<String>,
}

/// Handles one request; never fails (errors become status codes).
pub(crate) async fn handle(
    shared: Arc<Shared>,
    conn: Arc<ConnCtx>,
    mut req: Request<ClientBody>,
) -> Result<ProxyResponse, std::convert::Infallible> {
    let start = Instant::now();
    let seen = forward::Seen::scan(req.headers());
    let request_id = seen.request_id();
    // A gRPC call is a POST (a CONNECT must keep its non-2xx answer: a 2xx opens a tunnel).
    let grpc_client = req.method() == Method::POST && seen.content_type.is_some_and(grpc::is_grpc);
    let front = intake::front_door(&seen, req.uri(), req.version(), PathOptions::default());
    let upgrade = req.version() <= Version::HTTP_11 && seen.is_upgrade(req.headers());
    let strip = seen.needs_strip();
    let mut client = ClientHead {
        host: HeaderValue::from_static(""),
        limits: check_limits(&shared, &seen),
        origin: seen.origin.cloned(),
        grpc: grpc_client,
        upgrade,
    };
    // Phase 0: one authority and one path (or 400), and the client's hop-by-hop fields gone
    // before anything the gateway sets.
    match front {
        Ok(front) => {
            client.host = front.authority.clone();
            front.apply(&mut req);
        }
        Err(code) => client.limits = client.limits.and(Err(code)),
    }
    if strip {
        forward::strip_client(req.headers_mut(), upgrade);
    }
    let log = shared.access_log.enabled().then(|| {
        Box::new(LogFields {
            started_at: SystemTime::now(),
            method: req.method().clone(),
            uri: req.uri().clone(),
            host: client.host.to_str().unwrap_or("").to_owned(),
            peer: conn.peer,
            grpc: grpc_client,
            grpc_status: None,
            fault: None,
        })
    });
    let mut done = Completion {
        start,
        status: 0,
        route: None,
        metrics: shared.metrics.no_route().clone(),
        shared: shared.clone(),
        request_id: request_id.clone(),
        guard: None,
        upstream_answered: false,
        log,
    };
    // Put there by our HTTP/1 server (module `h1serve`) for a request that may upgrade.
    let client_upgrade = client
        .upgrade
        .then(|| req.extensions_mut().remove::<OnUpgrade>())
        .flatten();
    let snapshot = shared.snapshot.load_full();
    let mut resp = match snapshot {
        Some(snapshot) => {
            let work = proxy(
                &shared,
                &snapshot,
                &conn,
                client,
                req,
                client_upgrade,
                &mut done,
            );
            work.await
        }
        None => status(StatusCode::NOT_FOUND),
    };
    // Metrics and the access log count the answer by what it means (a gRPC client's 404 is
    // a 404, though it goes out as 200 with `grpc-status: 12`).
    done.status = resp.status().as_u16();
    if grpc_client && !done.upstream_answered {
        resp = grpc::trailers_only(resp);
    }
    if grpc_client && let Some(log) = done.log.as_mut() {
        // Trailers-Only (the gateway's own answer, or an upstream's); else the trailers say.
        log.grpc_status = grpc::status_of(resp.headers());
    }
    resp.headers_mut().insert(X_REQUEST_ID.clone(), request_id);
    let (parts, body) = resp.into_parts();
    Ok(Response::from_parts(parts, TrackedBody::new(body, done)))
}

/// What phase 1 found in the client's headers, carried into [`proxy`].
struct ClientHead {
    /// The normalized authority, `host[:port]` (module `intake`).
    host: HeaderValue,
    /// Phase 1's verdict, applied once a snapshot is there.
    limits: Result<(), StatusCode>,
    /// `Origin`, for CORS decoration of the response.
    origin: Option<HeaderValue>,
    /// A gRPC call: the gateway's own error answers go out as gRPC statuses.
    grpc: bool,
    /// An HTTP/1 upgrade request.
    upgrade: bool,
}

/// `host[:port]` → `host` (IPv6 literals keep their brackets).
fn strip_port(host: &str) -> &str {
    let b = host.as_bytes();
    if b.first() == Some(&b'[') {
        return b
            .iter()
            .position(|&c| c == b']')
            .map_or(host, |i| &host[..=i]);
    }
    // A host ending in neither a digit nor `:` has no port to strip (the usual case).
    if !b.last().is_some_and(|c| c.is_ascii_digit() || *c == b':') {
        return host;
    }
    // By byte, as `router::host_without_port` (`rsplit_once(char)` cost ~240 instructions).
    match b.iter().rposition(|&c| c == b':') {
        Some(i) if b[i + 1..].iter().all(u8::is_ascii_digit) => &host[..i],
        _ => host,
    }
}

/// Phase 1.
fn check_limits(shared: &Shared, seen: &forward::Seen<'_>) -> Result<(), StatusCode> {
    if seen.bytes > shared.limits.max_header_bytes {
        return Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    }
    if let Some(cl) = seen.content_length {
        let len: u64 = cl
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or(StatusCode::BAD_REQUEST)?;
        if len > shared.limits.max_body_bytes {
            return Err(StatusCode::PAYLOAD_TOO_LARGE);
        }
    }
    Ok(())
}

/// Phase 3 (and the backend-filter half of phase 4): one filter. `Some` answers the request.
fn request_filter<'s>(
    f: &'s Filter,
    parts: &mut Parts,
    view: &RequestView<'_>,
    plan: &mut Plan<'s>,
) -> Option<Response<ProxyBody>> {
    match f {
        Filter::RequestHeaderModifier(m) => filters::modify_headers(m, &mut parts.headers),
        Filter::ResponseHeaderModifier(m) => plan.response_mods.push(m),
        Filter::RequestRedirect(r) => return Some(with_empty_body(filters::redirect(r, view))),
        Filter::UrlRewrite(r) => {
            let rw = filters::rewrite(r, view);
            if rw.host.is_some() {
                plan.host = rw.host;
            }
            plan.path_and_query = Some(rw.path_and_query);
        }
        Filter::RequestMirror(m) => {
            if let Some(key) = m.backend.as_deref()
                && mirror::sampled(m)
            {
                plan.mirrors.push(key);
            }
        }
        Filter::Cors(c) => {
            if let Some(resp) = filters::cors_preflight(c, &parts.method, &parts.headers) {
                return Some(with_empty_body(resp));
            }
            plan.cors.push(c);
        }
    }
    None
}

/// Phases 1 to 6 for a request with a live snapshot.
async fn proxy(
    shared: &Arc<Shared>,
    snapshot: &Snapshot,
    conn: &ConnCtx,
    client: ClientHead,
    req: Request<ClientBody>,
    client_upgrade: Option<OnUpgrade>,
    done: &mut Completion,
) -> Response<ProxyBody> {
    let original_host = client.host.to_str().unwrap_or("");
    let bare_host = strip_port(original_host);
    let (mut parts, body) = req.into_parts();
    if let Err(code) = client.limits {
        return close_after(status(code));
    }

    // Phase 2: route. A request for a name another listener serves than the one the TLS
    // connection was made for (HTTP/2 connection reuse) is misdirected.
    if let Some(sni) = conn.sni.as_deref()
        && snapshot
            .router
            .misdirected(conn.table_port, sni, original_host)
    {
        return status(StatusCode::MISDIRECTED_REQUEST);
    }
    let original_uri = parts.uri.clone();
    let target = original_uri.path_and_query().map_or("/", |pq| pq.as_str());
    let Some(hit) = snapshot.router.route(
        conn.table_port,
        original_host,
        &parts.method,
        target,
        &parts.headers,
    ) else {
        return status(StatusCode::NOT_FOUND);
    };
    let route = &hit.route.api;
    done.route = Some(hit.route.label.clone());
    done.metrics = hit.route.metrics.clone();

    // Phase 2b: policies (authentication, authorization, rate limit), unless this is a CORS
    // preflight the route answers itself (browsers send those without credentials).
    let mut rate_limit = None;
    if let Some(key) = route.policy.as_deref()
        && !is_cors_preflight(&route.filters, &parts)
    {
        let Some(enforcer) = snapshot.policies.get(key) else {
            // A table whose route names a missing policy set: never serve it open.
            return status(StatusCode::INTERNAL_SERVER_ERROR);
        };
        // Normalized (module `intake`): the host routing matched, in one spelling.
        let info = RequestInfo {
            host: bare_host,
            target,
            scheme: conn.scheme,
            peer: conn.peer,
            peer_address: conn.peer_value.to_str().ok().filter(|a| !a.is_empty()),
            peer_cert: conn.peer_cert.as_deref(),
        };
        match enforcer.enforce(&shared.policy, &mut parts, info).await {
            Ok(decision) => rate_limit = decision,
            Err(resp) => {
                // A gRPC client reads the policy's message in `grpc-message` (copied only
                // for one: a flood of denials to HTTP clients allocates nothing more).
                let reply = client.grpc.then(|| grpc::Override {
                    code: None,
                    message: Some(String::from_utf8_lossy(resp.body()).into_owned().into()),
                });
                // A browser must be able to read the denial (status, Retry-After): decorate it
                // as the route's CORS filters would decorate an upstream answer.
                let mut resp = resp.map(full);
                if let Some(reply) = reply {
                    resp.extensions_mut().insert(reply);
                }
                let origin = parts.headers.get(ORIGIN);
                for f in &route.filters {
                    if let Filter::Cors(c) = f {
                        filters::cors_decorate(c, origin, resp.headers_mut());
                    }
                }
                return resp;
            }
        }
    }

    // Phase 3: request filters, in table order.
    let (path, query) = crate::lifecycle::router::split_path_and_query(target);
    let view = RequestView {
        scheme: conn.scheme,
        host: bare_host,
        port: conn.local_port,
        path,
        query,
        matched_prefix: hit.matched_prefix,
    };
    let mut plan = Plan::default();
    if let Some(resp) = request_filters(&route.filters, &mut parts, &view, &mut plan) {
        return resp;
    }

    // Phase 4: backend (and its filters), then endpoint.
    let (balancer, guard) = match pick_backend(
        shared,
        snapshot,
        &route.backends,
        &mut parts,
        &view,
        &mut plan,
    ) {
        Ok(picked) => picked,
        Err(resp) => return *resp,
    };

    // Phase 5: forward.
    let upgrade = client_upgrade.is_some();
    let protocol = if upgrade {
        BackendProtocol::Http1
    } else {
        balancer.protocol
    };
    let pq = plan.path_and_query.as_deref().unwrap_or(target);
    let head = UpstreamHead {
        conn,
        original_host: &client.host,
        request_id: &done.request_id,
        host: plan.host.as_deref(),
        path_and_query: pq,
        endpoint: &guard,
        protocol,
        upgrade,
    };
    // Read before `apply` sets the upstream's version: the bounds are the client's.
    let body_pace = BodyPace::for_request(&shared.limits, parts.version);
    let added = match head.apply(&mut parts) {
        Ok(added) => added,
        Err(code) => return status(code),
    };
    // The request timeout runs from arrival, not from here.
    let deadline = route
        .timeouts
        .request_ms
        .map(|ms| tokio::time::Instant::from_std(done.start) + Duration::from_millis(ms));
    // Only a request with a body can exceed the body limit or stall it.
    let fault = (!body.is_end_stream()).then(|| Arc::new(BodyFault::default()));
    if let Some(log) = done.log.as_mut() {
        log.fault = fault.clone();
    }
    let call = Call {
        shared,
        snapshot,
        protocol,
        endpoint: guard.endpoint(),
        path_and_query: pq,
        mirrors: &plan.mirrors,
        fault: fault.as_ref(),
        body_pace,
        backend_timeout: route.timeouts.backend_request_ms.map(Duration::from_millis),
    };
    let result = match deadline {
        Some(d) => tokio::time::timeout_at(d, call.send(&mut parts, body, &added))
            .await
            .unwrap_or(Err(Failure::Timeout)),
        None => call.send(&mut parts, body, &added).await,
    };
    done.guard = Some(guard);
    done.upstream_answered = result.is_ok();
    let mut resp = match result {
        // Phase 6.
        Ok(resp) => response_filters(
            resp,
            &plan.response_mods,
            &plan.cors,
            client.origin.as_ref(),
            client_upgrade,
        ),
        Err(f) => failure_response(shared, f, fault.as_deref()),
    };
    if let Some(decision) = rate_limit {
        decision.insert_headers(resp.headers_mut());
    }
    resp
}

/// True for a CORS preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`)
/// on a route with a CORS filter.
fn is_cors_preflight(filters: &[Filter], parts: &Parts) -> bool {
    parts.method == Method::OPTIONS
        && parts.headers.contains_key(ORIGIN)
        && parts
            .headers
            .contains_key(http::header::ACCESS_CONTROL_REQUEST_METHOD)
        && filters.iter().any(|f| matches!(f, Filter::Cors(_)))
}

/// Phase 3: the rule's filters in order; `Some` answers the request.
fn request_filters<'s>(
    filters: &'s [Filter],
    parts: &mut Parts,
    view: &RequestView<'_>,
    plan: &mut Plan<'s>,
) -> Option<Response<ProxyBody>> {
    filters
        .iter()
        .find_map(|f| request_filter(f, parts, view, plan))
}

/// Phase 4: weighted backend pick (unresolved or missing → 500), the backend's own filters,
/// then an endpoint (none → 503).
fn pick_backend<'s>(
    shared: &Shared,
    snapshot: &'s Snapshot,
    backends: &'s [tollgate_api::WeightedBackend],
    parts: &mut Parts,
    view: &RequestView<'_>,
    plan: &mut Plan<'s>,
) -> Result<(&'s Balancer, EndpointGuard), Box<Response<ProxyBody>>> {
    // A rule without a usable backend: 500, and for gRPC clients `UNAVAILABLE`, as
    // GRPCRoute requires for traffic to invalid backends.
    let internal = || {
        let mut r = status(StatusCode::INTERNAL_SERVER_ERROR);
        r.extensions_mut().insert(grpc::Override {
            code: Some(grpc::Code::Unavailable),
            message: Some(std::borrow::Cow::Borrowed("no valid backend")),
        });
        Box::new(r)
    };
    let picked = crate::upstream::pick_weighted(backends).ok_or_else(internal)?;
    let key = picked.backend.as_deref().ok_or_else(internal)?;
    if let Some(resp) = request_filters(&picked.filters, parts, view, plan) {
        return Err(Box::new(resp));
    }
    let balancer = snapshot.backends.get(key).ok_or_else(internal)?;
    let Some(guard) = balancer.pick() else {
        shared
            .metrics
            .upstream_error(UpstreamErrorKind::NoEndpoints);
        return Err(Box::new(status(StatusCode::SERVICE_UNAVAILABLE)));
    };
    Ok((balancer, guard))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_ports() {
        assert_eq!(strip_port("a.example:8080"), "a.example");
        assert_eq!(strip_port("a.example"), "a.example");
        assert_eq!(strip_port("[::1]:80"), "[::1]");
        assert_eq!(strip_port("[::1]"), "[::1]");
        assert_eq!(strip_port("a.example:http"), "a.example:http");
        assert_eq!(strip_port("a.example:"), "a.example");
        assert_eq!(strip_port(""), "");
    }
}
