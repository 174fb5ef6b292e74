//! Remote key sets: fetched from a loopback JWKS server, shared across table builds,
//! refetched (once, rate-limited) for an unknown kid, kept when a fetch fails.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use jsonwebtoken::Algorithm;
use serde_json::Value;
use tollgate_proxy::policy::auth::{AuthOptions, AuthOutcome, MethodKind, Outcome};

use crate::support::*;

#[tokio::test]
async fn keys_are_fetched_once_and_shared_across_table_builds() {
    let k1 = SigningKey::rsa(1, Algorithm::RS256);
    let doc = Arc::new(Mutex::new(jwks(&[&k1])));
    let server = jwks_server(doc).await;
    let s = state();
    let policy = auth(vec![method(
        "jwt",
        bearer(),
        jwt_remote(&server.url("/jwks")),
    )]);
    let t1 = build(&policy, &s);
    assert!(
        check(&t1, with_bearer(&k1.sign(&claims("alice"))))
            .await
            .allowed()
    );
    // A new table (same URI) reuses the keys while the old one is still alive.
    let t2 = build(&policy, &s);
    drop(t1);
    assert!(
        check(&t2, with_bearer(&k1.sign(&claims("bob"))))
            .await
            .allowed()
    );
    assert_eq!(server.hits(), 1, "one fetch for both tables");
    assert_eq!(s.metrics().jwks_fetches(true), 1);
}

#[tokio::test]
async fn a_new_kid_triggers_one_refetch_then_further_unknown_kids_wait() {
    let (k1, k2) = (
        SigningKey::rsa(1, Algorithm::RS256),
        SigningKey::rsa(2, Algorithm::RS256),
    );
    let doc = Arc::new(Mutex::new(jwks(&[&k1])));
    let server = jwks_server(doc.clone()).await;
    // The default limit: at most one refetch per 10 s per URI.
    let s = state();
    let p = build(
        &auth(vec![method(
            "jwt",
            bearer(),
            jwt_remote(&server.url("/jwks")),
        )]),
        &s,
    );
    assert!(
        check(&p, with_bearer(&k1.sign(&claims("a"))))
            .await
            .allowed()
    );
    assert_eq!(server.hits(), 1);

    // The issuer rotates: rsa-2 appears.
    *doc.lock().unwrap() = jwks(&[&k1, &k2]);
    assert!(
        check(&p, with_bearer(&k2.sign(&claims("b"))))
            .await
            .allowed()
    );
    assert_eq!(server.hits(), 2, "one refetch for the new kid");
    assert!(
        check(&p, with_bearer(&k2.sign(&claims("c"))))
            .await
            .allowed()
    );
    assert_eq!(server.hits(), 2, "known now");

    // Tokens naming kids nobody published do not hammer the endpoint.
    let stranger = SigningKey::rsa(2, Algorithm::RS256).with_kid("rsa-9");
    for _ in 0..5 {
        assert!(
            !check(&p, with_bearer(&stranger.sign(&claims("m"))))
                .await
                .allowed()
        );
    }
    assert_eq!(server.hits(), 2, "refetch is rate-limited");
    assert!(
        check(&p, with_bearer(&k1.sign(&claims("d"))))
            .await
            .allowed()
    );
}

#[tokio::test]
async fn a_failed_fetch_keeps_the_last_keys() {
    let (k1, k2) = (
        SigningKey::rsa(1, Algorithm::RS256),
        SigningKey::rsa(2, Algorithm::RS256),
    );
    let doc = Arc::new(Mutex::new(jwks(&[&k1])));
    let server = jwks_server(doc.clone()).await;
    let s = state_with(AuthOptions {
        jwks_min_refetch_interval: Duration::ZERO,
        ..AuthOptions::default()
    });
    let p = build(
        &auth(vec![method(
            "jwt",
            bearer(),
            jwt_remote(&server.url("/jwks")),
        )]),
        &s,
    );
    assert!(
        check(&p, with_bearer(&k1.sign(&claims("a"))))
            .await
            .allowed()
    );

    // The endpoint breaks; an unknown kid makes the proxy try, and fail.
    *doc.lock().unwrap() = Value::Null;
    let c = check(&p, with_bearer(&k2.sign(&claims("b")))).await;
    assert_eq!(c.status(), 401);
    assert_eq!(s.metrics().jwks_fetches(false), 1);
    // rsa-1 still verifies.
    assert!(
        check(&p, with_bearer(&k1.sign(&claims("c"))))
            .await
            .allowed()
    );

    // Back up, with rsa-2: picked up on the next unknown kid.
    *doc.lock().unwrap() = jwks(&[&k1, &k2]);
    assert!(
        check(&p, with_bearer(&k2.sign(&claims("d"))))
            .await
            .allowed()
    );
    assert_eq!(s.metrics().jwks_fetches(true), 2);
}

#[tokio::test]
async fn an_unreachable_jwks_with_no_keys_denies_as_an_error() {
    let k1 = SigningKey::rsa(1, Algorithm::RS256);
    let s = state_with(AuthOptions {
        http_timeout: Duration::from_millis(500),
        ..AuthOptions::default()
    });
    let addr = dead_addr().await;
    let p = build(
        &auth(vec![method(
            "jwt",
            bearer(),
            jwt_remote(&format!("http://{addr}/jwks")),
        )]),
        &s,
    );
    let c = check(&p, with_bearer(&k1.sign(&claims("a")))).await;
    assert_eq!(c.status(), 401);
    assert_eq!(c.www_authenticate(), [r#"Bearer realm="tollgate""#]);
    match c.outcome {
        AuthOutcome::Denied(d) => assert_eq!(d.outcome, Outcome::Error),
        AuthOutcome::Allowed(_) => unreachable!(),
    }
    assert_eq!(
        s.metrics().outcome_count(MethodKind::Jwt, Outcome::Error),
        1
    );
}

#[tokio::test]
async fn a_jwks_serving_garbage_denies() {
    let k1 = SigningKey::rsa(1, Algorithm::RS256);
    let server = jwks_server(Arc::new(Mutex::new(serde_json::json!({"hello": "world"})))).await;
    let s = state();
    let p = build(
        &auth(vec![method(
            "jwt",
            bearer(),
            jwt_remote(&server.url("/jwks")),
        )]),
        &s,
    );
    assert!(
        !check(&p, with_bearer(&k1.sign(&claims("a"))))
            .await
            .allowed()
    );
    assert_eq!(s.metrics().jwks_fetches(false), 1);
}

#[tokio::test]
async fn a_jwks_uri_that_is_not_http_is_a_build_error() {
    for uri in ["ftp://x/jwks", "/relative", "not a uri"] {
        let err = tollgate_proxy::policy::auth::CompiledAuth::build(
            &auth(vec![method("jwt", bearer(), jwt_remote(uri))]),
            &state(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("authentication.jwt: `{uri}` is not an absolute http(s) URI")
        );
    }
}

#[tokio::test]
async fn keys_are_fetched_over_https_trusting_the_configured_roots() {
    let k1 = SigningKey::rsa(1, Algorithm::RS256);
    let (acceptor, client) = loopback_tls();
    let server = jwks_server_with(Some(acceptor), Arc::new(Mutex::new(jwks(&[&k1])))).await;
    assert!(server.url("/jwks").starts_with("https://127.0.0.1:"));
    let policy = auth(vec![method(
        "jwt",
        bearer(),
        jwt_remote(&server.url("/jwks")),
    )]);
    let trusting = state_with(AuthOptions {
        tls: Some(client),
        ..AuthOptions::default()
    });
    let p = build(&policy, &trusting);
    assert!(
        check(&p, with_bearer(&k1.sign(&claims("a"))))
            .await
            .allowed()
    );

    // System roots do not include the test CA: the handshake fails, and that denies.
    let system = state();
    let p = build(&policy, &system);
    let c = check(&p, with_bearer(&k1.sign(&claims("a")))).await;
    assert_eq!(c.status(), 401);
    assert_eq!(system.metrics().jwks_fetches(false), 1);
    assert_eq!(server.hits(), 1, "no request got through without trust");
}

#[tokio::test]
async fn stale_keys_are_refreshed_and_a_removed_key_stops_verifying() {
    let (k1, k2) = (
        SigningKey::rsa(1, Algorithm::RS256),
        SigningKey::rsa(2, Algorithm::RS256),
    );
    let doc = Arc::new(Mutex::new(jwks(&[&k1, &k2])));
    let server = jwks_server(doc.clone()).await;
    // Every set is stale at once; refetches are not limited.
    let s = state_with(AuthOptions {
        jwks_max_age: Duration::ZERO,
        jwks_min_refetch_interval: Duration::ZERO,
        ..AuthOptions::default()
    });
    let p = build(
        &auth(vec![method(
            "jwt",
            bearer(),
            jwt_remote(&server.url("/jwks")),
        )]),
        &s,
    );
    let cached = k1.sign(&claims("a"));
    assert!(check(&p, with_bearer(&cached)).await.allowed());
    assert_eq!(s.metrics().jwks_fetches(true), 1);

    // The issuer revokes rsa-1. Requests are still served from the keys at hand, and start
    // a background refresh (when no other fetch holds the set).
    *doc.lock().unwrap() = jwks(&[&k2]);
    for i in 0..500 {
        if s.metrics().jwks_fetches(true) > 1 {
            break;
        }
        let _ = check(&p, with_bearer(&k1.sign(&claims(&format!("b{i}"))))).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        s.metrics().jwks_fetches(true) > 1,
        "background refresh stored"
    );

    // rsa-1 is gone: new tokens and the once-cached one are refused; rsa-2 still works.
    assert!(
        !check(&p, with_bearer(&k1.sign(&claims("c"))))
            .await
            .allowed()
    );
    assert!(!check(&p, with_bearer(&cached)).await.allowed());
    assert!(
        check(&p, with_bearer(&k2.sign(&claims("d"))))
            .await
            .allowed()
    );
}
