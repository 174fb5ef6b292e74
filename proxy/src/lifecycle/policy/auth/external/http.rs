//! The HTTP check. In: the rule's settings and the request's attributes. Out: the check
//! request, and the [`Decision`] read from the service's answer.
//!
//! The check request has the original method, the path `path prefix + original path and
//! query`, the forwarded headers (those the rule names) plus `Host` (the original host),
//! `X-Forwarded-Host`, `X-Forwarded-Proto`, `X-Forwarded-For` (the client's IP),
//! `X-Forwarded-Method` and `X-Forwarded-Uri`, and the body when the rule forwards it (with
//! its `Content-Length`; otherwise none, and `Content-Length: 0` where the method has one).
//!
//! The forwarded headers never include a hop-by-hop or framing header of the client's
//! request: the check request is a message of its own.
//!
//! An allowing answer (any 2xx for the AuthPolicy rule, as nginx's `auth_request` and
//! Traefik's ForwardAuth; `200` only for the HTTPRoute ExternalAuth filter, as GEP-1494 says:
//! [`AllowStatus`]) allows: the headers the rule lists in `headersToUpstream` are set on the
//! upstream request (every header but framing, hop-by-hop, `Content-*`, `Date` and `Server`
//! for the filter without `allowedResponseHeaders`) and those in `headersToClient` added to
//! the client's response; Host, hop-by-hop and framing headers never are, listed or not
//! ([`super::Grant::new`]). Another 2xx under the filter's rule is an authorization failure
//! the client must not read as a success: 403. A 5xx answer is a failure of the service
//! (denied with 403, or let through with `failOpen`). Any other answer denies with the
//! service's status, body and headers (less hop-by-hop and framing ones), so a
//! `WWW-Authenticate` challenge or a login redirect reaches the client.

use std::sync::Arc;

use ::http::header::{CONTENT_LENGTH, HOST};
use ::http::uri::Authority;
use ::http::{HeaderName, HeaderValue, Request, Response, StatusCode, Version};
use tollgate_api::BackendProtocol;
use tollgate_api::external::AllowStatus;

use super::{CheckInput, Decision, ExternalError, Grant, Refusal, is_hop_or_framing, read_body};
use crate::lifecycle::body::{ProxyBody, full};
use crate::upstream::pool::PooledBody;
use crate::upstream::request_uri;

/// The HTTP settings of a rule.
#[derive(Debug)]
pub(super) struct HttpSettings {
    /// Without a trailing `/`.
    pub path_prefix: String,
    pub to_upstream: Vec<HeaderName>,
    pub to_client: Vec<HeaderName>,
    /// Every header of an allowing answer goes upstream (the ExternalAuth filter without
    /// `allowedResponseHeaders`), but Host, framing, hop-by-hop and content headers.
    pub all_to_upstream: bool,
    /// Which statuses allow.
    pub allow: AllowStatus,
}

const FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
const FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");

/// The check request for `input`.
pub(super) fn request(
    s: &HttpSettings,
    forward: &[HeaderName],
    protocol: BackendProtocol,
    authority: &Authority,
    input: &CheckInput<'_>,
) -> Result<Request<ProxyBody>, ExternalError> {
    let path = format!("{}{}", s.path_prefix, input.target);
    let uri = request_uri(protocol, authority, &path, &::http::Uri::default())?;
    let body = input.body.cloned().unwrap_or_default();
    let mut req = Request::builder()
        .method(input.method.clone())
        .uri(uri)
        .version(match protocol {
            BackendProtocol::H2c => Version::HTTP_2,
            _ => Version::HTTP_11,
        })
        .body(full(body.clone()))?;
    let h = req.headers_mut();
    for name in forward.iter().filter(|n| !is_hop_or_framing(n)) {
        for v in input.headers.get_all(name) {
            h.append(name.clone(), v.clone());
        }
    }
    let value = |s: &str| HeaderValue::from_str(s).ok();
    if let Some(host) = value(input.host) {
        if protocol != BackendProtocol::H2c {
            h.insert(HOST, host.clone());
        }
        h.insert(FORWARDED_HOST, host);
    }
    if let Some(v) = value(input.scheme) {
        h.insert(FORWARDED_PROTO, v);
    }
    if let Some(v) = value(&input.peer.ip().to_string()) {
        h.insert(FORWARDED_FOR, v);
    }
    if let Some(v) = value(input.method.as_str()) {
        h.insert(FORWARDED_METHOD, v);
    }
    if let Some(v) = value(input.target) {
        h.insert(FORWARDED_URI, v);
    }
    h.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    Ok(req)
}

/// The decision the service's answer carries.
pub(super) async fn decision(
    s: &HttpSettings,
    resp: Response<PooledBody>,
) -> Result<Decision, ExternalError> {
    let (parts, body) = resp.into_parts();
    let (body, _) = read_body(body).await?;
    if parts.status.is_server_error() {
        return Err(ExternalError::Status(parts.status));
    }
    let allows = match s.allow {
        AllowStatus::Any2xx => parts.status.is_success(),
        AllowStatus::Only200 => parts.status == StatusCode::OK,
    };
    if allows {
        let pick = |names: &[HeaderName]| -> Vec<(HeaderName, HeaderValue)> {
            names
                .iter()
                .flat_map(|n| {
                    parts
                        .headers
                        .get_all(n)
                        .iter()
                        .map(|v| (n.clone(), v.clone()))
                })
                .collect()
        };
        let upstream = if s.all_to_upstream {
            parts
                .headers
                .iter()
                .filter(|(n, _)| !is_content(n))
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect()
        } else {
            pick(&s.to_upstream)
        };
        return Ok(Decision::Allow(Arc::new(Grant::new(
            upstream,
            Vec::new(),
            Vec::new(),
            pick(&s.to_client),
        ))));
    }
    if parts.status.is_success() {
        // A 204 or 206 that does not allow: the client must not read it as a success.
        return Ok(Decision::Deny(Arc::new(Refusal::failed())));
    }
    Ok(Decision::Deny(Arc::new(Refusal::new(
        parts.status,
        parts.headers.iter().map(|(n, v)| (n.clone(), v.clone())),
        body,
    ))))
}

/// Headers describing the answer's own body (and its date): never copied to the request.
fn is_content(n: &HeaderName) -> bool {
    n.as_str().starts_with("content-") || n == ::http::header::DATE || n == ::http::header::SERVER
}
