//! Request and response transforms of Gateway API filters, as pure functions over `http` types.
//! In: a filter from the table and the request/response parts. Out: edited parts, or a
//! response to send instead (redirects, CORS preflights).
//!
//! Nothing here panics on any input: values that cannot become header values (the compiler
//! validated them, so this is defence only) are skipped, or turn a redirect into a 500.

mod cors;
mod path;
#[cfg(test)]
mod tests;

use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};
use tollgate_api::{HeaderModifier, Redirect, UrlRewrite};

pub use cors::{cors_decorate, cors_preflight, is_cors_preflight, origin_allowed};
pub use path::replace_prefix;

/// Applies set/add/remove to a header map (request or response side).
///
/// Order: `set` (replaces every value of the name), then `add` (appends a value), then
/// `remove` (deletes every value). Names are case-insensitive; invalid names or values are
/// skipped.
pub fn modify_headers(m: &HeaderModifier, headers: &mut HeaderMap) {
    for (name, value) in &m.set {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.insert(n, v);
        }
    }
    for (name, value) in &m.add {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.append(n, v);
        }
    }
    for name in &m.remove {
        if let Ok(n) = HeaderName::from_bytes(name.as_bytes()) {
            headers.remove(n);
        }
    }
}

/// What a redirect or rewrite needs to know about the incoming request.
#[derive(Debug, Clone, Copy)]
pub struct RequestView<'a> {
    /// `http` or `https`, as the client spoke to us.
    pub scheme: &'a str,
    /// Host without port, as the client sent it.
    pub host: &'a str,
    /// Port the client connected to (the listener port).
    pub port: u16,
    /// Path without query.
    pub path: &'a str,
    /// Query string without `?`, if any.
    pub query: Option<&'a str>,
    /// Prefix matched by the route's PathPrefix, if that is how it matched.
    pub matched_prefix: Option<&'a str>,
}

/// The well-known port of a scheme.
fn default_port(scheme: &str) -> Option<u16> {
    if scheme.eq_ignore_ascii_case("http") {
        Some(80)
    } else if scheme.eq_ignore_ascii_case("https") {
        Some(443)
    } else {
        None
    }
}

/// The new path (without query) a path modifier produces.
fn rewritten_path(m: Option<&tollgate_api::PathModifier>, req: &RequestView<'_>) -> String {
    use tollgate_api::PathModifier;
    match m {
        None => req.path.to_owned(),
        Some(PathModifier::ReplaceFullPath(p)) if p.is_empty() => "/".to_owned(),
        Some(PathModifier::ReplaceFullPath(p)) => p.clone(),
        // ReplacePrefixMatch is only valid on a PathPrefix match; without one the path is
        // kept as it is.
        Some(PathModifier::ReplacePrefixMatch(repl)) => match req.matched_prefix {
            Some(prefix) => replace_prefix(req.path, prefix, repl),
            None => req.path.to_owned(),
        },
    }
}

fn with_query(mut path: String, query: Option<&str>) -> String {
    if let Some(q) = query {
        path.push('?');
        path.push_str(q);
    }
    path
}

/// Builds the redirect response (status and Location, empty body).
///
/// The Location is absolute: `scheme://host[:port]path[?query]`, each part from the filter
/// or, when unset, from the request. The port follows Gateway API: unset with a scheme set
/// means the scheme's well-known port; unset without a scheme keeps the listener port. It is
/// left out when it is the well-known port of the Location's scheme (80 for http, 443 for
/// https). The query string is always preserved. A status outside 3xx becomes 302; a
/// Location that cannot be a header value (never, with a validated table) gives a 500.
pub fn redirect(r: &Redirect, req: &RequestView<'_>) -> Response<()> {
    let scheme = r.scheme.as_deref().unwrap_or(req.scheme);
    let host = r.hostname.as_deref().unwrap_or(req.host);
    let port = match (r.port, &r.scheme) {
        (Some(p), _) => p,
        (None, Some(s)) => default_port(s).unwrap_or(req.port),
        (None, None) => req.port,
    };
    let mut location = String::with_capacity(64);
    location.push_str(scheme);
    location.push_str("://");
    if host.contains(':') && !host.starts_with('[') {
        // An IPv6 literal needs brackets in a URL.
        location.push('[');
        location.push_str(host);
        location.push(']');
    } else {
        location.push_str(host);
    }
    if default_port(scheme) != Some(port) {
        location.push(':');
        location.push_str(&port.to_string());
    }
    location.push_str(&with_query(rewritten_path(r.path.as_ref(), req), req.query));

    let mut resp = Response::new(());
    match HeaderValue::from_str(&location) {
        Ok(v) => {
            *resp.status_mut() = StatusCode::from_u16(r.status_code)
                .ok()
                .filter(StatusCode::is_redirection)
                .unwrap_or(StatusCode::FOUND);
            resp.headers_mut().insert(header::LOCATION, v);
        }
        Err(_) => *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR,
    }
    resp
}

/// The result of a URLRewrite: the new Host (if changed) and the new path-and-query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    /// New Host header value, if the filter sets one.
    pub host: Option<String>,
    /// New `path?query`.
    pub path_and_query: String,
}

/// Applies a URLRewrite: the path as [`redirect`] rewrites it (query preserved), and the
/// filter's hostname, if any.
pub fn rewrite(r: &UrlRewrite, req: &RequestView<'_>) -> Rewritten {
    Rewritten {
        host: r.hostname.clone(),
        path_and_query: with_query(rewritten_path(r.path.as_ref(), req), req.query),
    }
}
