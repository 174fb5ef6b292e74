//! The request lifecycle. In: one request from a connection ([`ConnCtx`]). Out: its response,
//! produced by named phases over the snapshot loaded once for it, each reading and filling
//! the request's one context ([`RequestCtx`], module `ctx`):
//!
//! 0. `intake::front_door` (in `RequestCtx::arrive`): one normalized authority and path (module `normalize`), or 400
//!    for an ambiguous request (several Hosts, HTTP/1.1 without Host, a bad port or path);
//!    the client's hop-by-hop fields and field names with `_` removed (`forward::strip_client`).
//! 1. `check_limits` (in `RequestCtx::arrive`): header block over `max_header_bytes` or
//!    fields over `max_header_count` → 431; once the route is known, a declared body over
//!    its limit (a ClientPolicy on its HTTPRoute) or the port's `max_body_bytes` → 413.
//! 2. `route`: the router over (listener port, host, method, target, headers) → 404; then
//!    the route's policies (module `policy::enforce`): authentication (X.509 with the
//!    connection's verified client certificate) → 401, authorization → 403, rate limit →
//!    429, then the rule's ExternalAuth filter (module `ext_auth`; CORS preflights on a CORS
//!    route skip them).
//! 3. `request_filters`: the rule's filters in order (header edits, redirect, rewrite,
//!    mirror, CORS); a redirect or preflight answers here.
//! 4. `pick_backend`: weighted pick (unresolved → 500), backend filters, endpoint (none → 503),
//!    by the request's key on a consistent-hash backend (module `affinity`; an expression key
//!    reads `auth.identity` from the context, where phase 2 left it).
//! 5. `RequestCtx::upstream_head` then `Call::send` (module `call`): header hygiene, mirrors, the
//!    upstream call under the request and backend timeouts (→ 504), connection failures →
//!    502, body over the limit → 413; upgrades spliced.
//! 6. `RequestCtx::answer` (`response_filters`, module `call`): hop-by-hop removal, response header edits, CORS.
//! 7. `RequestCtx::finish`, after any costs read from the body: the upstream's answer
//!    compressed for a client that accepts it (module `compress`), unless the route opts out.
//!
//! The gateway's own error answers to a gRPC client go out as gRPC statuses (module `grpc`);
//! a gRPC-Web call on a GRPCRoute is translated to gRPC for phase 5 and back in phase 7
//! (module `grpc_web`).
//! Every answer gets `X-Request-Id`, and is counted and logged when its body finishes
//! (`ctx::Completion`, the part of the context the answer's body carries). The request keeps its snapshot `Arc` to the end, across any swap.

use std::sync::Arc;
use std::time::Duration;

use http::header::ORIGIN;
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Body as _;
use tollgate_api::backend::HashOn;
use tollgate_api::{BackendProtocol, Filter};

use crate::downstream::client_body::ClientBody;
use crate::downstream::conn::ConnCtx;
use crate::downstream::pace::BodyPace;
use crate::lifecycle::affinity;
use crate::lifecycle::answer::{close_after, status, with_empty_body};
use crate::lifecycle::body::{BodyFault, ProxyBody};
use crate::lifecycle::cache;
use crate::lifecycle::call::{Call, Failure, failure_response};
use crate::lifecycle::cost_body::{self, BodyCost};
pub(crate) use crate::lifecycle::ctx::ProxyResponse;
use crate::lifecycle::ctx::{Plan, RequestCtx};
use crate::lifecycle::ext_auth;
use crate::lifecycle::filters::{self, RequestView};
use crate::lifecycle::grpc;
use crate::lifecycle::grpc_web::decode::RequestBody;
use crate::lifecycle::mirror;
use crate::lifecycle::policy::auth::external::ExternalIo;
use crate::lifecycle::policy::cel::Attrs;
use crate::lifecycle::policy::enforce::RequestInfo;
use crate::metrics::UpstreamErrorKind;
use crate::state::{Shared, Snapshot};
use crate::upstream::breaker::Admission;
use crate::upstream::{Balancer, EndpointGuard};

/// Handles one request; never fails (errors become status codes).
pub(crate) async fn handle(
    shared: Arc<Shared>,
    conn: Arc<ConnCtx>,
    mut req: Request<ClientBody>,
) -> Result<ProxyResponse, std::convert::Infallible> {
    let snapshot = shared.snapshot.load_full();
    let port = snapshot.as_deref().and_then(|s| s.client(conn.table_port));
    let mut ctx = RequestCtx::arrive(&shared, &conn, port, &mut req);
    let mut resp = match snapshot.as_deref() {
        Some(snapshot) => proxy(snapshot, &mut ctx, req).await,
        None => status(StatusCode::NOT_FOUND),
    };
    if !ctx.rate_pending.is_empty() {
        count_response_costs(&mut ctx, &mut resp).await;
    }
    Ok(ctx.finish(resp))
}

/// Counts the rate-limit costs read from the answer (`cost.response`) before it leaves, so
/// the client's next request sees them; whatever answered (the upstream, or the gateway
/// itself after the policy phase admitted the request). An answer that carries
/// `X-RateLimit-*` gets the numbers after the count. Costs read from the body are counted
/// when it ends (module `cost_body`).
async fn count_response_costs(ctx: &mut RequestCtx<'_>, resp: &mut Response<ProxyBody>) {
    let pending = std::mem::take(&mut ctx.rate_pending);
    let limiter = &ctx.shared.policy.limiter;
    let after = limiter
        .add_response_costs(&pending, resp.status().as_u16(), resp.headers())
        .await;
    let from_body: Vec<BodyCost> = pending
        .into_iter()
        .filter_map(|p| {
            Some(BodyCost {
                cap: p.limit.response_body_cap()?,
                limiter: limiter.clone(),
                limit: p.limit.clone(),
                key: p.key,
            })
        })
        .collect();
    if !from_body.is_empty() {
        cost_body::count_from_body(resp, from_body).await;
    }
    if let (Some(after), Some(before)) = (after, ctx.rate_limit)
        && resp
            .headers()
            .contains_key(&crate::lifecycle::policy::ratelimit::X_RATELIMIT_LIMIT)
    {
        before.merge(after).insert_headers(resp.headers_mut());
    }
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
        // Run in phase 2b (module `ext_auth`), from the compiled route.
        Filter::ExternalAuth(_) => {}
    }
    None
}

/// Phases 1 to 6 for a request with a live snapshot.
async fn proxy<'s>(
    snapshot: &'s Snapshot,
    ctx: &mut RequestCtx<'s>,
    req: Request<ClientBody>,
) -> Response<ProxyBody> {
    let shared = ctx.shared;
    let conn = ctx.conn;
    let (mut parts, mut body) = req.into_parts();
    if let Err(code) = ctx.verdict {
        return close_after(status(code));
    }
    let original_host = ctx.host.to_str().unwrap_or("");
    let bare_host = strip_port(original_host);

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
    if route.compression_disabled {
        ctx.compress = None;
    }
    ctx.done.route = Some(hit.route.label.clone());
    ctx.done.metrics = hit.route.metrics.clone();
    if let Some(t) = ctx.done.trace.as_deref_mut() {
        t.set_rule(route.rule_name.as_deref(), route.rule_index);
    }
    // A declared body over the route's limit (a ClientPolicy on its HTTPRoute) or else the
    // port's is refused before anything else reads it.
    let max_body_bytes = route
        .max_request_body_bytes
        .unwrap_or(conn.limits.max_body_bytes);
    if ctx.declared_len.is_some_and(|n| n > max_body_bytes) {
        return close_after(status(StatusCode::PAYLOAD_TOO_LARGE));
    }

    // Phase 2b: policies (authentication, authorization, rate limit), then the rule's
    // ExternalAuth filter, unless this is a CORS preflight the route answers itself (browsers
    // send those without credentials).
    let preflight = is_cors_preflight(&route.filters, &parts);
    let mut held = None;
    if let Some(key) = route.policy.as_deref()
        && !preflight
    {
        let Some(enforcer) = snapshot.policies.get(key) else {
            // A table whose route names a missing policy set: never serve it open.
            return status(StatusCode::INTERNAL_SERVER_ERROR);
        };
        // An external authorization rule that forwards the body reads it whole first.
        if let Some(limit) = enforcer.external_body_limit() {
            match ext_auth::hold(&mut body, &mut held, limit, ctx.declared_len).await {
                Ok(()) => {}
                Err(code) => return close_after(status(code)),
            }
        }
        // Normalized (module `intake`): the host routing matched, in one spelling.
        let (peer, peer_value) = ctx.source();
        let info = RequestInfo {
            host: bare_host,
            target,
            scheme: conn.scheme,
            peer,
            peer_address: peer_value
                .and_then(|v| v.to_str().ok())
                .filter(|a| !a.is_empty()),
            peer_cert: conn.peer_cert.as_deref(),
            body: held.as_ref(),
            external: Some(ExternalIo::new(&snapshot.backends, &shared.upstream)),
        };
        let enforced = crate::otel::with_decisions(
            ctx.done.trace.as_deref_mut(),
            enforcer.enforce(&shared.policy, &mut parts, info),
        );
        match enforced.await {
            Ok(admitted) => {
                ctx.rate_limit = admitted.decision;
                ctx.identity = admitted.identity;
                ctx.auth_cookies = admitted.set_cookies;
                ctx.auth_response_headers = admitted.response_headers;
                ctx.rate_pending = admitted.pending;
                ctx.done.shadow_limited = admitted
                    .shadow_refused
                    .iter()
                    .map(|l| l.id_shared().clone())
                    .collect();
            }
            Err(resp) => return ext_auth::denial(ctx, &route.filters, &parts, resp),
        }
    }
    if let Some(check) = &hit.route.external
        && !preflight
    {
        match ext_auth::filter(
            snapshot, ctx, check, &mut parts, &mut body, &mut held, bare_host, target,
        )
        .await
        {
            Ok(client) => ctx.auth_response_headers.extend(client),
            Err(resp) => return ext_auth::denial(ctx, &route.filters, &parts, resp),
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
    if let Some(resp) = request_filters(&route.filters, &mut parts, &view, &mut ctx.plan) {
        return resp;
    }

    // Phase 4: backend (and its filters), then endpoint.
    // The request timeout runs from arrival, not from here: the route's or the port's,
    // the shorter. It bounds a wait for the circuit breaker too.
    let timeout = match (
        route.timeouts.request_ms.map(Duration::from_millis),
        conn.limits.request_timeout,
    ) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let deadline = timeout.map(|t| tokio::time::Instant::from_std(ctx.done.start) + t);
    // Phase 3b: the shared cache (module `cache`), after the policies: a hit is authorized
    // and counted as any request.
    let mut fill = None;
    if let (Some(rule), Some(store)) = (route.cache.as_deref(), &shared.cache) {
        match cache::look(
            store,
            rule,
            cache_request(ctx, &mut parts, &view, route.rule_index, deadline),
        )
        .await
        {
            cache::Look::Answer(mut resp) => {
                cache::response_filters(&ctx.plan, ctx.origin.as_ref(), resp.headers_mut());
                ctx.done.upstream_answered = true;
                return decorate(ctx, resp);
            }
            cache::Look::Fetch(f) => fill = Some(f),
        }
    }
    let balancer = match pick_backend(snapshot, &route.backends, &mut parts, &view, &mut ctx.plan) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    // The circuit breaker's wait, boxed: a future of its own that a request without a
    // breaker never carries (the request's future is moved whole; its size is copied).
    if let Some(breaker) = &balancer.breaker {
        match Box::pin(admit(shared, breaker, deadline)).await {
            Ok(a) => ctx.done.admission = Some(a),
            Err(resp) => return cache::finish_failed(fill, *resp, &ctx.plan, ctx.origin.as_ref()),
        }
    }
    let caller = affinity::Caller {
        addr: ctx.source().0,
        identity: ctx.identity.as_ref(),
    };
    let Picked {
        guard,
        set_cookie,
        session,
    } = match pick_endpoint(shared, balancer, route, &parts, &view, caller) {
        Ok(picked) => picked,
        Err(resp) => return cache::finish_failed(fill, *resp, &ctx.plan, ctx.origin.as_ref()),
    };

    // Phase 5: forward. A gRPC-Web call on a GRPCRoute goes to the backend as gRPC, its
    // body decoded and checked on the way (module `grpc_web`).
    if route.grpc_web
        && let Some(web) = &ctx.web
    {
        ctx.web_translated = true;
        body = ClientBody::GrpcWeb(Box::new(RequestBody::new(body, web.text, max_body_bytes)));
    }
    let protocol = if ctx.client_upgrade.is_some() {
        BackendProtocol::Http1
    } else {
        balancer.protocol
    };
    // Only a request with a body can exceed the body limit or stall it.
    let fault = (!body.is_end_stream()).then(|| Arc::new(BodyFault::default()));
    ctx.note_body_fault(fault.as_ref());
    // Read before the head sets the upstream's version: the bounds are the client's.
    let body_pace = BodyPace::for_request(&conn.limits, parts.version);
    let (mut guard, mut retried) = (guard, Vec::new());
    let result = {
        let ctx = &*ctx;
        let pq = ctx.plan.path_and_query.as_deref().unwrap_or(target);
        let added = match ctx.upstream_head(&mut parts, &guard, protocol, pq) {
            Ok(added) => added,
            Err(code) => return status(code),
        };
        if let Some(web) = ctx.web.as_ref().filter(|_| ctx.web_translated) {
            web.upstream_head(&mut parts.headers);
        }
        let call = Call {
            shared,
            snapshot,
            protocol,
            balancer,
            path_and_query: pq,
            mirrors: &ctx.plan.mirrors,
            fault: fault.as_ref(),
            body_pace,
            max_body_bytes,
            backend_timeout: route.timeouts.backend_request_ms.map(Duration::from_millis),
            request_trailers: route.request_trailers,
            // An upgrade is never sent twice: its connection is the client's.
            retry: route
                .retry
                .as_ref()
                .filter(|_| ctx.client_upgrade.is_none()),
            trace: ctx.done.trace.as_deref(),
        };
        let send = call.send(&mut parts, body, &added, &mut guard, &mut retried);
        match deadline {
            Some(d) => tokio::time::timeout_at(d, send)
                .await
                .unwrap_or(Err(Failure::Timeout)),
            None => send.await,
        }
    };
    // The session names the endpoint that answered (a retry may have moved it: a new session
    // then); one that went on is renewed only when it can time out idle.
    let rule = route
        .session
        .as_ref()
        .or(balancer.settings.session.as_ref());
    let secure = conn.scheme == "https";
    let session_field = rule.zip(session).and_then(|(s, p)| {
        let id = balancer.session_id(guard.endpoint());
        match p.honoured {
            Some((named, began)) if named == id => s
                .idle_secs
                .and_then(|_| affinity::session_field(s, id, began, p.now, secure)),
            _ => affinity::session_field(s, id, p.now, p.now, secure),
        }
    });
    ctx.done.guard = Some(guard);
    ctx.done.retried = retried;
    ctx.done.upstream_answered = result.is_ok();
    let mut resp = match result {
        // Phase 6.
        Ok(resp) => {
            if let Some(f) = fill.as_mut() {
                f.observe(resp.status(), resp.headers());
            }
            ctx.answer(resp)
        }
        Err(f) => failure_response(shared, f, fault.as_deref()),
    };
    if let Some(f) = fill {
        resp = f.finish(resp, &ctx.plan, ctx.origin.as_ref());
    }
    if let Some(cookie) = set_cookie {
        resp.headers_mut().append(http::header::SET_COOKIE, cookie);
    }
    if let Some((name, value)) = session_field {
        resp.headers_mut().append(name, value);
    }
    decorate(ctx, resp)
}

/// What every answer past the policy phase carries for this request: its rate-limit
/// headers and the authentication's cookies and headers.
fn decorate(ctx: &mut RequestCtx<'_>, mut resp: Response<ProxyBody>) -> Response<ProxyBody> {
    if let Some(decision) = &ctx.rate_limit {
        decision.insert_headers(resp.headers_mut());
    }
    for cookie in std::mem::take(&mut ctx.auth_cookies) {
        resp.headers_mut().append(http::header::SET_COOKIE, cookie);
    }
    for (name, value) in std::mem::take(&mut ctx.auth_response_headers) {
        resp.headers_mut().append(name, value);
    }
    resp
}

/// The request as the cache reads it (phase 3b).
fn cache_request<'a>(
    ctx: &'a RequestCtx<'_>,
    parts: &'a mut Parts,
    view: &'a RequestView<'_>,
    rule_index: u32,
    deadline: Option<tokio::time::Instant>,
) -> cache::Request<'a> {
    cache::Request {
        method: &parts.method,
        headers: &mut parts.headers,
        scheme: view.scheme,
        host: view.host,
        target: ctx.plan.path_and_query.as_deref().unwrap_or(
            parts
                .uri
                .path_and_query()
                .map_or("/", http::uri::PathAndQuery::as_str),
        ),
        identity: ctx.identity.as_ref(),
        source: ctx.source().0,
        route: ctx.done.route.clone(),
        rule_index,
        deadline,
    }
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

/// What phase 4 chose: the endpoint and what keeps the client on it.
struct Picked {
    guard: EndpointGuard,
    /// A consistent-hash cookie the request lacked, for its answer.
    set_cookie: Option<http::HeaderValue>,
    /// On a route with session persistence: what the request's session did.
    session: Option<SessionPick>,
}

/// A session-persistence pick.
struct SessionPick {
    /// Unix seconds now.
    now: u64,
    /// The endpoint (hash) and start of the request's session, when its endpoint was picked.
    honoured: Option<(u64, u64)>,
}

/// Phase 4: weighted backend pick (unresolved or missing → 500), the backend's own filters.
fn pick_backend<'s>(
    snapshot: &'s Snapshot,
    backends: &'s [tollgate_api::WeightedBackend],
    parts: &mut Parts,
    view: &RequestView<'_>,
    plan: &mut Plan<'s>,
) -> Result<&'s Balancer, Box<Response<ProxyBody>>> {
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
    snapshot
        .backends
        .get(key)
        .map(|b| &**b)
        .ok_or_else(internal)
}

/// Phase 4, the circuit breaker: a place under its limits (503 beyond one), waiting no longer
/// than the request's deadline (504; a request past it is never sent).
async fn admit(
    shared: &Shared,
    breaker: &Arc<crate::upstream::breaker::Breaker>,
    deadline: Option<tokio::time::Instant>,
) -> Result<Admission, Box<Response<ProxyBody>>> {
    let timed_out = || {
        shared.metrics.upstream_error(UpstreamErrorKind::Timeout);
        Box::new(status(StatusCode::GATEWAY_TIMEOUT))
    };
    let admitted = match deadline {
        Some(d) => tokio::time::timeout_at(d, breaker.admit())
            .await
            .map_err(|_| timed_out())?,
        None => breaker.admit().await,
    };
    let admission = admitted.map_err(|limit| {
        shared.metrics.backend().circuit_breaker_rejected(limit);
        Box::new(status(StatusCode::SERVICE_UNAVAILABLE))
    })?;
    if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
        return Err(timed_out());
    }
    Ok(admission)
}

/// Phase 4, the endpoint: a live session's while it is here and available (the route's
/// session rule, else the backend's), else by the request's key on a consistent-hash
/// backend, else the balancer's choice (none → 503).
fn pick_endpoint(
    shared: &Shared,
    balancer: &Balancer,
    route: &tollgate_api::Route,
    parts: &Parts,
    view: &RequestView<'_>,
    caller: affinity::Caller<'_>,
) -> Result<Picked, Box<Response<ProxyBody>>> {
    if let Some(budget) = &balancer.budget {
        budget.request();
    }
    let session = route
        .session
        .as_ref()
        .or(balancer.settings.session.as_ref());
    let mut session_pick = None;
    let mut guard = None;
    if let Some(s) = session {
        let now = affinity::unix_now();
        let named = affinity::session(s, &parts.headers, now);
        let honoured = named.and_then(|(id, began)| {
            guard = balancer.pick_session(id);
            guard.as_ref().map(|_| (id, began))
        });
        session_pick = Some(SessionPick { now, honoured });
    }
    let (hash, set_cookie) = match (&guard, &balancer.settings.hash) {
        (None, Some(HashOn::Expression(_))) => (
            balancer
                .key_expr
                .as_ref()
                .and_then(|e| expression_key(e, parts, view, caller)),
            None,
        ),
        (None, Some(on)) => {
            affinity::key(on, &parts.headers, caller.addr.ip(), view.scheme == "https")
        }
        _ => (None, None),
    };
    let Some(guard) = guard.or_else(|| balancer.pick_keyed(hash)) else {
        shared
            .metrics
            .upstream_error(UpstreamErrorKind::NoEndpoints);
        return Err(Box::new(status(StatusCode::SERVICE_UNAVAILABLE)));
    };
    Ok(Picked {
        guard,
        set_cookie,
        session: session_pick,
    })
}

/// The hash of an expression key over the request as policies see it (the normalized host
/// and path with query, as routing matched them) with its headers as they are at the pick
/// (after the route's filters and the AuthPolicy's success headers, as a `header` key reads
/// them), the client and `auth.identity`.
fn expression_key(
    e: &affinity::KeyExpr,
    parts: &Parts,
    view: &RequestView<'_>,
    caller: affinity::Caller<'_>,
) -> Option<u64> {
    let attrs = Attrs {
        method: parts.method.as_str(),
        host: view.host,
        // The target routing matched: nothing before phase 5 sets the request's URI.
        path: parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str),
        scheme: view.scheme,
        headers: &parts.headers,
        source: caller.addr,
    };
    e.hash(&attrs, caller.identity)
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
