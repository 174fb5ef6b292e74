//! AuthPolicy `oidc` method: the shape of the issue compiles to the table's `Oidc` with the
//! client secret and cookie keys read from labelled Secrets; a missing Secret or key, short
//! keys, bad paths and a `credentials` block make the policy `Invalid`, and a never-valid
//! policy closes its route (fail closed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tollgate::compile::Output;
use tollgate_api::ObjectKey;
use tollgate_api::policy::{Credentials, Method};

fn ap<'a>(out: &'a Output, name: &str) -> &'a [Condition] {
    &out.auth_policies[&ObjectKey::new("pol", name)].conditions
}

const SECRETS: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: shop-oidc, namespace: pol, labels: {tollgate.dev/credential: "true"}}
stringData: {clientSecret: s3cret}
---
apiVersion: v1
kind: Secret
metadata: {name: shop-cookie-key, namespace: pol, labels: {tollgate.dev/credential: "true"}}
stringData:
  keys: |
    new-key-0123456789abcdef0123456789abcdef
    old-key-0123456789abcdef0123456789abcdef
"#;

/// The policy with `oidc` (a flow mapping's inside) on the route `shop`/`checkout`.
fn policy(oidc: &str) -> String {
    format!(
        r#"
apiVersion: tollgate.dev/v1alpha1
kind: AuthPolicy
metadata: {{name: login, namespace: pol}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: shop, sectionName: checkout}}]
  rules:
    authentication:
      browser:
        oidc: {{{oidc}}}
    response:
      success:
        headers: {{x-user: {{expression: auth.identity.sub}}}}
"#
    )
}

const SHAPE: &str = "issuer: https://id.example.com, clientID: shop, clientSecretRef: {name: shop-oidc}, redirectPath: /oauth2/callback, logoutPath: /logout, cookieKeyRef: {name: shop-cookie-key}";

fn invalid_message(out: &Output) -> String {
    let c = ap(out, "login");
    assert_cond(c, "Accepted", "False", "Invalid");
    cond(c, "Accepted").message.clone()
}

#[test]
fn the_issue_shape_compiles_with_secrets_read_and_defaults_filled() {
    let out = run(&["policies"], &format!("{SECRETS}---{}", policy(SHAPE)));
    assert_cond(ap(&out, "login"), "Accepted", "True", "Accepted");
    let t = table(&out, "pol", "gw");
    let set = t
        .policies
        .values()
        .find(|s| {
            s.auth
                .as_ref()
                .is_some_and(|a| a.sources.contains(&ObjectKey::new("pol", "login")))
        })
        .expect("the policy's set");
    let m = &set.auth.as_ref().unwrap().authentication[0];
    assert_eq!(m.name, "browser");
    assert_eq!(
        m.credentials,
        Credentials::Cookie {
            name: "tollgate_session".into()
        }
    );
    let Method::Oidc(o) = &m.method else {
        panic!("{:?}", m.method)
    };
    assert_eq!(o.issuer, "https://id.example.com");
    assert_eq!(o.client_id, "shop");
    assert_eq!(o.client_secret, "s3cret");
    assert_eq!(o.redirect_path, "/oauth2/callback");
    assert_eq!(o.logout_path.as_deref(), Some("/logout"));
    assert_eq!(o.scopes, ["openid", "profile", "email"]);
    assert_eq!(o.cookie_name, "tollgate_session");
    assert_eq!(
        o.cookie_keys,
        [
            "new-key-0123456789abcdef0123456789abcdef",
            "old-key-0123456789abcdef0123456789abcdef"
        ],
        "in order: the first seals"
    );
    // Secrets stay out of Debug output (logs).
    let debug = format!("{o:?}");
    assert!(
        !debug.contains("s3cret") && !debug.contains("new-key"),
        "{debug}"
    );
}

#[test]
fn scopes_and_cookie_name_are_taken_with_openid_first() {
    let out = run(
        &["policies"],
        &format!(
            "{SECRETS}---{}",
            policy(&format!(
                "{SHAPE}, scopes: [email, offline_access, openid], cookieName: shop_sid"
            ))
        ),
    );
    assert_cond(ap(&out, "login"), "Accepted", "True", "Accepted");
    let t = table(&out, "pol", "gw");
    let o = t
        .policies
        .values()
        .find_map(|s| match &s.auth.as_ref()?.authentication.first()?.method {
            Method::Oidc(o) => Some(o.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(o.scopes, ["openid", "email", "offline_access"]);
    assert_eq!(o.cookie_name, "shop_sid");
}

#[test]
fn a_missing_secret_makes_the_policy_invalid_and_closes_its_route() {
    // No client secret Secret.
    let only_keys = SECRETS.split("---").nth(1).unwrap();
    let out = run(&["policies"], &format!("{only_keys}---{}", policy(SHAPE)));
    let m = invalid_message(&out);
    assert!(
        m.contains("clientSecretRef") && m.contains("pol/shop-oidc not found"),
        "{m}"
    );
    assert!(m.contains("answer 500"), "fail closed: {m}");
    let t = table(&out, "pol", "gw");
    assert!(!t.closed.is_empty(), "the route is closed");

    // No cookie key Secret.
    let only_client = SECRETS.split("---").next().unwrap();
    let out = run(&["policies"], &format!("{only_client}---{}", policy(SHAPE)));
    let m = invalid_message(&out);
    assert!(
        m.contains("cookieKeyRef") && m.contains("pol/shop-cookie-key not found"),
        "{m}"
    );

    // An unlabelled Secret is not read.
    let unlabelled = SECRETS.replace(r#"labels: {tollgate.dev/credential: "true"}"#, "labels: {}");
    let out = run(&["policies"], &format!("{unlabelled}---{}", policy(SHAPE)));
    assert!(invalid_message(&out).contains("tollgate.dev/credential"));
}

#[test]
fn secrets_without_their_keys_and_short_cookie_keys_are_invalid() {
    let no_field = SECRETS.replace("clientSecret: s3cret", "other: x");
    let m = invalid_message(&run(
        &["policies"],
        &format!("{no_field}---{}", policy(SHAPE)),
    ));
    assert!(m.contains("has no clientSecret"), "{m}");

    let short = SECRETS.replace("old-key-0123456789abcdef0123456789abcdef", "short");
    let m = invalid_message(&run(&["policies"], &format!("{short}---{}", policy(SHAPE))));
    assert!(
        m.contains("key #2") && m.contains("shorter than 32 bytes"),
        "{m}"
    );
}

#[test]
fn bad_shapes_are_invalid_with_the_field_named() {
    for (oidc, wanted) in [
        (
            SHAPE.replace("https://id.example.com", "id.example.com"),
            "oidc.issuer",
        ),
        (
            SHAPE.replace("redirectPath: /oauth2/callback", "redirectPath: oauth2"),
            "oidc.redirectPath",
        ),
        (
            SHAPE.replace("logoutPath: /logout", "logoutPath: /oauth2/callback"),
            "must differ from redirectPath",
        ),
        (
            SHAPE.replace("redirectPath: /oauth2/callback", "redirectPath: //evil"),
            "oidc.redirectPath",
        ),
        (format!("{SHAPE}, cookieName: 'a b'"), "oidc.cookieName"),
        (
            SHAPE.replace("clientID: shop", "clientID: ''"),
            "oidc.clientID",
        ),
    ] {
        let m = invalid_message(&run(
            &["policies"],
            &format!("{SECRETS}---{}", policy(&oidc)),
        ));
        assert!(m.contains(wanted), "{oidc}: {m}");
    }
    // The session cookie is the credential: a credentials block is refused.
    let with_credentials = policy(SHAPE).replace(
        "        oidc:",
        "        credentials: {cookie: {name: x}}\n        oidc:",
    );
    let m = invalid_message(&run(
        &["policies"],
        &format!("{SECRETS}---{with_credentials}"),
    ));
    assert!(m.contains("not used by oidc"), "{m}");
    // One method, one kind.
    let two = policy(SHAPE).replace("        oidc:", "        x509: {}\n        oidc:");
    let m = invalid_message(&run(&["policies"], &format!("{SECRETS}---{two}")));
    assert!(m.contains("exactly one of") && m.contains("oidc"), "{m}");
}
