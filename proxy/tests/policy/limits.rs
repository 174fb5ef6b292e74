//! Rate limits on the wire: `X-RateLimit-*` on admitted answers, 429 with `Retry-After`,
//! counters per value, `when`, several limits at once.

use http::{Method, StatusCode};
use tollgate_api::PolicySet;

use crate::common::*;
use crate::support::*;

// ---- rate limits ----

/// A proxy whose one route (`/`) allows `limit` requests a minute per `x-client-id`.
async fn per_client_limit(app: &EchoBackend, limit: u64) -> (tollgate_proxy::Proxy, String) {
    let set = PolicySet {
        auth: None,
        rate_limits: vec![per_minute(
            "per-client",
            limit,
            "request.headers['x-client-id']",
        )],
    };
    proxy_with_policies(app, vec![guarded("api", "/", "p")], vec![("p", set)]).await
}

#[tokio::test]
async fn a_per_client_limit_admits_three_a_minute_then_answers_429() {
    let app = echo_backend("app").await;
    let (_p, url) = per_client_limit(&app, 3).await;
    let c = h1_client();
    let alice = [("x-client-id", "alice")];

    for remaining in ["2", "1", "0"] {
        let ok = get_with(&c, &url, &alice).await;
        assert_eq!(ok.status, StatusCode::OK, "{ok:?}");
        assert_eq!(limit_headers(&ok), (Some("3"), Some(remaining)));
        reset_within_the_window(&ok);
        assert!(!ok.headers.contains_key("retry-after"), "{:?}", ok.headers);
        assert_eq!(
            ok.json()["backend"],
            "app",
            "admitted answers come from the upstream"
        );
    }
    let limited = get_with(&c, &url, &alice).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limit_headers(&limited), (Some("3"), Some("0")));
    retry_after_a_full_window_of_3(&limited);
    reset_within_the_window(&limited);
    assert_eq!(&limited.body[..], b"Too Many Requests\n");
    assert!(header(&limited, "x-request-id").is_some());
    assert_eq!(
        app.hits(),
        3,
        "the refused request did not reach the upstream"
    );

    // Another value of the counter has a counter of its own.
    let bob = get_with(&c, &url, &[("x-client-id", "bob")]).await;
    assert_eq!(bob.status, StatusCode::OK);
    assert_eq!(limit_headers(&bob), (Some("3"), Some("2")));
    // And alice stays refused.
    let again = get_with(&c, &url, &alice).await;
    assert_eq!(again.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn requests_without_the_counter_value_share_one_counter() {
    let app = echo_backend("app").await;
    let (_p, url) = per_client_limit(&app, 3).await;
    let c = h1_client();
    for remaining in ["2", "1", "0"] {
        let ok = get_with(&c, &url, &[]).await;
        assert_eq!(limit_headers(&ok), (Some("3"), Some(remaining)));
    }
    let limited = get_with(&c, &url, &[]).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_limit_whose_when_does_not_hold_is_not_applied() {
    let app = echo_backend("app").await;
    let mut writes = per_minute("writes", 1, "source.address");
    writes.when = vec!["request.method == 'POST'".into()];
    let set = PolicySet {
        auth: None,
        rate_limits: vec![writes],
    };
    let (_p, url) =
        proxy_with_policies(&app, vec![guarded("api", "/", "p")], vec![("p", set)]).await;
    let c = h1_client();
    for _ in 0..4 {
        let read = get_with(&c, &url, &[]).await;
        assert_eq!(read.status, StatusCode::OK);
        assert_eq!(
            limit_headers(&read),
            (None, None),
            "a limit that does not apply adds no headers"
        );
    }
    let write = request(&c, Method::POST, &url, &[]).await;
    assert_eq!(write.status, StatusCode::OK);
    assert_eq!(limit_headers(&write), (Some("1"), Some("0")));
    let write = request(&c, Method::POST, &url, &[]).await;
    assert_eq!(write.status, StatusCode::TOO_MANY_REQUESTS);
    // Reads are still not limited.
    assert_eq!(get_with(&c, &url, &[]).await.status, StatusCode::OK);
}

#[tokio::test]
async fn every_applicable_limit_must_admit_and_the_tightest_is_reported() {
    let app = echo_backend("app").await;
    let set = PolicySet {
        auth: None,
        rate_limits: vec![
            per_minute("per-client", 3, "request.headers['x-client-id']"),
            per_minute("per-ip", 5, "source.address"),
        ],
    };
    let (_p, url) =
        proxy_with_policies(&app, vec![guarded("api", "/", "p")], vec![("p", set)]).await;
    let c = h1_client();
    // alice: 3 of her own and of the 5 per address.
    for remaining in ["2", "1", "0"] {
        let a = get_with(&c, &url, &[("x-client-id", "alice")]).await;
        assert_eq!(limit_headers(&a), (Some("3"), Some(remaining)));
    }
    // bob: his own limit has room, but the address has 2, then 1... left.
    let b = get_with(&c, &url, &[("x-client-id", "bob")]).await;
    assert_eq!(b.status, StatusCode::OK);
    assert_eq!(limit_headers(&b), (Some("5"), Some("1")));
    let b = get_with(&c, &url, &[("x-client-id", "bob")]).await;
    assert_eq!(limit_headers(&b), (Some("5"), Some("0")));
    let b = get_with(&c, &url, &[("x-client-id", "bob")]).await;
    assert_eq!(b.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limit_headers(&b), (Some("5"), Some("0")));
    assert_eq!(app.hits(), 5);
}

/// A gRPC client over the limit gets `RESOURCE_EXHAUSTED` (8), not an HTTP 429 its library
/// would map to `UNAVAILABLE` and retry; `Retry-After` and `X-RateLimit-*` stay.
#[tokio::test]
async fn a_grpc_client_over_the_limit_gets_resource_exhausted() {
    let app = echo_backend("app").await;
    let (_p, url) = per_client_limit(&app, 1).await;
    let c = h2c_client();
    let url = format!("{url}/svc.Api/Get");
    let call = [
        ("x-client-id", "alice"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ];
    let ok = request(&c, Method::POST, &url, &call).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(ok.json()["backend"], "app");
    assert_eq!(header(&ok, "grpc-status"), None, "the upstream's answer");
    let limited = request(&c, Method::POST, &url, &call).await;
    assert_eq!(limited.status, StatusCode::OK, "{limited:?}");
    assert_eq!(header(&limited, "grpc-status"), Some("8"));
    assert_eq!(header(&limited, "grpc-message"), Some("Too Many Requests"));
    assert_eq!(limit_headers(&limited), (Some("1"), Some("0")));
    assert!(header(&limited, "retry-after").is_some());
    assert!(limited.body.is_empty());
    assert_eq!(app.hits(), 1);
}
