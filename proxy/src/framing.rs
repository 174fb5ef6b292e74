//! Closing after a refusal. In: an answer the proxy made. Out: the same, marked to close
//! the connection when it is a 400 (HTTP/1 framing is checked by the codec,
//! `tollgate_h1::framing`, as our server reads each head: module `h1serve`).

use http::header::CONNECTION;
use http::{HeaderValue, Response, StatusCode};

/// Marks a refusal to close the connection after it: what follows a head that was refused
/// (or a body that was never read) cannot be trusted to start a request.
pub(crate) fn close_after<B>(mut resp: Response<B>) -> Response<B> {
    if resp.status() == StatusCode::BAD_REQUEST {
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}
