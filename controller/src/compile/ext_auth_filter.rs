//! The HTTPRoute ExternalAuth filter (GEP-1494, experimental channel) to the route table's
//! [`Filter::ExternalAuth`]: the same check as an AuthPolicy `external` rule
//! ([`super::policies::external`]), run by the proxy after the route's policies.
//!
//! In: the filter and the route's [`FilterCtx`] (its backendRef resolves like the route's:
//! a Service in the route's namespace or granted to HTTPRoutes by a ReferenceGrant;
//! BackendTLSPolicy applies; GRPC speaks HTTP/2). Out: an [`ExternalAuthz`]:
//!
//! - HTTP: only a `200` answer allows (any other status is an authorization failure: 3xx
//!   and 4xx reach the client as the service wrote them, another 2xx and a 5xx are 403);
//!   `http.path` prefixes the path; `Authorization` plus `http.allowedHeaders` are
//!   forwarded (Host, method, path and Content-Length always are); `http.allowedResponseHeaders`
//!   are copied upstream from an allowing answer, or, when empty, every header but Host and
//!   framing, hop-by-hop and content headers (Host, framing and hop-by-hop headers are never
//!   copied, listed or not);
//! - GRPC: `grpc.allowedHeaders` are sent, every header when empty;
//! - `forwardBody.maxSize` > 0 forwards the body, a larger one refused with 413 (the spec
//!   allows a 4xx); 0 or unset, no body;
//! - the filter fails closed (no failOpen), waits at most [`TIMEOUT_MS`], caches nothing.
//!
//! An unresolvable backendRef is a ResolvedRefs problem of the route (like a mirror's), and the
//! filter keeps an empty backend key, which the proxy cannot reach: it answers 403, never
//! lets the request through.

use gateway_types::experimental::httproutes::{
    HttpRouteRulesFiltersExternalAuth, HttpRouteRulesFiltersExternalAuthProtocol,
};
use tollgate_api::external::{AllowStatus, ExternalAuthz, ExternalProtocol, HttpCheck};

use super::backends::RefSpec;
use super::conditions::{Problem, reason};
use super::filters::FilterCtx;
use super::policies::external::header_names;

/// How long a check may take: Envoy ext_authz's default.
pub const TIMEOUT_MS: u64 = 200;

/// Converts one ExternalAuth filter; `id` names it (`namespace/route/rule-N`).
pub fn convert(
    f: &HttpRouteRulesFiltersExternalAuth,
    field: &str,
    id: String,
    ctx: &mut FilterCtx<'_, '_, '_, '_>,
) -> Result<ExternalAuthz, Problem> {
    let unsupported = |what: String| Problem::new(reason::UNSUPPORTED_VALUE, what);
    let names = |list: &Option<Vec<String>>, f: &str| {
        header_names(list.as_deref().unwrap_or_default(), f).map_err(|p| unsupported(p.message))
    };
    let max_body_bytes = match f.forward_body.as_ref().and_then(|b| b.max_size) {
        None | Some(0) => None,
        Some(n) => Some(u64::try_from(n).map_err(|_| {
            unsupported(format!(
                "{field}.forwardBody.maxSize: {n} must not be negative"
            ))
        })?),
    };
    let grpc = f.protocol == HttpRouteRulesFiltersExternalAuthProtocol::Grpc;
    let (protocol, forward_headers) = if grpc {
        let allowed = f.grpc.as_ref().and_then(|g| g.allowed_headers.clone());
        (
            ExternalProtocol::Grpc,
            names(&allowed, &format!("{field}.grpc.allowedHeaders"))?,
        )
    } else {
        let h = f.http.clone().unwrap_or_default();
        let path = h.path.clone().unwrap_or_default();
        // GEP-1494: implementations must sanitize the path; the API server's pattern does
        // not run for `tollgate run`. One the proxy could not put in a request line would
        // deny every request (fail closed) with no word why: refused here instead.
        let valid = path.is_empty()
            || (path.starts_with('/')
                && !path.contains(['?', '#'])
                && path.parse::<http::uri::PathAndQuery>().is_ok());
        if !valid {
            return Err(unsupported(format!(
                "{field}.http.path: {path:?} is not an absolute path"
            )));
        }
        let mut forward = names(&h.allowed_headers, &format!("{field}.http.allowedHeaders"))?;
        forward.push("authorization".to_owned());
        forward.sort();
        forward.dedup();
        let upstream = names(
            &h.allowed_response_headers,
            &format!("{field}.http.allowedResponseHeaders"),
        )?;
        (
            ExternalProtocol::Http(HttpCheck {
                path_prefix: path.trim_end_matches('/').to_owned(),
                all_headers_to_upstream: upstream.is_empty(),
                headers_to_upstream: upstream,
                headers_to_client: Vec::new(),
                allow: AllowStatus::Only200,
            }),
            forward,
        )
    };
    let r = &f.backend_ref;
    let spec = RefSpec {
        group: r.group.as_deref(),
        kind: r.kind.as_deref(),
        name: &r.name,
        namespace: r.namespace.as_deref(),
        port: r.port,
    };
    // The check speaks HTTP/2 to a gRPC service: resolved as a GRPCRoute's backend is.
    let kind = ctx.kind;
    if grpc {
        ctx.kind = super::kinds::RouteKind::Grpc;
    }
    let backend = ctx.resolve_backend(&spec, &format!("{field}.externalAuth.backendRef"));
    ctx.kind = kind;
    Ok(ExternalAuthz {
        id,
        backend: backend.unwrap_or_default(),
        protocol,
        forward_headers,
        max_body_bytes,
        timeout_ms: TIMEOUT_MS,
        fail_open: false,
        cache_ttl_ms: None,
    })
}
