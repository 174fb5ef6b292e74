//! The gRPC check: Envoy's `envoy.service.auth.v3.Authorization/Check`, so services written
//! for Envoy's ext_authz (OPA-Envoy, Authorino) work unchanged. In: the request's attributes.
//! Out: the call (HTTP/2, `content-type: application/grpc`, `te: trailers`, the message
//! behind the 5-byte gRPC prefix) and the [`Decision`] of its CheckResponse.
//!
//! The CheckRequest carries `attributes.source.address` (the client), and
//! `attributes.request.http`: method, path (with query), host, scheme, protocol, headers
//! (lower-case names, repeated fields joined with `,`, and `:authority`, `:method`, `:path`
//! as Envoy adds them, when every header is forwarded), the body size, and the body when the
//! rule forwards it (`raw_body`, and `body` too when it is UTF-8).
//!
//! A CheckResponse with status code 0 (OK) allows: `ok_response.headers` are set (or
//! appended, with `append`) on the upstream request, `headers_to_remove` removed, and
//! `response_headers_to_add` added to the client's response (never Host upstream, nor a
//! hop-by-hop or framing header either way: [`super::Grant::new`]). Any other code denies
//! with `denied_response` (its status, default 403, headers less hop-by-hop and framing
//! ones, and body). A call that fails (HTTP
//! status other than 200, `grpc-status` other than 0, an unreadable message) is a failure of
//! the service: denied with 403, or let through with `failOpen`.

use std::sync::Arc;

use ::http::header::{CONTENT_TYPE, TE};
use ::http::uri::Authority;
use ::http::{HeaderName, HeaderValue, Request, Response, StatusCode, Version};
use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use tollgate_api::BackendProtocol;

use super::proto::{
    Address, AttributeContext, CheckRequest, CheckResponse, HeaderValueOption, HttpRequest, Peer,
    Request as ProtoRequest, SocketAddress,
};
use super::{CheckInput, Decision, ExternalError, Grant, Refusal, header, read_body};
use crate::lifecycle::body::{ProxyBody, full};
use crate::upstream::pool::PooledBody;
use crate::upstream::request_uri;

/// The method's path.
const CHECK_PATH: &str = "/envoy.service.auth.v3.Authorization/Check";

/// The Check call for `input`.
pub(super) fn request(
    forward: &[HeaderName],
    authority: &Authority,
    input: &CheckInput<'_>,
) -> Result<Request<ProxyBody>, ExternalError> {
    let mut headers = std::collections::HashMap::new();
    let mut add = |name: &str, value: &[u8]| {
        let value = String::from_utf8_lossy(value);
        headers
            .entry(name.to_owned())
            .and_modify(|v: &mut String| {
                v.push(',');
                v.push_str(&value);
            })
            .or_insert_with(|| value.into_owned());
    };
    if forward.is_empty() {
        add(":authority", input.host.as_bytes());
        add(":method", input.method.as_str().as_bytes());
        add(":path", input.target.as_bytes());
        for (n, v) in input.headers {
            add(n.as_str(), v.as_bytes());
        }
    } else {
        for n in forward {
            for v in input.headers.get_all(n) {
                add(n.as_str(), v.as_bytes());
            }
        }
    }
    let (body, raw_body) = match input.body {
        Some(b) => (
            std::str::from_utf8(b)
                .map(str::to_owned)
                .unwrap_or_default(),
            b.to_vec(),
        ),
        None => (String::new(), Vec::new()),
    };
    let size = input
        .body
        .map_or(-1, |b| i64::try_from(b.len()).unwrap_or(i64::MAX));
    let msg = CheckRequest {
        attributes: Some(AttributeContext {
            source: Some(Peer {
                address: Some(Address {
                    socket_address: Some(SocketAddress {
                        address: input.peer.ip().to_string(),
                        port_value: u32::from(input.peer.port()),
                    }),
                }),
            }),
            request: Some(ProtoRequest {
                http: Some(HttpRequest {
                    id: String::new(),
                    method: input.method.as_str().to_owned(),
                    headers,
                    path: input.target.to_owned(),
                    host: input.host.to_owned(),
                    scheme: input.scheme.to_owned(),
                    size,
                    protocol: "HTTP/1.1".to_owned(),
                    body,
                    raw_body,
                }),
            }),
        }),
    };
    let len = msg.encoded_len();
    let mut framed = BytesMut::with_capacity(5 + len);
    framed.put_u8(0);
    framed.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    msg.encode(&mut framed)
        .map_err(|e| ExternalError::Grpc(e.to_string()))?;
    let uri = request_uri(
        BackendProtocol::H2c,
        authority,
        CHECK_PATH,
        &::http::Uri::default(),
    )?;
    let mut req = Request::builder()
        .method(::http::Method::POST)
        .uri(uri)
        .version(Version::HTTP_2)
        .body(full(framed.freeze()))?;
    let h = req.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert(TE, HeaderValue::from_static("trailers"));
    Ok(req)
}

/// The decision of the call's answer.
pub(super) async fn decision(resp: Response<PooledBody>) -> Result<Decision, ExternalError> {
    let (parts, body) = resp.into_parts();
    if parts.status != StatusCode::OK {
        return Err(ExternalError::Grpc(format!("HTTP status {}", parts.status)));
    }
    let (body, trailers) = read_body(body).await?;
    // A trailers-only answer carries grpc-status in its headers.
    let status = trailers
        .as_ref()
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| parts.headers.get("grpc-status"));
    match status.map(HeaderValue::as_bytes) {
        Some(b"0") => {}
        Some(code) => {
            let message = trailers
                .as_ref()
                .and_then(|t| t.get("grpc-message"))
                .or_else(|| parts.headers.get("grpc-message"))
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            return Err(ExternalError::Grpc(format!(
                "grpc-status {} {message}",
                String::from_utf8_lossy(code)
            )));
        }
        None => return Err(ExternalError::Grpc("no grpc-status".into())),
    }
    let msg = unframe(&body)?;
    let check = CheckResponse::decode(msg)
        .map_err(|e| ExternalError::Grpc(format!("CheckResponse: {e}")))?;
    let code = check.status.as_ref().map_or(0, |s| s.code);
    if code == 0 {
        let ok = check.ok_response.unwrap_or_default();
        let (mut set, mut append) = (Vec::new(), Vec::new());
        for o in &ok.headers {
            if let Some(h) = option(o) {
                if o.append.as_ref().is_some_and(|a| a.value) {
                    append.push(h);
                } else {
                    set.push(h);
                }
            }
        }
        let remove = ok
            .headers_to_remove
            .iter()
            .filter_map(|n| HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes()).ok())
            .collect();
        let client = ok
            .response_headers_to_add
            .iter()
            .filter_map(option)
            .collect();
        return Ok(Decision::Allow(Arc::new(Grant::new(
            set, append, remove, client,
        ))));
    }
    let denied = check.denied_response.unwrap_or_default();
    let status = denied
        .status
        .and_then(|s| u16::try_from(s.code).ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
        .filter(|s| s.as_u16() >= 200)
        .unwrap_or(StatusCode::FORBIDDEN);
    Ok(Decision::Deny(Arc::new(Refusal::new(
        status,
        denied.headers.iter().filter_map(option),
        Bytes::from(denied.body),
    ))))
}

/// One header of a HeaderValueOption (`raw_value` wins over `value`, as in Envoy).
fn option(o: &HeaderValueOption) -> Option<(HeaderName, HeaderValue)> {
    let h = o.header.as_ref()?;
    if h.key.starts_with(':') {
        return None;
    }
    let value = if h.raw_value.is_empty() {
        h.value.as_bytes()
    } else {
        &h.raw_value
    };
    header(&h.key, value)
}

/// The message of a one-message gRPC body (uncompressed: we offer no `grpc-encoding`).
fn unframe(body: &[u8]) -> Result<&[u8], ExternalError> {
    let bad = |what: &str| ExternalError::Grpc(format!("answer framing: {what}"));
    let (head, rest) = body.split_at_checked(5).ok_or_else(|| bad("short"))?;
    if head[0] != 0 {
        return Err(bad("compressed message"));
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    rest.get(..len).ok_or_else(|| bad("truncated message"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unframe_checks_the_prefix() {
        assert_eq!(unframe(&[0, 0, 0, 0, 2, 8, 1]).unwrap(), &[8, 1]);
        assert!(unframe(&[0, 0, 0]).is_err());
        assert!(unframe(&[1, 0, 0, 0, 0]).is_err());
        assert!(unframe(&[0, 0, 0, 0, 3, 8]).is_err());
    }

    #[test]
    fn options_skip_pseudo_headers_and_prefer_raw_values() {
        let o = |k: &str, v: &str, raw: &[u8]| HeaderValueOption {
            header: Some(super::super::proto::HeaderValue {
                key: k.into(),
                value: v.into(),
                raw_value: raw.to_vec(),
            }),
            append: None,
        };
        assert!(option(&o(":path", "/x", b"")).is_none());
        let (n, v) = option(&o("X-User", "a", b"b")).unwrap();
        assert_eq!((n.as_str(), v.as_bytes()), ("x-user", &b"b"[..]));
    }
}
