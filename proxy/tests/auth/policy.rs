//! The policy around the methods: method order and `when`, authorization rules, deny answers,
//! success headers, X.509 identities, anonymous policies.

use jsonwebtoken::Algorithm;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
use serde_json::json;
use tollgate_api::policy::{AuthzRule, Credentials, DenyResponse, Method};
use tollgate_proxy::policy::auth::{AuthOutcome, CompiledAuth, MethodKind, Outcome};
use tollgate_proxy::policy::cel::{Activation, Attrs, Expr};

use crate::support::*;

fn x_api_key() -> Credentials {
    Credentials::CustomHeader {
        name: "x-api-key".into(),
    }
}

fn rule(name: &str, predicate: &str, when: &[&str]) -> AuthzRule {
    AuthzRule {
        name: name.into(),
        policy: Default::default(),
        predicate: predicate.into(),
        external: None,
        when: when.iter().map(|w| w.to_string()).collect(),
    }
}

#[tokio::test]
async fn the_first_method_that_verifies_wins_and_when_skips_methods() {
    let k = SigningKey::es256();
    let mut keys = method("keys", x_api_key(), api_keys(&[("k-svc", "svc")]));
    keys.when = vec!["request.url_path.startsWith('/internal')".into()];
    let p = build(
        &auth(vec![
            keys,
            method("jwt", bearer(), jwt_inline(&jwks(&[&k]), &[])),
        ]),
        &state(),
    );
    // The key method applies under /internal only.
    let c = check(&p, req("GET", "/internal/x", &[("x-api-key", "k-svc")])).await;
    assert!(c.allowed());
    match &c.outcome {
        AuthOutcome::Allowed(a) => {
            assert_eq!(a.method.as_deref(), Some("keys"));
            assert_eq!(a.kind, MethodKind::ApiKey);
        }
        AuthOutcome::Denied(_) => unreachable!(),
    }
    assert!(!check(&p, get(&[("x-api-key", "k-svc")])).await.allowed());
    // A bad key does not stop the JWT from being tried.
    let token = k.sign(&claims("alice"));
    let (h, v) = bearer_header(&token);
    let c = check(
        &p,
        req("GET", "/internal/x", &[("x-api-key", "nope"), (h, &v)]),
    )
    .await;
    assert_eq!(c.sub.as_deref(), Some("alice"));
    // Both schemes are offered.
    assert_eq!(
        check(&p, get(&[])).await.www_authenticate(),
        [r#"APIKEY realm="tollgate""#, r#"Bearer realm="tollgate""#]
    );
}

#[tokio::test]
async fn a_policy_whose_every_method_is_skipped_denies() {
    let mut keys = method("keys", x_api_key(), api_keys(&[("k", "k")]));
    keys.when = vec!["request.method == 'POST'".into()];
    let s = state();
    let p = build(&auth(vec![keys]), &s);
    let c = check(&p, get(&[("x-api-key", "k")])).await;
    assert_eq!(c.status(), 401);
    assert_eq!(
        s.metrics()
            .outcome_count(MethodKind::None, Outcome::Unauthenticated),
        1
    );
}

#[tokio::test]
async fn a_policy_whose_when_does_not_hold_neither_authenticates_nor_denies() {
    let mut a = auth(vec![method("keys", x_api_key(), api_keys(&[("k", "svc")]))]);
    a.when = vec!["request.url_path.startsWith('/api')".into()];
    a.authorization = vec![rule("never", "false", &[])];
    a.success_headers = vec![("x-user".into(), "'svc'".into())];
    let s = state();
    let p = build(&a, &s);
    let c = check(&p, req("GET", "/public", &[("x-user", "spoofed")])).await;
    assert!(c.allowed(), "outside /api the policy does not apply");
    assert_eq!(c.identity(), serde_json::Value::Null);
    assert!(
        c.parts.headers.get("x-user").is_none(),
        "spoofed headers still go"
    );
    assert_eq!(check(&p, req("GET", "/api/x", &[])).await.status(), 401);
    assert_eq!(
        s.metrics()
            .outcome_count(MethodKind::None, Outcome::Skipped),
        1
    );
}

#[tokio::test]
async fn authorization_rules_apply_when_their_when_holds() {
    let k = SigningKey::rsa(1, Algorithm::RS256);
    let mut a = auth(vec![method("jwt", bearer(), jwt_inline(&jwks(&[&k]), &[]))]);
    a.authorization = vec![
        rule(
            "admins-delete",
            "auth.identity.role == 'admin'",
            &["request.method == 'DELETE'"],
        ),
        rule(
            "not-blocked",
            "!('blocked' in auth.identity) || !auth.identity.blocked",
            &[],
        ),
    ];
    a.unauthorized = DenyResponse {
        code: 404,
        message: Some("no such thing".into()),
    };
    let s = state();
    let p = build(&a, &s);
    let token = |role: &str, blocked: bool| {
        let mut c = claims("alice");
        c["role"] = json!(role);
        c["blocked"] = json!(blocked);
        k.sign(&c)
    };
    let send = |m: &str, t: String| {
        let (h, v) = bearer_header(&t);
        req(m, "/orders/1", &[(h, &v)])
    };
    assert!(check(&p, send("GET", token("user", false))).await.allowed());
    let c = check(&p, send("DELETE", token("user", false))).await;
    assert_eq!(c.status(), 404);
    match &c.outcome {
        AuthOutcome::Denied(d) => {
            assert_eq!(d.outcome, Outcome::Forbidden);
            assert_eq!(&d.body[..], b"no such thing\n");
            assert!(d.headers.get("www-authenticate").is_none());
        }
        AuthOutcome::Allowed(_) => unreachable!(),
    }
    assert!(
        check(&p, send("DELETE", token("admin", false)))
            .await
            .allowed()
    );
    assert_eq!(
        check(&p, send("GET", token("admin", true))).await.status(),
        404
    );
    assert_eq!(
        s.metrics()
            .outcome_count(MethodKind::Jwt, Outcome::Forbidden),
        2
    );
    assert_eq!(
        s.metrics().outcome_count(MethodKind::Jwt, Outcome::Allowed),
        2
    );
}

#[tokio::test]
async fn a_predicate_that_errors_denies() {
    let mut a = auth(vec![]);
    a.authorization = vec![rule(
        "needs-team",
        "request.headers['x-team'] == 'blue'",
        &[],
    )];
    let p = build(&a, &state());
    assert_eq!(
        check(&p, get(&[])).await.status(),
        403,
        "missing header: error → false"
    );
    assert!(check(&p, get(&[("x-team", "blue")])).await.allowed());
}

#[tokio::test]
async fn anonymous_policies_only_authorize() {
    let mut a = auth(vec![]);
    a.authorization = vec![rule("get-only", "request.method == 'GET'", &[])];
    let s = state();
    let p = build(&a, &s);
    let c = check(&p, get(&[])).await;
    assert!(c.allowed());
    assert_eq!(c.identity(), serde_json::Value::Null);
    assert_eq!(check(&p, req("POST", "/", &[])).await.status(), 403);
    assert_eq!(
        s.metrics()
            .outcome_count(MethodKind::None, Outcome::Allowed),
        1
    );
}

#[tokio::test]
async fn success_headers_are_stripped_from_clients_and_set_from_the_identity() {
    let mut a = auth(vec![method(
        "keys",
        x_api_key(),
        api_keys(&[("k-alice", "alice")]),
    )]);
    a.success_headers = vec![
        ("x-user".into(), "auth.identity.metadata.name".into()),
        ("x-tier".into(), "auth.identity.metadata.labels.tier".into()),
        ("x-missing".into(), "auth.identity.metadata.nothing".into()),
    ];
    let p = build(&a, &state());
    let spoof = [
        ("x-user", "admin"),
        ("x-missing", "forged"),
        ("x-tier", "platinum"),
    ];

    let mut h = spoof.to_vec();
    h.push(("x-api-key", "k-alice"));
    let c = check(&p, get(&h)).await;
    assert!(c.allowed());
    let hv = |c: &Checked, n: &str| {
        c.parts
            .headers
            .get_all(n)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(hv(&c, "x-user"), ["alice"]);
    assert_eq!(hv(&c, "x-tier"), ["gold"]);
    assert!(
        hv(&c, "x-missing").is_empty(),
        "no value: removed, not forwarded"
    );
    assert_eq!(hv(&c, "x-api-key"), ["k-alice"], "other headers untouched");

    // Denied requests are stripped too.
    let c = check(&p, get(&spoof)).await;
    assert_eq!(c.status(), 401);
    for n in ["x-user", "x-tier", "x-missing"] {
        assert!(hv(&c, n).is_empty(), "{n}");
    }
}

fn client_cert() -> Vec<u8> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "checkout");
    dn.push(DnType::OrganizationName, "Shop");
    params.distinguished_name = dn;
    params.subject_alt_names = vec![
        SanType::DnsName("checkout.shop.svc".try_into().unwrap()),
        SanType::URI(
            "spiffe://cluster.local/ns/shop/sa/checkout"
                .try_into()
                .unwrap(),
        ),
    ];
    let key = KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().der().to_vec()
}

#[tokio::test]
async fn x509_authenticates_with_a_verified_client_certificate() {
    let mut a = auth(vec![method(
        "mtls",
        Credentials::AuthorizationHeader {
            prefix: String::new(),
        },
        Method::X509,
    )]);
    a.authorization = vec![rule(
        "only-checkout",
        "'spiffe://cluster.local/ns/shop/sa/checkout' in auth.identity.uri",
        &[],
    )];
    a.success_headers = vec![("x-client-cn".into(), "auth.identity.cn".into())];
    let s = state();
    let p = build(&a, &s);
    let der = client_cert();
    let c = check_with(&p, get(&[]), Some(&der)).await;
    assert!(c.allowed());
    assert_eq!(c.identity()["cn"], "checkout");
    assert_eq!(c.identity()["dns"], json!(["checkout.shop.svc"]));
    assert_eq!(c.sub.as_deref(), Some("CN=checkout, O=Shop"));
    assert_eq!(c.parts.headers["x-client-cn"], "checkout");

    let c = check_with(&p, get(&[]), None).await;
    assert_eq!(c.status(), 401, "no certificate");
    assert!(c.www_authenticate().is_empty(), "no HTTP challenge for TLS");
    assert_eq!(
        s.metrics()
            .outcome_count(MethodKind::X509, Outcome::Allowed),
        1
    );
}

#[tokio::test]
async fn bad_configuration_is_a_build_error() {
    let mut a = auth(vec![method("keys", x_api_key(), api_keys(&[]))]);
    a.authentication[0].when = vec!["request.method ==".into()];
    let e = CompiledAuth::build(&a, &state()).unwrap_err().to_string();
    assert!(
        e.starts_with("authentication.keys.when: invalid CEL expression"),
        "{e}"
    );

    let mut a = auth(vec![]);
    a.success_headers = vec![("bad header".into(), "'x'".into())];
    let e = CompiledAuth::build(&a, &state()).unwrap_err().to_string();
    assert_eq!(e, "successHeaders: invalid header name `bad header`");

    let mut a = auth(vec![]);
    a.unauthenticated.code = 1000;
    let e = CompiledAuth::build(&a, &state()).unwrap_err().to_string();
    assert_eq!(e, "deny response code 1000 is not a valid HTTP status");
}

/// The way the request path calls it: the activation built from the request head (it copies
/// what it needs), then the head handed to `check` mutably; the future can cross threads.
#[tokio::test]
async fn the_check_future_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let mut a = auth(vec![method("keys", x_api_key(), api_keys(&[("k", "svc")]))]);
    a.success_headers = vec![("x-user".into(), "auth.identity.metadata.name".into())];
    let p = build(&a, &state());
    let mut parts = get(&[("x-api-key", "k"), ("x-user", "spoofed")]);
    p.strip_success_headers(&mut parts.headers);
    let mut act = Activation::new(&Attrs {
        method: parts.method.as_str(),
        host: "shop.example.com",
        path: "/orders?page=1",
        scheme: "https",
        headers: &parts.headers,
        source: "127.0.0.1:1".parse().unwrap(),
    });
    let fut = p.check(&mut parts, None, "https", &mut act);
    assert_send(&fut);
    assert!(matches!(fut.await, AuthOutcome::Allowed(_)));
    assert_eq!(parts.headers["x-user"], "svc");
    let header = Expr::compile("request.headers['x-user']").unwrap();
    assert_eq!(
        header.eval_string(&act),
        None,
        "expressions never saw the spoofed value"
    );
}
