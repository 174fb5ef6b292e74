//! AuthPolicy `external` authorization over HTTP, end to end: a proxy whose route carries an
//! external rule, an authorization service written here (hyper on 127.0.0.1, plaintext or
//! TLS, recording every check it is asked), and the echo backend. Allowed answers add the
//! listed headers upstream and downstream; denials carry the service's status, headers and
//! body; a slow, failing or unreachable service denies (403) unless `failOpen`; decisions are
//! cached per forwarded attributes; bodies are forwarded up to the limit and refused (413)
//! beyond it. The HTTPRoute ExternalAuth filter follows GEP-1494: only a 200 allows. A
//! service's answer never sets Host, hop-by-hop or framing headers, and a check never
//! carries the client's hop-by-hop headers.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use tollgate_api::external::{ExternalProtocol, HttpCheck};

use crate::common::*;
use crate::external_grpc::h2c_at;
use crate::external_support::*;

#[tokio::test]
async fn an_allowing_answer_adds_the_listed_headers_upstream_and_downstream() {
    let s = Setup::policy(http_rule(2_000, false, None)).await;
    let a = s
        .get(
            "/orders?page=1",
            &[
                ("authorization", "Bearer good"),
                ("x-other", "not forwarded"),
                ("x-auth-user", "mallory"),
            ],
        )
        .await;
    assert_eq!(a.status, StatusCode::OK);
    // Upstream: the service's listed header replaces the client's; the unlisted one is not
    // copied.
    assert_eq!(a.upstream_header("x-auth-user").as_deref(), Some("alice"));
    assert_eq!(a.upstream_header("x-unlisted"), None);
    assert_eq!(a.upstream_header("x-auth-client"), None);
    // Downstream: the listed client header.
    assert_eq!(a.headers["x-auth-client"], "hi");
    assert!(a.headers.get("x-auth-user").is_none());
    // The check: method, prefixed path with the query, the forwarded header only, and the
    // forwarding headers.
    let seen = s.svc.last();
    assert_eq!(seen.method, "GET");
    assert_eq!(seen.path, "/check/orders?page=1");
    assert_eq!(seen.headers["authorization"], "Bearer good");
    assert!(seen.headers.get("x-other").is_none());
    assert_eq!(seen.headers["x-forwarded-method"], "GET");
    assert_eq!(seen.headers["x-forwarded-uri"], "/orders?page=1");
    assert_eq!(seen.headers["x-forwarded-proto"], "http");
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen.headers["host"], "127.0.0.1");
    assert_eq!(s.svc.checks(), 1);
}

#[tokio::test]
async fn a_denying_answer_reaches_the_client_with_its_status_headers_and_body() {
    let s = Setup::policy(http_rule(2_000, false, None)).await;
    let a = s.bearer("bad").await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert_eq!(a.headers["www-authenticate"], "Bearer realm=\"ext\"");
    assert_eq!(&a.body[..], b"go away\n");
    assert_eq!(
        s.app.hits(),
        0,
        "a denied request never reaches the backend"
    );
    assert_eq!(s.counted("denied"), 1);
    assert_eq!(s.decided(Outcome::Denied), 1);
    assert_eq!(s.decided(Outcome::Allowed), 0);
}

#[tokio::test]
async fn a_slow_service_denies_unless_the_rule_fails_open() {
    let slow = [("authorization", "Bearer good"), ("x-slow", "yes")];
    let s = Setup::policy(http_rule(100, false, None)).await;
    let a = s.get("/orders", &slow).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(s.app.hits(), 0);
    assert_eq!(s.counted("error"), 1);
    assert_eq!(s.decided(Outcome::Error), 1);

    let s = Setup::policy(http_rule(100, true, None)).await;
    let a = s.get("/orders", &slow).await;
    assert_eq!(a.status, StatusCode::OK);
    // Let through without the service's headers: it never answered.
    assert_eq!(a.upstream_header("x-auth-user"), None);
    assert_eq!(s.app.hits(), 1);
    assert_eq!(s.counted("fail_open"), 1);
    assert_eq!(s.decided(Outcome::FailOpen), 1);
    assert_eq!(s.decided(Outcome::Error), 0);
}

#[tokio::test]
async fn a_failing_or_unreachable_service_denies_with_403() {
    let s = Setup::policy(http_rule(2_000, false, None)).await;
    let a = s.bearer("broken").await;
    assert_eq!(
        a.status,
        StatusCode::FORBIDDEN,
        "a 5xx is a failure, not a denial"
    );
    assert_eq!(&a.body[..], b"Forbidden\n");
    assert_eq!(s.counted("error"), 1);

    let closed: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let s = Setup::policy_to(http_rule(2_000, false, None), |_| backend_at(closed)).await;
    let a = s.bearer("good").await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(s.app.hits(), 0);
}

#[tokio::test]
async fn decisions_are_cached_per_forwarded_attributes() {
    let s = Setup::policy(http_rule(2_000, false, Some(60_000))).await;
    for _ in 0..5 {
        let a = s.bearer("good").await;
        assert_eq!(a.status, StatusCode::OK);
        // A cached allow still adds its headers.
        assert_eq!(a.upstream_header("x-auth-user").as_deref(), Some("alice"));
        assert_eq!(a.headers["x-auth-client"], "hi");
    }
    assert_eq!(s.svc.checks(), 1, "five identical requests, one check");
    assert_eq!(s.counted("cache_hit"), 4);
    // Another credential is never served the cached decision.
    for _ in 0..3 {
        assert_eq!(s.bearer("bad").await.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(s.svc.checks(), 2, "a denial is cached too");
    // Cached or not, each request is a decision of the rule.
    assert_eq!(s.decided(Outcome::Allowed), 5);
    assert_eq!(s.decided(Outcome::Denied), 3);
    // Another path is another decision.
    let a = s
        .get("/orders/7", &[("authorization", "Bearer good")])
        .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(s.svc.checks(), 3);
}

#[tokio::test]
async fn without_a_cache_ttl_every_request_is_checked() {
    let s = Setup::policy(http_rule(2_000, false, None)).await;
    for _ in 0..3 {
        s.bearer("good").await;
    }
    assert_eq!(s.svc.checks(), 3);
}

#[tokio::test]
async fn the_body_is_forwarded_up_to_the_limit_and_refused_beyond_it() {
    let mut rule = http_rule(2_000, false, None);
    rule.max_body_bytes = Some(16);
    let s = Setup::policy(rule).await;
    let post = |body: &'static [u8]| {
        Request::post(format!("{}/orders", s.url))
            .header("authorization", "Bearer good")
            .body(Full::new(Bytes::from_static(body)))
            .unwrap()
    };
    let a = send(&s.client, post(b"{\"qty\": 2}")).await;
    assert_eq!(a.status, StatusCode::OK);
    let seen = s.svc.last();
    assert_eq!(seen.method, "POST");
    assert_eq!(&seen.body[..], b"{\"qty\": 2}");
    // The backend still gets the whole body.
    assert_eq!(a.json()["body"], "{\"qty\": 2}");

    let a = send(&s.client, post(b"a body longer than sixteen bytes")).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        s.svc.checks(),
        1,
        "a body over the limit is refused before any check"
    );
    assert_eq!(s.app.hits(), 1);
}

#[tokio::test]
async fn an_h2c_service_is_asked_over_http2() {
    // The same HTTP check to a service port spoken to over h2c (appProtocol kubernetes.io/h2c).
    let s = Setup::policy_to(http_rule(2_000, false, None), h2c_at).await;
    let a = s.bearer("good").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.upstream_header("x-auth-user").as_deref(), Some("alice"));
    assert_eq!(s.svc.last().path, "/check/orders");
}

#[tokio::test]
async fn the_policy_rule_allows_any_2xx() {
    // The AuthPolicy rule's documented rule (nginx's auth_request, Traefik's ForwardAuth).
    let s = Setup::policy(http_rule(2_000, false, None)).await;
    let a = s.bearer("nocontent").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.upstream_header("x-auth-user").as_deref(), Some("alice"));
    assert_eq!(s.counted("allowed"), 1);
}

#[tokio::test]
async fn an_answer_never_sets_host_or_hop_by_hop_headers_even_when_listed() {
    // A rule that lists them: the service's Host would send the request to another virtual
    // host than the one routed and judged; hop-by-hop headers belong to one connection.
    let mut rule = http_rule(2_000, false, None);
    rule.protocol = ExternalProtocol::Http(HttpCheck {
        path_prefix: "/check".into(),
        headers_to_upstream: ["x-auth-user", "host", "keep-alive", "te", "trailer"]
            .map(String::from)
            .to_vec(),
        headers_to_client: ["x-auth-client", "keep-alive", "trailer"]
            .map(String::from)
            .to_vec(),
        ..HttpCheck::default()
    });
    let s = Setup::policy(rule).await;
    let a = s.bearer("hostile").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.upstream_header("x-auth-user").as_deref(), Some("alice"));
    let host = s.url.trim_start_matches("http://");
    assert_eq!(a.upstream_header("host").as_deref(), Some(host));
    for name in ["keep-alive", "te", "trailer"] {
        assert_eq!(a.upstream_header(name), None, "{name} upstream");
    }
    assert_eq!(a.headers["x-auth-client"], "hi");
    for name in ["keep-alive", "trailer"] {
        assert!(a.headers.get(name).is_none(), "{name} to the client");
    }
}

#[tokio::test]
async fn a_check_never_carries_the_clients_hop_by_hop_headers() {
    let mut rule = http_rule(2_000, false, None);
    rule.forward_headers = ["authorization", "keep-alive", "te", "trailer", "x-tenant"]
        .map(String::from)
        .to_vec();
    let s = Setup::policy(rule).await;
    let a = s
        .get(
            "/orders",
            &[
                ("authorization", "Bearer good"),
                ("keep-alive", "timeout=5"),
                ("te", "trailers"),
                ("trailer", "x-checksum"),
                ("x-tenant", "acme"),
            ],
        )
        .await;
    assert_eq!(a.status, StatusCode::OK);
    let seen = s.svc.last();
    assert_eq!(seen.headers["x-tenant"], "acme");
    for name in ["keep-alive", "te", "trailer"] {
        assert!(seen.headers.get(name).is_none(), "{name}");
    }
}

#[tokio::test]
async fn an_answer_too_large_or_never_ending_is_a_failure_of_the_service() {
    // The gateway reads at most 64 KiB of an answer, all of it within the rule's timeout: a
    // huge answer or one that drips forever cannot hold the request or the proxy's memory.
    for fail_open in [false, true] {
        let s = Setup::policy(http_rule(300, fail_open, None)).await;
        for token in ["huge", "drip"] {
            let a = s.bearer(token).await;
            if fail_open {
                assert_eq!(a.status, StatusCode::OK, "{token}");
                assert_eq!(a.upstream_header("x-auth-user"), None, "{token}");
            } else {
                assert_eq!(a.status, StatusCode::FORBIDDEN, "{token}");
            }
        }
        let (counted, hits) = if fail_open {
            ("fail_open", 2)
        } else {
            ("error", 0)
        };
        assert_eq!(s.counted(counted), 2);
        assert_eq!(s.app.hits(), hits);
    }
}

// ---- the HTTPRoute ExternalAuth filter (GEP-1494): the same check, from the route ----

#[tokio::test]
async fn the_external_auth_filter_copies_the_allowing_answer_upstream() {
    let s = Setup::filter(filter_rule()).await;
    let a = s.bearer("good").await;
    assert_eq!(a.status, StatusCode::OK);
    for (name, value) in [
        ("x-auth-user", "alice"),
        ("x-auth-client", "hi"),
        ("x-unlisted", "nope"),
    ] {
        assert_eq!(a.upstream_header(name).as_deref(), Some(value), "{name}");
    }
    // Not the answer's own framing or content headers.
    assert_eq!(a.json()["method"], "GET");
    assert_eq!(s.svc.last().path, "/check/orders");
}

#[tokio::test]
async fn the_external_auth_filter_denies_with_the_answer_and_fails_closed() {
    let s = Setup::filter(filter_rule()).await;
    let a = s.bearer("bad").await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert_eq!(&a.body[..], b"go away\n");

    // A backend the compiler could not resolve (empty key): 403, never open.
    let mut unresolved = filter_rule();
    unresolved.backend = String::new();
    let s = Setup::filter(unresolved).await;
    assert_eq!(s.bearer("good").await.status, StatusCode::FORBIDDEN);
    assert_eq!(s.app.hits(), 0);
}

#[tokio::test]
async fn the_external_auth_filter_allows_only_on_200() {
    // GEP-1494: "each backend must respond with a `200` status code on a successful
    // authorization. Any other code is considered an authorization failure." A 204 must not
    // read as a success to the client either: 403.
    let s = Setup::filter(filter_rule()).await;
    let a = s.bearer("nocontent").await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(s.svc.checks(), 1, "the service was asked");
    assert_eq!(s.app.hits(), 0);
    // And a 5xx is one too: 403, the filter never fails open.
    assert_eq!(s.bearer("broken").await.status, StatusCode::FORBIDDEN);
    assert_eq!(s.app.hits(), 0);
}
