//! ClientPolicy `compression` on the wire (`ports[].client.compression` of the table): a
//! real upstream answers, the proxy compresses for the client's `Accept-Encoding`, and the
//! body is decoded with real decoders and compared byte for byte. One test per rule: the
//! q-values, the size threshold, the media types, bodies already encoded, `no-transform`,
//! ranges, HEAD, `Vary`, `ETag`, gRPC, a server-sent event flushed before the next is sent,
//! a broken upstream body, the per-route opt-out, HTTP/2 and the metrics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use async_compression::tokio::bufread::{BrotliDecoder, GzipDecoder, ZstdDecoder};
use bytes::Bytes;
use common::*;
use http::{Method, Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tollgate_api::client::{ClientSettings, Compression, Encoding};
use tollgate_proxy::{Metrics, Proxy, ProxyOptions};

type Body = BoxBody<Bytes, std::io::Error>;

/// A JSON document of about 8 KiB that compresses well.
fn json_doc() -> Bytes {
    let items: Vec<String> = (0..120)
        .map(|i| format!(r#"{{"id":{i},"name":"item-{i}","tags":["a","b"],"ok":true}}"#))
        .collect();
    Bytes::from(format!(r#"{{"items":[{}]}}"#, items.join(",")))
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|e| match e {}).boxed()
}

/// A body fed frame by frame through a channel (an `Err` breaks it).
fn streamed() -> (mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>, Body) {
    let (tx, rx) = mpsc::channel(4);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (tx, BodyExt::boxed(StreamBody::new(stream)))
}

/// The upstream: answers by path (see each arm); `go` releases the second event of `/sse`.
async fn upstream(go: Arc<Notify>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let go = go.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| answer(req, go.clone()));
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

async fn answer(req: Request<Incoming>, go: Arc<Notify>) -> Result<Response<Body>, Infallible> {
    let doc = json_doc();
    let len = doc.len().to_string();
    let r = Response::builder();
    let resp = match req.uri().path() {
        "/json" | "/raw/json" => r
            .header("content-type", "application/json; charset=UTF-8")
            .header("content-length", &len)
            .header("etag", "\"v1\"")
            .header("accept-ranges", "bytes")
            .header("vary", "Origin")
            .body(full(doc)),
        "/chunked" => {
            // 500 bytes of unknown length, in two frames.
            let (tx, body) = streamed();
            tokio::spawn(async move {
                let _ = tx.send(Ok(Frame::data(Bytes::from("x".repeat(250))))).await;
                let _ = tx.send(Ok(Frame::data(Bytes::from("y".repeat(250))))).await;
            });
            r.header("content-type", "text/plain").body(body)
        }
        "/small" => r
            .header("content-type", "application/json")
            .header("content-length", "14")
            .body(full(r#"{"small":true}"#)),
        "/image" => r
            .header("content-type", "image/png")
            .header("content-length", &len)
            .body(full(doc)),
        "/identity" => r
            .header("content-type", "application/json")
            .header("content-encoding", "identity")
            .body(full(doc)),
        "/no-transform" => r
            .header("content-type", "application/json")
            .header("cache-control", "public, No-Transform")
            .body(full(doc)),
        "/range" => r
            .status(206)
            .header("content-type", "application/json")
            .header("content-range", format!("bytes 0-{}/99999", doc.len() - 1))
            .body(full(doc)),
        "/grpc" => r
            .header("content-type", "application/grpc")
            .header("grpc-status", "0")
            .body(full(doc)),
        "/sse" => {
            let (tx, body) = streamed();
            tokio::spawn(async move {
                let _ = tx.send(Ok(Frame::data(Bytes::from("data: one\n\n")))).await;
                // The next event only once the client has decoded the first.
                go.notified().await;
                let _ = tx.send(Ok(Frame::data(Bytes::from("data: two\n\n")))).await;
            });
            r.header("content-type", "text/event-stream").body(body)
        }
        "/broken" => {
            // Declares more than it sends, then fails.
            let (tx, body) = streamed();
            let chunk = doc.slice(..4096);
            tokio::spawn(async move {
                let _ = tx.send(Ok(Frame::data(chunk))).await;
                let _ = tx.send(Err(std::io::Error::other("upstream broke"))).await;
            });
            r.header("content-type", "application/json")
                .header("content-length", "100000")
                .body(body)
        }
        "/endless" => {
            let (tx, body) = streamed();
            tokio::spawn(async move {
                let line = Bytes::from(format!("{}\n", "z".repeat(1023)));
                while tx.send(Ok(Frame::data(line.clone()))).await.is_ok() {}
            });
            r.header("content-type", "text/plain").body(body)
        }
        _ => r.status(404).body(full("")),
    };
    Ok(resp.unwrap())
}

fn settings(algorithms: &[Encoding], min_bytes: u64) -> Compression {
    Compression {
        algorithms: algorithms.to_vec(),
        min_bytes,
        content_types: vec![
            "application/json".into(),
            "text/*".into(),
            "application/*".into(),
        ],
        gzip_level: None,
    }
}

struct Gateway {
    _proxy: Proxy,
    url: String,
    metrics: Arc<Metrics>,
    go: Arc<Notify>,
}

/// A proxy whose port compresses with `c`; `/raw` is a route that opts out.
async fn gateway(c: Compression) -> Gateway {
    let go = Arc::new(Notify::new());
    let up = upstream(go.clone()).await;
    let metrics = metrics();
    let proxy = Proxy::new(ProxyOptions {
        metrics: metrics.clone(),
        ..ProxyOptions::default()
    });
    let mut raw = route("raw", "/raw", vec![wb("up", 1)]);
    raw.compression_disabled = true;
    let mut port = http_port(0, vec![raw, route("all", "/", vec![wb("up", 1)])]);
    port.client = ClientSettings {
        compression: Some(c),
        ..ClientSettings::default()
    };
    proxy
        .apply(table(1, vec![port], vec![("up", backend_at(up))]))
        .await
        .unwrap();
    let url = format!("http://{}", proxy.local_addr(0).unwrap());
    Gateway {
        _proxy: proxy,
        url,
        metrics,
        go,
    }
}

fn request(method: Method, url: &str, accept: Option<&str>) -> Request<Full<Bytes>> {
    let mut b = Request::builder().method(method).uri(url);
    if let Some(a) = accept {
        b = b.header("accept-encoding", a);
    }
    b.body(Full::default()).unwrap()
}

async fn fetch(client: &TestClient, url: &str, accept: Option<&str>) -> Answer {
    send(client, request(Method::GET, url, accept)).await
}

fn header<'a>(a: &'a Answer, name: &str) -> Option<&'a str> {
    a.headers.get(name).map(|v| v.to_str().unwrap())
}

async fn decode(coding: &str, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match coding {
        "gzip" => GzipDecoder::new(body).read_to_end(&mut out).await,
        "br" => BrotliDecoder::new(body).read_to_end(&mut out).await,
        "zstd" => ZstdDecoder::new(body).read_to_end(&mut out).await,
        other => panic!("unexpected coding {other}"),
    }
    .unwrap();
    out
}

/// Asserts `a` is `doc` in `coding`, decoded.
async fn assert_coded(a: &Answer, coding: &str, doc: &[u8]) {
    assert_eq!(a.status, 200);
    assert_eq!(
        header(a, "content-encoding"),
        Some(coding),
        "{:?}",
        a.headers
    );
    assert!(a.body.len() < doc.len(), "compressed");
    assert_eq!(decode(coding, &a.body).await, doc);
}

#[tokio::test]
async fn each_algorithm_round_trips_and_is_counted() {
    let g = gateway(settings(&Encoding::ALL, 1024)).await;
    let c = h1_client();
    let doc = json_doc();
    for coding in ["zstd", "br", "gzip"] {
        let a = fetch(&c, &format!("{}/json", g.url), Some(coding)).await;
        assert_coded(&a, coding, &doc).await;
        assert_eq!(header(&a, "content-length"), None, "streamed");
    }
    for coding in ["zstd", "br", "gzip"] {
        let line = format!("tollgate_compressed_responses_total{{algorithm=\"{coding}\"}} 1");
        // The bytes are counted when the body is dropped, just after its last frame.
        let bytes_in = format!(
            "tollgate_compression_in_bytes_total{{algorithm=\"{coding}\"}} {}",
            doc.len()
        );
        let counted = eventually(|| {
            let text = g.metrics.encode();
            text.contains(&line) && text.contains(&bytes_in)
        })
        .await;
        assert!(counted, "{line} and {bytes_in} in\n{}", g.metrics.encode());
    }
}

#[tokio::test]
async fn gzip_level_from_the_policy_sets_the_ratio() {
    let doc = json_doc();
    let mut sizes = Vec::new();
    for level in [1, 9] {
        let g = gateway(Compression {
            gzip_level: Some(level),
            ..settings(&[Encoding::Gzip], 1024)
        })
        .await;
        let a = fetch(&h1_client(), &format!("{}/json", g.url), Some("gzip")).await;
        assert_coded(&a, "gzip", &doc).await;
        sizes.push(a.body.len());
    }
    assert!(
        sizes[1] < sizes[0],
        "level 9 compresses smaller than level 1: {sizes:?}"
    );
}

#[tokio::test]
async fn the_coding_follows_the_q_values_and_ties_the_policys_order() {
    let g = gateway(settings(&[Encoding::Gzip, Encoding::Br], 0)).await;
    let c = h1_client();
    let url = format!("{}/json", g.url);
    let coding = |a: &Answer| header(a, "content-encoding").map(str::to_owned);
    let cases: &[(&str, Option<&str>)] = &[
        ("br, gzip", Some("gzip")),
        ("gzip;q=0.5, br;q=0.8", Some("br")),
        ("gzip;q=0, br", Some("br")),
        ("*", Some("gzip")),
        ("*;q=0.1, gzip;q=0", Some("br")),
        ("zstd", None),
        ("identity", None),
        ("gzip;q=0.4, identity;q=0.9", None),
        ("gzip;q=7, br;q=0.x", None),
        ("", None),
    ];
    for (accept, want) in cases {
        let a = fetch(&c, &url, Some(accept)).await;
        assert_eq!(coding(&a).as_deref(), *want, "Accept-Encoding: {accept:?}");
        assert_eq!(header(&a, "vary"), Some("Origin, Accept-Encoding"));
    }
    let a = fetch(&c, &url, None).await;
    assert_eq!(coding(&a), None, "no Accept-Encoding");
    assert_eq!(a.body, json_doc());
    // A hostile field: long, repeated, malformed; answered like any other.
    let hostile = "gzip;q=0.0.0;;==,br;q=, *;q=-1, ".repeat(1500) + "br;q=0.3";
    let a = fetch(&c, &url, Some(&hostile)).await;
    assert_eq!(a.status, 200);
    assert_eq!(coding(&a).as_deref(), Some("br"));
    assert_eq!(decode("br", &a.body).await, json_doc());
}

#[tokio::test]
async fn a_declared_length_under_min_bytes_is_sent_as_it_is_but_unknown_lengths_compress() {
    let g = gateway(settings(&[Encoding::Gzip], 1024)).await;
    let c = h1_client();
    let a = fetch(&c, &format!("{}/small", g.url), Some("gzip")).await;
    assert_eq!(header(&a, "content-encoding"), None);
    assert_eq!(
        header(&a, "vary"),
        None,
        "nothing depends on Accept-Encoding"
    );
    assert_eq!(&a.body[..], br#"{"small":true}"#);
    // 500 bytes, under the threshold, but of unknown length.
    let a = fetch(&c, &format!("{}/chunked", g.url), Some("gzip")).await;
    let want = "x".repeat(250) + &"y".repeat(250);
    assert_coded(&a, "gzip", want.as_bytes()).await;
}

#[tokio::test]
async fn only_listed_media_types_compress() {
    let mut s = settings(&[Encoding::Gzip], 0);
    s.content_types = vec!["APPLICATION/JSON".into()];
    let g = gateway(s).await;
    let c = h1_client();
    // `application/json; charset=UTF-8`: parameters and case aside.
    let a = fetch(&c, &format!("{}/json", g.url), Some("gzip")).await;
    assert_coded(&a, "gzip", &json_doc()).await;
    for path in ["/image", "/chunked"] {
        let a = fetch(&c, &format!("{}{path}", g.url), Some("gzip")).await;
        assert_eq!(header(&a, "content-encoding"), None, "{path}");
        assert_eq!(header(&a, "vary"), None, "{path}");
    }
}

#[tokio::test]
async fn encoded_no_transform_and_partial_responses_pass_untouched() {
    let g = gateway(settings(&[Encoding::Gzip], 0)).await;
    let c = h1_client();
    for path in ["/identity", "/no-transform", "/range"] {
        let a = fetch(&c, &format!("{}{path}", g.url), Some("gzip")).await;
        assert_ne!(header(&a, "content-encoding"), Some("gzip"), "{path}");
        assert_eq!(header(&a, "vary"), None, "{path}");
        assert_eq!(a.body, json_doc(), "{path}");
    }
}

#[tokio::test]
async fn vary_merges_etag_weakens_and_accept_ranges_goes() {
    let g = gateway(settings(&[Encoding::Gzip], 0)).await;
    let c = h1_client();
    let a = fetch(&c, &format!("{}/json", g.url), Some("gzip")).await;
    assert_coded(&a, "gzip", &json_doc()).await;
    assert_eq!(header(&a, "vary"), Some("Origin, Accept-Encoding"));
    assert_eq!(header(&a, "etag"), Some("W/\"v1\""));
    assert_eq!(header(&a, "accept-ranges"), None);
    // Not compressed for this client: the same Vary, the upstream's ETag and ranges.
    let a = fetch(&c, &format!("{}/json", g.url), Some("identity")).await;
    assert_eq!(header(&a, "vary"), Some("Origin, Accept-Encoding"));
    assert_eq!(header(&a, "etag"), Some("\"v1\""));
    assert_eq!(header(&a, "accept-ranges"), Some("bytes"));
    assert_eq!(a.body, json_doc());
}

#[tokio::test]
async fn head_gets_the_header_fields_get_would_and_no_body() {
    let g = gateway(settings(&[Encoding::Gzip], 0)).await;
    let url = format!("{}/json", g.url);
    for client in [h1_client(), h2c_client()] {
        let get = fetch(&client, &url, Some("gzip")).await;
        let head = send(&client, request(Method::HEAD, &url, Some("gzip"))).await;
        assert!(head.body.is_empty());
        for name in [
            "content-encoding",
            "vary",
            "etag",
            "accept-ranges",
            "content-type",
        ] {
            assert_eq!(header(&head, name), header(&get, name), "{name}");
        }
        assert_eq!(header(&head, "content-encoding"), Some("gzip"));
        assert_eq!(header(&head, "content-length"), None);
    }
}

#[tokio::test]
async fn grpc_is_never_compressed() {
    let g = gateway(settings(&[Encoding::Gzip], 0)).await;
    let mut call = grpc_call(&format!("{}/grpc", g.url), "application/grpc");
    call.headers_mut()
        .insert("accept-encoding", "gzip".parse().unwrap());
    let a = send(&h2c_client(), call).await;
    assert_eq!(header(&a, "content-encoding"), None);
    assert_eq!(a.body, json_doc());
    // A GET whose answer is gRPC, though `application/*` is listed.
    let a = fetch(&h1_client(), &format!("{}/grpc", g.url), Some("gzip")).await;
    assert_eq!(header(&a, "content-encoding"), None);
    assert_eq!(header(&a, "vary"), None);
    assert_eq!(a.body, json_doc());
}

#[tokio::test]
async fn a_server_sent_event_is_flushed_before_the_next_is_sent() {
    for coding in ["gzip", "br", "zstd"] {
        let g = gateway(settings(&Encoding::ALL, 1024)).await;
        let resp = h1_client()
            .request(request(
                Method::GET,
                &format!("{}/sse", g.url),
                Some(coding),
            ))
            .await
            .unwrap();
        assert_eq!(resp.headers()["content-encoding"], coding);
        let mut body = resp.into_body();
        let mut wire = Vec::new();
        // The upstream holds the second event until `go`: the first must decode from what
        // came so far. (The timeout only turns a hang into a failure.)
        let first = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let frame = body.frame().await.unwrap().unwrap();
                wire.extend_from_slice(frame.data_ref().unwrap());
                let decoded = decode_prefix(coding, &wire).await;
                if decoded == b"data: one\n\n" {
                    return decoded;
                }
            }
        })
        .await
        .expect("the first event was held back");
        assert_eq!(first, b"data: one\n\n");
        g.go.notify_one();
        while let Some(frame) = body.frame().await {
            wire.extend_from_slice(frame.unwrap().data_ref().unwrap());
        }
        assert_eq!(
            decode(coding, &wire).await,
            b"data: one\n\ndata: two\n\n",
            "{coding}"
        );
    }
}

/// What a coding's first bytes decode to, the stream unfinished.
async fn decode_prefix(coding: &str, wire: &[u8]) -> Vec<u8> {
    use async_compression::tokio::write::{BrotliDecoder, GzipDecoder, ZstdDecoder};
    async fn run<W: tokio::io::AsyncWrite + Unpin>(mut w: W, wire: &[u8]) -> W {
        w.write_all(wire).await.unwrap();
        w.flush().await.unwrap();
        w
    }
    match coding {
        "gzip" => run(GzipDecoder::new(Vec::new()), wire).await.into_inner(),
        "br" => run(BrotliDecoder::new(Vec::new()), wire).await.into_inner(),
        _ => run(ZstdDecoder::new(Vec::new()), wire).await.into_inner(),
    }
}

#[tokio::test]
async fn an_endless_body_streams() {
    let g = gateway(settings(&[Encoding::Zstd], 0)).await;
    let resp = h1_client()
        .request(request(
            Method::GET,
            &format!("{}/endless", g.url),
            Some("zstd"),
        ))
        .await
        .unwrap();
    let mut body = resp.into_body();
    let mut decoder = async_compression::tokio::write::ZstdDecoder::new(Vec::new());
    let mut decoded = 0;
    // 4 MiB decoded, read as it comes; the body never ends.
    while decoded < 4 << 20 {
        let frame = body.frame().await.unwrap().unwrap();
        decoder.write_all(frame.data_ref().unwrap()).await.unwrap();
        decoder.flush().await.unwrap();
        decoded += decoder.get_ref().len();
        assert!(decoder.get_ref().iter().all(|&b| b == b'z' || b == b'\n'));
        decoder.get_mut().clear();
    }
}

#[tokio::test]
async fn a_broken_upstream_body_ends_the_response_as_without_compression() {
    let g = gateway(settings(&[Encoding::Gzip], 0)).await;
    for client in [h1_client(), h2c_client()] {
        for accept in ["gzip", "identity"] {
            // Broken before the head went out, the connection closes unanswered; after, the
            // body ends short (HTTP/1: no last chunk or short of its length; HTTP/2: reset).
            let sent = client
                .request(request(
                    Method::GET,
                    &format!("{}/broken", g.url),
                    Some(accept),
                ))
                .await;
            if let Ok(resp) = sent {
                let got = resp.into_body().collect().await;
                assert!(got.is_err(), "{accept}: the client must see the break");
            }
        }
    }
}

#[tokio::test]
async fn a_route_that_opts_out_is_never_compressed() {
    let g = gateway(settings(&[Encoding::Gzip], 0)).await;
    let a = fetch(&h1_client(), &format!("{}/raw/json", g.url), Some("gzip")).await;
    assert_eq!(header(&a, "content-encoding"), None);
    assert_eq!(header(&a, "vary"), Some("Origin"));
    assert_eq!(header(&a, "etag"), Some("\"v1\""));
    assert_eq!(a.body, json_doc());
}

#[tokio::test]
async fn http2_clients_get_every_coding() {
    let g = gateway(settings(&Encoding::ALL, 0)).await;
    let c = h2c_client();
    for coding in ["zstd", "br", "gzip"] {
        let a = fetch(&c, &format!("{}/json", g.url), Some(coding)).await;
        assert_coded(&a, coding, &json_doc()).await;
        let a = fetch(&c, &format!("{}/chunked", g.url), Some(coding)).await;
        let want = "x".repeat(250) + &"y".repeat(250);
        assert_coded(&a, coding, want.as_bytes()).await;
    }
}
