//! Token introspection against a loopback RFC 7662 endpoint: active, inactive, unreachable,
//! slow, failing, and the answer cache.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::StatusCode;
use serde_json::json;
use tollgate_proxy::policy::auth::{AuthOptions, AuthOutcome, Cache, MethodKind, Outcome};

use crate::support::*;

/// An endpoint that knows `tok-alice` (active) and `tok-old` (inactive).
async fn endpoint(delay: Duration) -> TestServer {
    TestServer::start(delay, |_, body| {
        let form: Vec<(String, String)> = form_urlencoded::parse(body).into_owned().collect();
        let token = form
            .iter()
            .find(|(k, _)| k == "token")
            .map(|(_, v)| v.as_str());
        match token {
            Some("tok-alice") => (
                StatusCode::OK,
                json!({"active": true, "sub": "alice", "scope": "orders:read",
                       "exp": now() + 3600}),
            ),
            Some("tok-broken") => (StatusCode::INTERNAL_SERVER_ERROR, json!({})),
            _ => (StatusCode::OK, json!({"active": false})),
        }
    })
    .await
}

fn policy(url: &str, cache_ms: u64) -> tollgate_api::policy::Auth {
    auth(vec![method(
        "oauth",
        bearer(),
        introspection(url, cache_ms),
    )])
}

fn denied_outcome(c: &Checked) -> Outcome {
    match &c.outcome {
        AuthOutcome::Denied(d) => d.outcome,
        AuthOutcome::Allowed(_) => panic!("allowed"),
    }
}

#[tokio::test]
async fn an_active_token_is_allowed_with_the_answer_as_identity() {
    let server = endpoint(Duration::ZERO).await;
    let p = build(&policy(&server.url("/introspect"), 10_000), &state());
    let c = check(&p, with_bearer("tok-alice")).await;
    assert!(c.allowed());
    assert_eq!(c.sub.as_deref(), Some("alice"));
    assert_eq!(c.identity()["scope"], "orders:read");

    // RFC 7662 request: form body with the token, Basic client credentials (RFC 6749
    // §2.3.1: form-encoded before base64).
    let seen = server.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let (authz, body) = &seen[0];
    let expected = STANDARD.encode("gateway:s3cret%3A%26%3D");
    assert_eq!(authz.as_deref(), Some(format!("Basic {expected}").as_str()));
    assert_eq!(body, "token=tok-alice&token_type_hint=access_token");
}

#[tokio::test]
async fn an_inactive_token_is_refused() {
    let server = endpoint(Duration::ZERO).await;
    let s = state();
    let p = build(&policy(&server.url("/introspect"), 10_000), &s);
    let c = check(&p, with_bearer("tok-old")).await;
    assert_eq!(c.status(), 401);
    assert_eq!(c.www_authenticate(), [r#"Bearer realm="tollgate""#]);
    assert_eq!(denied_outcome(&c), Outcome::Unauthenticated);
    assert_eq!(
        s.metrics()
            .outcome_count(MethodKind::Introspection, Outcome::Unauthenticated),
        1
    );
}

#[tokio::test]
async fn answers_are_cached_for_cache_ms() {
    let server = endpoint(Duration::ZERO).await;
    let s = state();
    let p = build(&policy(&server.url("/introspect"), 60_000), &s);
    for _ in 0..3 {
        assert!(check(&p, with_bearer("tok-alice")).await.allowed());
        assert!(!check(&p, with_bearer("tok-old")).await.allowed());
    }
    assert_eq!(
        server.hits(),
        2,
        "one call per token, inactive answers cached too"
    );
    assert_eq!(s.metrics().cache_hits(Cache::Introspection), 4);
    // A rebuilt table shares the cache.
    let p2 = build(&policy(&server.url("/introspect"), 60_000), &s);
    assert!(check(&p2, with_bearer("tok-alice")).await.allowed());
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn cache_ms_zero_asks_every_time() {
    let server = endpoint(Duration::ZERO).await;
    let p = build(&policy(&server.url("/introspect"), 0), &state());
    for _ in 0..3 {
        assert!(check(&p, with_bearer("tok-alice")).await.allowed());
    }
    assert_eq!(server.hits(), 3);
}

#[tokio::test]
async fn an_unreachable_endpoint_denies() {
    let addr = dead_addr().await;
    let s = state();
    let p = build(&policy(&format!("http://{addr}/introspect"), 10_000), &s);
    let c = check(&p, with_bearer("tok-alice")).await;
    assert_eq!(c.status(), 401);
    assert_eq!(denied_outcome(&c), Outcome::Error);
    assert_eq!(
        s.metrics()
            .outcome_count(MethodKind::Introspection, Outcome::Error),
        1
    );
}

#[tokio::test]
async fn a_slow_endpoint_times_out_and_denies() {
    let server = endpoint(Duration::from_secs(10)).await;
    let s = state_with(AuthOptions {
        http_timeout: Duration::from_millis(200),
        ..AuthOptions::default()
    });
    let p = build(&policy(&server.url("/introspect"), 10_000), &s);
    let c = check(&p, with_bearer("tok-alice")).await;
    assert_eq!(c.status(), 401);
    assert_eq!(denied_outcome(&c), Outcome::Error);
}

#[tokio::test]
async fn endpoint_errors_deny_and_are_not_cached() {
    let server = endpoint(Duration::ZERO).await;
    let p = build(&policy(&server.url("/introspect"), 60_000), &state());
    for _ in 0..2 {
        let c = check(&p, with_bearer("tok-broken")).await;
        assert_eq!(denied_outcome(&c), Outcome::Error);
    }
    assert_eq!(server.hits(), 2);
}
