//! A collector that fails: requests are never held up, and every span that cannot be
//! delivered is counted in `tollgate_trace_spans_dropped_total`: one that never answers
//! (the bounded queue fills, the rest dropped at once; after a timed-out export the next
//! connects anew), an OTLP/HTTP collector answering 503, and an OTLP/gRPC one answering
//! with a gRPC error status.

use super::*;

use std::sync::atomic::{AtomicUsize, Ordering};

/// How a broken collector answers.
#[derive(Clone, Copy)]
enum Broken {
    /// Reads the request and never answers.
    Hangs,
    /// HTTP 503.
    Unavailable,
    /// HTTP 200 with `grpc-status: 14` in the head (a trailers-only gRPC answer).
    GrpcError,
}

/// A collector on loopback that fails as `how` says; counts the export requests it got.
async fn broken(how: Broken) -> (SocketAddr, Arc<AtomicUsize>) {
    let (addr, seen, _) = broken_counting(how).await;
    (addr, seen)
}

/// [`broken`], counting the connections it accepted too.
async fn broken_counting(how: Broken) -> (SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let connections = Arc::new(AtomicUsize::new(0));
    let (count, accepted) = (seen.clone(), connections.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            accepted.fetch_add(1, Ordering::SeqCst);
            let count = count.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let count = count.clone();
                    async move {
                        let _ = req.into_body().collect().await;
                        count.fetch_add(1, Ordering::SeqCst);
                        let resp = match how {
                            Broken::Hangs => std::future::pending().await,
                            Broken::Unavailable => Response::builder().status(503),
                            Broken::GrpcError => Response::builder()
                                .header("content-type", "application/grpc")
                                .header("grpc-status", "14")
                                .header("grpc-message", "unavailable"),
                        };
                        Ok::<_, std::convert::Infallible>(
                            resp.body(Full::new(Bytes::new())).unwrap(),
                        )
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, seen, connections)
}

/// A proxy exporting to `collector` over `protocol` with a queue of `queue` spans sent in
/// batches of 2; its route `/` goes to `app`.
async fn exporting_to(
    collector: SocketAddr,
    protocol: Protocol,
    queue: usize,
    app: &EchoBackend,
) -> (Proxy, String, Arc<tollgate_proxy::metrics::Metrics>) {
    let metrics = metrics();
    let mut t = TraceSettings::new(&format!("http://{collector}"), protocol, 1.0).unwrap();
    t.batch_delay = Duration::from_millis(20);
    t.batch_size = 2;
    t.queue_size = queue;
    let (proxy, url) = proxy_with_options(
        ProxyOptions {
            tracing: Some(t),
            metrics: metrics.clone(),
            ..ProxyOptions::default()
        },
        vec![route("r", "/", vec![wb("app", 1)])],
        vec![("app", backend_of(&[app]))],
    )
    .await;
    (proxy, url, metrics)
}

fn dropped(m: &tollgate_proxy::metrics::Metrics) -> u64 {
    m.encode()
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_trace_spans_dropped_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_collector_that_never_answers_costs_spans_not_requests() {
    let (collector, seen) = broken(Broken::Hangs).await;
    let app = echo_backend("app").await;
    let (_p, url, metrics) = exporting_to(collector, Protocol::Http, 4, &app).await;
    let c = h1_client();
    // 40 requests, 80 spans: at most 4 export requests of 2 spans in flight (hanging), 4
    // spans taken for the next ones and 4 queued; every other span is dropped as it ends.
    for _ in 0..40 {
        assert_eq!(get(&c, &format!("{url}/")).await.status, 200);
    }
    assert!(
        eventually(|| dropped(&metrics) >= 80 - 8 - 4 - 4).await,
        "dropped {}",
        dropped(&metrics)
    );
    assert!(dropped(&metrics) <= 80);
    assert!((1..=4).contains(&seen.load(Ordering::SeqCst)));
}

#[tokio::test]
async fn refused_batches_are_counted_dropped() {
    for (how, protocol) in [
        (Broken::Unavailable, Protocol::Http),
        (Broken::GrpcError, Protocol::Grpc),
    ] {
        let (collector, seen) = broken(how).await;
        let app = echo_backend("app").await;
        let (_p, url, metrics) = exporting_to(collector, protocol, 8192, &app).await;
        let c = h1_client();
        for _ in 0..5 {
            assert_eq!(get(&c, &format!("{url}/")).await.status, 200);
        }
        // Two spans a request, every batch refused.
        assert!(
            eventually(|| dropped(&metrics) == 10).await,
            "{protocol:?}: dropped {}",
            dropped(&metrics)
        );
        assert!(seen.load(Ordering::SeqCst) >= 1);
    }
}

/// A collector that stops answering (its address blackholed, say) does not keep its
/// connection: after an export times out, the next one connects anew (over HTTP/2, where
/// every export shares one connection, the old one would otherwise be used until the kernel
/// gave up on it).
#[tokio::test]
async fn after_a_timed_out_export_the_next_one_connects_anew() {
    let (collector, seen, connections) = broken_counting(Broken::Hangs).await;
    let app = echo_backend("app").await;
    let (_p, url, metrics) = exporting_to(collector, Protocol::Grpc, 8192, &app).await;
    let c = h1_client();
    assert_eq!(get(&c, &format!("{url}/")).await.status, 200);
    assert!(eventually(|| seen.load(Ordering::SeqCst) == 1).await);
    assert_eq!(connections.load(Ordering::SeqCst), 1);
    // The export's 10 s run out: its two spans are counted dropped.
    let mut waited = 0;
    while dropped(&metrics) < 2 && waited < 300 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += 1;
    }
    assert_eq!(dropped(&metrics), 2);
    assert_eq!(get(&c, &format!("{url}/")).await.status, 200);
    assert!(eventually(|| seen.load(Ordering::SeqCst) == 2).await);
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}
