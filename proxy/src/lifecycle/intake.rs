//! The front door of the request lifecycle. In: a request as its connection delivered it and
//! the one-pass scan of its fields ([`forward::Seen`]). Out: [`Front`], the one normalized
//! authority and path the rest of the lifecycle uses (module [`crate::lifecycle::normalize`]), or the 400
//! that refuses an ambiguous request: several Host fields, HTTP/1.1 without Host, a Host
//! disagreeing with an absolute-form target or HTTP/2 `:authority`, an invalid authority or
//! path. [`Front::apply`] then puts the normal forms into the request, so the upstream
//! receives exactly what was matched, judged and logged.

use std::borrow::Cow;

use http::header::HOST;
use http::uri::PathAndQuery;
use http::{HeaderValue, Request, StatusCode, Uri, Version};

use crate::lifecycle::forward;
use crate::lifecycle::normalize::{Authority, PathOptions, normalize_path, parse_authority};

/// What the front door decided.
#[derive(Debug)]
pub(crate) struct Front {
    /// `host[:port]`, normalized: what routing, policies, filters, the access log, Host and
    /// `X-Forwarded-Host` use. Empty when the client named no host (HTTP/1.0).
    pub authority: HeaderValue,
    /// The client's Host field must be replaced by [`Front::authority`].
    replace_host: bool,
    /// The target with its path normalized, when that differs from the client's.
    uri: Option<Uri>,
}

impl Front {
    /// Puts the normal forms into `req`.
    pub fn apply<B>(self, req: &mut Request<B>) {
        if self.replace_host {
            req.headers_mut().insert(HOST, self.authority.clone());
        }
        if let Some(uri) = self.uri {
            *req.uri_mut() = uri;
        }
    }
}

/// Checks and normalizes the authority and path of a request.
pub(crate) fn front_door(
    seen: &forward::Seen<'_>,
    uri: &Uri,
    version: Version,
    paths: PathOptions,
) -> Result<Front, StatusCode> {
    const BAD: StatusCode = StatusCode::BAD_REQUEST;
    if seen.hosts > 1 {
        return Err(BAD);
    }
    let from_uri = match uri.authority() {
        Some(a) => Some(parse_authority(a.as_str().as_bytes()).map_err(|_| BAD)?),
        None => None,
    };
    let from_host = match seen.host {
        Some(h) => Some(parse_authority(h.as_bytes()).map_err(|_| BAD)?),
        None => None,
    };
    let (authority, replace_host) = match (from_host, from_uri) {
        (Some(h), Some(u)) => {
            if !same(&h, &u) {
                return Err(BAD);
            }
            (value(&h, seen.host), !h.unchanged)
        }
        (Some(h), None) => (value(&h, seen.host), !h.unchanged),
        (None, Some(u)) => (value(&u, None), false),
        // RFC 9112 §3.2: a server MUST answer 400 to an HTTP/1.1 request without Host.
        (None, None) if version == Version::HTTP_11 => return Err(BAD),
        (None, None) => (HeaderValue::from_static(""), false),
    };
    let uri = match uri.path_and_query() {
        Some(pq) => match normalize_path(pq.path(), paths).map_err(|_| BAD)? {
            Cow::Borrowed(_) => None,
            Cow::Owned(path) => Some(with_path(uri, path, pq.query()).ok_or(BAD)?),
        },
        None => None,
    };
    Ok(Front {
        authority,
        replace_host,
        uri,
    })
}

fn same(a: &Authority<'_>, b: &Authority<'_>) -> bool {
    a.host == b.host && a.port == b.port
}

/// The authority as a field value: the client's own when it was already normal.
fn value(a: &Authority<'_>, raw: Option<&HeaderValue>) -> HeaderValue {
    match raw {
        Some(v) if a.unchanged => v.clone(),
        // Only visible ASCII survives `parse_authority`.
        _ => HeaderValue::from_str(&a.to_text()).unwrap_or_else(|_| HeaderValue::from_static("")),
    }
}

/// `uri` with `path` in place of its own (the rare request whose path was not normal).
fn with_path(uri: &Uri, path: String, query: Option<&str>) -> Option<Uri> {
    let pq = match query {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(PathAndQuery::try_from(pq).ok()?);
    Uri::from_parts(parts).ok()
}
