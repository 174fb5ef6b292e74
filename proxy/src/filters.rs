//! Request and response transforms of Gateway API filters, as pure functions over `http` types.
//! In: a filter from the table and the request/response parts. Out: edited parts, or a
//! response to send instead (redirects, CORS preflights).
//!
//! INTERFACE STUB: owned by the router work; signatures are the contract used by the server.

use http::{HeaderMap, HeaderValue, Response, StatusCode};
use tollgate_api::{Cors, HeaderModifier, Redirect, UrlRewrite};

/// Applies set/add/remove to a header map (request or response side).
pub fn modify_headers(m: &HeaderModifier, headers: &mut HeaderMap) {
    let _ = (m, headers);
    todo!()
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

/// Builds the redirect response (status and Location, empty body).
pub fn redirect(r: &Redirect, req: &RequestView<'_>) -> Response<()> {
    let _ = (r, req);
    todo!()
}

/// The result of a URLRewrite: the new Host (if changed) and the new path-and-query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    /// New Host header value, if the filter sets one.
    pub host: Option<String>,
    /// New `path?query`.
    pub path_and_query: String,
}

/// Applies a URLRewrite.
pub fn rewrite(r: &UrlRewrite, req: &RequestView<'_>) -> Rewritten {
    let _ = (r, req);
    todo!()
}

/// For a CORS preflight (OPTIONS with Origin and Access-Control-Request-Method) returns the
/// response to send instead of forwarding; `None` when the request is not a preflight.
pub fn cors_preflight(c: &Cors, method: &http::Method, headers: &HeaderMap) -> Option<Response<()>> {
    let _ = (c, method, headers);
    todo!()
}

/// Adds CORS response headers for an actual (non-preflight) request carrying `origin`.
pub fn cors_decorate(c: &Cors, origin: Option<&HeaderValue>, response: &mut HeaderMap) {
    let _ = (c, origin, response);
    todo!()
}

#[allow(dead_code)]
fn _status(_: StatusCode) {}
