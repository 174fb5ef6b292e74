//! Controller metrics and the admin endpoints.
//!
//! In: counters and gauges updated by the watches, the reconcile loop, the status writer and
//! the leader elector. Out: `GET /metrics` (OpenMetrics text), `GET /healthz` (200 while the
//! process serves) and `GET /readyz` (200 once every watch has listed and the first compile ran).
//! Labels stay low-cardinality: kinds and outcomes, never object names.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label set `kind` (an object kind).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// Object kind, e.g. `HTTPRoute`.
    pub kind: String,
}

/// Label set `kind` + `result`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindResult {
    /// Object kind.
    pub kind: String,
    /// `ok`, `conflict` or `error`.
    pub result: String,
}

/// Label set `path` (what a reconcile did).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabel {
    /// `full` (compile, status, provisioning), `endpoints` (compile and publish only) or
    /// `status` (status comparison only).
    pub path: String,
}

/// Every metric of the controller, registered once.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Reconciles, by path.
    pub reconciles: Family<PathLabel, Counter>,
    /// Reconcile duration in seconds.
    pub reconcile_duration: Histogram,
    /// Watch events received, by kind.
    pub watch_events: Family<KindLabel, Counter>,
    /// Objects that could not be deserialized, by kind.
    pub malformed_objects: Family<KindLabel, Counter>,
    /// Status patches sent, by kind and result.
    pub status_writes: Family<KindResult, Counter>,
    /// Events published, by kind of the object they are about.
    pub events: Family<KindLabel, Counter>,
    /// Table versions published to the push server.
    pub pushed_versions: Counter,
    /// Proxies connected to the push server.
    pub connected_proxies: Gauge,
    /// Proxies in sync with the latest version of their Gateway.
    pub in_sync_proxies: Gauge,
    /// 1 while this replica holds the Lease.
    pub leader: Gauge,
    /// Time of one Lease round (read, then create, renew or take over).
    pub lease_round_duration: Histogram,
    /// Lease rounds that failed or timed out.
    pub lease_round_failures: Counter,
    /// Times this replica gained or lost the leadership.
    pub leadership_changes: Counter,
    /// Gateways with a route table.
    pub gateways: Gauge,
    /// Reconcile spans dropped: the export queue was full or the collector failed.
    pub trace_spans_dropped: Counter,
    ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `tollgate_controller` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tollgate_controller");
        let reconciles = Family::<PathLabel, Counter>::default();
        registry.register("reconciles", "Reconciles, by path", reconciles.clone());
        let reconcile_duration = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        registry.register(
            "reconcile_duration_seconds",
            "Time from the end of the debounce to the end of the reconcile",
            reconcile_duration.clone(),
        );
        let watch_events = Family::<KindLabel, Counter>::default();
        registry.register(
            "watch_events",
            "Watch events received, by kind",
            watch_events.clone(),
        );
        let malformed_objects = Family::<KindLabel, Counter>::default();
        registry.register(
            "malformed_objects",
            "Objects skipped because they do not deserialize, by kind",
            malformed_objects.clone(),
        );
        let status_writes = Family::<KindResult, Counter>::default();
        registry.register(
            "status_writes",
            "Status patches sent, by kind and result",
            status_writes.clone(),
        );
        let events = Family::<KindLabel, Counter>::default();
        registry.register("events", "Kubernetes Events published", events.clone());
        let pushed_versions = Counter::default();
        registry.register(
            "pushed_versions",
            "Route-table versions published to proxies",
            pushed_versions.clone(),
        );
        let connected_proxies = Gauge::default();
        registry.register(
            "connected_proxies",
            "Proxies connected to the push server",
            connected_proxies.clone(),
        );
        let in_sync_proxies = Gauge::default();
        registry.register(
            "in_sync_proxies",
            "Proxies running the latest version of their Gateway's table",
            in_sync_proxies.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            leader.clone(),
        );
        let lease_round_duration = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        registry.register(
            "lease_round_duration_seconds",
            "Time of one leader-election round on the Lease (read, then create, renew or take over)",
            lease_round_duration.clone(),
        );
        let lease_round_failures = Counter::default();
        registry.register(
            "lease_round_failures",
            "Leader-election rounds that failed or timed out",
            lease_round_failures.clone(),
        );
        let leadership_changes = Counter::default();
        registry.register(
            "leadership_changes",
            "Times this replica gained or lost the leadership",
            leadership_changes.clone(),
        );
        let gateways = Gauge::default();
        registry.register("gateways", "Gateways with a route table", gateways.clone());
        let trace_spans_dropped = Counter::default();
        registry.register(
            "trace_spans_dropped",
            "Reconcile spans dropped (export queue full, or the collector failed)",
            trace_spans_dropped.clone(),
        );
        Self {
            registry,
            reconciles,
            reconcile_duration,
            watch_events,
            malformed_objects,
            status_writes,
            events,
            pushed_versions,
            connected_proxies,
            in_sync_proxies,
            leader,
            lease_round_duration,
            lease_round_failures,
            leadership_changes,
            gateways,
            trace_spans_dropped,
            ready: AtomicBool::new(false),
        }
    }

    /// Marks the controller ready (every watch listed, first compile done).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Whether [`Metrics::set_ready`] was called.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Counter label helper.
pub fn kind(kind: &str) -> KindLabel {
    KindLabel {
        kind: kind.to_owned(),
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let resp = answer(&req, &metrics);
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn answer(req: &Request<Incoming>, metrics: &Metrics) -> Response<Full<Bytes>> {
    let reply = |code: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = code;
        r
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, String::new());
    }
    match req.uri().path() {
        "/metrics" => {
            let mut r = reply(StatusCode::OK, metrics.encode());
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            r
        }
        "/healthz" => reply(StatusCode::OK, "ok\n".to_owned()),
        "/readyz" if metrics.is_ready() => reply(StatusCode::OK, "ready\n".to_owned()),
        "/readyz" => reply(StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_owned()),
        _ => reply(StatusCode::NOT_FOUND, String::new()),
    }
}
