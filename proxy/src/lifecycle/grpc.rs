//! The gateway's own answers to gRPC clients. In: a response the gateway made itself (no
//! route, a policy denial, no endpoint, an upstream failure; the service knows which answers
//! came from an upstream) to a POST whose `Content-Type` is gRPC's, and the [`Override`] a
//! few of them carry. Out: the same answer as gRPC's "Trailers-Only"
//! response: HTTP 200, `content-type: application/grpc`, `grpc-status` and `grpc-message`,
//! no body (one HEADERS frame that ends the stream), the other headers kept
//! (`WWW-Authenticate`, `Retry-After`, `X-RateLimit-*`, `X-Request-Id`).
//!
//! Without this a gRPC client derives a status from the HTTP code alone, and gets `UNKNOWN`
//! for a 500: GRPCRoute requires `UNAVAILABLE` for traffic to invalid backends. The codes:
//! 400 `INTERNAL`, 401 `UNAUTHENTICATED`, 403 `PERMISSION_DENIED`, 404 `UNIMPLEMENTED` (no
//! route: as a gRPC server answers an unknown method), 421, 502 and 503 `UNAVAILABLE`, an
//! invalid or missing backend `UNAVAILABLE`, any other 500 `INTERNAL`, as gRPC's HTTP mapping
//! has them; then two where the gateway knows more than an HTTP status says: 408 and 504
//! `DEADLINE_EXCEEDED` (the gateway's timeout ran out, and the upstream may have acted on the
//! call: `UNAVAILABLE` would invite a retry), 413, 429 and 431 `RESOURCE_EXHAUSTED` (a quota
//! or a size limit, not a fault to retry). The rest `UNKNOWN`. Only POST requests are gRPC
//! calls.
//! Answers from upstreams are never touched: a gRPC server's own statuses pass as they are.

use std::borrow::Cow;

use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, HeaderName};
use http::{HeaderValue, Response, StatusCode};

use crate::lifecycle::body::{ProxyBody, empty};

/// `grpc-status`.
static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`.
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// gRPC status codes the gateway answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Code {
    Unknown = 2,
    DeadlineExceeded = 4,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl Code {
    /// The code of a local answer with HTTP status `status`.
    pub fn of(status: StatusCode) -> Code {
        match status.as_u16() {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            408 | 504 => Code::DeadlineExceeded,
            413 | 429 | 431 => Code::ResourceExhausted,
            421 | 502 | 503 => Code::Unavailable,
            500 => Code::Internal,
            _ => Code::Unknown,
        }
    }

    fn header_value(self) -> HeaderValue {
        HeaderValue::from(u16::from(self as u8))
    }
}

/// What a gRPC client is told instead of what the HTTP status implies, as an extension of the
/// few local answers that need it (an invalid backend, a policy's message).
#[derive(Debug, Clone, Default)]
pub(crate) struct Override {
    /// The gRPC code when it is not [`Code::of`] the HTTP status.
    pub code: Option<Code>,
    /// What `grpc-message` says when not the HTTP status's reason phrase (a policy's
    /// configured message).
    pub message: Option<Cow<'static, str>>,
}

/// Whether `content_type` is gRPC's: `application/grpc`, alone or with a `+format` or
/// parameters (`application/grpc-web` is another protocol: module `grpc_web`).
pub(crate) fn is_grpc(content_type: &HeaderValue) -> bool {
    let v = content_type.as_bytes();
    const GRPC: &[u8] = b"application/grpc";
    v.len() >= GRPC.len()
        && v[..GRPC.len()].eq_ignore_ascii_case(GRPC)
        && matches!(v.get(GRPC.len()), None | Some(b'+' | b';' | b' '))
}

/// `resp`, a local answer, as a gRPC Trailers-Only answer when it is an error (status 400
/// or more); anything else unchanged. The caller keeps upstream answers away.
pub(crate) fn trailers_only(resp: Response<ProxyBody>) -> Response<ProxyBody> {
    let status = resp.status();
    if status.as_u16() < 400 {
        return resp;
    }
    let (mut parts, _) = resp.into_parts();
    let over = parts.extensions.remove::<Override>().unwrap_or_default();
    let code = over.code.unwrap_or_else(|| Code::of(status));
    let message = over
        .message
        .as_deref()
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .or(status.canonical_reason())
        .unwrap_or("error");
    parts.status = StatusCode::OK;
    parts.headers.remove(CONTENT_LENGTH);
    parts
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    parts
        .headers
        .insert(GRPC_STATUS.clone(), code.header_value());
    if let Ok(v) = HeaderValue::from_str(&percent_encode(message)) {
        parts.headers.insert(GRPC_MESSAGE.clone(), v);
    }
    Response::from_parts(parts, empty())
}

/// The `grpc-status` of a response head (Trailers-Only) or of trailers: a decimal number;
/// `None` when absent or not a number.
pub(crate) fn status_of(headers: &HeaderMap) -> Option<u32> {
    let v = headers.get(&GRPC_STATUS)?.as_bytes();
    if v.is_empty() || v.len() > 9 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0, |n, d| n * 10 + u32::from(d - b'0')))
}

/// `grpc-message` encoding: bytes outside printable ASCII, and `%`, as `%XX`.
fn percent_encode(text: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http_body_util::BodyExt as _;

    use super::*;
    use crate::lifecycle::body::full;

    fn local(status: StatusCode, reply: Option<Override>) -> Response<ProxyBody> {
        let mut r = Response::new(full(Bytes::from_static(b"Not Found\n")));
        *r.status_mut() = status;
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        r.headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from_static("10"));
        r.headers_mut()
            .insert("retry-after", HeaderValue::from_static("3"));
        if let Some(reply) = reply {
            r.extensions_mut().insert(reply);
        }
        r
    }

    #[test]
    fn grpc_content_types() {
        for ct in [
            "application/grpc",
            "application/grpc+proto",
            "application/GRPC+json",
            "application/grpc; charset=utf-8",
        ] {
            assert!(is_grpc(&HeaderValue::from_static(ct)), "{ct}");
        }
        for ct in [
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/json",
            "application/grp",
            "",
        ] {
            assert!(!is_grpc(&HeaderValue::from_static(ct)), "{ct}");
        }
    }

    #[test]
    fn codes_of_local_answers() {
        let cases = [
            (401, Code::Unauthenticated),
            (403, Code::PermissionDenied),
            (404, Code::Unimplemented),
            (408, Code::DeadlineExceeded),
            (413, Code::ResourceExhausted),
            (421, Code::Unavailable),
            (429, Code::ResourceExhausted),
            (431, Code::ResourceExhausted),
            (400, Code::Internal),
            (409, Code::Unknown),
            (500, Code::Internal),
            (502, Code::Unavailable),
            (503, Code::Unavailable),
            (504, Code::DeadlineExceeded),
        ];
        for (status, code) in cases {
            assert_eq!(
                Code::of(StatusCode::from_u16(status).unwrap()),
                code,
                "{status}"
            );
        }
    }

    #[tokio::test]
    async fn a_local_error_becomes_trailers_only() {
        let r = trailers_only(local(StatusCode::NOT_FOUND, None));
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["content-type"], "application/grpc");
        assert_eq!(r.headers()["grpc-status"], "12");
        assert_eq!(r.headers()["grpc-message"], "Not Found");
        assert_eq!(r.headers()["retry-after"], "3", "other headers are kept");
        assert!(r.headers().get("content-length").is_none());
        assert!(hyper::body::Body::is_end_stream(r.body()));
        assert!(r.into_body().collect().await.unwrap().to_bytes().is_empty());
    }

    #[test]
    fn the_reply_may_name_its_code_and_message() {
        let reply = Override {
            code: Some(Code::Unavailable),
            message: Some("Zugriff verweigert: 100% \n".into()),
        };
        let r = trailers_only(local(StatusCode::INTERNAL_SERVER_ERROR, Some(reply)));
        assert_eq!(r.headers()["grpc-status"], "14");
        assert_eq!(
            r.headers()["grpc-message"],
            "Zugriff verweigert: 100%25",
            "trimmed, % encoded"
        );
        let reply = Override {
            code: None,
            message: Some("über".into()),
        };
        let r = trailers_only(local(StatusCode::FORBIDDEN, Some(reply)));
        assert_eq!(r.headers()["grpc-status"], "7");
        assert_eq!(r.headers()["grpc-message"], "%C3%BCber");
    }

    #[test]
    fn successes_are_left_alone() {
        // (Upstream answers never reach `trailers_only`: tests/grpc.rs shows one passing.)
        let r = trailers_only(local(StatusCode::FOUND, None));
        assert_eq!(r.status(), StatusCode::FOUND);
        assert!(r.headers().get("grpc-status").is_none());
    }

    #[test]
    fn status_of_reads_a_decimal_grpc_status() {
        let of = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("grpc-status", HeaderValue::from_static(v));
            status_of(&h)
        };
        assert_eq!(of("0"), Some(0));
        assert_eq!(of("14"), Some(14));
        assert_eq!(of("016"), Some(16));
        for bad in ["", "-1", "1 ", "x", "1234567890"] {
            assert_eq!(of(bad), None, "{bad:?}");
        }
        assert_eq!(status_of(&HeaderMap::new()), None);
        let converted = trailers_only(local(StatusCode::NOT_FOUND, None));
        assert_eq!(status_of(converted.headers()), Some(12));
    }
}
