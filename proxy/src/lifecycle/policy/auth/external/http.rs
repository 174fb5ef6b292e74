//! The HTTP check. In: the rule's settings and the request's attributes. Out: the check
//! request, and the [`Decision`] read from the service's answer.
//!
//! The check request has the original method, the path `path prefix + original path and
//! query`, the forwarded headers (those the rule names) plus `Host` (the original host),
//! `X-Forwarded-Host`, `X-Forwarded-Proto`, `X-Forwarded-For` (the client's IP),
//! `X-Forwarded-Method` and `X-Forwarded-Uri`, and the body when the rule forwards it (with
//! its `Content-Length`; otherwise none, and `Content-Length: 0` where the method has one).
//!
//! A 2xx answer allows: the headers the rule lists in `headersToUpstream` are set on the
//! upstream request (every header but Host, framing, hop-by-hop, `Content-*`, `Date` and
//! `Server` for the HTTPRoute filter without `allowedResponseHeaders`) and those in
//! `headersToClient` added to the client's response. A 5xx
//! answer is a failure of the service (denied with 403, or let through with `failOpen`).
//! Any other answer denies with the service's status, body and headers (less hop-by-hop and
//! framing ones), so a `WWW-Authenticate` challenge or a login redirect reaches the client.

use std::sync::Arc;

use ::http::header::{CONNECTION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use ::http::uri::Authority;
use ::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Version};
use tollgate_api::BackendProtocol;

use super::{CheckInput, Decision, ExternalError, Grant, Refusal, read_body};
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
    for name in forward {
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
    h.remove(TRANSFER_ENCODING);
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
    if parts.status.is_success() {
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
                .filter(|(n, _)| !is_framing(n) && !is_content(n) && *n != HOST)
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect()
        } else {
            pick(&s.to_upstream)
        };
        return Ok(Decision::Allow(Arc::new(Grant {
            upstream,
            client: pick(&s.to_client),
            ..Grant::default()
        })));
    }
    let mut headers = HeaderMap::new();
    for (n, v) in &parts.headers {
        if !is_framing(n) {
            headers.append(n.clone(), v.clone());
        }
    }
    Ok(Decision::Deny(Arc::new(Refusal {
        status: parts.status,
        headers,
        body,
    })))
}

/// Headers describing the answer's own body (and its date): never copied to the request.
fn is_content(n: &HeaderName) -> bool {
    n.as_str().starts_with("content-") || n == ::http::header::DATE || n == ::http::header::SERVER
}

/// Hop-by-hop and framing headers, which the gateway sets for its own answer.
fn is_framing(n: &HeaderName) -> bool {
    n == CONNECTION
        || n == CONTENT_LENGTH
        || n == TRANSFER_ENCODING
        || matches!(
            n.as_str(),
            "keep-alive" | "proxy-connection" | "te" | "trailer" | "upgrade"
        )
}
