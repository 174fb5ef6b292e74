//! Basic auth on the wire: the `Basic` challenge, each accepted hash format, wrong passwords
//! and unknown users refused alike, the identity upstream, and a credential the decoder
//! refuses.

use base64::Engine as _;
use http::StatusCode;
use serde_json::json;
use tollgate_api::policy::{AuthnMethod, BasicUser, BasicUsers, Credentials, Method as Verify};

use crate::common::*;
use crate::support::*;

// `openssl passwd -5 -salt saltsalt secret`, `openssl passwd -6 -salt saltsalt secret`.
const SHA256: &str = "$5$saltsalt$0IyaXrmV7.sGNS6tirgqHLqX/G.FBvgkYA.lpPdS5sA";
const SHA512: &str = "$6$saltsalt$TVLlQcbpFVof5W3Yz4DTP6gRstiNuHwwTt6GLc1E5n0U0aDehy0S5knV8wiOQSpT0Y77vwPZN.Pq.H91p5hVO1";

fn basic_auth(users: &[(&str, String)]) -> tollgate_api::policy::Auth {
    let mut a = auth(vec![AuthnMethod {
        name: "staff".into(),
        policy: Default::default(),
        credentials: Credentials::AuthorizationHeader {
            prefix: "Basic".into(),
        },
        method: Verify::Basic(BasicUsers {
            users: users
                .iter()
                .map(|(u, h)| BasicUser {
                    username: (*u).to_owned(),
                    hash: h.clone(),
                    identity: json!({"username": u, "metadata": {"name": "admins"}}),
                })
                .collect(),
        }),
        when: vec![],
    }]);
    a.success_headers = vec![("x-user".into(), "auth.identity.username".into())];
    a
}

fn bcrypt_as(password: &str, version: bcrypt::Version) -> String {
    bcrypt::hash_with_result(password, 5)
        .unwrap()
        .format_for_version(version)
}

fn basic(user_pass: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(user_pass)
    )
}

#[tokio::test]
async fn each_hash_format_admits_its_password_and_names_the_user_upstream() {
    let app = echo_backend("app").await;
    let users = [
        ("bcrypt-2y", bcrypt_as("secret", bcrypt::Version::TwoY)),
        ("bcrypt-2b", bcrypt_as("secret", bcrypt::Version::TwoB)),
        ("bcrypt-2a", bcrypt_as("secret", bcrypt::Version::TwoA)),
        ("sha256", SHA256.to_owned()),
        ("sha512", SHA512.to_owned()),
    ];
    assert!(users[0].1.starts_with("$2y$05$") && users[2].1.starts_with("$2a$05$"));
    let (_p, url) = proxy_with_policies(
        &app,
        vec![guarded("admin", "/", "p")],
        vec![("p", only_auth(basic_auth(&users)))],
    )
    .await;
    let c = h1_client();
    let url = format!("{url}/admin");
    for (user, _) in &users {
        let ok = get_with(
            &c,
            &url,
            &[("authorization", &basic(&format!("{user}:secret")))],
        )
        .await;
        assert_eq!(ok.status, StatusCode::OK, "{user}");
        assert_eq!(ok.upstream_header("x-user").as_deref(), Some(*user));
        // The same again comes from the memo: still admitted, still the same user.
        let again = get_with(
            &c,
            &url,
            &[("authorization", &basic(&format!("{user}:secret")))],
        )
        .await;
        assert_eq!(again.upstream_header("x-user").as_deref(), Some(*user));
        let wrong = get_with(
            &c,
            &url,
            &[("authorization", &basic(&format!("{user}:Secret")))],
        )
        .await;
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{user}");
    }
    assert_eq!(
        app.hits(),
        10,
        "only the right passwords reached the upstream"
    );
}

#[tokio::test]
async fn wrong_unknown_and_malformed_credentials_get_the_basic_challenge() {
    let app = echo_backend("app").await;
    let (_p, url) = proxy_with_policies(
        &app,
        vec![guarded("admin", "/", "p")],
        vec![("p", only_auth(basic_auth(&[("alice", SHA512.to_owned())])))],
    )
    .await;
    let c = h1_client();
    let url = format!("{url}/admin");
    let cases: [(&str, Option<String>); 6] = [
        ("none", None),
        ("wrong password", Some(basic("alice:nope"))),
        ("unknown user", Some(basic("mallory:secret"))),
        ("no colon", Some(basic("alice"))),
        ("not base64", Some("Basic %%%".to_owned())),
        ("another scheme", Some("Bearer YWxpY2U6c2VjcmV0".to_owned())),
    ];
    for (what, header) in cases {
        let headers: Vec<(&str, &str)> = header
            .as_deref()
            .map(|h| vec![("authorization", h)])
            .unwrap_or_default();
        let a = get_with(&c, &url, &headers).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{what}");
        assert_eq!(www_authenticate(&a), ["Basic realm=\"tollgate\""], "{what}");
    }
    assert_eq!(app.hits(), 0);
    let ok = get_with(&c, &url, &[("authorization", &basic("alice:secret"))]).await;
    assert_eq!(ok.status, StatusCode::OK);
    // A password may hold colons: only the first one separates the user (RFC 7617).
    let colon = basic_auth(&[("bob", bcrypt::hash("a:b:c", 4).unwrap())]);
    let (_p2, url2) = proxy_with_policies(
        &app,
        vec![guarded("admin", "/", "p")],
        vec![("p", only_auth(colon))],
    )
    .await;
    let ok = get_with(
        &c,
        &format!("{url2}/admin"),
        &[("authorization", &basic("bob:a:b:c"))],
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK);
}
