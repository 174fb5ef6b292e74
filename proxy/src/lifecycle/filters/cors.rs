//! The CORS filter. In: the filter, the request method and headers (preflight) or the
//! request's `Origin` and the response headers (actual requests). Out: a preflight answer,
//! or CORS headers on the response.
//!
//! Behaviour, following the HTTPCORSFilter API docs and the HTTPRouteCORS conformance tests:
//! - An origin is allowed when `allow_origins` holds `*`, the same origin (scheme and host
//!   case-insensitive; a missing port is 80 for http and 443 for https), or a wildcard
//!   `https://*.example.com`, where `*` stands for one or more labels. An empty
//!   `allow_origins` allows every origin: the CORSAllowCredentialsBehavior conformance test
//!   configures only `allowCredentials` and expects the origin echoed.
//! - On a preflight, `Access-Control-Allow-Origin` is `*` only for an allow-all list without
//!   credentials; otherwise it echoes the request's origin (never `*` with credentials). On
//!   an actual request it always echoes the origin: the request may carry credentials (a
//!   cookie, an Authorization header), and a browser refuses `*` for those, which is what the
//!   conformance test "CORS request with credentials should hide auth headers on unauth path"
//!   checks (the origin echoed, Allow-Credentials absent).
//! - A preflight (OPTIONS with `Origin` and `Access-Control-Request-Method`) is answered by
//!   the gateway with 200. From an allowed origin it carries Allow-Origin, Allow-Methods
//!   (the list, or the requested method for `*`), Allow-Headers (the list; for `*` the
//!   requested headers, or `*` without credentials when none were requested),
//!   Expose-Headers, Max-Age (when above 0) and Allow-Credentials (when set). From a
//!   disallowed origin it is still a 200 but without any `Access-Control-*` header, which
//!   the spec allows and makes the browser fail the request.
//! - Every answer whose headers depend on the origin carries `Vary: Origin`, so a cache
//!   never serves one origin's answer to another.
//! - The filter is authoritative on actual responses: for a disallowed origin it removes
//!   upstream `Access-Control-Allow-Origin`/`-Credentials` headers rather than letting the
//!   backend grant what the route's policy refuses.

use http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode};
use tollgate_api::Cors;

use super::default_port;

/// True for a CORS preflight: OPTIONS with `Origin` and `Access-Control-Request-Method`.
pub fn is_cors_preflight(method: &Method, headers: &HeaderMap) -> bool {
    method == Method::OPTIONS
        && headers.contains_key(ORIGIN)
        && headers.contains_key(ACCESS_CONTROL_REQUEST_METHOD)
}

/// For a CORS preflight (OPTIONS with Origin and Access-Control-Request-Method) returns the
/// response to send instead of forwarding; `None` when the request is not a preflight.
pub fn cors_preflight(c: &Cors, method: &Method, headers: &HeaderMap) -> Option<Response<()>> {
    if !is_cors_preflight(method, headers) {
        return None;
    }
    let origin = headers.get(ORIGIN)?;
    let mut resp = Response::new(());
    *resp.status_mut() = StatusCode::OK;
    let out = resp.headers_mut();
    if !origin_allowed(c, origin) {
        add_vary_origin(out);
        return Some(resp);
    }
    allow_origin(c, origin, out, answers_star(c));

    if contains_star(&c.allow_methods) {
        if let Some(m) = headers.get(ACCESS_CONTROL_REQUEST_METHOD) {
            out.insert(ACCESS_CONTROL_ALLOW_METHODS, m.clone());
        }
    } else {
        insert_list(out, ACCESS_CONTROL_ALLOW_METHODS, &c.allow_methods);
    }

    if contains_star(&c.allow_headers) {
        match headers.get(ACCESS_CONTROL_REQUEST_HEADERS) {
            Some(h) => {
                out.insert(ACCESS_CONTROL_ALLOW_HEADERS, h.clone());
            }
            None if !c.allow_credentials => {
                out.insert(ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static("*"));
            }
            None => {}
        }
    } else {
        insert_list(out, ACCESS_CONTROL_ALLOW_HEADERS, &c.allow_headers);
    }

    insert_list(out, ACCESS_CONTROL_EXPOSE_HEADERS, &c.expose_headers);
    if c.max_age > 0 {
        out.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from(c.max_age));
    }
    Some(resp)
}

/// Adds CORS response headers for an actual (non-preflight) request carrying `origin`.
pub fn cors_decorate(c: &Cors, origin: Option<&HeaderValue>, response: &mut HeaderMap) {
    match origin {
        Some(o) if origin_allowed(c, o) => {
            allow_origin(c, o, response, false);
            insert_list(response, ACCESS_CONTROL_EXPOSE_HEADERS, &c.expose_headers);
        }
        _ => {
            response.remove(ACCESS_CONTROL_ALLOW_ORIGIN);
            response.remove(ACCESS_CONTROL_ALLOW_CREDENTIALS);
            add_vary_origin(response);
        }
    }
}

/// True when `origin` may read responses under this filter.
pub fn origin_allowed(c: &Cors, origin: &HeaderValue) -> bool {
    if c.allow_origins.is_empty() || contains_star(&c.allow_origins) {
        return true;
    }
    let Some(origin) = origin.to_str().ok().and_then(Origin::parse) else {
        return false;
    };
    c.allow_origins
        .iter()
        .filter_map(|p| Origin::parse(p))
        .any(|p| p.allows(&origin))
}

/// True when Allow-Origin is `*` whatever the origin: allow-all without credentials.
fn answers_star(c: &Cors) -> bool {
    !c.allow_credentials && (c.allow_origins.is_empty() || contains_star(&c.allow_origins))
}

/// Sets Allow-Origin (`*` when `star`, else the origin with `Vary: Origin`) and
/// Allow-Credentials for an allowed origin.
fn allow_origin(c: &Cors, origin: &HeaderValue, out: &mut HeaderMap, star: bool) {
    if star {
        out.insert(ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
    } else {
        out.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
        add_vary_origin(out);
    }
    if c.allow_credentials {
        out.insert(
            ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
    } else {
        out.remove(ACCESS_CONTROL_ALLOW_CREDENTIALS);
    }
}

fn contains_star(list: &[String]) -> bool {
    list.iter().any(|v| v == "*")
}

/// Inserts `a, b, c` when the list is non-empty and forms a valid header value.
fn insert_list(out: &mut HeaderMap, name: http::HeaderName, list: &[String]) {
    if list.is_empty() {
        return;
    }
    if let Ok(v) = HeaderValue::from_str(&list.join(", ")) {
        out.insert(name, v);
    }
}

/// Appends `Vary: Origin` unless the response already varies on it (or on everything).
fn add_vary_origin(out: &mut HeaderMap) {
    let present = out.get_all(VARY).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',')
                .map(str::trim)
                .any(|t| t == "*" || t.eq_ignore_ascii_case("origin"))
        })
    });
    if !present {
        out.append(VARY, HeaderValue::from_static("Origin"));
    }
}

/// A parsed origin or origin pattern: `scheme://host[:port]`.
#[derive(Debug, PartialEq, Eq)]
struct Origin<'a> {
    scheme: &'a str,
    host: &'a str,
    /// Explicit port, or the scheme's well-known port.
    port: Option<u16>,
}

impl<'a> Origin<'a> {
    fn parse(s: &'a str) -> Option<Self> {
        let (scheme, authority) = s.trim().split_once("://")?;
        let authority = authority.strip_suffix('/').unwrap_or(authority);
        let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
            let (h, after) = rest.split_once(']')?;
            (h, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        let port = match port {
            Some(p) => Some(p.parse().ok()?),
            None => default_port(scheme),
        };
        (!host.is_empty()).then_some(Self { scheme, host, port })
    }

    /// True when this pattern allows `origin`.
    fn allows(&self, origin: &Origin<'_>) -> bool {
        if !self.scheme.eq_ignore_ascii_case(origin.scheme) || self.port != origin.port {
            return false;
        }
        match self.host.strip_prefix('*') {
            // `*` alone matches every host; `*.x` needs at least one character before `.x`.
            Some("") => true,
            Some(suffix) => {
                origin.host.len() > suffix.len()
                    && origin
                        .host
                        .get(origin.host.len() - suffix.len()..)
                        .is_some_and(|tail| tail.eq_ignore_ascii_case(suffix))
            }
            None => self.host.eq_ignore_ascii_case(origin.host),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allows(pattern: &str, origin: &str) -> bool {
        let c = Cors {
            allow_origins: vec![pattern.into()],
            ..Cors::default()
        };
        origin_allowed(&c, &HeaderValue::from_str(origin).unwrap())
    }

    #[test]
    fn exact_origin_is_allowed() {
        assert!(allows("https://www.foo.com", "https://www.foo.com"));
        assert!(allows("https://www.foo.com", "HTTPS://WWW.FOO.COM"));
        assert!(!allows("https://www.foo.com", "http://www.foo.com"));
        assert!(!allows("https://www.foo.com", "https://foo.com"));
    }

    #[test]
    fn default_ports_are_implied() {
        assert!(allows("https://a.com", "https://a.com:443"));
        assert!(allows("http://a.com:80", "http://a.com"));
        assert!(!allows("https://a.com", "https://a.com:8443"));
        assert!(allows("https://a.com:8443", "https://a.com:8443"));
    }

    #[test]
    fn wildcard_origin_matches_any_number_of_labels() {
        assert!(allows("https://*.bar.com", "https://www.bar.com"));
        assert!(allows("https://*.bar.com", "https://xpto.www.bar.com"));
        assert!(!allows("https://*.bar.com", "https://bar.com"));
        assert!(!allows("https://*.bar.com", "https://foobar.com"));
        assert!(!allows("https://*.bar.com", "http://www.bar.com"));
    }

    #[test]
    fn star_host_matches_every_host_of_the_scheme() {
        assert!(allows("https://*", "https://anything.org"));
        assert!(!allows("https://*", "http://anything.org"));
    }

    #[test]
    fn malformed_origins_are_refused() {
        assert!(!allows("https://a.com", "null"));
        assert!(!allows("https://a.com", "https://a.com:99999"));
        assert!(!allows("https://a.com", "https://"));
        assert!(!allows("https://a.com", "https://[::1"));
    }

    #[test]
    fn ipv6_origin_is_parsed() {
        assert!(allows("http://[::1]:8080", "http://[::1]:8080"));
        assert!(!allows("http://[::1]:8080", "http://[::1]"));
    }
}
