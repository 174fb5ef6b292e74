//! The gateway's own answers. In: a status the proxy decided (no route, a refusal, an
//! upstream failure). Out: the response it goes out as: a short text body, and a
//! `connection: close` after a 400 (what follows a refused head, or a body never read, cannot
//! be trusted to start a request).

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_TYPE};
use http::{HeaderValue, Response, StatusCode};

use crate::lifecycle::body::{ProxyBody, empty, full};

/// A bodiless answer with a short text reason.
pub(crate) fn status(code: StatusCode) -> Response<ProxyBody> {
    let mut r = Response::new(full(Bytes::from(format!(
        "{}\n",
        code.canonical_reason().unwrap_or("error")
    ))));
    *r.status_mut() = code;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

pub(crate) fn with_empty_body(resp: Response<()>) -> Response<ProxyBody> {
    resp.map(|()| empty())
}

/// Marks a refusal to close the connection after it: what follows a head that was refused
/// (or a body that was never read) cannot be trusted to start a request.
pub(crate) fn close_after<B>(mut resp: Response<B>) -> Response<B> {
    if resp.status() == StatusCode::BAD_REQUEST {
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}
