//! The login itself: redirect, the provider's form, callback, session cookie, identity
//! headers upstream; API clients; forged and replayed state; an unreachable provider.

use http::{Method, StatusCode};

use crate::common::*;
use crate::support::*;

#[tokio::test]
async fn a_browser_logs_in_through_the_provider_and_the_backend_gets_the_id_token_claims() {
    let Some(op) = provider("1h") else { return };
    let app = echo_backend("app").await;
    let (_p, url) = oidc_proxy(&app, &op.issuer, &[OLD_KEY]).await;
    let mut b = Browser::new();
    let start = format!("{url}/orders?page=2");

    // Not logged in: a redirect to the provider, nothing reaches the backend.
    let first = b.request(Method::GET, &start, None).await;
    assert_eq!(first.status, StatusCode::FOUND);
    let to = first.headers["location"].to_str().unwrap().to_owned();
    assert!(to.starts_with(&format!("{}/auth?", op.issuer)), "{to}");
    let q: std::collections::HashMap<String, String> =
        form_urlencoded::parse(to.split_once('?').unwrap().1.as_bytes())
            .into_owned()
            .collect();
    assert_eq!(q["response_type"], "code");
    assert_eq!(q["client_id"], CLIENT_ID);
    assert_eq!(q["redirect_uri"], format!("{url}/oauth2/callback"));
    assert_eq!(q["code_challenge_method"], "S256");
    assert_eq!(q["code_challenge"].len(), 43, "base64url SHA-256");
    assert!(q["scope"].split(' ').any(|s| s == "openid"));
    assert!(!q["state"].is_empty() && !q["nonce"].is_empty());
    let login = &b.jar[&format!("{COOKIE}_login")];
    assert_eq!(login.path, "/oauth2/callback");
    let set = first.headers["set-cookie"].to_str().unwrap();
    for attr in ["HttpOnly", "Secure", "SameSite=Lax", "Max-Age=600"] {
        assert!(set.contains(attr), "{set}");
    }
    assert!(
        !set.contains(&q["state"]),
        "the state is sealed, not in clear"
    );
    assert_eq!(app.hits(), 0);

    // The provider's form, then back to the callback: a session, and back to the page.
    b.jar.clear();
    let (back, _) = b.log_in(&start, USER, PASSWORD).await;
    assert_eq!(back.status, StatusCode::FOUND, "{:?}", back.body);
    assert_eq!(back.headers["location"], "/orders?page=2");
    let session = back
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .find(|c| c.starts_with(&format!("{COOKIE}=")))
        .expect("a session cookie");
    for attr in ["Path=/", "HttpOnly", "Secure", "SameSite=Lax"] {
        assert!(session.contains(attr), "{session}");
    }
    assert!(b.jar.contains_key(COOKIE));
    assert!(
        !b.jar.contains_key(&format!("{COOKIE}_login")),
        "the login cookie is cleared"
    );

    // Logged in: the backend gets the request with the identity headers.
    let page = b.request(Method::GET, &start, None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(page.json()["path"], "/orders?page=2");
    assert_eq!(
        page.upstream_header("x-user-sub").as_deref(),
        Some(USER_SUB)
    );
    assert_eq!(
        page.upstream_header("x-user-iss").as_deref(),
        Some(op.issuer.as_str())
    );
    // An API call with the same cookie passes too; without it, a 401 and no redirect.
    assert_eq!(
        api_get(&b, &format!("{url}/api/cart")).await.status,
        StatusCode::OK
    );
    let anonymous = api_get(&Browser::new(), &format!("{url}/api/cart")).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert!(anonymous.headers.get("location").is_none());
    assert_eq!(app.hits(), 2);
}

#[tokio::test]
async fn a_forged_or_replayed_state_is_refused() {
    let Some(op) = provider("1h") else { return };
    let app = echo_backend("app").await;
    let (_p, url) = oidc_proxy(&app, &op.issuer, &[OLD_KEY]).await;

    // A callback with another state than the login cookie's.
    let mut b = Browser::new();
    b.request(Method::GET, &format!("{url}/"), None).await;
    assert!(b.jar.contains_key(&format!("{COOKIE}_login")));
    let forged = b
        .request(
            Method::GET,
            &format!("{url}/oauth2/callback?code=abc&state=forged"),
            None,
        )
        .await;
    assert_eq!(forged.status, StatusCode::UNAUTHORIZED);
    assert!(!b.jar.contains_key(COOKIE), "no session");

    // A real code and state, but from another browser (no login cookie): refused.
    let mut alice = Browser::new();
    let (_, callback) = {
        let mut tmp = Browser::new();
        let r = tmp.log_in(&format!("{url}/"), USER, PASSWORD).await;
        // Undo tmp's own callback: we want the URL, used once more by another browser.
        (r.0, r.1)
    };
    let stolen = alice.request(Method::GET, &callback, None).await;
    assert_eq!(stolen.status, StatusCode::UNAUTHORIZED);
    assert!(!alice.jar.contains_key(COOKIE));

    // The right state, but a code the provider does not know: the token endpoint refuses.
    let mut c = Browser::new();
    let first = c.request(Method::GET, &format!("{url}/"), None).await;
    let to = first.headers["location"].to_str().unwrap().to_owned();
    let state: String = form_urlencoded::parse(to.split_once('?').unwrap().1.as_bytes())
        .find(|(k, _)| k == "state")
        .map(|(_, v)| v.into_owned())
        .unwrap();
    let bad_code = c
        .request(
            Method::GET,
            &format!("{url}/oauth2/callback?code=not-a-code&state={state}"),
            None,
        )
        .await;
    assert_eq!(bad_code.status, StatusCode::UNAUTHORIZED);
    assert!(!c.jar.contains_key(COOKIE));
    assert_eq!(app.hits(), 0);
}

#[tokio::test]
async fn an_unreachable_provider_denies_and_the_callback_answers_502() {
    let Some(op) = provider("1h") else { return };
    let app = echo_backend("app").await;
    let (_p, url) = oidc_proxy(&app, &op.issuer, &[OLD_KEY]).await;
    let mut b = Browser::new();
    let first = b.request(Method::GET, &format!("{url}/"), None).await;
    assert_eq!(first.status, StatusCode::FOUND);
    let to = first.headers["location"].to_str().unwrap().to_owned();
    let state: String = form_urlencoded::parse(to.split_once('?').unwrap().1.as_bytes())
        .find(|(k, _)| k == "state")
        .map(|(_, v)| v.into_owned())
        .unwrap();
    drop(op);
    let cb = b
        .request(
            Method::GET,
            &format!("{url}/oauth2/callback?code=any&state={state}"),
            None,
        )
        .await;
    assert_eq!(cb.status, StatusCode::BAD_GATEWAY);
    assert!(!b.jar.contains_key(COOKIE));

    // A proxy that never reached the provider cannot start a login: 401, never the page.
    let (_p2, url2) = oidc_proxy(&app, "http://127.0.0.1:1", &[OLD_KEY]).await;
    let page = Browser::new()
        .request(Method::GET, &format!("{url2}/"), None)
        .await;
    assert_eq!(page.status, StatusCode::UNAUTHORIZED);
    assert_eq!(app.hits(), 0);
}
