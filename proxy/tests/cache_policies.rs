//! The cache runs after the route's policies: a request the AuthPolicy refuses is refused
//! even when its answer is stored, and every hit is counted by the rate limit (the request
//! past the limit is refused, though a stored answer was there for it); and an answer made
//! for one credential (an AuthPolicy's, or one an ExternalAuth filter's service read) is not
//! shared with another.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cache_support;
mod common;

use cache_support::*;
use serde_json::json;
use tollgate_api::ObjectKey;
use tollgate_api::PolicySet;
use tollgate_api::policy::{
    ApiKey, ApiKeys, Auth, AuthnMethod, Credentials, DenyResponse, Method as Verify, Rate,
    RateLimit,
};

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An API key (`x-api-key: alice-key`) and a limit of 3 requests a minute per identity.
fn policies() -> PolicySet {
    with_keys(&[("alice-key", "alice")])
}

/// API keys in `x-api-key` (key, identity name), and a limit of 3 requests a minute per
/// identity.
fn with_keys(keys: &[(&str, &str)]) -> PolicySet {
    PolicySet {
        auth: Some(Auth {
            sources: vec![ObjectKey::new("default", "auth")],
            when: vec![],
            authentication: vec![AuthnMethod {
                name: "keys".into(),
                policy: Default::default(),
                credentials: Credentials::CustomHeader {
                    name: "x-api-key".into(),
                },
                method: Verify::ApiKey(ApiKeys {
                    keys: keys
                        .iter()
                        .map(|(key, name)| ApiKey {
                            sha256: sha256_hex(key),
                            identity: json!({"metadata": {"name": name, "namespace": "default", "labels": {}, "annotations": {}}}),
                        })
                        .collect(),
                }),
                when: vec![],
            }],
            authorization: vec![],
            success_headers: vec![],
            unauthenticated: DenyResponse::unauthenticated(),
            unauthorized: DenyResponse::unauthorized(),
        }),
        rate_limits: vec![RateLimit {
            id: "default/limits/all".into(),
            rates: vec![Rate {
                limit: 3,
                window_ms: 60_000,
            }],
            algorithm: Default::default(),
            counters: vec!["auth.identity.metadata.name".into()],
            when: vec![],
            cost: None,
            cost_max_body_bytes: None,
            mode: Default::default(),
        }],
    }
}

#[tokio::test]
async fn a_stored_answer_is_still_authenticated_and_rate_limited() {
    let o = origin().await;
    let c = cached_with(
        &o,
        rule(),
        |r| r.policy = Some("p".into()),
        vec![("p", policies())],
    )
    .await;
    let cc = ("x-origin-header", "cache-control: public, max-age=60");
    let key = ("x-api-key", "alice-key");
    let first = fetch(&c.url, "/doc", &[cc]).await;
    assert_eq!(first.status.as_u16(), 401, "{first:?}");
    let a = fetch(&c.url, "/doc", &[cc, key]).await;
    assert_eq!((a.status.as_u16(), x_cache(&a)), (200, "MISS"));
    let b = fetch(&c.url, "/doc", &[cc, key]).await;
    assert_eq!((b.status.as_u16(), x_cache(&b)), (200, "HIT"));
    // Stored, yet a request without the key is refused, not answered from the cache.
    let anon = fetch(&c.url, "/doc", &[cc]).await;
    assert_eq!(anon.status.as_u16(), 401);
    assert_ne!(x_cache(&anon), "HIT");
    // The hits were counted: the third admitted request is the last under the limit.
    assert_eq!(x_cache(&fetch(&c.url, "/doc", &[cc, key]).await), "HIT");
    let over = fetch(&c.url, "/doc", &[cc, key]).await;
    assert_eq!(over.status.as_u16(), 429);
    assert_eq!(o.count("/doc"), 1);
}

/// A credential outside `Authorization` (here an API key header) makes an answer its user's
/// own, as RFC 9111 §3.5 says of `Authorization`: stored only when marked shareable, so a
/// `max-age` answer made for alice is neither stored nor served to bob.
#[tokio::test]
async fn an_answer_for_a_credential_in_another_header_is_not_shared() {
    let o = origin().await;
    let c = cached_with(
        &o,
        rule(),
        |r| r.policy = Some("p".into()),
        vec![(
            "p",
            with_keys(&[("alice-key", "alice"), ("bob-key", "bob")]),
        )],
    )
    .await;
    let cc = ("x-origin-header", "cache-control: max-age=60");
    let alice = fetch(&c.url, "/mine", &[cc, ("x-api-key", "alice-key")]).await;
    assert_eq!(alice.status.as_u16(), 200, "{alice:?}");
    let bob = fetch(&c.url, "/mine", &[cc, ("x-api-key", "bob-key")]).await;
    assert_eq!(bob.status.as_u16(), 200, "{bob:?}");
    assert_ne!(x_cache(&bob), "HIT");
    assert_eq!(o.count("/mine"), 2);
}

/// A request the route's ExternalAuth filter admitted is its caller's own, as one with
/// `Authorization` is: the service decided on a credential the cache cannot see (here a
/// session cookie), so a `max-age` answer made for alice is neither stored nor served to bob;
/// an answer marked `public` is shared.
#[tokio::test]
async fn an_answer_an_external_auth_filter_admitted_is_not_shared() {
    use tollgate_api::external::{ExternalAuthz, ExternalProtocol, HttpCheck};
    let o = origin().await;
    // Answers 200 to every check: every request is admitted.
    let authz = common::echo_backend("authz").await;
    let check = ExternalAuthz {
        id: "default/site/ext".into(),
        backend: "authz".into(),
        protocol: ExternalProtocol::Http(HttpCheck {
            path_prefix: "/check".into(),
            ..HttpCheck::default()
        }),
        forward_headers: vec!["cookie".into()],
        max_body_bytes: None,
        timeout_ms: 2_000,
        fail_open: false,
        cache_ttl_ms: None,
    };
    let c = cached(&o, rule(), |r| {
        r.filters = vec![tollgate_api::Filter::ExternalAuth(check)];
    })
    .await;
    let mut t = c.table.clone();
    t.version = 2;
    t.backends
        .insert("authz".into(), common::backend_of(&[&authz]));
    c.proxy.apply(t).await.unwrap();

    let cc = ("x-origin-header", "cache-control: max-age=60");
    let alice = fetch(&c.url, "/mine", &[cc, ("cookie", "session=alice")]).await;
    assert_eq!(alice.status.as_u16(), 200, "{alice:?}");
    let bob = fetch(&c.url, "/mine", &[cc, ("cookie", "session=bob")]).await;
    assert_eq!(bob.status.as_u16(), 200, "{bob:?}");
    assert_ne!(x_cache(&bob), "HIT");
    assert_eq!(o.count("/mine"), 2);

    let public = ("x-origin-header", "cache-control: public, max-age=60");
    fetch(&c.url, "/news", &[public, ("cookie", "session=alice")]).await;
    let bob = fetch(&c.url, "/news", &[public, ("cookie", "session=bob")]).await;
    assert_eq!(x_cache(&bob), "HIT");
    assert_eq!(o.count("/news"), 1);
}
