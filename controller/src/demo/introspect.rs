//! A DEMO OAuth 2.0 token introspection endpoint (RFC 7662) for examples/introspection. It
//! is not an authorization server and must never stand in for one: its client credentials and
//! tokens are fixed strings published in this file and in the example's README.
//!
//! In: `POST /introspect` with HTTP Basic client credentials and a form body with `token`.
//! Out:
//! - 401 (`WWW-Authenticate: Basic`) unless the credentials are [`CLIENT_ID`]:[`CLIENT_SECRET`];
//! - 400 `invalid_request` without a `token` field;
//! - [`ALICE_TOKEN`]: active, `sub: alice`, `scope: read`, `exp` an hour from now;
//! - [`ADMIN_TOKEN`]: active, `sub: admin`, `scope: "read write"`, `role: admin`;
//! - anything else: `{"active": false}`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::StatusCode;
use serde_json::{Value, json};

/// Where the demo backend answers introspection requests (`POST` only).
pub const PATH: &str = "/introspect";
/// The demo client id a gateway must present.
pub const CLIENT_ID: &str = "demo-client";
/// The demo client secret a gateway must present.
pub const CLIENT_SECRET: &str = "demo-secret";
/// A demo token that is active for `alice`.
pub const ALICE_TOKEN: &str = "demo-token-alice";
/// A demo token that is active for `admin`, with `role: admin`.
pub const ADMIN_TOKEN: &str = "demo-token-admin";

/// How long the demo tokens are said to stay valid, from the time of the call.
const LIFETIME_SECS: u64 = 3600;

/// The answer to one introspection request: `authorization` is the request's
/// `Authorization` header, `body` its form body, `now` the time in unix seconds.
pub fn answer(authorization: Option<&[u8]>, body: &[u8], now: u64) -> (StatusCode, Value) {
    if !client_authenticated(authorization) {
        return (StatusCode::UNAUTHORIZED, json!({"error": "invalid_client"}));
    }
    let Some(token) = form_urlencoded::parse(body)
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v)
    else {
        return (StatusCode::BAD_REQUEST, json!({"error": "invalid_request"}));
    };
    let (iat, exp) = (now, now.saturating_add(LIFETIME_SECS));
    let doc = match token.as_ref() {
        ALICE_TOKEN => json!({
            "active": true, "sub": "alice", "scope": "read", "client_id": CLIENT_ID,
            "token_type": "Bearer", "iat": iat, "exp": exp,
        }),
        ADMIN_TOKEN => json!({
            "active": true, "sub": "admin", "scope": "read write", "role": "admin",
            "client_id": CLIENT_ID, "token_type": "Bearer", "iat": iat, "exp": exp,
        }),
        _ => json!({"active": false}),
    };
    (StatusCode::OK, doc)
}

/// Whether `Authorization: Basic` carries the demo client's credentials. RFC 6749 §2.3.1
/// form-encodes id and secret before base64; the demo ones encode to themselves.
fn client_authenticated(authorization: Option<&[u8]>) -> bool {
    let Some(basic) = authorization
        .and_then(|h| std::str::from_utf8(h).ok())
        .and_then(|h| h.strip_prefix("Basic "))
    else {
        return false;
    };
    STANDARD
        .decode(basic.trim())
        .is_ok_and(|pair| pair == format!("{CLIENT_ID}:{CLIENT_SECRET}").as_bytes())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn basic(id: &str, secret: &str) -> Vec<u8> {
        format!("Basic {}", STANDARD.encode(format!("{id}:{secret}"))).into_bytes()
    }

    fn ask(token: &str) -> (StatusCode, Value) {
        let body = format!("token={token}&token_type_hint=access_token");
        answer(Some(&basic(CLIENT_ID, CLIENT_SECRET)), body.as_bytes(), NOW)
    }

    #[test]
    fn alice_is_active_for_an_hour() {
        let (status, doc) = ask(ALICE_TOKEN);
        assert_eq!(status, StatusCode::OK);
        assert_eq!(doc["active"], true);
        assert_eq!(doc["sub"], "alice");
        assert_eq!(doc["scope"], "read");
        assert_eq!(doc["exp"], NOW + 3600);
        assert!(doc.get("role").is_none(), "{doc}");
    }

    #[test]
    fn admin_is_active_with_a_role() {
        let (status, doc) = ask(ADMIN_TOKEN);
        assert_eq!(status, StatusCode::OK);
        assert_eq!(doc["active"], true);
        assert_eq!(doc["sub"], "admin");
        assert_eq!(doc["role"], "admin");
    }

    #[test]
    fn other_tokens_are_inactive_and_say_nothing_else() {
        for token in ["demo-token-bob", "", "demo-token-alice%20"] {
            assert_eq!(ask(token), (StatusCode::OK, json!({"active": false})));
        }
    }

    #[test]
    fn wrong_or_missing_client_credentials_are_refused() {
        let body = format!("token={ALICE_TOKEN}");
        for auth in [
            None,
            Some(basic(CLIENT_ID, "wrong")),
            Some(basic("other", CLIENT_SECRET)),
            Some(format!("Bearer {ALICE_TOKEN}").into_bytes()),
            Some(b"Basic !!!".to_vec()),
        ] {
            let (status, _) = answer(auth.as_deref(), body.as_bytes(), NOW);
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{auth:?}");
        }
    }

    #[test]
    fn a_request_without_a_token_is_invalid() {
        let (status, doc) = answer(
            Some(&basic(CLIENT_ID, CLIENT_SECRET)),
            b"token_type_hint=access_token",
            NOW,
        );
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(doc["error"], "invalid_request");
    }
}
