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
//!    Then (3b) the shared cache (module `cache`): an answer from the store, or a fill that
//!    stores the upstream's; a stale answer may start a background revalidation (module
//!    `refresh`).
//! 4. `pick_backend` (module `dispatch`, as phases 5 and 6): weighted pick (unresolved →
//!    500), backend filters, endpoint (none → 503), by the request's key on a consistent-hash backend (module `affinity`; an expression key
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
use tollgate_api::Filter;

use crate::downstream::client_body::ClientBody;
use crate::downstream::conn::ConnCtx;
use crate::lifecycle::answer::{close_after, status, with_empty_body};
use crate::lifecycle::body::ProxyBody;
use crate::lifecycle::cache;
use crate::lifecycle::cost_body::{self, BodyCost};
pub(crate) use crate::lifecycle::ctx::ProxyResponse;
use crate::lifecycle::ctx::{Plan, RequestCtx};
use crate::lifecycle::ext_auth;
use crate::lifecycle::filters::{self, RequestView};
use crate::lifecycle::mirror;
use crate::lifecycle::policy::auth::external::ExternalIo;
use crate::lifecycle::policy::enforce::RequestInfo;
use crate::lifecycle::{dispatch, refresh};
use crate::metrics::UpstreamErrorKind;
use crate::state::{Shared, Snapshot};

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
    if let (Some(job), Some(snapshot)) = (ctx.refresh.take(), snapshot.clone()) {
        tokio::spawn(refresh::run(shared.clone(), conn.clone(), snapshot, job));
    }
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
    // Its own handle (a reference count): the context is lent whole to phases 4 to 6.
    let host_value = ctx.host.clone();
    let original_host = host_value.to_str().unwrap_or("");
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
    if let Some(t) = ctx.done.trace.as_mut() {
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
            ctx.done.trace.as_mut(),
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
            Ok(client) => {
                ctx.credentialed = true;
                ctx.auth_response_headers.extend(client);
            }
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
    let deadline = request_deadline(route, conn, ctx.done.start);
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
            cache::Look::Refresh(mut resp, ticket) => {
                cache::response_filters(&ctx.plan, ctx.origin.as_ref(), resp.headers_mut());
                ctx.done.upstream_answered = true;
                // Started by `handle` once this answer is made (it holds the connection's
                // and the snapshot's `Arc`s the background request needs).
                ctx.refresh = Some(Box::new(refresh::Job::new(
                    ticket,
                    &parts,
                    ctx,
                    &view,
                    target,
                    hit.matched_prefix,
                    route.rule_index,
                )));
                return decorate(ctx, resp);
            }
            cache::Look::Expired => {
                // The lead it waited for outlived the request's deadline: the gateway's own
                // 504, as an upstream that did not answer in time.
                shared.metrics.upstream_error(UpstreamErrorKind::Timeout);
                return status(StatusCode::GATEWAY_TIMEOUT);
            }
            cache::Look::Fetch(f) => fill = Some(f),
        }
    }
    let up = dispatch::Upstream {
        snapshot,
        route,
        view: &view,
        deadline,
        max_body_bytes,
        target,
        refresh: false,
    };
    let resp = dispatch::forward(up, ctx, parts, body, fill).await;
    decorate(ctx, resp)
}

/// The deadline of a request on `route` that arrived at `start`: the route's request
/// timeout or the port's, the shorter.
pub(crate) fn request_deadline(
    route: &tollgate_api::Route,
    conn: &ConnCtx,
    start: std::time::Instant,
) -> Option<tokio::time::Instant> {
    let timeout = match (
        route.timeouts.request_ms.map(Duration::from_millis),
        conn.limits.request_timeout,
    ) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    timeout.map(|t| tokio::time::Instant::from_std(start) + t)
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
        credentialed: ctx.credentialed,
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
pub(crate) fn request_filters<'s>(
    filters: &'s [Filter],
    parts: &mut Parts,
    view: &RequestView<'_>,
    plan: &mut Plan<'s>,
) -> Option<Response<ProxyBody>> {
    filters
        .iter()
        .find_map(|f| request_filter(f, parts, view, plan))
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
