//! Background revalidation (`staleWhileRevalidate`). In: a [`Job`], made when the cache
//! answered a client from a stale entry within its window and took the lead of the key
//! ([`cache::Refresh`]): the request as phase 3 left it, with the entry's validators as its
//! conditions. Out: nothing to a client; phases 4 to 6 run once more (module `dispatch`)
//! and the answer, read to its end, refreshes (304) or replaces (200) the entry, while an
//! error leaves the stale entry until its window ends.
//!
//! Bounded: one per key (the lead), at most `cache::MAX_REFRESHES` at once (beyond it the
//! stale answer goes out without one), under the route's request deadline and never longer
//! than [`REFRESH_LIMIT`]. It runs on the snapshot the client's request had and the rule it
//! matched: a table swap or a purge while it runs keeps its answer out of the store
//! (module `cache`, the store's generation). It passed the policies as the client's
//! request (authentication, rate limits are not run or counted again), is not mirrored,
//! logged or counted as a request: the cache metrics count it.

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderValue, Request};
use http_body_util::BodyExt;

use crate::downstream::client_body::ClientBody;
use crate::downstream::conn::ConnCtx;
use crate::lifecycle::cache;
use crate::lifecycle::ctx::RequestCtx;
use crate::lifecycle::dispatch;
use crate::lifecycle::filters::RequestView;
use crate::state::{Shared, Snapshot};

/// The longest a background revalidation runs, body included, when its route sets no
/// deadline.
pub(crate) const REFRESH_LIMIT: Duration = Duration::from_secs(30);

/// What a background revalidation needs of the client's request.
pub(crate) struct Job {
    ticket: Box<cache::Refresh>,
    parts: Parts,
    /// The authority and target routing matched (to find the same rule again).
    authority: HeaderValue,
    target: String,
    /// The host without port, as phase 3 saw it.
    host: String,
    matched_prefix: Option<String>,
    route: Option<Arc<str>>,
    rule_index: u32,
    identity: Option<Arc<serde_json::Value>>,
    plan_host: Option<String>,
    plan_path_and_query: Option<String>,
}

impl Job {
    /// The job for the request `parts` (as phase 3 left them) that `ticket` refreshes.
    pub(crate) fn new(
        ticket: Box<cache::Refresh>,
        parts: &Parts,
        ctx: &RequestCtx<'_>,
        view: &RequestView<'_>,
        target: &str,
        matched_prefix: Option<&str>,
        rule_index: u32,
    ) -> Self {
        let mut head = Request::new(()).into_parts().0;
        head.method = parts.method.clone();
        head.uri = parts.uri.clone();
        head.version = parts.version;
        head.headers = ticket.headers(&parts.headers);
        // Not traced (module docs): the client's trace fields, unchecked, stay behind.
        head.headers.remove(crate::otel::w3c::TRACEPARENT);
        head.headers.remove(crate::otel::w3c::TRACESTATE);
        Self {
            ticket,
            parts: head,
            authority: ctx.host.clone(),
            target: target.to_owned(),
            host: view.host.to_owned(),
            matched_prefix: matched_prefix.map(str::to_owned),
            route: ctx.done.route.clone(),
            rule_index,
            identity: ctx.identity.clone(),
            plan_host: ctx.plan.host.clone(),
            plan_path_and_query: ctx.plan.path_and_query.clone(),
        }
    }
}

/// Runs `job` to its end (or [`REFRESH_LIMIT`]); see the module docs.
pub(crate) async fn run(
    shared: Arc<Shared>,
    conn: Arc<ConnCtx>,
    snapshot: Arc<Snapshot>,
    job: Box<Job>,
) {
    let _ = tokio::time::timeout(REFRESH_LIMIT, refresh(&shared, &conn, &snapshot, *job)).await;
}

async fn refresh(shared: &Arc<Shared>, conn: &ConnCtx, snapshot: &Snapshot, job: Job) {
    let Job {
        ticket,
        parts,
        authority,
        target,
        host,
        matched_prefix,
        route: label,
        rule_index,
        identity,
        plan_host,
        plan_path_and_query,
    } = job;
    // The rule the client's request matched, in the same table; anything else (a filter
    // changed a field a match reads) refreshes nothing.
    let Some(hit) = snapshot.router.route(
        conn.table_port,
        authority.to_str().unwrap_or(""),
        &parts.method,
        &target,
        &parts.headers,
    ) else {
        return;
    };
    let route = &hit.route.api;
    if Some(&hit.route.label) != label.as_ref() || route.rule_index != rule_index {
        return;
    }
    let port = snapshot.client(conn.table_port);
    let mut req = Request::from_parts(parts, ClientBody::Empty);
    let mut ctx = RequestCtx::arrive(shared, conn, port, &mut req);
    if ctx.verdict.is_err() {
        return;
    }
    // Not the client's answer: never compressed, traced or logged.
    ctx.compress = None;
    ctx.done.trace = None;
    ctx.done.route = label;
    ctx.identity = identity;
    ctx.plan.host = plan_host;
    ctx.plan.path_and_query = plan_path_and_query;
    let (parts, body) = req.into_parts();
    let (path, query) = crate::lifecycle::router::split_path_and_query(&target);
    let view = RequestView {
        scheme: conn.scheme,
        host: &host,
        port: conn.local_port,
        path,
        query,
        matched_prefix: matched_prefix.as_deref(),
    };
    let deadline = crate::lifecycle::service::request_deadline(route, conn, ctx.done.start);
    let up = dispatch::Upstream {
        snapshot,
        route,
        view: &view,
        deadline,
        max_body_bytes: route
            .max_request_body_bytes
            .unwrap_or(conn.limits.max_body_bytes),
        target: &target,
        refresh: true,
    };
    let (fill, permit) = ticket.start();
    let resp = dispatch::forward(up, &mut ctx, parts, body, Some(fill)).await;
    // Read to its end, the body stores itself (module `cache::fill`).
    let mut body = resp.into_body();
    let drain = async {
        while let Some(frame) = body.frame().await {
            if frame.is_err() {
                break;
            }
        }
    };
    match deadline {
        Some(d) => {
            let _ = tokio::time::timeout_at(d, drain).await;
        }
        None => drain.await,
    }
    drop(permit);
}
