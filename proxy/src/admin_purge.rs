//! `POST /cache/purge` on the admin server. In: a JSON body naming what to remove
//! (`{"host": .., "route": .., "prefix": ..}`, every field optional, all given must match;
//! `{}` removes everything) and the caller's `Authorization`. Out: `{"purged": N}`.
//!
//! A purge empties the cache in front of the backends, so it is refused unless the operator
//! named a token file (`--admin-token-file`) and the caller sends that token as
//! `Authorization: Bearer`: 403 without a configured token (loopback is not enough here),
//! 401 without the header, 403 with another token.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;

use crate::{HttpCache, Purge};

/// Largest purge request body.
const MAX_BODY: usize = 64 * 1024;

/// Answers `POST /cache/purge`.
pub(crate) async fn purge(
    req: Request<Incoming>,
    cache: Option<&Arc<HttpCache>>,
    token: Option<&str>,
) -> Response<Full<Bytes>> {
    let answer = |code: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = code;
        r
    };
    if req.method() != Method::POST {
        return answer(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n".into(),
        );
    }
    let Some(token) = token else {
        return answer(
            StatusCode::FORBIDDEN,
            "forbidden: /cache/purge needs --admin-token-file\n".into(),
        );
    };
    let sent = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(sent) = sent else {
        let mut r = answer(StatusCode::UNAUTHORIZED, "unauthorized\n".into());
        r.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer"),
        );
        return r;
    };
    {
        use subtle::ConstantTimeEq;
        if !bool::from(sent.as_bytes().ct_eq(token.as_bytes())) {
            return answer(StatusCode::FORBIDDEN, "forbidden\n".into());
        }
    }
    let Some(cache) = cache else {
        return answer(
            StatusCode::NOT_FOUND,
            "no cache here (--cache-size 0)\n".into(),
        );
    };
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return answer(StatusCode::PAYLOAD_TOO_LARGE, "body too large\n".into()),
    };
    let what: Purge = if body.iter().all(u8::is_ascii_whitespace) {
        Purge::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(p) => p,
            Err(e) => return answer(StatusCode::BAD_REQUEST, format!("{e}\n")),
        }
    };
    let n = cache.purge(&what);
    let mut r = answer(StatusCode::OK, format!("{{\"purged\":{n}}}\n"));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}
