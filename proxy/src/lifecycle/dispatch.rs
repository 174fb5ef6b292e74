//! Phases 4 to 6 of a request (module `service`): backend and endpoint, the upstream call
//! under the request's deadline, the answer's filters. In: the request as phase 3 left it
//! (and the cache's [`cache::Fill`] when its rule caches), from a client's request or from
//! a background revalidation (module `refresh`). Out: the answer (the upstream's, the stale
//! entry's, or the gateway's own error), before `service::decorate`.

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{Response, StatusCode};
use hyper::body::Body as _;
use tollgate_api::BackendProtocol;
use tollgate_api::backend::HashOn;

use crate::downstream::client_body::ClientBody;
use crate::downstream::pace::BodyPace;
use crate::lifecycle::affinity;
use crate::lifecycle::answer::status;
use crate::lifecycle::body::{BodyFault, ProxyBody};
use crate::lifecycle::cache;
use crate::lifecycle::call::{Call, Failure, failure_response};
use crate::lifecycle::ctx::{Plan, RequestCtx};
use crate::lifecycle::filters::RequestView;
use crate::lifecycle::grpc;
use crate::lifecycle::grpc_web::decode::RequestBody;
use crate::lifecycle::policy::cel::Attrs;
use crate::lifecycle::service::request_filters;
use crate::metrics::UpstreamErrorKind;
use crate::state::{Shared, Snapshot};
use crate::upstream::breaker::Admission;
use crate::upstream::{Balancer, EndpointGuard};

/// What phases 4 to 6 read besides the context.
pub(crate) struct Upstream<'s, 'v> {
    pub snapshot: &'s Snapshot,
    pub route: &'s tollgate_api::Route,
    pub view: &'v RequestView<'v>,
    pub deadline: Option<tokio::time::Instant>,
    pub max_body_bytes: u64,
    /// The target as the client sent it (the upstream's unless a rewrite changed it).
    pub target: &'v str,
    /// A cache refresh (module `refresh`): its backend's RequestMirror filters copy nothing.
    pub refresh: bool,
}

/// Phases 4 to 6; see the module docs.
pub(crate) async fn forward<'s>(
    up: Upstream<'s, '_>,
    ctx: &mut RequestCtx<'s>,
    mut parts: Parts,
    mut body: ClientBody,
    mut fill: Option<Box<cache::Fill>>,
) -> Response<ProxyBody> {
    let Upstream {
        snapshot,
        route,
        view,
        deadline,
        max_body_bytes,
        target,
        refresh,
    } = up;
    let shared = ctx.shared;
    let conn = ctx.conn;
    let balancer = match pick_backend(snapshot, &route.backends, &mut parts, view, &mut ctx.plan) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    if refresh {
        ctx.plan.mirrors.clear();
    }
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
    } = match pick_endpoint(shared, balancer, route, &parts, view, caller) {
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
            trace: ctx.done.trace.as_ref(),
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
    resp
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
