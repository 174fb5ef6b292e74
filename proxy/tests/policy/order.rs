//! The order of the checks: authentication and authorization before the rate limit (denied
//! requests consume nothing), the identity visible to counters, and CORS preflights answered
//! before any policy.

use http::{Method, StatusCode};
use tollgate_api::PolicySet;
use tollgate_api::policy::AuthzRule;

use crate::common::*;
use crate::support::*;

// ---- order: authentication, authorization, rate limit ----

#[tokio::test]
async fn denied_requests_do_not_consume_the_rate_limit() {
    let app = echo_backend("app").await;
    let mut a = api_key_auth();
    a.authorization = vec![AuthzRule {
        name: "no-delete".into(),
        policy: Default::default(),
        predicate: "request.method != 'DELETE'".into(),
        external: None,
        when: vec![],
    }];
    let set = PolicySet {
        auth: Some(a),
        rate_limits: vec![per_minute(
            "per-client",
            3,
            "request.headers['x-client-id']",
        )],
    };
    let (_p, url) =
        proxy_with_policies(&app, vec![guarded("api", "/", "p")], vec![("p", set)]).await;
    let c = h1_client();
    let client = ("x-client-id", "alice");

    for _ in 0..5 {
        let unauthenticated = get_with(&c, &url, &[client]).await;
        assert_eq!(unauthenticated.status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            limit_headers(&unauthenticated),
            (None, None),
            "a 401 is decided before any limit"
        );
        let wrong_key = get_with(&c, &url, &[client, ("x-api-key", "nope")]).await;
        assert_eq!(wrong_key.status, StatusCode::UNAUTHORIZED);
        let forbidden = request(&c, Method::DELETE, &url, &[client, ("x-api-key", API_KEY)]).await;
        assert_eq!(forbidden.status, StatusCode::FORBIDDEN);
        assert_eq!(limit_headers(&forbidden), (None, None));
    }
    let first = get_with(&c, &url, &[client, ("x-api-key", API_KEY)]).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        limit_headers(&first),
        (Some("3"), Some("2")),
        "15 denied requests consumed nothing"
    );
    assert_eq!(app.hits(), 1);
}

#[tokio::test]
async fn a_limit_may_count_per_authenticated_identity() {
    let app = echo_backend("app").await;
    let set = PolicySet {
        auth: Some(api_key_auth()),
        rate_limits: vec![per_minute("per-user", 3, "auth.identity.metadata.name")],
    };
    let (_p, url) =
        proxy_with_policies(&app, vec![guarded("api", "/", "p")], vec![("p", set)]).await;
    let c = h1_client();
    for remaining in ["2", "1", "0"] {
        let a = get_with(&c, &url, &[("x-api-key", API_KEY)]).await;
        assert_eq!(limit_headers(&a), (Some("3"), Some(remaining)));
    }
    let a = get_with(&c, &url, &[("x-api-key", API_KEY)]).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    // A spoofed success header cannot move alice into another counter or identity.
    let b = get_with(&c, &url, &[("x-api-key", "bob-key"), ("x-user", "alice")]).await;
    assert_eq!(b.status, StatusCode::OK);
    assert_eq!(limit_headers(&b), (Some("3"), Some("2")));
    assert_eq!(b.upstream_header("x-user").as_deref(), Some("bob"));
}

#[tokio::test]
async fn a_cors_preflight_is_answered_by_cors_not_by_auth_or_the_rate_limit() {
    let app = echo_backend("app").await;
    let mut r = guarded("api", "/", "p");
    r.filters = vec![cors()];
    let set = PolicySet {
        auth: Some(api_key_auth()),
        rate_limits: vec![per_minute("per-ip", 3, "source.address")],
    };
    let (_p, url) = proxy_with_policies(&app, vec![r], vec![("p", set)]).await;
    let c = h1_client();
    let preflight = [
        ("origin", "https://app.example"),
        ("access-control-request-method", "GET"),
        ("access-control-request-headers", "x-api-key"),
    ];
    for _ in 0..5 {
        let answer = request(&c, Method::OPTIONS, &format!("{url}/orders"), &preflight).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(
            header(&answer, "access-control-allow-origin"),
            Some("https://app.example")
        );
        assert_eq!(
            header(&answer, "access-control-allow-methods"),
            Some("GET, POST")
        );
        assert_eq!(
            header(&answer, "access-control-allow-headers"),
            Some("x-api-key")
        );
        assert_eq!(header(&answer, "access-control-max-age"), Some("600"));
        assert!(!answer.headers.contains_key("www-authenticate"));
        assert_eq!(limit_headers(&answer), (None, None));
    }
    assert_eq!(app.hits(), 0, "the gateway answers preflights itself");

    // An OPTIONS that is not a preflight is an ordinary request: authenticated.
    let plain = request(
        &c,
        Method::OPTIONS,
        &format!("{url}/orders"),
        &[("origin", "https://app.example")],
    )
    .await;
    assert_eq!(plain.status, StatusCode::UNAUTHORIZED);
    // The actual request needs its key, and the preflights consumed no rate limit.
    let ok = get_with(
        &c,
        &format!("{url}/orders"),
        &[("origin", "https://app.example"), ("x-api-key", API_KEY)],
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(
        header(&ok, "access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(limit_headers(&ok), (Some("3"), Some("2")));
}

#[tokio::test]
async fn a_preflight_on_a_route_without_cors_is_authenticated_like_any_request() {
    let app = echo_backend("app").await;
    let (_p, url) = proxy_with_policies(
        &app,
        vec![guarded("api", "/", "p")],
        vec![("p", only_auth(api_key_auth()))],
    )
    .await;
    let c = h1_client();
    let answer = request(
        &c,
        Method::OPTIONS,
        &url,
        &[
            ("origin", "https://app.example"),
            ("access-control-request-method", "GET"),
        ],
    )
    .await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    assert_eq!(app.hits(), 0);
}

/// A browser can only read a denial its page may see: on a CORS route, the 401/403/429
/// the gateway answers for a request from an allowed origin should carry the CORS headers
/// the upstream's answers get (as Envoy's CORS filter does for local replies). Without them
/// the page sees an opaque network error and cannot read `Retry-After` or react to 401.
#[tokio::test]
async fn policy_denials_on_a_cors_route_carry_the_cors_headers() {
    let app = echo_backend("app").await;
    let mut r = guarded("api", "/", "p");
    r.filters = vec![cors()];
    let set = PolicySet {
        auth: Some(api_key_auth()),
        rate_limits: vec![per_minute("per-ip", 1, "source.address")],
    };
    let (_p, url) = proxy_with_policies(&app, vec![r], vec![("p", set)]).await;
    let c = h1_client();
    let origin = ("origin", "https://app.example");
    let denied = get_with(&c, &url, &[origin]).await;
    assert_eq!(denied.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        header(&denied, "access-control-allow-origin"),
        Some("https://app.example"),
        "{denied:?}"
    );
    assert_eq!(
        get_with(&c, &url, &[origin, ("x-api-key", API_KEY)])
            .await
            .status,
        StatusCode::OK
    );
    let limited = get_with(&c, &url, &[origin, ("x-api-key", API_KEY)]).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&limited, "access-control-allow-origin"),
        Some("https://app.example"),
        "{limited:?}"
    );
}
