//! Retries (HTTPRoute `rules[].retry`) over real sockets: which failures go again and
//! which never do, to which endpoint, how many times, what the metrics and the access log
//! say, and a backend process killed and restarted under steady load.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tollgate_api::{Backend, BackendProtocol, Endpoint, LoadBalancer, Retry, Route, Timeouts};

fn retry(attempts: u32, codes: &[u16]) -> Retry {
    Retry {
        attempts,
        backoff_ms: 1,
        codes: codes.to_vec(),
    }
}

fn retrying(attempts: u32, codes: &[u16]) -> Route {
    let mut r = route("r", "/", vec![wb("b", 1)]);
    r.retry = Some(retry(attempts, codes));
    r
}

/// Round robin over `addrs` in order: the first attempt goes to the first.
fn in_order(addrs: &[SocketAddr]) -> Backend {
    Backend {
        tls: None,
        protocol: BackendProtocol::Http1,
        load_balancer: LoadBalancer::RoundRobin,
        settings: Default::default(),
        endpoints: addrs
            .iter()
            .map(|a| Endpoint {
                ip: a.ip().to_string(),
                port: a.port(),
            })
            .collect(),
    }
}

/// An address nothing listens on.
fn dead() -> SocketAddr {
    // Bound without listening, and kept bound for the test's life: a connect there is refused,
    // and no other test's server, binding port 0 at the same time, can be handed the port (a
    // port only reserved and released was, once, and the request found an answer there).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr().unwrap();
    Box::leak(Box::new(socket));
    addr
}

/// A backend that fails each request id's (`?id=`) first `fail` requests with `code` and
/// then answers 200, as the conformance suite's echo server simulates retries; it counts
/// every request it reads.
async fn fails_first(fail: usize, code: u16) -> (SocketAddr, Arc<AtomicUsize>) {
    let seen: Arc<std::sync::Mutex<HashMap<String, usize>>> = Arc::default();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let addr = serve(move |target, _body| {
        h.fetch_add(1, Ordering::SeqCst);
        let mut seen = seen.lock().unwrap();
        let n = seen.entry(target.to_owned()).or_default();
        *n += 1;
        if *n <= fail { code } else { 200 }
    })
    .await;
    (addr, hits)
}

/// A keep-alive HTTP/1.1 backend that reads each request whole (Content-Length bodies) and
/// answers `answer(target, body)`'s status with the body `ok:` and the request body.
async fn serve(answer: impl Fn(&str, &[u8]) -> u16 + Send + Sync + 'static) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let (r, mut w) = s.into_split();
                let mut r = BufReader::new(r);
                loop {
                    let mut head = Vec::new();
                    loop {
                        let mut line = String::new();
                        if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        head.push(line);
                    }
                    let target = head[0].split(' ').nth(1).unwrap_or("").to_owned();
                    let len: usize = head
                        .iter()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    let mut body = vec![0; len];
                    if r.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let status = answer(&target, &body);
                    let mut out = b"ok:".to_vec();
                    out.extend_from_slice(&body);
                    let head = format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\n\r\n",
                        out.len()
                    );
                    let mut all = head.into_bytes();
                    all.extend_from_slice(&out);
                    if w.write_all(&all).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A backend that reads a request head and closes the connection without a byte of answer,
/// counting the requests.
async fn hangs_up() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let h = h.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                h.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (addr, hits)
}

fn post(url: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post(url)
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

#[tokio::test]
async fn listed_statuses_are_retried_up_to_attempts_and_others_are_not() {
    let (addr, hits) = fails_first(2, 500).await;
    let (_p, url, metrics) = proxy_with_metrics(
        vec![retrying(3, &[500, 502])],
        vec![("b", backend_at(addr))],
    )
    .await;
    let c = h1_client();
    // Two failures, then a success: within three retries.
    assert_eq!(get(&c, &format!("{url}/a")).await.status, StatusCode::OK);
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    let (addr, hits) = fails_first(4, 500).await;
    let (_p2, url2) = proxy_with(vec![retrying(3, &[500])], vec![("b", backend_at(addr))]).await;
    // Four failures: the fourth answer (after three retries) is the client's.
    assert_eq!(
        get(&c, &format!("{url2}/b")).await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(hits.load(Ordering::SeqCst), 4);
    let (addr, hits) = fails_first(1, 503).await;
    let (_p3, url3) = proxy_with(vec![retrying(3, &[500])], vec![("b", backend_at(addr))]).await;
    // 503 is not listed: answered as it came, after one attempt.
    assert_eq!(
        get(&c, &format!("{url3}/c")).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    let text = metrics.encode();
    assert!(
        text.contains(r#"tollgate_upstream_retries_total{reason="status"} 2"#),
        "{text}"
    );
}

#[tokio::test]
async fn a_failed_connect_goes_to_another_endpoint_with_the_body_for_any_method() {
    let live = serve(|_, _| 200).await;
    let (_p, url, metrics) = proxy_with_metrics(
        vec![retrying(1, &[])],
        vec![("b", in_order(&[dead(), live]))],
    )
    .await;
    let c = h1_client();
    // Round robin starts at the dead endpoint: the POST goes there first, then here.
    let a = send(&c, post(&format!("{url}/"), "order=1")).await;
    assert_eq!(
        (a.status, &a.body[..]),
        (StatusCode::OK, &b"ok:order=1"[..])
    );
    assert!(
        metrics
            .encode()
            .contains(r#"tollgate_upstream_retries_total{reason="connect"} 1"#)
    );
    // Without a retry rule the same request fails.
    let (_p2, url2) = proxy_with(
        vec![route("r", "/", vec![wb("b", 1)])],
        vec![("b", in_order(&[dead(), live]))],
    )
    .await;
    assert_eq!(
        send(&c, post(&format!("{url2}/"), "order=1")).await.status,
        StatusCode::BAD_GATEWAY
    );
}

#[tokio::test]
async fn a_hang_up_after_the_request_went_out_is_retried_only_for_idempotent_methods() {
    let (gone, hung) = hangs_up().await;
    let live = serve(|_, _| 200).await;
    let (_p, url) = proxy_with(vec![retrying(1, &[])], vec![("b", in_order(&[gone, live]))]).await;
    let c = h1_client();
    let put = Request::put(format!("{url}/"))
        .body(Full::new(Bytes::from_static(b"x")))
        .unwrap();
    assert_eq!(send(&c, put).await.status, StatusCode::OK);
    assert_eq!(hung.load(Ordering::SeqCst), 1);
    // The round robin is at the hanging endpoint again: a POST may have been acted on.
    assert_eq!(
        send(&c, post(&format!("{url}/"), "pay=1")).await.status,
        StatusCode::BAD_GATEWAY
    );
    assert_eq!(hung.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_backend_timeout_is_retried_for_a_get_and_not_for_a_post() {
    let slow = slow_backend("slow", 2_000).await;
    let fast = echo_backend("fast").await;
    let mut r = retrying(1, &[]);
    r.timeouts = Timeouts {
        request_ms: None,
        backend_request_ms: Some(200),
    };
    let (_p, url, metrics) =
        proxy_with_metrics(vec![r], vec![("b", in_order(&[slow.addr, fast.addr]))]).await;
    let c = h1_client();
    let a = get(&c, &format!("{url}/")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["backend"], "fast");
    assert_eq!(
        send(&c, post(&format!("{url}/"), "x")).await.status,
        StatusCode::GATEWAY_TIMEOUT
    );
    assert_eq!(slow.hits(), 2);
    assert_eq!(fast.hits(), 1);
    assert!(
        metrics
            .encode()
            .contains(r#"tollgate_upstream_retries_total{reason="timeout"} 1"#)
    );
}

#[tokio::test]
async fn a_streamed_body_is_sent_once() {
    // Two endpoints that refuse: whichever a request meets, a held body would be retried.
    let (_p, url, metrics) = proxy_with_metrics(
        vec![retrying(1, &[])],
        vec![("b", in_order(&[dead(), dead()]))],
    )
    .await;
    // Chunked (no declared length): not held, so not replayable.
    let chunks = futures_util::stream::iter(vec![Ok::<_, std::convert::Infallible>(
        hyper::body::Frame::data(Bytes::from_static(b"part")),
    )]);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let req = Request::post(format!("{url}/"))
        .body(StreamBody::new(chunks))
        .unwrap();
    let status = client.request(req).await.unwrap().status();
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert!(
        !metrics
            .encode()
            .contains("tollgate_upstream_retries_total{")
    );
    // A declared body over the held size is not replayable either.
    let big = Bytes::from(vec![b'x'; 64 * 1024 + 1]);
    let req = Request::post(format!("{url}/"))
        .body(Full::new(big))
        .unwrap();
    let c = h1_client();
    assert_eq!(send(&c, req).await.status, StatusCode::BAD_GATEWAY);
    assert!(
        !metrics
            .encode()
            .contains("tollgate_upstream_retries_total{")
    );
}

#[tokio::test]
async fn the_request_timeout_bounds_every_attempt_and_backoff_together() {
    let (addr, hits) = fails_first(100, 500).await;
    let mut r = retrying(10, &[500]);
    r.retry.as_mut().unwrap().backoff_ms = 60_000;
    r.timeouts = Timeouts {
        request_ms: Some(300),
        backend_request_ms: None,
    };
    let (_p, url) = proxy_with(vec![r], vec![("b", backend_at(addr))]).await;
    let c = h1_client();
    // One attempt, then a backoff longer than the request may take: 504, no second attempt.
    assert_eq!(
        get(&c, &format!("{url}/")).await.status,
        StatusCode::GATEWAY_TIMEOUT
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn h2c_backends_are_retried_on_another_endpoint_too() {
    let live = h2_backend("live").await;
    let mut backend = in_order(&[dead(), live.addr]);
    backend.protocol = BackendProtocol::H2c;
    let (_p, url) = proxy_with(vec![retrying(1, &[])], vec![("b", backend)]).await;
    let a = get(&h1_client(), &format!("{url}/x")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["backend"], "live");
    assert_eq!(a.json()["version"], "HTTP/2.0");
}

/// Not a test: a backend process for [`killed_endpoint_under_load_costs_idempotent_requests_nothing`],
/// started (and killed) by it as a child of this test binary, serving on
/// `TOLLGATE_TEST_BACKEND` and answering its own name, `TOLLGATE_TEST_BACKEND_NAME`.
#[test]
#[ignore = "run as a child process by the retry tests"]
fn backend_process() {
    let (Ok(addr), Ok(name)) = (
        std::env::var("TOLLGATE_TEST_BACKEND"),
        std::env::var("TOLLGATE_TEST_BACKEND_NAME"),
    ) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = TcpListener::bind(&addr).await.unwrap();
        println!("ready");
        loop {
            let (s, _) = listener.accept().await.unwrap();
            let name = name.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| {
                    let name = name.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from(name),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
}

/// Starts [`backend_process`] on `addr` and waits until it listens.
fn start_backend(addr: SocketAddr, name: &str) -> Killed {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "backend_process", "--ignored", "--nocapture"])
        .env("TOLLGATE_TEST_BACKEND", addr.to_string())
        .env("TOLLGATE_TEST_BACKEND_NAME", name)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.trim() == "ready")),
        "backend {name} did not start"
    );
    Killed(child)
}

/// Load from `workers` keep-alive clients until `stop`: (answers by body, failures).
async fn load(
    url: String,
    workers: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> (HashMap<String, usize>, Vec<String>) {
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (url, stop) = (url.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let c = h1_client();
            let mut by: HashMap<String, usize> = HashMap::new();
            let mut failed = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                match c
                    .request(Request::get(&url).body(Full::default()).unwrap())
                    .await
                {
                    Ok(r) if r.status() == StatusCode::OK => {
                        let body = r.into_body().collect().await.map(|b| b.to_bytes());
                        match body {
                            Ok(b) => {
                                *by.entry(String::from_utf8_lossy(&b).into()).or_default() += 1
                            }
                            Err(e) => failed.push(format!("body: {e}")),
                        }
                    }
                    Ok(r) => failed.push(r.status().to_string()),
                    Err(e) => failed.push(format!("{e}")),
                }
            }
            (by, failed)
        }));
    }
    let mut by = HashMap::new();
    let mut failed = Vec::new();
    for t in tasks {
        let (b, f) = t.await.unwrap();
        for (k, v) in b {
            *by.entry(k).or_default() += v;
        }
        failed.extend(f);
    }
    (by, failed)
}

/// One of three backend processes killed under steady load, then started again: with a
/// connection-error retry, not one GET fails; the restarted one gets traffic again. The
/// same kill without a retry rule fails requests (so the kill is felt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_endpoint_under_load_costs_idempotent_requests_nothing() {
    let addrs: Vec<SocketAddr> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()).parse().unwrap())
        .collect();
    let names = ["a", "b", "c"];
    let mut procs: Vec<Option<Killed>> = addrs
        .iter()
        .zip(names)
        .map(|(a, n)| Some(start_backend(*a, n)))
        .collect();
    let mut backend = in_order(&addrs);
    backend.load_balancer = LoadBalancer::LeastRequest;
    for (retry_rule, want_failures) in [(true, false), (false, true)] {
        let mut r = route("r", "/", vec![wb("b", 1)]);
        if retry_rule {
            r.retry = Some(retry(2, &[]));
        }
        let (_p, url) = proxy_with(vec![r], vec![("b", backend.clone())]).await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let run = tokio::spawn(load(format!("{url}/"), 8, stop.clone()));
        tokio::time::sleep(Duration::from_millis(500)).await;
        procs[1] = None; // killed (SIGKILL) and reaped
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        procs[1] = Some(start_backend(addrs[1], "b"));
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        stop.store(true, Ordering::SeqCst);
        let (by, failed) = run.await.unwrap();
        if want_failures {
            assert!(!failed.is_empty(), "the kill was not felt: {by:?}");
        } else {
            assert!(
                failed.is_empty(),
                "{} failed: {:?}",
                failed.len(),
                &failed[..failed.len().min(5)]
            );
            for n in names {
                assert!(
                    by.get(n).copied().unwrap_or(0) > 0,
                    "{n} got nothing: {by:?}"
                );
            }
        }
    }
    drop(procs);
}

/// A backend that fails every request, a rule retrying 503 three times: with a retry budget
/// of 20% (no minimum rate), the backend sees the requests and at most a fifth more, not
/// four times as many; the refused retries are counted.
#[tokio::test]
async fn a_retry_budget_caps_retries_at_its_share_of_requests() {
    let (addr, hits) = fails_first(usize::MAX, 503).await;
    let mut def = backend_at(addr);
    def.settings.retry_budget = Some(tollgate_api::backend::RetryBudget {
        percent: 20,
        interval_ms: 60_000,
        min_retries: 0,
        min_interval_ms: 1_000,
    });
    let (_p, url, metrics) = proxy_with_metrics(vec![retrying(3, &[503])], vec![("b", def)]).await;
    let c = h1_client();
    let requests = 200;
    for i in 0..requests {
        let a = get(&c, &format!("{url}/{i}")).await;
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    let sent = hits.load(Ordering::SeqCst);
    let retries = sent - requests;
    assert!(
        retries <= requests / 5,
        "{retries} retries for {requests} requests"
    );
    assert!(
        retries >= requests / 5 - 2,
        "the budget was used: {retries}"
    );
    let text = metrics.encode();
    let refused: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_upstream_retry_budget_exhausted_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    // Each request after the budget ran out was refused a retry.
    assert!(refused >= (requests - retries) as u64, "{refused}: {text}");
    // Without a budget the same rule would have sent each request four times.
    let (addr, hits) = fails_first(usize::MAX, 503).await;
    let (_p2, url2) = proxy_with(vec![retrying(3, &[503])], vec![("b", backend_at(addr))]).await;
    for i in 0..10 {
        get(&c, &format!("{url2}/{i}")).await;
    }
    assert_eq!(hits.load(Ordering::SeqCst), 40);
}
