//! OpenTelemetry tracing over real sockets: what the upstream receives in `traceparent` and
//! `tracestate`, and the spans the proxy exports over OTLP/HTTP to a receiver in the test
//! that decodes them with the OTLP protobuf types: the incoming parent kept (server span's
//! parent), the client span a child of the server span and the upstream's parent, one
//! client span per attempt, the policy decisions as events, the sampled flag honoured both
//! ways, a malformed `traceparent` treated as absent, and with tracing off the client's
//! fields passed on untouched and none invented; module [`propagation`]: the query
//! redacted, a mirror's trace fields, `tracestate` limits; module [`export`]: a collector
//! that hangs or refuses costs counted spans, never a request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "tracing/export.rs"]
mod export;
#[path = "tracing/propagation.rs"]
mod propagation;
#[path = "policy/support.rs"]
#[allow(dead_code)]
mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;
use support::*;
use tokio::net::TcpListener;
use tollgate_api::{PolicySet, Retry};
use tollgate_proxy::otel::{Protocol, TraceSettings};
use tollgate_proxy::{Proxy, ProxyOptions};

const PARENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP receiver: every span posted to `/v1/traces`.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Receiver {
    async fn start() -> (Self, SocketAddr) {
        let r = Self::default();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = r.spans.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let spans = spans.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let spans = spans.clone();
                        async move {
                            assert_eq!(req.uri().path(), "/v1/traces");
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let export = ExportTraceServiceRequest::decode(body).unwrap();
                            let mut seen = spans.lock().unwrap();
                            for rs in export.resource_spans {
                                for ss in rs.scope_spans {
                                    seen.extend(ss.spans);
                                }
                            }
                            Ok::<_, std::convert::Infallible>(
                                Response::builder()
                                    .header("content-type", "application/x-protobuf")
                                    .body(Full::new(Bytes::new()))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        (r, addr)
    }

    /// The spans of `trace` (hex), once `n` of them arrived.
    async fn spans_of(&self, trace: &str, n: usize) -> Vec<Span> {
        let of = || -> Vec<Span> {
            self.spans
                .lock()
                .unwrap()
                .iter()
                .filter(|s| hex(&s.trace_id) == trace)
                .cloned()
                .collect()
        };
        // Up to 20 s: a loaded machine may delay the export task (the batch waits 20 ms).
        for _ in 0..800 {
            if of().len() >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let spans = of();
        assert_eq!(spans.len(), n, "spans of {trace}: {spans:#?}");
        spans
    }

    fn all(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a AnyValue> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn str_attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    match attr(attrs, key) {
        Some(AnyValue::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

fn int_attr(attrs: &[KeyValue], key: &str) -> Option<i64> {
    match attr(attrs, key) {
        Some(AnyValue::IntValue(i)) => Some(*i),
        _ => None,
    }
}

/// A proxy tracing at `ratio` to a new collector, its route `r` going to one echo backend
/// `app`; the fields keep them alive for the test.
struct Traced {
    rx: Receiver,
    url: String,
    _app: EchoBackend,
    _proxy: Proxy,
}

async fn traced(ratio: f64) -> Traced {
    let (rx, collector) = Receiver::start().await;
    let app = echo_backend("app").await;
    let (proxy, url) = proxy_with_options(
        tracing_opts(collector, ratio),
        vec![route("r", "/", vec![wb("app", 1)])],
        vec![("app", backend_of(&[&app]))],
    )
    .await;
    Traced {
        rx,
        url,
        _app: app,
        _proxy: proxy,
    }
}

fn tracing_opts(collector: SocketAddr, ratio: f64) -> ProxyOptions {
    let mut t = TraceSettings::new(&format!("http://{collector}"), Protocol::Http, ratio).unwrap();
    t.batch_delay = Duration::from_millis(20);
    ProxyOptions {
        tracing: Some(t),
        ..ProxyOptions::default()
    }
}

/// A proxy with `opts` serving `/` to `app` under an API-key AuthPolicy and a per-key limit
/// of 1 a minute.
async fn guarded_proxy(opts: ProxyOptions, app: &EchoBackend) -> (Proxy, String) {
    let proxy = Proxy::new(opts);
    let mut t = table(
        1,
        vec![http_port(0, vec![guarded("api", "/", "default/api/0")])],
        vec![("app", backend_of(&[app]))],
    );
    t.policies.insert(
        "default/api/0".into(),
        PolicySet {
            auth: Some(api_key_auth()),
            rate_limits: vec![per_minute("per-key", 1, "request.headers['x-api-key']")],
        },
    );
    proxy.apply(t).await.unwrap();
    let url = format!("http://{}", proxy.local_addr(0).unwrap());
    (proxy, url)
}

/// `traceparent` as the upstream received it: (trace id, parent id, flags).
fn upstream_parent(a: &Answer) -> (String, String, String) {
    let v = a
        .upstream_header("traceparent")
        .expect("a traceparent upstream");
    let parts: Vec<&str> = v.split('-').collect();
    assert_eq!(parts.len(), 4, "{v}");
    assert_eq!(parts[0], "00");
    (
        parts[1].to_owned(),
        parts[2].to_owned(),
        parts[3].to_owned(),
    )
}

#[tokio::test]
async fn an_incoming_parent_is_kept_and_the_client_span_is_the_upstreams_parent() {
    let (rx, collector) = Receiver::start().await;
    let app = echo_backend("app").await;
    let (_p, url) = guarded_proxy(tracing_opts(collector, 1.0), &app).await;
    let c = h1_client();
    let incoming = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01");
    let a = get_with(
        &c,
        &format!("{url}/things?x=1"),
        &[
            ("x-api-key", API_KEY),
            ("traceparent", &incoming),
            ("tracestate", "congo=t61rcWkgMzE"),
        ],
    )
    .await;
    assert_eq!(a.status, 200);
    let (trace, parent, flags) = upstream_parent(&a);
    assert_eq!(trace, PARENT_TRACE);
    assert_ne!(
        parent, PARENT_SPAN,
        "the gateway's client span is the upstream's parent"
    );
    assert_eq!(flags, "01");
    assert_eq!(
        a.upstream_header("tracestate").as_deref(),
        Some("congo=t61rcWkgMzE")
    );

    let spans = rx.spans_of(PARENT_TRACE, 2).await;
    let server = spans
        .iter()
        .find(|s| s.kind == SpanKind::Server as i32)
        .unwrap();
    let client = spans
        .iter()
        .find(|s| s.kind == SpanKind::Client as i32)
        .unwrap();
    assert_eq!(hex(&server.parent_span_id), PARENT_SPAN);
    assert_eq!(hex(&client.parent_span_id), hex(&server.span_id));
    assert_eq!(hex(&client.span_id), parent);
    assert_eq!(
        str_attr(&server.attributes, "http.request.method").as_deref(),
        Some("GET")
    );
    assert_eq!(
        str_attr(&server.attributes, "url.path").as_deref(),
        Some("/things")
    );
    assert_eq!(
        str_attr(&server.attributes, "url.query").as_deref(),
        Some("x=REDACTED")
    );
    assert_eq!(
        int_attr(&server.attributes, "http.response.status_code"),
        Some(200)
    );
    assert_eq!(
        str_attr(&server.attributes, "tollgate.route").as_deref(),
        Some("default/api")
    );
    assert_eq!(
        int_attr(&server.attributes, "http.response.body.size"),
        Some(i64::try_from(a.body.len()).unwrap())
    );
    assert_eq!(
        int_attr(&client.attributes, "http.response.status_code"),
        Some(200)
    );
    assert_eq!(
        int_attr(&client.attributes, "server.port"),
        Some(i64::from(app.addr.port()))
    );
    // The policy decisions, in order: the API key authenticated, the limit counted.
    let events: Vec<(String, String, String)> = server
        .events
        .iter()
        .map(|e| {
            assert_eq!(e.name, "policy.decision");
            (
                str_attr(&e.attributes, "tollgate.policy").unwrap(),
                str_attr(&e.attributes, "tollgate.policy.rule").unwrap(),
                str_attr(&e.attributes, "tollgate.policy.outcome").unwrap(),
            )
        })
        .collect();
    assert_eq!(
        events,
        [
            (
                "default/auth".into(),
                "authentication.keys".into(),
                "authenticated".into()
            ),
            (
                "default/limits".into(),
                "limits.per-key".into(),
                "allowed".into()
            ),
        ]
    );
}

#[tokio::test]
async fn refusals_are_events_of_a_server_span_without_a_client_span() {
    let (rx, collector) = Receiver::start().await;
    let app = echo_backend("app").await;
    let (_p, url) = guarded_proxy(tracing_opts(collector, 1.0), &app).await;
    let c = h1_client();
    let send = |key: &'static str, trace: &'static str| {
        let c = c.clone();
        let url = url.clone();
        async move {
            let tp = format!("00-{trace}-{PARENT_SPAN}-01");
            get_with(
                &c,
                &format!("{url}/"),
                &[("x-api-key", key), ("traceparent", &tp)],
            )
            .await
            .status
        }
    };
    const T1: &str = "11111111111111111111111111111111";
    const T2: &str = "22222222222222222222222222222222";
    const T3: &str = "33333333333333333333333333333333";
    assert_eq!(send("wrong", T1).await, 401);
    assert_eq!(send(API_KEY, T2).await, 200);
    assert_eq!(send(API_KEY, T3).await, 429);
    let outcome = |s: &Span| -> Vec<String> {
        s.events
            .iter()
            .map(|e| str_attr(&e.attributes, "tollgate.policy.outcome").unwrap())
            .collect()
    };
    let denied = rx.spans_of(T1, 1).await;
    assert_eq!(outcome(&denied[0]), ["unauthenticated"]);
    assert_eq!(
        int_attr(&denied[0].attributes, "http.response.status_code"),
        Some(401)
    );
    let limited = rx.spans_of(T3, 1).await;
    assert_eq!(outcome(&limited[0]), ["authenticated", "limited"]);
    assert_eq!(
        int_attr(&limited[0].attributes, "http.response.status_code"),
        Some(429)
    );
}

#[tokio::test]
async fn an_unsampled_parent_is_honoured_and_nothing_of_it_is_exported() {
    let (rx, collector) = Receiver::start().await;
    let app = echo_backend("app").await;
    let (_p, url) = proxy_with_options(
        tracing_opts(collector, 1.0),
        vec![route("r", "/", vec![wb("app", 1)])],
        vec![("app", backend_of(&[&app]))],
    )
    .await;
    let c = h1_client();
    const UNSAMPLED: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const SAMPLED: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    let tp = format!("00-{UNSAMPLED}-{PARENT_SPAN}-00");
    let a = get_with(&c, &format!("{url}/"), &[("traceparent", &tp)]).await;
    let (trace, parent, flags) = upstream_parent(&a);
    assert_eq!((trace.as_str(), flags.as_str()), (UNSAMPLED, "00"));
    assert_ne!(parent, PARENT_SPAN);
    // A sampled request after it: once its spans are in, the unsampled one's would be too.
    let tp = format!("00-{SAMPLED}-{PARENT_SPAN}-01");
    get_with(&c, &format!("{url}/"), &[("traceparent", &tp)]).await;
    rx.spans_of(SAMPLED, 2).await;
    assert!(rx.all().iter().all(|s| hex(&s.trace_id) != UNSAMPLED));
}

#[tokio::test]
async fn without_a_parent_the_ratio_decides_a_new_trace() {
    let (rx, collector) = Receiver::start().await;
    let app = echo_backend("app").await;
    let c = h1_client();
    // Ratio 0: a new trace, not sampled, still propagated.
    let (_p0, url0) = proxy_with_options(
        tracing_opts(collector, 0.0),
        vec![route("r", "/", vec![wb("app", 1)])],
        vec![("app", backend_of(&[&app]))],
    )
    .await;
    let a = get(&c, &format!("{url0}/")).await;
    let (dropped, _, flags) = upstream_parent(&a);
    assert_eq!(flags, "00");
    // Ratio 1: a new sampled trace, its server span a root.
    let (_p1, url1) = proxy_with_options(
        tracing_opts(collector, 1.0),
        vec![route("r", "/", vec![wb("app", 1)])],
        vec![("app", backend_of(&[&app]))],
    )
    .await;
    let a = get(&c, &format!("{url1}/")).await;
    let (kept, parent, flags) = upstream_parent(&a);
    assert_eq!(flags, "01");
    assert_ne!(kept, dropped);
    let spans = rx.spans_of(&kept, 2).await;
    let server = spans
        .iter()
        .find(|s| s.kind == SpanKind::Server as i32)
        .unwrap();
    assert!(server.parent_span_id.is_empty(), "a root span");
    let client = spans
        .iter()
        .find(|s| s.kind == SpanKind::Client as i32)
        .unwrap();
    assert_eq!(hex(&client.span_id), parent);
    assert!(rx.all().iter().all(|s| hex(&s.trace_id) != dropped));
}

#[tokio::test]
async fn a_malformed_traceparent_is_absent_and_its_tracestate_dropped() {
    let (_rx, collector) = Receiver::start().await;
    let app = echo_backend("app").await;
    let (_p, url) = proxy_with_options(
        tracing_opts(collector, 1.0),
        vec![route("r", "/", vec![wb("app", 1)])],
        vec![("app", backend_of(&[&app]))],
    )
    .await;
    let c = h1_client();
    let bad = format!("00-{}-{PARENT_SPAN}-01", PARENT_TRACE.to_uppercase());
    let a = get_with(
        &c,
        &format!("{url}/"),
        &[("traceparent", &bad), ("tracestate", "congo=t61rcWkgMzE")],
    )
    .await;
    let (trace, parent, flags) = upstream_parent(&a);
    assert_ne!(trace, PARENT_TRACE.to_lowercase());
    assert_ne!(parent, PARENT_SPAN);
    assert_eq!(flags, "01");
    assert_eq!(a.upstream_header("tracestate"), None);
}

#[tokio::test]
async fn each_retried_attempt_is_a_client_span() {
    let (rx, collector) = Receiver::start().await;
    // Round robin in order over an endpoint nothing listens on, then the app: the first
    // attempt cannot connect, the retry goes to the app (as in tests/retry.rs).
    let app = echo_backend("app").await;
    let dead: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut backend = backend_of(&[&app]);
    backend.load_balancer = tollgate_api::LoadBalancer::RoundRobin;
    backend.endpoints.insert(
        0,
        tollgate_api::Endpoint {
            ip: dead.ip().to_string(),
            port: dead.port(),
        },
    );
    let mut r = route("r", "/", vec![wb("b", 1)]);
    r.retry = Some(Retry {
        attempts: 3,
        backoff_ms: 1,
        codes: vec![],
    });
    let (_p, url) =
        proxy_with_options(tracing_opts(collector, 1.0), vec![r], vec![("b", backend)]).await;
    let c = h1_client();
    const T: &str = "cccccccccccccccccccccccccccccccc";
    let tp = format!("00-{T}-{PARENT_SPAN}-01");
    let a = get_with(&c, &format!("{url}/"), &[("traceparent", &tp)]).await;
    assert_eq!(a.status, 200);
    let spans = rx.spans_of(T, 3).await;
    let server = spans
        .iter()
        .find(|s| s.kind == SpanKind::Server as i32)
        .unwrap();
    let mut attempts: Vec<&Span> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Client as i32)
        .collect();
    attempts.sort_by_key(|s| s.start_time_unix_nano);
    assert_eq!(attempts.len(), 2);
    assert!(attempts.iter().all(|s| s.parent_span_id == server.span_id));
    assert_eq!(
        str_attr(&attempts[0].attributes, "error.type").as_deref(),
        Some("upstream")
    );
    assert_eq!(
        int_attr(&attempts[0].attributes, "server.port"),
        Some(i64::from(dead.port()))
    );
    assert_eq!(
        int_attr(&attempts[1].attributes, "http.request.resend_count"),
        Some(1)
    );
    assert_eq!(
        int_attr(&attempts[1].attributes, "http.response.status_code"),
        Some(200)
    );
    // The upstream's parent is the attempt that reached it.
    let (_, parent, _) = upstream_parent(&a);
    assert_eq!(hex(&attempts[1].span_id), parent);
}

#[tokio::test]
async fn with_tracing_off_the_clients_fields_pass_untouched_and_none_is_invented() {
    let app = echo_backend("app").await;
    let (_p, url) = proxy_with(
        vec![route("r", "/", vec![wb("app", 1)])],
        vec![("app", backend_of(&[&app]))],
    )
    .await;
    let c = h1_client();
    let a = get(&c, &format!("{url}/")).await;
    assert_eq!(a.upstream_header("traceparent"), None);
    let incoming = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01");
    let a = get_with(
        &c,
        &format!("{url}/"),
        &[
            ("traceparent", &incoming),
            ("tracestate", "congo=t61rcWkgMzE"),
        ],
    )
    .await;
    assert_eq!(a.upstream_header("traceparent"), Some(incoming));
    assert_eq!(
        a.upstream_header("tracestate").as_deref(),
        Some("congo=t61rcWkgMzE")
    );
}
