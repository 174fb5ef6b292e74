//! API keys, read from every credential source; revocation by a rebuilt table.

use serde_json::json;
use tollgate_api::policy::Credentials;
use tollgate_proxy::policy::auth::{AuthOutcome, CompiledAuth, MethodKind, Outcome};

use crate::support::*;

fn keys_policy(credentials: Credentials, keys: &[(&str, &str)]) -> tollgate_api::policy::Auth {
    auth(vec![method("keys", credentials, api_keys(keys))])
}

#[tokio::test]
async fn every_credential_source_is_read() {
    let s = state();
    let cases = [
        (
            Credentials::AuthorizationHeader {
                prefix: "APIKEY".into(),
            },
            get(&[("authorization", "apikey k-alice")]),
            get(&[("authorization", "Bearer k-alice")]),
        ),
        (
            Credentials::CustomHeader {
                name: "x-api-key".into(),
            },
            get(&[("x-api-key", "k-alice")]),
            get(&[("x-other", "k-alice")]),
        ),
        (
            Credentials::QueryString {
                name: "api_key".into(),
            },
            req("GET", "/orders?page=1&api_key=k-alice", &[]),
            req("GET", "/orders?key=k-alice", &[]),
        ),
        (
            Credentials::Cookie { name: "key".into() },
            get(&[("cookie", "theme=dark; key=k-alice")]),
            get(&[("cookie", "apikey=k-alice")]),
        ),
    ];
    for (credentials, good, elsewhere) in cases {
        let label = format!("{credentials:?}");
        let p = build(&keys_policy(credentials, &[("k-alice", "alice")]), &s);
        let c = check(&p, good).await;
        assert!(c.allowed(), "{label}");
        assert_eq!(c.identity()["metadata"]["name"], "alice", "{label}");
        let c = check(&p, elsewhere).await;
        assert_eq!(c.status(), 401, "{label}: credential in the wrong place");
        assert_eq!(c.www_authenticate().len(), 1, "{label}");
    }
}

#[tokio::test]
async fn the_identity_is_the_secret_metadata_never_the_key() {
    let p = build(
        &keys_policy(
            Credentials::CustomHeader {
                name: "x-api-key".into(),
            },
            &[("k-alice", "alice"), ("k-bob", "bob")],
        ),
        &state(),
    );
    let c = check(&p, get(&[("x-api-key", "k-bob")])).await;
    assert_eq!(
        c.identity(),
        json!({"metadata": {"name": "bob", "namespace": "shop", "labels": {"tier": "gold"}}})
    );
    assert!(!c.identity().to_string().contains("k-bob"));
}

#[tokio::test]
async fn a_wrong_key_is_refused_with_an_apikey_challenge() {
    let s = state();
    let p = build(
        &keys_policy(
            Credentials::AuthorizationHeader {
                prefix: "APIKEY".into(),
            },
            &[("k-alice", "alice")],
        ),
        &s,
    );
    let c = check(&p, get(&[("authorization", "APIKEY k-alicE")])).await;
    assert_eq!(c.status(), 401);
    assert_eq!(c.www_authenticate(), [r#"APIKEY realm="tollgate""#]);
    match &c.outcome {
        AuthOutcome::Denied(d) => assert_eq!(d.outcome, Outcome::Unauthenticated),
        AuthOutcome::Allowed(_) => unreachable!(),
    }
    assert_eq!(
        s.metrics()
            .outcome_count(MethodKind::ApiKey, Outcome::Unauthenticated),
        1
    );
}

#[tokio::test]
async fn a_key_removed_in_a_rebuilt_table_is_refused() {
    let s = state();
    let src = Credentials::CustomHeader {
        name: "x-api-key".into(),
    };
    let before = build(
        &keys_policy(src.clone(), &[("k-alice", "alice"), ("k-bob", "bob")]),
        &s,
    );
    assert!(
        check(&before, get(&[("x-api-key", "k-bob")]))
            .await
            .allowed()
    );
    let after = build(&keys_policy(src, &[("k-alice", "alice")]), &s);
    assert!(
        !check(&after, get(&[("x-api-key", "k-bob")]))
            .await
            .allowed()
    );
    assert!(
        check(&after, get(&[("x-api-key", "k-alice")]))
            .await
            .allowed()
    );
}

#[tokio::test]
async fn a_malformed_digest_is_a_build_error() {
    let mut p = keys_policy(
        Credentials::CustomHeader {
            name: "x-api-key".into(),
        },
        &[("k", "k")],
    );
    if let tollgate_api::policy::Method::ApiKey(k) = &mut p.authentication[0].method {
        k.keys[0].sha256 = "abc".into();
    }
    let err = CompiledAuth::build(&p, &state()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "authentication.keys: API key #0: sha256 is not 64 hex digits"
    );
}
