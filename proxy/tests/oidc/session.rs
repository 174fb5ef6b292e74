//! The session after login: refresh when the ID token expires, logout, a tampered cookie,
//! cookie key rotation.

use http::{Method, StatusCode};

use crate::common::*;
use crate::support::*;

/// A browser logged in at `url` (its jar holds the session).
async fn logged_in(url: &str) -> Browser {
    let mut b = Browser::new();
    let (back, _) = b.log_in(&format!("{url}/"), USER, PASSWORD).await;
    assert_eq!(back.status, StatusCode::FOUND, "{:?}", back.body);
    assert!(b.jar.contains_key(COOKIE));
    b
}

#[tokio::test]
async fn an_expired_session_is_refreshed_transparently_and_never_passed_when_refresh_fails() {
    // ID tokens of 2 s: the session expires while the refresh token lives on.
    let Some(op) = provider("2s") else { return };
    let app = echo_backend("app").await;
    let (_p, url) = oidc_proxy(&app, &op.issuer, &[OLD_KEY]).await;
    // A second replica: same policy and keys, its own memory.
    let (_p2, replica) = oidc_proxy(&app, &op.issuer, &[OLD_KEY]).await;
    let mut b = logged_in(&url).await;
    let before = b.jar[COOKIE].value.clone();
    assert_eq!(
        b.request(Method::GET, &format!("{url}/a"), None)
            .await
            .status,
        StatusCode::OK
    );
    // Waiting for the token to expire is the point here (no assertion on time).
    tokio::time::sleep(std::time::Duration::from_millis(3100)).await;

    // Expired: refreshed on the way, the backend answers, the new session is set. The
    // requests a page makes at once all carry the expired cookie: they share one refresh (the
    // provider accepts each refresh token once).
    let (asset1, asset2) = (format!("{url}/assets/1"), format!("{url}/assets/2"));
    let (xhr1, xhr2) = tokio::join!(api_get(&b, &asset1), api_get(&b, &asset2));
    assert_eq!((xhr1.status, xhr2.status), (StatusCode::OK, StatusCode::OK));
    assert_eq!(
        xhr1.headers.get("set-cookie"),
        xhr2.headers.get("set-cookie"),
        "one refresh, one new session"
    );
    let page = b.request(Method::GET, &format!("{url}/b"), None).await;
    assert_eq!(page.status, StatusCode::OK, "{:?}", page.body);
    assert_eq!(
        page.upstream_header("x-user-sub").as_deref(),
        Some(USER_SUB)
    );
    let after = b.jar[COOKIE].value.clone();
    assert_ne!(before, after, "a refreshed session cookie");
    assert_eq!(
        b.request(Method::GET, &format!("{url}/c"), None)
            .await
            .status,
        StatusCode::OK
    );

    // The old cookie's refresh token was rotated away by the provider: another replica (which
    // did not refresh it) cannot refresh it again, and never passes it: an API client gets
    // 401, a browser goes to log in.
    let mut stale = Browser::new();
    stale.jar.insert(
        COOKIE.into(),
        Cookie {
            value: before,
            path: "/".into(),
        },
    );
    let hits = app.hits();
    assert_eq!(
        api_get(&stale, &format!("{replica}/d")).await.status,
        StatusCode::UNAUTHORIZED
    );
    let nav = stale
        .request(Method::GET, &format!("{replica}/d"), None)
        .await;
    assert_eq!(nav.status, StatusCode::FOUND);
    assert!(
        nav.headers["location"]
            .to_str()
            .unwrap()
            .starts_with(&op.issuer)
    );
    assert_eq!(app.hits(), hits);

    // With the provider gone, an expired session cannot be refreshed: 401, not the page.
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    drop(op);
    let gone = api_get(&b, &format!("{url}/e")).await;
    assert_eq!(gone.status, StatusCode::UNAUTHORIZED);
    assert_eq!(app.hits(), hits);
}

#[tokio::test]
async fn logout_clears_the_session_and_ends_it_at_the_provider() {
    let Some(op) = provider("1h") else { return };
    let app = echo_backend("app").await;
    let (_p, url) = oidc_proxy(&app, &op.issuer, &[OLD_KEY]).await;
    let mut b = logged_in(&url).await;
    let session = b.jar[COOKIE].clone();

    let out = b.request(Method::GET, &format!("{url}/logout"), None).await;
    assert_eq!(out.status, StatusCode::FOUND);
    let to = out.headers["location"].to_str().unwrap().to_owned();
    assert!(
        to.starts_with(&format!("{}/end_session?", op.issuer)),
        "{to}"
    );
    let q: std::collections::HashMap<String, String> =
        form_urlencoded::parse(to.split_once('?').unwrap().1.as_bytes())
            .into_owned()
            .collect();
    assert_eq!(q["post_logout_redirect_uri"], format!("{url}/"));
    assert_eq!(q["id_token_hint"].split('.').count(), 3, "the ID token");
    assert!(!b.jar.contains_key(COOKIE), "the session cookie is cleared");
    // The provider ends its session and sends the browser back to the site, which sends it
    // to log in again.
    let (_, landed) = b.follow(&to).await;
    assert!(landed.starts_with(&op.issuer), "{landed}: login again");
    assert!(
        b.visited.iter().any(|u| u == &format!("{url}/")),
        "back on the site first: {:?}",
        b.visited
    );
    assert_eq!(app.hits(), 0);

    // The logout path answers without a session too.
    let mut c = Browser::new();
    c.jar.insert(COOKIE.into(), session);
    let again = api_get(&c, &format!("{url}/logout")).await;
    assert_eq!(again.status, StatusCode::FOUND);
}

#[tokio::test]
async fn a_tampered_session_cookie_is_refused() {
    let Some(op) = provider("1h") else { return };
    let app = echo_backend("app").await;
    let (_p, url) = oidc_proxy(&app, &op.issuer, &[OLD_KEY]).await;
    let b = logged_in(&url).await;
    let good = b.jar[COOKIE].value.clone();
    assert_eq!(
        api_get(&b, &format!("{url}/x")).await.status,
        StatusCode::OK
    );

    for tampered in [
        // One character changed in the ciphertext.
        {
            let mut v = good.clone().into_bytes();
            let i = v.len() / 2;
            v[i] = if v[i] == b'A' { b'B' } else { b'A' };
            String::from_utf8(v).unwrap()
        },
        // Cut short, emptied, or garbage.
        good[..good.len() - 4].to_owned(),
        String::new(),
        "not-a-session".to_owned(),
    ] {
        let mut t = Browser::new();
        t.jar.insert(
            COOKIE.into(),
            Cookie {
                value: tampered,
                path: "/".into(),
            },
        );
        assert_eq!(
            api_get(&t, &format!("{url}/x")).await.status,
            StatusCode::UNAUTHORIZED
        );
        let nav = t.request(Method::GET, &format!("{url}/x"), None).await;
        assert_eq!(nav.status, StatusCode::FOUND, "to log in again");
    }
    assert_eq!(app.hits(), 1);
}

#[tokio::test]
async fn a_new_cookie_key_first_keeps_old_sessions_until_the_old_key_is_removed() {
    let Some(op) = provider("1h") else { return };
    let app = echo_backend("app").await;
    let (proxy, url) = oidc_proxy(&app, &op.issuer, &[OLD_KEY]).await;
    let old = logged_in(&url).await;
    assert_eq!(
        api_get(&old, &format!("{url}/x")).await.status,
        StatusCode::OK
    );

    // A new key first: sessions sealed with the old one still open; new ones use the new key.
    proxy
        .apply(oidc_table(2, &app, &op.issuer, &[NEW_KEY, OLD_KEY]))
        .await
        .unwrap();
    assert_eq!(
        api_get(&old, &format!("{url}/x")).await.status,
        StatusCode::OK
    );
    let new = logged_in(&url).await;
    assert_eq!(
        api_get(&new, &format!("{url}/x")).await.status,
        StatusCode::OK
    );

    // The old key removed: its sessions are refused, the new key's are not.
    proxy
        .apply(oidc_table(3, &app, &op.issuer, &[NEW_KEY]))
        .await
        .unwrap();
    assert_eq!(
        api_get(&old, &format!("{url}/x")).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        api_get(&new, &format!("{url}/x")).await.status,
        StatusCode::OK
    );
}
