//! Socket tests of gRPC-Web on a GRPCRoute (`Route::grpc_web`), against a real gRPC server
//! (HTTP/2 only, hyper's server speaking gRPC's framing and trailers): the call reaches it as
//! gRPC (`application/grpc`, `te: trailers`, the messages decoded) and its answer comes back
//! as gRPC-Web (the messages, then the trailers as a message flagged 0x80; base64 for
//! `-text`), over HTTP/1.1 as browsers speak it and over HTTP/2. Streams stream, a
//! Trailers-Only answer keeps its status in the head, a bad body gets a clean gRPC status,
//! CORS preflights are answered as the route's filter says, and a route from an HTTPRoute
//! leaves gRPC-Web alone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use common::*;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tollgate_api::{Backend, BackendProtocol, Cors, Filter, Route};

/// A gRPC message frame.
fn msg(flag: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![flag];
    f.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The frames of a body: (flag, payload).
fn frames(mut body: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    while !body.is_empty() {
        assert!(body.len() >= 5, "a truncated frame header: {body:?}");
        let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
        assert!(body.len() >= 5 + len, "a truncated frame: {body:?}");
        out.push((body[0], body[5..5 + len].to_vec()));
        body = &body[5 + len..];
    }
    out
}

/// Base64 text whose chunks may each be padded, decoded.
fn unbase64(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut start = 0;
    for end in (4..=text.len()).step_by(4) {
        if text[end - 1] == b'=' || end == text.len() {
            out.extend(STANDARD.decode(&text[start..end]).unwrap());
            start = end;
        }
    }
    assert_eq!(start, text.len(), "whole groups: {text:?}");
    out
}

type Out = BoxBody<Bytes, Infallible>;

fn grpc_trailers(status: &'static str, message: Option<&'static str>) -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from_static(status));
    if let Some(m) = message {
        t.insert("grpc-message", HeaderValue::from_static(m));
    }
    t.insert("x-trailer", HeaderValue::from_static("yes"));
    t
}

fn stream_of(frames: Vec<Frame<Bytes>>) -> Out {
    StreamBody::new(futures_util::stream::iter(
        frames.into_iter().map(Ok::<_, Infallible>),
    ))
    .boxed()
}

/// The gRPC server's methods, by path: `Unary` answers each message `m` with `echo:m`;
/// `Stream` sends `one`, waits for `release`, then `two` and `three`; `Fail` ends with
/// `grpc-status: 5` in its trailers; `TrailersOnly` answers `grpc-status: 7` in its head;
/// `Bare` answers `grpc-status: 14` and nothing else, not even a content type.
/// Every answer says the `content-type` and `te` the call came with.
async fn grpc(req: Request<Incoming>, release: Arc<Notify>) -> Result<Response<Out>, Infallible> {
    let method = req.uri().path().rsplit('/').next().unwrap_or("").to_owned();
    let seen = |n| {
        req.headers()
            .get(n)
            .cloned()
            .unwrap_or(HeaderValue::from_static("-"))
    };
    let (ct, te) = (seen("content-type"), seen("te"));
    if method == "Bare" {
        // A Trailers-Only answer with the status alone, as some servers send it.
        let r = Response::builder().header("grpc-status", "14");
        return Ok(r.body(stream_of(vec![])).unwrap());
    }
    let head = Response::builder()
        .header("content-type", "application/grpc+proto")
        .header("x-seen-content-type", ct)
        .header("x-seen-te", te);
    let Ok(body) = req.into_body().collect().await else {
        return Ok(head.status(400).body(stream_of(vec![])).unwrap());
    };
    let body = body.to_bytes();
    let resp = match method.as_str() {
        "Unary" => {
            let mut out: Vec<Frame<Bytes>> = frames(&body)
                .into_iter()
                .map(|(_, m)| Frame::data(Bytes::from(msg(0, &[b"echo:", &m[..]].concat()))))
                .collect();
            out.push(Frame::trailers(grpc_trailers("0", None)));
            head.body(stream_of(out))
        }
        "Stream" => {
            let body = futures_util::stream::unfold(0u8, move |i| {
                let release = release.clone();
                async move {
                    let frame = match i {
                        0 => Frame::data(Bytes::from(msg(0, b"one"))),
                        1 => {
                            release.notified().await;
                            Frame::data(Bytes::from(msg(0, b"two")))
                        }
                        2 => Frame::data(Bytes::from(msg(0, b"three"))),
                        3 => Frame::trailers(grpc_trailers("0", None)),
                        _ => return None,
                    };
                    Some((Ok::<_, Infallible>(frame), i + 1))
                }
            });
            head.body(StreamBody::new(body).boxed())
        }
        "Fail" => head.body(stream_of(vec![Frame::trailers(grpc_trailers(
            "5",
            Some("no such thing"),
        ))])),
        "TrailersOnly" => head
            .header("grpc-status", "7")
            .header("grpc-message", "denied")
            .body(stream_of(vec![])),
        _ => head.status(404).body(stream_of(vec![])),
    };
    Ok(resp.unwrap())
}

/// The gRPC server, and what releases its streams.
async fn grpc_server() -> (SocketAddr, Arc<Notify>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let release = Arc::new(Notify::new());
    let r = release.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let r = r.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| grpc(req, r.clone()));
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (addr, release)
}

fn h2c_backend(addr: SocketAddr) -> Backend {
    Backend {
        protocol: BackendProtocol::H2c,
        ..backend_at(addr)
    }
}

fn grpc_route(filters: Vec<Filter>) -> Route {
    let mut r = with_filters(
        route("greeter", "/test.Echo/", vec![wb("grpc", 1)]),
        filters,
    );
    r.grpc_web = true;
    r.max_request_body_bytes = Some(4096);
    r
}

/// A proxy with the GRPCRoute to the gRPC server; its URL and the server's stream release.
async fn proxy(filters: Vec<Filter>) -> (tollgate_proxy::Proxy, String, Arc<Notify>) {
    let (addr, release) = grpc_server().await;
    let (p, url) = proxy_with(vec![grpc_route(filters)], vec![("grpc", h2c_backend(addr))]).await;
    (p, url, release)
}

fn call(url: &str, method: &str, content_type: &str, body: Vec<u8>) -> Request<Full<Bytes>> {
    Request::post(format!("{url}/test.Echo/{method}"))
        .header("content-type", content_type)
        .header("x-grpc-web", "1")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// The trailer frame's lines, as a map.
fn trailer_lines(payload: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(payload).unwrap();
    assert!(text.ends_with("\r\n"), "{text:?}");
    text.split_terminator("\r\n").map(str::to_owned).collect()
}

#[tokio::test]
async fn a_unary_binary_call_is_translated_both_ways_over_http1_and_http2() {
    let (_p, url, _) = proxy(vec![]).await;
    for (client, version) in [(h1_client(), "HTTP/1.1"), (h2c_client(), "HTTP/2")] {
        let body = [msg(0, b"hi"), msg(0, b"there")].concat();
        let a = send(
            &client,
            call(&url, "Unary", "application/grpc-web+proto", body),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK, "{version}: {a:?}");
        assert_eq!(
            a.headers["content-type"], "application/grpc-web+proto",
            "{version}"
        );
        assert_eq!(
            a.headers["x-seen-content-type"], "application/grpc+proto",
            "{version}"
        );
        assert_eq!(a.headers["x-seen-te"], "trailers", "{version}");
        assert!(a.headers.get("grpc-status").is_none(), "{version}");
        let f = frames(&a.body);
        assert_eq!(f.len(), 3, "{version}: {f:?}");
        assert_eq!(f[0], (0, b"echo:hi".to_vec()), "{version}");
        assert_eq!(f[1], (0, b"echo:there".to_vec()), "{version}");
        assert_eq!(f[2].0, 0x80, "{version}");
        assert_eq!(
            trailer_lines(&f[2].1),
            ["grpc-status: 0", "x-trailer: yes"],
            "{version}"
        );
    }
}

#[tokio::test]
async fn a_unary_text_call_is_decoded_and_its_answer_encoded() {
    let (_p, url, _) = proxy(vec![]).await;
    for client in [h1_client(), h2c_client()] {
        let body = STANDARD.encode(msg(0, b"hello")).into_bytes();
        let a = send(
            &client,
            call(&url, "Unary", "application/grpc-web-text", body),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        assert_eq!(a.headers["content-type"], "application/grpc-web-text");
        assert_eq!(a.headers["x-seen-content-type"], "application/grpc");
        let f = frames(&unbase64(&a.body));
        assert_eq!(f[0], (0, b"echo:hello".to_vec()));
        assert_eq!(f[1].0, 0x80);
        assert_eq!(trailer_lines(&f[1].1)[0], "grpc-status: 0");
    }
}

/// A text body may come in chunks each padded on its own, and cut anywhere between them.
#[tokio::test]
async fn a_text_body_in_padded_chunks_cut_mid_group_is_decoded() {
    let (_p, url, _) = proxy(vec![]).await;
    let first = STANDARD.encode(msg(0, b"a")); // "AAAAAAFh": no padding
    let second = STANDARD.encode(msg(0, b"bc")); // padded
    let third = STANDARD.encode(msg(0, b"xyz12")); // padded
    assert!(second.ends_with('=') && third.ends_with('='));
    let chunks: Vec<String> = vec![
        first[..3].to_owned(),
        format!("{}{}", &first[3..], &second[..5]),
        second[5..].to_owned(),
        third[..1].to_owned(),
        third[1..].to_owned(),
    ];
    let stream = futures_util::stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from(c)))),
    );
    let mut sender = h2_connection(&url).await;
    let req = Request::post(format!("{url}/test.Echo/Unary"))
        .header("content-type", "application/grpc-web-text+proto")
        .body(StreamBody::new(stream))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers()["content-type"],
        "application/grpc-web-text+proto"
    );
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let f = frames(&unbase64(&body));
    let payloads: Vec<&[u8]> = f.iter().map(|(_, p)| &p[..]).collect();
    assert_eq!(payloads[..3], [&b"echo:a"[..], b"echo:bc", b"echo:xyz12"]);
}

/// A server stream's messages reach the client as the server sends them: the first arrives
/// while the server holds the rest back (nothing waits for the whole body).
#[tokio::test]
async fn server_streaming_streams_in_both_forms() {
    let (_p, url, release) = proxy(vec![]).await;
    for (client, ct) in [
        (h1_client(), "application/grpc-web-text"),
        (h2c_client(), "application/grpc-web"),
    ] {
        let text = ct.ends_with("-text");
        let req = call(&url, "Stream", ct, msg(0, b""));
        let req = if text {
            let (parts, _) = req.into_parts();
            Request::from_parts(parts, Full::new(Bytes::from(STANDARD.encode(msg(0, b"")))))
        } else {
            req
        };
        let resp = client.request(req).await.unwrap();
        assert_eq!(resp.headers()["content-type"], ct);
        let mut body = resp.into_body();
        let mut got = Vec::new();
        // Whole base64 groups only: a chunk may end mid-group on the client's side.
        let decoded = |got: &[u8]| {
            if text {
                unbase64(&got[..got.len() / 4 * 4])
            } else {
                got.to_vec()
            }
        };
        // Until the first message is whole; the server sends no more before the release.
        while decoded(&got).len() < 8 {
            let frame = body.frame().await.unwrap().unwrap();
            got.extend_from_slice(&frame.into_data().unwrap());
        }
        assert_eq!(frames(&decoded(&got)), [(0, b"one".to_vec())], "{ct}");
        release.notify_one();
        while let Some(frame) = body.frame().await {
            got.extend_from_slice(&frame.unwrap().into_data().unwrap());
        }
        let f = frames(&decoded(&got));
        let payloads: Vec<&[u8]> = f.iter().map(|(_, p)| &p[..]).collect();
        assert_eq!(payloads[..3], [&b"one"[..], b"two", b"three"], "{ct}");
        assert_eq!(f[3].0, 0x80, "{ct}");
        assert_eq!(f.len(), 4, "{ct}");
    }
}

#[tokio::test]
async fn an_error_status_in_the_trailers_is_the_last_message() {
    let (_p, url, _) = proxy(vec![]).await;
    let a = send(
        &h1_client(),
        call(&url, "Fail", "application/grpc-web", msg(0, b"")),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    let f = frames(&a.body);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].0, 0x80);
    assert_eq!(
        trailer_lines(&f[0].1),
        [
            "grpc-status: 5",
            "grpc-message: no such thing",
            "x-trailer: yes"
        ]
    );
}

#[tokio::test]
async fn a_trailers_only_answer_keeps_its_status_in_the_head() {
    let (_p, url, _) = proxy(vec![]).await;
    for ct in ["application/grpc-web", "application/grpc-web-text"] {
        let body = if ct.ends_with("-text") {
            STANDARD.encode(msg(0, b"")).into_bytes()
        } else {
            msg(0, b"")
        };
        let a = send(&h1_client(), call(&url, "TrailersOnly", ct, body)).await;
        assert_eq!(a.status, StatusCode::OK, "{ct}");
        assert_eq!(a.headers["content-type"], ct);
        assert_eq!(a.headers["grpc-status"], "7", "{ct}");
        assert_eq!(a.headers["grpc-message"], "denied", "{ct}");
        assert!(a.body.is_empty(), "{ct}: {a:?}");
    }
    let a = send(
        &h1_client(),
        call(&url, "Bare", "application/grpc-web", msg(0, b"")),
    )
    .await;
    assert_eq!(a.headers["content-type"], "application/grpc-web", "{a:?}");
    assert_eq!(a.headers["grpc-status"], "14");
    assert!(a.body.is_empty());
}

/// What a hostile or broken client sends gets a gRPC status of the gateway's, in the call's
/// own gRPC-Web form: never a hang, a panic or a buffer the size of the declared message.
#[tokio::test]
async fn bad_bodies_get_clean_grpc_statuses() {
    let (_p, url, _) = proxy(vec![]).await;
    let huge = [&[0u8, 0xff, 0xff, 0xff, 0xff][..], b"only a few bytes"].concat();
    let cases: [(&str, &str, Vec<u8>, &str); 5] = [
        (
            "bad base64",
            "application/grpc-web-text",
            b"AAAA!!!!".to_vec(),
            "13",
        ),
        (
            "truncated base64",
            "application/grpc-web-text",
            b"AAAAAAF".to_vec(),
            "13",
        ),
        (
            "a trailer frame in a request",
            "application/grpc-web",
            msg(0x80, b""),
            "13",
        ),
        (
            "a truncated message",
            "application/grpc-web",
            msg(0, b"abc")[..6].to_vec(),
            "13",
        ),
        (
            "a message over the body limit",
            "application/grpc-web",
            huge,
            "8",
        ),
    ];
    for (what, ct, body, code) in cases {
        for client in [h1_client(), h2c_client()] {
            let a = send(&client, call(&url, "Unary", ct, body.clone())).await;
            assert_eq!(a.status, StatusCode::OK, "{what}: {a:?}");
            assert_eq!(a.headers["content-type"], ct, "{what}");
            assert_eq!(a.headers["grpc-status"], code, "{what}: {a:?}");
            assert!(a.body.is_empty(), "{what}");
        }
    }
}

#[tokio::test]
async fn the_gateways_own_answers_are_grpc_web_statuses() {
    let (_p, url, _) = proxy(vec![]).await;
    let req = Request::post(format!("{url}/other.Svc/Call"))
        .header("content-type", "application/grpc-web-text")
        .body(Full::new(Bytes::from(STANDARD.encode(msg(0, b"")))))
        .unwrap();
    let a = send(&h1_client(), req).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.headers["content-type"], "application/grpc-web-text");
    assert_eq!(a.headers["grpc-status"], "12");
    assert_eq!(a.headers["grpc-message"], "Not Found");
}

fn cors() -> Filter {
    let list = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
    Filter::Cors(Cors {
        allow_origins: list(&["https://app.example"]),
        allow_credentials: false,
        allow_methods: list(&["POST"]),
        allow_headers: list(&["content-type", "x-grpc-web", "x-user-agent"]),
        expose_headers: list(&["grpc-status", "grpc-message"]),
        max_age: 600,
    })
}

fn preflight(url: &str, origin: &str) -> Request<Full<Bytes>> {
    Request::options(format!("{url}/test.Echo/Unary"))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type,x-grpc-web")
        .body(Full::default())
        .unwrap()
}

#[tokio::test]
async fn cors_preflights_are_answered_as_the_routes_filter_says() {
    let (_p, url, _) = proxy(vec![cors()]).await;
    let c = h1_client();
    let a = send(&c, preflight(&url, "https://app.example")).await;
    assert_eq!(a.status, StatusCode::OK);
    let h = |n: &str| a.headers.get(n).map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(
        h("access-control-allow-origin").as_deref(),
        Some("https://app.example")
    );
    assert_eq!(h("access-control-allow-methods").as_deref(), Some("POST"));
    assert_eq!(
        h("access-control-allow-headers").as_deref(),
        Some("content-type, x-grpc-web, x-user-agent")
    );
    assert_eq!(h("access-control-max-age").as_deref(), Some("600"));

    let refused = send(&c, preflight(&url, "https://evil.example")).await;
    assert_eq!(refused.status, StatusCode::OK);
    assert!(
        !refused
            .headers
            .keys()
            .any(|k| k.as_str().starts_with("access-control-")),
        "{refused:?}"
    );

    // The call itself: the browser may read the status headers.
    let mut req = call(&url, "TrailersOnly", "application/grpc-web", msg(0, b""));
    req.headers_mut()
        .insert("origin", HeaderValue::from_static("https://app.example"));
    let a = send(&c, req).await;
    assert_eq!(
        a.headers["access-control-allow-origin"],
        "https://app.example"
    );
    assert_eq!(
        a.headers["access-control-expose-headers"],
        "grpc-status, grpc-message"
    );
    assert_eq!(a.headers["grpc-status"], "7");
}

/// An HTTPRoute's backend gets gRPC-Web as the client sent it: translating is the
/// GRPCRoute's promise, and a backend behind an HTTPRoute may speak gRPC-Web itself.
#[tokio::test]
async fn a_route_from_an_httproute_passes_grpc_web_through() {
    let b = echo_backend("web").await;
    let (_p, url) = proxy_with(
        vec![route("web", "/test.Echo/", vec![wb("b", 1)])],
        vec![("b", backend_of(&[&b]))],
    )
    .await;
    let a = send(
        &h1_client(),
        call(&url, "Unary", "application/grpc-web", msg(0, b"x")),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.upstream_header("content-type").as_deref(),
        Some("application/grpc-web")
    );
}
