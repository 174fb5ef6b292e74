//! JWT parsing and verification (`tollgate_proxy::policy::auth`, method `jwt`), through the
//! public policy API with an inline JWKS (an HMAC and an EC key): the bearer credential,
//! the header, the key choice, the signature and the claims. The first byte picks the input:
//! even, the rest is a token as a client sends it; odd, the rest is a claims document
//! signed with the HMAC key, so the claim checks see arbitrary JSON. Checks, besides not
//! panicking: a token is only accepted with the right issuer, audience and a numeric
//! expiry.
#![no_main]

use std::sync::LazyLock;

use http::HeaderMap;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use libfuzzer_sys::fuzz_target;
use tollgate_api::ObjectKey;
use tollgate_api::policy::{Auth, AuthnMethod, Credentials, DenyResponse, Jwt, Method};
use tollgate_proxy::policy::auth::{AuthMetrics, AuthOutcome, AuthState, CompiledAuth};
use tollgate_proxy::policy::cel::{Activation, Attrs};

const SECRET: &[u8] = b"fuzz-only shared secret, 32 byte";
const ISSUER: &str = "https://issuer.test";
const JWKS: &str = r#"{"keys":[
  {"kty":"oct","kid":"hmac-1","alg":"HS256","k":"ZnV6ei1vbmx5IHNoYXJlZCBzZWNyZXQsIDMyIGJ5dGU"},
  {"kty":"EC","kid":"ec-1","crv":"P-256","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}
]}"#;

struct Fixture {
    runtime: tokio::runtime::Runtime,
    policy: CompiledAuth,
    key: EncodingKey,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let auth = Auth {
        sources: vec![ObjectKey::new("shop", "auth")],
        when: vec![],
        authentication: vec![AuthnMethod {
            name: "jwt".into(),
            policy: Default::default(),
            credentials: Credentials::AuthorizationHeader {
                prefix: "Bearer".into(),
            },
            method: Method::Jwt(Jwt {
                issuer: ISSUER.into(),
                audiences: vec!["shop".into()],
                jwks_uri: None,
                jwks: Some(JWKS.into()),
            }),
            when: vec![],
        }],
        authorization: vec![],
        success_headers: vec![],
        unauthenticated: DenyResponse::unauthenticated(),
        unauthorized: DenyResponse::unauthorized(),
    };
    let state = AuthState::new(AuthMetrics::new());
    Fixture {
        runtime: tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime"),
        policy: CompiledAuth::build(&auth, &state).expect("the fixture policy builds"),
        key: EncodingKey::from_secret(SECRET).expect("a non-empty secret"),
    }
});

fuzz_target!(|data: &[u8]| {
    let fx = &*FIXTURE;
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let signed = mode & 1 == 1;
    let token = if signed {
        let Ok(claims) = serde_json::from_slice::<serde_json::Value>(rest) else {
            return;
        };
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("hmac-1".into());
        let Ok(t) = jsonwebtoken::encode(&header, &claims, &fx.key) else {
            return;
        };
        t
    } else {
        String::from_utf8_lossy(rest).into_owned()
    };
    let Ok(value) = http::HeaderValue::try_from(format!("Bearer {token}")) else {
        return;
    };
    let mut parts = http::Request::new(()).into_parts().0;
    parts.headers.insert(http::header::AUTHORIZATION, value);
    let headers: HeaderMap = parts.headers.clone();
    let mut act = Activation::new(&Attrs {
        method: "GET",
        host: "shop.example.com",
        path: "/",
        scheme: "https",
        headers: &headers,
        source: std::net::SocketAddr::from(([127, 0, 0, 1], 40000)),
    });
    let outcome = fx
        .runtime
        .block_on(fx.policy.check(&mut parts, None, "https", &mut act));
    if let AuthOutcome::Allowed(who) = outcome {
        // Only with the right claims (a raw token passes only when it is signed with the
        // HMAC key, as the seed `valid_token` is).
        let claims = &who.identity;
        assert_eq!(claims["iss"], ISSUER);
        assert!(claims.get("exp").is_some_and(serde_json::Value::is_number));
        let aud = &claims["aud"];
        assert!(
            aud == "shop"
                || aud
                    .as_array()
                    .is_some_and(|a| a.iter().any(|v| v == "shop")),
            "accepted for another audience: {aud}"
        );
    }
});
