//! Strict HTTP/1 request framing of the requests hyper's server reads (the codec,
//! `tollgate_h1::framing`, checks the heads the proxy's own server reads). In: a request
//! hyper parsed. Out: `Ok`, or the 400 it is answered with, its connection closed.

use http::header::CONNECTION;
use http::{HeaderValue, Request, Response, StatusCode, Version};
use tollgate_h1::framing::check_request_fields;

use crate::body::ClientBody;

/// [`check_request_fields`] of a request hyper's HTTP/1 server read, as the status it is
/// answered with. Requests the proxy's own server read ([`ClientBody::Empty`]: their head
/// passed `tollgate_h1::framing::check_request_head`) and HTTP/2 ones (no such fields) are not looked at again.
pub(crate) fn check_request(req: &Request<ClientBody>) -> Result<(), StatusCode> {
    if req.version() > Version::HTTP_11 || matches!(req.body(), ClientBody::Empty) {
        return Ok(());
    }
    check_request_fields(req.headers()).map_err(|e| {
        tracing::debug!(error = %e, "request refused");
        StatusCode::BAD_REQUEST
    })
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
