//! Fixtures of the policy tests: tables with policy sets, API keys, HS256 tokens over an
//! inline JWKS, requests and the headers of their answers.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;
use sha2::{Digest, Sha256};
use tollgate_api::client::ClientSettings;
use tollgate_api::policy::{
    ApiKey, ApiKeys, Auth, AuthnMethod, Credentials, DenyResponse, Jwt, Method as Verify, Rate,
    RateLimit,
};
use tollgate_api::{Cors, Filter, ObjectKey, PolicySet, Route};
use tollgate_proxy::{Proxy, ProxyOptions};

use crate::common::*;

pub const ISSUER: &str = "https://issuer.test";
pub const HMAC_SECRET: &[u8] = b"policy-test shared secret, 32+ bytes";
pub const API_KEY: &str = "alice-key";
pub const APIKEY_CHALLENGE: &str = "APIKEY realm=\"tollgate\"";

// ---- tables ----

/// A route under `prefix` to the backend `app`, enforcing the policy set `key`.
pub fn guarded(name: &str, prefix: &str, key: &str) -> Route {
    let mut r = route(name, prefix, vec![wb("app", 1)]);
    r.policy = Some(key.to_owned());
    r
}

/// A proxy serving `routes` to `app`, with the policy sets `policies` in its table.
pub async fn proxy_with_policies(
    app: &EchoBackend,
    routes: Vec<Route>,
    policies: Vec<(&str, PolicySet)>,
) -> (Proxy, String) {
    proxy_with_client(app, ClientSettings::default(), routes, policies).await
}

/// [`proxy_with_policies`], its port with `client` settings (ClientPolicy).
pub async fn proxy_with_client(
    app: &EchoBackend,
    client: ClientSettings,
    routes: Vec<Route>,
    policies: Vec<(&str, PolicySet)>,
) -> (Proxy, String) {
    let proxy = Proxy::new(ProxyOptions::default());
    let mut port = http_port(0, routes);
    port.client = client;
    let mut t = table(1, vec![port], vec![("app", backend_of(&[app]))]);
    t.policies = policies
        .into_iter()
        .map(|(k, s)| (k.to_owned(), s))
        .collect();
    proxy.apply(t).await.unwrap();
    let addr = proxy.local_addr(0).unwrap();
    (proxy, format!("http://{addr}"))
}

pub fn auth(methods: Vec<AuthnMethod>) -> Auth {
    Auth {
        sources: vec![ObjectKey::new("default", "auth")],
        when: vec![],
        authentication: methods,
        authorization: vec![],
        success_headers: vec![],
        unauthenticated: DenyResponse::unauthenticated(),
        unauthorized: DenyResponse::unauthorized(),
    }
}

pub fn only_auth(a: Auth) -> PolicySet {
    PolicySet {
        auth: Some(a),
        rate_limits: vec![],
    }
}

pub fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// API keys read from `X-API-Key`: `key → name of the Secret it came from` (group label
/// `admins` for alice, `users` otherwise).
pub fn api_keys(pairs: &[(&str, &str)]) -> AuthnMethod {
    AuthnMethod {
        name: "keys".into(),
        policy: Default::default(),
        credentials: Credentials::CustomHeader {
            name: "x-api-key".into(),
        },
        method: Verify::ApiKey(ApiKeys {
            keys: pairs
                .iter()
                .map(|(key, name)| ApiKey {
                    sha256: sha256_hex(key),
                    identity: json!({"metadata": {"name": name, "namespace": "default",
                        "labels": {"group": if *name == "alice" { "admins" } else { "users" }},
                        "annotations": {}}}),
                })
                .collect(),
        }),
        when: vec![],
    }
}

/// API-key auth (alice and bob) setting `x-user` from the Secret name.
pub fn api_key_auth() -> Auth {
    let mut a = auth(vec![api_keys(&[(API_KEY, "alice"), ("bob-key", "bob")])]);
    a.success_headers = vec![("x-user".into(), "auth.identity.metadata.name".into())];
    a
}

/// A limit of `limit` per minute counted per value of `counter`.
pub fn per_minute(id: &str, limit: u64, counter: &str) -> RateLimit {
    RateLimit {
        id: format!("default/limits/{id}"),
        rates: vec![Rate {
            limit,
            window_ms: 60_000,
        }],
        algorithm: Default::default(),
        counters: vec![counter.into()],
        when: vec![],
        cost: None,
        cost_max_body_bytes: None,
        mode: Default::default(),
    }
}

// ---- JWT ----

pub fn jwks() -> String {
    json!({"keys": [{"kty": "oct", "kid": "hmac-1", "alg": "HS256",
        "k": URL_SAFE_NO_PAD.encode(HMAC_SECRET)}]})
    .to_string()
}

pub fn now() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

/// An HS256 token for `sub` with `role`, expiring `exp_in` seconds from now.
pub fn token(sub: &str, role: &str, exp_in: i64) -> String {
    token_signed(sub, role, exp_in, HMAC_SECRET)
}

pub fn token_signed(sub: &str, role: &str, exp_in: i64, secret: &[u8]) -> String {
    let mut h = Header::new(Algorithm::HS256);
    h.kid = Some("hmac-1".into());
    let claims = json!({"iss": ISSUER, "aud": "shop", "sub": sub, "role": role,
        "exp": now() + exp_in});
    jsonwebtoken::encode(&h, &claims, &EncodingKey::from_secret(secret).unwrap()).unwrap()
}

pub fn jwt_auth() -> Auth {
    let mut a = auth(vec![AuthnMethod {
        name: "users".into(),
        policy: Default::default(),
        credentials: Credentials::AuthorizationHeader {
            prefix: "Bearer".into(),
        },
        method: Verify::Jwt(Jwt {
            issuer: ISSUER.into(),
            audiences: vec!["shop".into()],
            jwks_uri: None,
            jwks: Some(jwks()),
        }),
        when: vec![],
    }]);
    a.success_headers = vec![("x-user".into(), "auth.identity.sub".into())];
    a
}

// ---- requests ----

pub async fn get_with(c: &TestClient, url: &str, headers: &[(&str, &str)]) -> Answer {
    request(c, Method::GET, url, headers).await
}

pub async fn request(
    c: &TestClient,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
) -> Answer {
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(c, b.body(Full::<Bytes>::default()).unwrap()).await
}

pub fn header<'a>(a: &'a Answer, name: &str) -> Option<&'a str> {
    a.headers.get(name).map(|v| v.to_str().unwrap())
}

pub fn www_authenticate(a: &Answer) -> Vec<&str> {
    a.headers
        .get_all("www-authenticate")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect()
}

/// `(X-RateLimit-Limit, X-RateLimit-Remaining)` of an answer.
pub fn limit_headers(a: &Answer) -> (Option<&str>, Option<&str>) {
    (
        header(a, "x-ratelimit-limit"),
        header(a, "x-ratelimit-remaining"),
    )
}

/// Header `name` as whole seconds, within `range`.
pub fn seconds(a: &Answer, name: &str, range: std::ops::RangeInclusive<u64>) -> u64 {
    let v: u64 = header(a, name)
        .unwrap_or_else(|| panic!("no {name}: {a:?}"))
        .parse()
        .unwrap();
    assert!(range.contains(&v), "{name}: {v} not in {range:?}");
    v
}

/// `X-RateLimit-Reset` of a one-minute window: the time left in it.
pub fn reset_within_the_window(a: &Answer) {
    seconds(a, "x-ratelimit-reset", 1..=60);
}

/// `Retry-After` of a full sliding window of 3 per minute: the previous window's count
/// weighs until a third of the next window has passed, so at most 60 + 20 s.
pub fn retry_after_a_full_window_of_3(a: &Answer) {
    seconds(a, "retry-after", 1..=80);
}

pub fn cors() -> Filter {
    Filter::Cors(Cors {
        allow_origins: vec!["https://app.example".into()],
        allow_credentials: false,
        allow_methods: vec!["GET".into(), "POST".into()],
        allow_headers: vec!["x-api-key".into()],
        expose_headers: vec![],
        max_age: 600,
    })
}
