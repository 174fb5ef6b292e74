//! JWT verification with inline key sets: accepted algorithms, and every reason to refuse.

use jsonwebtoken::Algorithm;
use serde_json::json;
use tollgate_proxy::policy::auth::{AuthOutcome, CompiledAuth, MethodKind, Outcome};

use crate::support::*;

/// A policy with one inline-JWKS JWT method (audience `shop`) over `keys`.
fn policy(keys: &[&SigningKey]) -> CompiledAuth {
    build(
        &auth(vec![method(
            "jwt",
            bearer(),
            jwt_inline(&jwks(keys), &["shop"]),
        )]),
        &state(),
    )
}

async fn accepted(p: &CompiledAuth, token: &str) -> bool {
    check(p, with_bearer(token)).await.allowed()
}

#[tokio::test]
async fn rsa_ec_eddsa_and_hmac_tokens_are_accepted() {
    for alg in [
        Algorithm::RS256,
        Algorithm::RS384,
        Algorithm::RS512,
        Algorithm::PS256,
    ] {
        let k = SigningKey::rsa(1, alg);
        let p = policy(&[&k]);
        let c = check(&p, with_bearer(&k.sign(&claims("alice")))).await;
        assert!(c.allowed(), "{alg:?}");
        assert_eq!(
            c.sub.as_deref(),
            Some("alice"),
            "{alg:?}: identity in the activation"
        );
    }
    for k in [
        SigningKey::es256(),
        SigningKey::es384(),
        SigningKey::eddsa(),
        SigningKey::hs256(),
    ] {
        let p = policy(&[&k]);
        let c = check(&p, with_bearer(&k.sign(&claims("bob")))).await;
        assert!(c.allowed(), "{:?}", k.alg);
        assert_eq!(
            c.identity()["role"],
            "user",
            "{:?}: claims are the identity",
            k.alg
        );
    }
}

#[tokio::test]
async fn the_key_is_picked_by_kid_among_several() {
    let (a, b, e) = (
        SigningKey::rsa(1, Algorithm::RS256),
        SigningKey::rsa(2, Algorithm::RS256),
        SigningKey::es256(),
    );
    let p = policy(&[&a, &b, &e]);
    for k in [&a, &b, &e] {
        assert!(accepted(&p, &k.sign(&claims("x"))).await, "{}", k.kid);
    }
}

#[tokio::test]
async fn expiry_and_not_before_are_checked_with_30s_leeway() {
    let k = SigningKey::rsa(1, Algorithm::RS256);
    let p = policy(&[&k]);
    let with = |field: &str, v: i64| {
        let mut c = claims("alice");
        c[field] = json!(v);
        k.sign(&c)
    };
    let now = now() as i64;
    assert!(!accepted(&p, &with("exp", now - 120)).await, "expired");
    assert!(
        accepted(&p, &with("exp", now - 10)).await,
        "expired within leeway"
    );
    assert!(
        !accepted(&p, &with("nbf", now + 120)).await,
        "not yet valid"
    );
    assert!(
        accepted(&p, &with("nbf", now + 10)).await,
        "nbf within leeway"
    );
    assert!(accepted(&p, &with("nbf", now - 10)).await);
}

#[tokio::test]
async fn claims_of_the_wrong_type_or_missing_are_refused() {
    let k = SigningKey::rsa(1, Algorithm::RS256);
    let p = policy(&[&k]);
    let mut c = claims("alice");
    c["nbf"] = json!((now() + 100_000).to_string());
    assert!(
        !accepted(&p, &k.sign(&c)).await,
        "string nbf is not ignored"
    );
    let mut c = claims("alice");
    c["exp"] = json!("never");
    assert!(
        !accepted(&p, &k.sign(&c)).await,
        "string exp is not ignored"
    );
    let mut c = claims("alice");
    c.as_object_mut().unwrap().remove("exp");
    assert!(!accepted(&p, &k.sign(&c)).await, "exp is required");
    let mut c = claims("alice");
    c.as_object_mut().unwrap().remove("iss");
    assert!(!accepted(&p, &k.sign(&c)).await, "iss is required");
}

#[tokio::test]
async fn issuer_and_audience_must_match() {
    let k = SigningKey::rsa(1, Algorithm::RS256);
    let p = policy(&[&k]);
    let mut c = claims("alice");
    c["iss"] = json!("https://evil.test");
    assert!(!accepted(&p, &k.sign(&c)).await, "wrong issuer");
    let mut c = claims("alice");
    c["aud"] = json!("billing");
    assert!(!accepted(&p, &k.sign(&c)).await, "wrong audience");
    let mut c = claims("alice");
    c["aud"] = json!(["billing", "shop"]);
    assert!(accepted(&p, &k.sign(&c)).await, "one of several audiences");
    let mut c = claims("alice");
    c.as_object_mut().unwrap().remove("aud");
    assert!(
        !accepted(&p, &k.sign(&c)).await,
        "aud required when audiences are set"
    );

    // Without configured audiences, aud is not checked.
    let open = build(
        &auth(vec![method("jwt", bearer(), jwt_inline(&jwks(&[&k]), &[]))]),
        &state(),
    );
    let mut c = claims("alice");
    c["aud"] = json!("anything");
    assert!(accepted(&open, &k.sign(&c)).await);
}

#[tokio::test]
async fn bad_signatures_are_refused() {
    let k1 = SigningKey::rsa(1, Algorithm::RS256);
    let p = policy(&[&k1]);
    // Signed by another key claiming rsa-1's kid.
    let forged = SigningKey::rsa(2, Algorithm::RS256).with_kid("rsa-1");
    let c = check(&p, with_bearer(&forged.sign(&claims("mallory")))).await;
    assert!(!c.allowed());
    assert_eq!(c.status(), 401);
    // A valid token with its payload swapped.
    let good = k1.sign(&claims("alice"));
    let parts: Vec<&str> = good.split('.').collect();
    let mut evil = claims("alice");
    evil["role"] = json!("admin");
    let tampered = format!("{}.{}.{}", parts[0], b64(&evil), parts[2]);
    assert!(!accepted(&p, &tampered).await, "tampered payload");
    assert!(accepted(&p, &good).await);
    assert!(!accepted(&p, "not-a-jwt").await);
    assert!(!accepted(&p, "a.b.c").await);
}

#[tokio::test]
async fn alg_none_is_refused() {
    let k = SigningKey::rsa(1, Algorithm::RS256);
    let p = policy(&[&k]);
    for header in [
        json!({"alg": "none", "typ": "JWT"}),
        json!({"alg": "none", "kid": "rsa-1"}),
        json!({"alg": "None"}),
    ] {
        let token = format!("{}.{}.", b64(&header), b64(&claims("mallory")));
        assert!(!accepted(&p, &token).await, "{header}");
    }
}

#[tokio::test]
async fn the_algorithm_must_fit_the_key() {
    let rsa = SigningKey::rsa(1, Algorithm::RS256);
    let p = policy(&[&rsa]);
    // HS256 "signed" with the RSA public key (the classic key-confusion attack).
    let n = rsa.jwk["n"].as_str().unwrap().to_owned();
    let mut confused = SigningKey::hs256().with_kid("rsa-1");
    confused.key = jsonwebtoken::EncodingKey::from_secret(n.as_bytes()).unwrap();
    assert!(!accepted(&p, &confused.sign(&claims("mallory"))).await);

    // An HMAC token whose kid names an EC key.
    let ec = SigningKey::es256();
    let hs_as_ec = SigningKey::hs256().with_kid("ec-1");
    let p = policy(&[&ec, &SigningKey::hs256()]);
    assert!(!accepted(&p, &hs_as_ec.sign(&claims("mallory"))).await);

    // An ES256 token naming a P-384 key.
    let p = policy(&[&SigningKey::es384()]);
    let p256_as_p384 = SigningKey::es256().with_kid("ec-2");
    assert!(!accepted(&p, &p256_as_p384.sign(&claims("mallory"))).await);

    // A key whose JWK pins RS384 does not verify RS256 (nor the reverse).
    let mut pinned = SigningKey::rsa(1, Algorithm::RS256);
    pinned.jwk["alg"] = json!("RS384");
    let p = policy(&[&pinned]);
    assert!(!accepted(&p, &pinned.sign(&claims("x"))).await);
    let rs384 = SigningKey::rsa(1, Algorithm::RS384);
    assert!(accepted(&p, &rs384.sign(&claims("x"))).await);
}

#[tokio::test]
async fn missing_and_misplaced_tokens_get_a_bearer_challenge() {
    let k = SigningKey::es256();
    let p = policy(&[&k]);
    let c = check(&p, get(&[])).await;
    assert_eq!(c.status(), 401);
    assert_eq!(c.www_authenticate(), [r#"Bearer realm="tollgate""#]);
    let token = k.sign(&claims("alice"));
    let c = check(&p, get(&[("authorization", &format!("Token {token}"))])).await;
    assert_eq!(c.status(), 401, "wrong scheme");
    match c.outcome {
        AuthOutcome::Denied(d) => {
            assert_eq!(d.outcome, Outcome::Unauthenticated);
            assert_eq!(&d.body[..], b"Unauthorized\n");
        }
        AuthOutcome::Allowed(_) => unreachable!(),
    }
}

#[tokio::test]
async fn verified_tokens_are_cached_per_verifier_configuration() {
    let k = SigningKey::rsa(1, Algorithm::RS256);
    let s = state();
    let shop = build(
        &auth(vec![method(
            "jwt",
            bearer(),
            jwt_inline(&jwks(&[&k]), &["shop"]),
        )]),
        &s,
    );
    let token = k.sign(&claims("alice"));
    assert!(accepted(&shop, &token).await);
    assert_eq!(
        s.metrics()
            .cache_hits(tollgate_proxy::policy::auth::Cache::Jwt),
        0
    );
    assert!(accepted(&shop, &token).await);
    assert!(accepted(&shop, &token).await);
    assert_eq!(
        s.metrics()
            .cache_hits(tollgate_proxy::policy::auth::Cache::Jwt),
        2,
        "repeat callers skip the signature check"
    );
    // The same token, cached as valid for audience `shop`, is not valid for `billing`.
    let billing = build(
        &auth(vec![method(
            "jwt",
            bearer(),
            jwt_inline(&jwks(&[&k]), &["billing"]),
        )]),
        &s,
    );
    assert!(!accepted(&billing, &token).await);
    assert_eq!(
        s.metrics()
            .cache_hits(tollgate_proxy::policy::auth::Cache::Jwt),
        2
    );
    assert_eq!(
        s.metrics().outcome_count(MethodKind::Jwt, Outcome::Allowed),
        3
    );
    assert_eq!(
        s.metrics()
            .outcome_count(MethodKind::Jwt, Outcome::Unauthenticated),
        1
    );
}

#[tokio::test]
async fn inline_jwks_without_usable_keys_is_a_build_error() {
    let bad = auth(vec![method(
        "jwt",
        bearer(),
        jwt_inline(
            &json!({"keys": [{"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB"}]}),
            &[],
        ),
    )]);
    let err = CompiledAuth::build(&bad, &state()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "authentication.jwt: JWKS: no usable signature verification key"
    );
}
