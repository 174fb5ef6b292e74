//! Phase 2b's external authorization pieces: the HTTPRoute ExternalAuth filter (GEP-1494),
//! holding a request body that a check forwards, and decorating a denial.
//!
//! In: the request's head, its body, the matched route's compiled check
//! ([`crate::router::CompiledRoute::external`], built once per table from
//! [`tollgate_api::Filter::ExternalAuth`]) and the snapshot's backends. Out: the request
//! with the service's upstream headers set and its client headers noted in the context, or
//! the answer to send (the service's denial, or 403 when it failed: the filter fails closed).

use std::sync::Arc;

use bytes::Bytes;
use http::header::ORIGIN;
use http::request::Parts;
use http::{HeaderName, HeaderValue, Response, StatusCode};
use hyper::body::Body as _;
use tollgate_api::Filter;

use crate::downstream::client_body::ClientBody;
use crate::lifecycle::body::{ProxyBody, full};
use crate::lifecycle::ctx::RequestCtx;
use crate::lifecycle::filters;
use crate::lifecycle::grpc;
use crate::lifecycle::policy::auth::external::{CheckInput, Decision, ExternalCheck, ExternalIo};
use crate::state::Snapshot;

/// Reads the request body whole into `held` (and `body` becomes that held copy), unless an
/// earlier check did: at most `limit` bytes (a larger one, declared or sent, is refused with
/// 413, as Envoy's ext_authz does without `allow_partial_message`); a body that breaks off is
/// a bad request.
pub(crate) async fn hold(
    body: &mut ClientBody,
    held: &mut Option<Bytes>,
    limit: u64,
    declared: Option<u64>,
) -> Result<(), StatusCode> {
    use http_body_util::BodyExt;
    if let Some(b) = held {
        return if b.len() as u64 > limit {
            Err(StatusCode::PAYLOAD_TOO_LARGE)
        } else {
            Ok(())
        };
    }
    if declared.is_some_and(|n| n > limit) {
        return Err(StatusCode::PAYLOAD_TOO_LARGE);
    }
    let whole = if body.is_end_stream() {
        Bytes::new()
    } else {
        let taken = std::mem::replace(body, ClientBody::Empty);
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        match http_body_util::Limited::new(taken, limit).collect().await {
            Ok(c) => c.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return Err(StatusCode::PAYLOAD_TOO_LARGE);
            }
            Err(_) => return Err(StatusCode::BAD_REQUEST),
        }
    };
    *body = ClientBody::Held(Some(whole.clone()));
    *held = Some(whole);
    Ok(())
}

/// Runs the rule's ExternalAuth filter. `Ok` holds the headers for the client's response;
/// `Err` is the answer (not yet decorated).
#[allow(clippy::too_many_arguments)] // the pieces of phase 2b it reads and writes
pub(crate) async fn filter(
    snapshot: &Snapshot,
    ctx: &RequestCtx<'_>,
    check: &Arc<ExternalCheck>,
    parts: &mut Parts,
    body: &mut ClientBody,
    held: &mut Option<Bytes>,
    host: &str,
    target: &str,
) -> Result<Vec<(HeaderName, HeaderValue)>, Response<Bytes>> {
    let shared = ctx.shared;
    if let Some(limit) = check.max_body_bytes() {
        hold(body, held, limit, ctx.declared_len)
            .await
            .map_err(|code| {
                let mut r = Response::new(Bytes::new());
                *r.status_mut() = code;
                r
            })?;
    }
    let (peer, _) = ctx.source();
    let input = CheckInput {
        method: &parts.method,
        host,
        target,
        scheme: ctx.conn.scheme,
        headers: &parts.headers,
        peer,
        body: held.as_ref(),
    };
    let io = ExternalIo::new(&snapshot.backends, &shared.upstream);
    match check.check(&io, &input, shared.policy.auth.metrics()).await {
        Decision::Allow(grant) => {
            grant.apply(&mut parts.headers);
            Ok(grant.client.clone())
        }
        Decision::Deny(refusal) => Err(refusal.to_response()),
    }
}

/// A policy's or an authorization service's denial as the client gets it: a gRPC client reads
/// the message in `grpc-message`, and a browser can read it (the route's CORS filters decorate
/// it as they would an upstream answer).
pub(crate) fn denial(
    ctx: &RequestCtx<'_>,
    route_filters: &[Filter],
    parts: &Parts,
    resp: Response<Bytes>,
) -> Response<ProxyBody> {
    // Copied only for a gRPC client: a flood of denials to HTTP clients allocates nothing more.
    let reply = ctx.grpc.then(|| grpc::Override {
        code: None,
        message: Some(String::from_utf8_lossy(resp.body()).into_owned().into()),
    });
    let mut resp = resp.map(full);
    if let Some(reply) = reply {
        resp.extensions_mut().insert(reply);
    }
    let origin = parts.headers.get(ORIGIN);
    for f in route_filters {
        if let Filter::Cors(c) = f {
            filters::cors_decorate(c, origin, resp.headers_mut());
        }
    }
    resp
}
