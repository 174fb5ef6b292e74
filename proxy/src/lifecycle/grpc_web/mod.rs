//! gRPC-Web, translated to gRPC at the gateway. In: a POST whose `Content-Type` is
//! `application/grpc-web` or `application/grpc-web-text` (each alone or with `+proto` or
//! another format), over any HTTP version, on a route compiled from a GRPCRoute
//! (`Route::grpc_web`). Out, to the backend: an HTTP/2 gRPC call (`application/grpc` with the
//! same format, `te: trailers`, the body decoded by [`decode::RequestBody`]); to the client,
//! the backend's answer in the request's gRPC-Web form ([`Web::answer`]): the content type,
//! the messages, and the trailers as a last message ([`encode::ResponseBody`]). A
//! Trailers-Only answer (`grpc-status` in the head) keeps its status in the head, which the
//! protocol allows, and has no body. The gateway's own error answers to a gRPC-Web client are
//! gRPC statuses in that same Trailers-Only form ([`Web::local`]).
//!
//! A route from an HTTPRoute leaves gRPC-Web alone: its backend speaks it, or says why not.
//! Nothing is held whole: both bodies stream, so server streaming works and a hostile body
//! costs no memory (module `decode` bounds what it keeps).

pub(crate) mod decode;
pub(crate) mod encode;

use std::sync::Arc;

use http::header::{CONTENT_LENGTH, CONTENT_TYPE, TE};
use http::{HeaderMap, HeaderValue, Method, Response};

use crate::lifecycle::body::ProxyBody;
use crate::lifecycle::grpc;
pub(crate) use encode::StatusSlot;

/// A gRPC-Web call's form, read from its `Content-Type`.
#[derive(Debug, Clone)]
pub(crate) struct Web {
    /// `application/grpc-web-text`: both bodies are base64.
    pub text: bool,
    /// The backend's `Content-Type`: `application/grpc` and the call's `+format`.
    upstream_type: HeaderValue,
    /// The answer's `Content-Type`: the request's, without parameters.
    answer_type: HeaderValue,
}

impl Web {
    /// The form of a gRPC-Web call; `None` for any other request (a gRPC call is a POST).
    pub fn of(method: &Method, content_type: Option<&HeaderValue>) -> Option<Web> {
        if method != Method::POST {
            return None;
        }
        let v = content_type?.to_str().ok()?;
        let media = v.split(';').next().unwrap_or(v).trim();
        const PREFIX: &str = "application/grpc-web";
        let rest = media
            .get(..PREFIX.len())
            .filter(|p| p.eq_ignore_ascii_case(PREFIX))
            .and(media.get(PREFIX.len()..))?;
        let (text, format) = match rest.get(..5) {
            Some(t) if t.eq_ignore_ascii_case("-text") => (true, &rest[5..]),
            _ => (false, rest),
        };
        if !(format.is_empty() || (format.starts_with('+') && format.len() > 1)) {
            return None;
        }
        let format = format.to_ascii_lowercase();
        let answer = if text {
            format!("application/grpc-web-text{format}")
        } else {
            format!("application/grpc-web{format}")
        };
        Some(Web {
            text,
            upstream_type: HeaderValue::from_str(&format!("application/grpc{format}")).ok()?,
            answer_type: HeaderValue::from_str(&answer).ok()?,
        })
    }

    /// The request head as a gRPC call's. A text body's length changes as it is decoded, so
    /// its `Content-Length` goes.
    pub fn upstream_head(&self, headers: &mut HeaderMap) {
        headers.insert(CONTENT_TYPE, self.upstream_type.clone());
        headers.insert(TE, HeaderValue::from_static("trailers"));
        if self.text {
            headers.remove(CONTENT_LENGTH);
        }
    }

    /// The backend's answer as gRPC-Web. An answer that is not gRPC's (an HTTP error page
    /// of a backend that is no gRPC server) passes as it is, as for gRPC clients.
    pub fn answer(
        &self,
        resp: Response<ProxyBody>,
        status: Option<Arc<StatusSlot>>,
    ) -> Response<ProxyBody> {
        // A Trailers-Only answer without a content type is gRPC's too: some servers send
        // only the status.
        let is_grpc = match resp.headers().get(CONTENT_TYPE) {
            Some(ct) => grpc::is_grpc(ct),
            None => resp.headers().contains_key("grpc-status"),
        };
        if !is_grpc {
            return resp;
        }
        let (mut parts, body) = resp.into_parts();
        parts.headers.insert(CONTENT_TYPE, self.answer_type.clone());
        parts.headers.remove(CONTENT_LENGTH);
        if parts.headers.contains_key("grpc-status") {
            // Trailers-Only: the status stays in the head; there is no body to translate.
            return Response::from_parts(parts, body);
        }
        let body = encode::ResponseBody::new(body, self.text, status);
        Response::from_parts(parts, http_body_util::BodyExt::boxed(body))
    }

    /// A gRPC Trailers-Only answer of the gateway's own (module `grpc`) with this call's
    /// gRPC-Web content type.
    pub fn local(&self, resp: Response<ProxyBody>) -> Response<ProxyBody> {
        let mut resp = grpc::trailers_only(resp);
        if resp.headers().contains_key("grpc-status") {
            resp.headers_mut()
                .insert(CONTENT_TYPE, self.answer_type.clone());
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(ct: &'static str) -> Option<(bool, String, String)> {
        Web::of(&Method::POST, Some(&HeaderValue::from_static(ct))).map(|w| {
            (
                w.text,
                w.upstream_type.to_str().unwrap().to_owned(),
                w.answer_type.to_str().unwrap().to_owned(),
            )
        })
    }

    #[test]
    fn grpc_web_content_types() {
        let t = |text, up: &str, ans: &str| Some((text, up.to_owned(), ans.to_owned()));
        assert_eq!(
            of("application/grpc-web"),
            t(false, "application/grpc", "application/grpc-web")
        );
        assert_eq!(
            of("application/grpc-web+proto"),
            t(
                false,
                "application/grpc+proto",
                "application/grpc-web+proto"
            )
        );
        assert_eq!(
            of("application/grpc-web-text"),
            t(true, "application/grpc", "application/grpc-web-text")
        );
        assert_eq!(
            of("Application/GRPC-Web-Text+Proto; charset=utf-8"),
            t(
                true,
                "application/grpc+proto",
                "application/grpc-web-text+proto"
            )
        );
        for other in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc-webx",
            "application/grpc-web+",
            "application/grpc-web-textual",
            "text/plain",
        ] {
            assert_eq!(of(other), None, "{other}");
        }
        let ct = HeaderValue::from_static("application/grpc-web");
        assert!(
            Web::of(&Method::GET, Some(&ct)).is_none(),
            "a call is a POST"
        );
    }
}
