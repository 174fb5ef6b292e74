//! Cost and shadow rate limits on the wire: a cost read from the request, a cost read from
//! the upstream's response header (the request after the one that crossed the limit gets
//! 429), and a shadow limit that never refuses while counting what the enforced one counts.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tollgate_api::PolicySet;
use tollgate_api::client::ClientSettings;
use tollgate_api::policy::{Cost, LimitMode, RateLimit};
use tollgate_proxy::metrics::Metrics;
use tollgate_proxy::{Proxy, ProxyOptions};

use crate::common::*;
use crate::support::*;

/// An upstream that answers every request 200 with `x-tokens-used: TOKENS`; the requests it
/// got.
async fn llm_backend(tokens: u64) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let hits = counted.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req| {
                    hits.fetch_add(1, Ordering::SeqCst);
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("x-tokens-used", tokens.to_string())
                                .body(Full::new(Bytes::from_static(b"{\"ok\":true}")))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, hits)
}

/// A limit of `limit` per minute per `x-user` counting `cost`, in `mode`.
pub(crate) fn tokens(id: &str, limit: u64, cost: Option<Cost>, mode: LimitMode) -> RateLimit {
    RateLimit {
        cost,
        mode,
        ..per_minute(id, limit, "request.headers['x-user']")
    }
}

/// A proxy whose route `/` to `upstream` enforces `limits`, recording into its own metrics.
pub(crate) async fn proxy_with_limits(
    upstream: SocketAddr,
    limits: Vec<RateLimit>,
) -> (Proxy, String, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    let proxy = Proxy::new(ProxyOptions {
        metrics: metrics.clone(),
        ..ProxyOptions::default()
    });
    let mut port = http_port(0, vec![guarded("llm", "/", "p")]);
    port.client = ClientSettings::default();
    let mut t = table(1, vec![port], vec![("app", backend_at(upstream))]);
    t.policies.insert(
        "p".into(),
        PolicySet {
            auth: None,
            rate_limits: limits,
        },
    );
    proxy.apply(t).await.unwrap();
    let addr = proxy.local_addr(0).unwrap();
    (proxy, format!("http://{addr}"), metrics)
}

fn response_tokens() -> Option<Cost> {
    Some(Cost::Response(
        "int(response.headers['x-tokens-used'])".into(),
    ))
}

#[tokio::test]
async fn a_response_cost_refuses_the_request_after_the_one_that_crossed_the_limit() {
    let (upstream, hits) = llm_backend(400).await;
    let limit = tokens("tokens", 1_000, response_tokens(), LimitMode::Enforce);
    let (_p, url, _m) = proxy_with_limits(upstream, vec![limit]).await;
    let c = h1_client();
    let alice = [("x-user", "alice")];
    // 400, 800, 1200 tokens counted: the third is admitted at 800 and crosses the limit.
    // Each answer carries the numbers after its own cost.
    for remaining in ["600", "200", "0"] {
        let ok = get_with(&c, &url, &alice).await;
        assert_eq!(ok.status, StatusCode::OK, "{ok:?}");
        assert_eq!(limit_headers(&ok), (Some("1000"), Some(remaining)));
        assert_eq!(header(&ok, "x-tokens-used"), Some("400"));
    }
    let refused = get_with(&c, &url, &alice).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{refused:?}");
    assert_eq!(limit_headers(&refused), (Some("1000"), Some("0")));
    seconds(&refused, "retry-after", 1..=120);
    assert_eq!(
        hits.load(Ordering::SeqCst),
        3,
        "the fourth never reached the upstream"
    );
    // Another user has a counter of its own.
    let bob = get_with(&c, &url, &[("x-user", "bob")]).await;
    assert_eq!(limit_headers(&bob), (Some("1000"), Some("600")));
}

#[tokio::test]
async fn a_request_cost_is_admitted_only_when_the_whole_cost_fits() {
    let (upstream, hits) = llm_backend(0).await;
    let cost = Some(Cost::Request("int(request.headers['x-cost'])".into()));
    let limit = tokens("bytes", 10, cost, LimitMode::Enforce);
    let (_p, url, metrics) = proxy_with_limits(upstream, vec![limit]).await;
    let c = h1_client();
    let with_cost = |n: &'static str| [("x-user", "alice"), ("x-cost", n)];
    let ok = get_with(&c, &url, &with_cost("4")).await;
    assert_eq!(limit_headers(&ok), (Some("10"), Some("6")));
    let ok = get_with(&c, &url, &with_cost("4")).await;
    assert_eq!(limit_headers(&ok), (Some("10"), Some("2")));
    let refused = get_with(&c, &url, &with_cost("4")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "8 + 4 > 10");
    assert_eq!(limit_headers(&refused), (Some("10"), Some("2")));
    // No cost header: the expression fails and the request counts 1, never 0.
    let ok = get_with(&c, &url, &[("x-user", "alice")]).await;
    assert_eq!(limit_headers(&ok), (Some("10"), Some("1")));
    assert!(
        metrics
            .encode()
            .contains(r#"tollgate_ratelimit_cost_errors_total{policy="default/limits"} 1"#),
        "{}",
        metrics.encode()
    );
    let ok = get_with(&c, &url, &with_cost("1")).await;
    assert_eq!(limit_headers(&ok), (Some("10"), Some("0")));
    let refused = get_with(&c, &url, &with_cost("0")).await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "a full counter refuses a free request too"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 4);
}

/// A request whose cost is above the limit can never fit: refused on a fresh counter, and
/// counting nothing, so the next request that fits is admitted.
#[tokio::test]
async fn a_request_cost_above_the_limit_is_refused_even_on_a_fresh_counter() {
    let (upstream, hits) = llm_backend(0).await;
    let cost = Some(Cost::Request("int(request.headers['x-cost'])".into()));
    let limit = tokens("bytes", 10, cost, LimitMode::Enforce);
    let (_p, url, _metrics) = proxy_with_limits(upstream, vec![limit]).await;
    let c = h1_client();
    let refused = get_with(&c, &url, &[("x-user", "alice"), ("x-cost", "11")]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "11 > 10");
    let huge = get_with(
        &c,
        &url,
        &[("x-user", "alice"), ("x-cost", "9223372036854775807")],
    )
    .await;
    assert_eq!(huge.status, StatusCode::TOO_MANY_REQUESTS);
    let ok = get_with(&c, &url, &[("x-user", "alice"), ("x-cost", "10")]).await;
    assert_eq!(ok.status, StatusCode::OK, "the refusals counted nothing");
    assert_eq!(limit_headers(&ok), (Some("10"), Some("0")));
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

/// The same six requests through an enforced limit and through the same limit in shadow
/// mode: the shadow proxy serves all six and sends no numbers of its own, and reports as
/// would-be refusals exactly the requests the enforcing proxy refused.
#[tokio::test]
async fn a_shadow_limit_never_refuses_and_reports_what_enforce_would_have_refused() {
    let (upstream, hits) = llm_backend(400).await;
    let mk = |mode| tokens("tokens", 1_000, response_tokens(), mode);
    let (_e, enforce_url, enforce_metrics) =
        proxy_with_limits(upstream, vec![mk(LimitMode::Enforce)]).await;
    let (_s, shadow_url, shadow_metrics) =
        proxy_with_limits(upstream, vec![mk(LimitMode::Shadow)]).await;
    let c = h1_client();
    let alice = [("x-user", "alice")];
    let mut enforced = Vec::new();
    for _ in 0..6 {
        enforced.push(get_with(&c, &enforce_url, &alice).await.status);
    }
    let served = hits.swap(0, Ordering::SeqCst);
    for _ in 0..6 {
        let a = get_with(&c, &shadow_url, &alice).await;
        assert_eq!(a.status, StatusCode::OK, "shadow never refuses: {a:?}");
        assert_eq!(limit_headers(&a), (None, None), "nor sends its numbers");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 6);
    let limited = enforced
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((served, limited), (3, 3), "{enforced:?}");
    let e = enforce_metrics.encode();
    let s = shadow_metrics.encode();
    for (text, want) in [
        (
            &e,
            r#"tollgate_ratelimit_decisions_total{policy="default/limits",outcome="limited"} 3"#,
        ),
        (
            &e,
            r#"tollgate_ratelimit_decisions_total{policy="default/limits",outcome="allowed"} 3"#,
        ),
        (
            &s,
            r#"tollgate_ratelimit_decisions_total{policy="default/limits",outcome="shadow_limited"} 3"#,
        ),
        (
            &s,
            r#"tollgate_ratelimit_decisions_total{policy="default/limits",outcome="allowed"} 3"#,
        ),
    ] {
        assert!(text.contains(want), "missing {want} in\n{text}");
    }
    assert!(
        !s.contains(r#"outcome="limited""#),
        "a shadow limit refuses nothing:\n{s}"
    );
}
