//! Authentication and authorization on the wire: 401 with its challenge, 403, the policy's
//! own answers, success headers upstream and spoofed ones gone, the policy-level `when`, and
//! the CEL attributes the request path fills in.

use http::{Method, Request, StatusCode};
use http_body_util::Full;
use tollgate_api::policy::{Auth, AuthzRule, DenyResponse};

use crate::common::*;
use crate::support::*;

// ---- authentication ----

#[tokio::test]
async fn api_key_in_a_custom_header_is_required_and_its_identity_reaches_the_upstream() {
    let app = echo_backend("app").await;
    let (_p, url) = proxy_with_policies(
        &app,
        vec![guarded("orders", "/", "p")],
        vec![("p", only_auth(api_key_auth()))],
    )
    .await;
    let c = h1_client();
    let url = format!("{url}/orders");

    let none = get_with(&c, &url, &[]).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(www_authenticate(&none), [APIKEY_CHALLENGE]);
    assert_eq!(&none.body[..], b"Unauthorized\n");
    assert_eq!(
        header(&none, "content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert!(
        header(&none, "x-request-id").is_some(),
        "denials get a request id"
    );

    let wrong = get_with(&c, &url, &[("x-api-key", "not-a-key")]).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(www_authenticate(&wrong), [APIKEY_CHALLENGE]);
    // The key in another place than the policy reads it from does not count.
    let elsewhere = get_with(&c, &url, &[("authorization", &format!("APIKEY {API_KEY}"))]).await;
    assert_eq!(elsewhere.status, StatusCode::UNAUTHORIZED);
    assert_eq!(app.hits(), 0, "no denied request reaches the upstream");

    let ok = get_with(&c, &url, &[("x-api-key", API_KEY)]).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(ok.upstream_header("x-user").as_deref(), Some("alice"));
    assert!(
        !ok.headers.contains_key("www-authenticate"),
        "{:?}",
        ok.headers
    );
    assert!(
        !ok.headers.contains_key("x-ratelimit-limit"),
        "no limit, no headers"
    );

    // A client-sent identity header is replaced, every copy of it.
    let spoofed = send(
        &c,
        Request::get(&url)
            .header("x-api-key", "bob-key")
            .header("x-user", "alice")
            .header("X-User", "root")
            .body(Full::default())
            .unwrap(),
    )
    .await;
    assert_eq!(spoofed.status, StatusCode::OK);
    assert_eq!(spoofed.upstream_header("x-user").as_deref(), Some("bob"));
    assert_eq!(app.hits(), 2);
}

#[tokio::test]
async fn api_key_identity_reaches_the_upstream_over_http2() {
    let app = echo_backend("app").await;
    let (_p, url) = proxy_with_policies(
        &app,
        vec![guarded("orders", "/", "p")],
        vec![("p", only_auth(api_key_auth()))],
    )
    .await;
    let c = h2c_client();
    let url = format!("{url}/orders");
    assert_eq!(
        get_with(&c, &url, &[]).await.status,
        StatusCode::UNAUTHORIZED
    );
    let ok = get_with(&c, &url, &[("x-api-key", API_KEY), ("x-user", "root")]).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(ok.upstream_header("x-user").as_deref(), Some("alice"));
}

#[tokio::test]
async fn jwt_from_an_inline_hs256_jwks_is_verified() {
    let app = echo_backend("app").await;
    let (_p, url) = proxy_with_policies(
        &app,
        vec![guarded("profile", "/", "p")],
        vec![("p", only_auth(jwt_auth()))],
    )
    .await;
    let c = h1_client();
    let url = format!("{url}/me");
    let bearer = |t: &str| format!("Bearer {t}");

    let valid = get_with(
        &c,
        &url,
        &[
            ("authorization", &bearer(&token("alice", "user", 3600))),
            ("x-user", "root"),
        ],
    )
    .await;
    assert_eq!(valid.status, StatusCode::OK);
    assert_eq!(valid.upstream_header("x-user").as_deref(), Some("alice"));

    let none = get_with(&c, &url, &[]).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(www_authenticate(&none), ["Bearer realm=\"tollgate\""]);

    // Expired an hour ago: well past the 30 s leeway.
    let expired = get_with(
        &c,
        &url,
        &[("authorization", &bearer(&token("alice", "user", -3600)))],
    )
    .await;
    assert_eq!(expired.status, StatusCode::UNAUTHORIZED);
    assert_eq!(www_authenticate(&expired), ["Bearer realm=\"tollgate\""]);

    let forged = token_signed(
        "alice",
        "user",
        3600,
        b"another secret of at least 32 bytes",
    );
    let forged = get_with(&c, &url, &[("authorization", &bearer(&forged))]).await;
    assert_eq!(forged.status, StatusCode::UNAUTHORIZED);
    assert_eq!(app.hits(), 1);
}

// ---- authorization ----

#[tokio::test]
async fn an_authorization_rule_that_does_not_hold_is_403_without_a_challenge() {
    let app = echo_backend("app").await;
    let mut a = jwt_auth();
    a.authorization = vec![AuthzRule {
        name: "admins-only".into(),
        policy: Default::default(),
        predicate: "auth.identity.role == 'admin'".into(),
        external: None,
        when: vec!["request.url_path.startsWith('/admin')".into()],
    }];
    let (_p, url) = proxy_with_policies(
        &app,
        vec![guarded("shop", "/", "p")],
        vec![("p", only_auth(a))],
    )
    .await;
    let c = h1_client();
    let user = format!("Bearer {}", token("bob", "user", 3600));
    let admin = format!("Bearer {}", token("alice", "admin", 3600));

    let forbidden = get_with(
        &c,
        &format!("{url}/admin/users"),
        &[("authorization", &user)],
    )
    .await;
    assert_eq!(forbidden.status, StatusCode::FORBIDDEN);
    assert_eq!(&forbidden.body[..], b"Forbidden\n");
    assert!(
        !forbidden.headers.contains_key("www-authenticate"),
        "{:?}",
        forbidden.headers
    );
    assert_eq!(app.hits(), 0);

    // The rule's `when` limits it to /admin; elsewhere bob is fine.
    let elsewhere = get_with(&c, &format!("{url}/shop"), &[("authorization", &user)]).await;
    assert_eq!(elsewhere.status, StatusCode::OK);
    let allowed = get_with(
        &c,
        &format!("{url}/admin/users"),
        &[("authorization", &admin)],
    )
    .await;
    assert_eq!(allowed.status, StatusCode::OK);
    assert_eq!(allowed.upstream_header("x-user").as_deref(), Some("alice"));
    // Authentication comes first: no token on /admin is 401, not 403.
    let anonymous = get_with(&c, &format!("{url}/admin/users"), &[]).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert_eq!(app.hits(), 2);
}

/// API keys, "who are you?" to a caller without one, and a rule only the `admins` group's
/// keys pass.
fn admins_only() -> Auth {
    let mut a = api_key_auth();
    a.unauthenticated = DenyResponse {
        code: 401,
        message: Some("who are you?".into()),
    };
    a.authorization = vec![AuthzRule {
        name: "admins".into(),
        policy: Default::default(),
        predicate: "auth.identity.metadata.labels.group == 'admins'".into(),
        external: None,
        when: vec![],
    }];
    a
}

#[tokio::test]
async fn deny_answers_carry_the_policy_code_and_message() {
    let app = echo_backend("app").await;
    let mut a = admins_only();
    a.unauthorized = DenyResponse {
        code: 404,
        message: Some("nothing here".into()),
    };
    let (_p, url) = proxy_with_policies(
        &app,
        vec![guarded("shop", "/", "p")],
        vec![("p", only_auth(a))],
    )
    .await;
    let c = h1_client();
    let none = get_with(&c, &url, &[]).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(&none.body[..], b"who are you?\n");
    assert_eq!(www_authenticate(&none), [APIKEY_CHALLENGE]);
    let bob = get_with(&c, &url, &[("x-api-key", "bob-key")]).await;
    assert_eq!(bob.status, StatusCode::NOT_FOUND);
    assert_eq!(&bob.body[..], b"nothing here\n");
    let alice = get_with(&c, &url, &[("x-api-key", API_KEY)]).await;
    assert_eq!(alice.status, StatusCode::OK);
}

// ---- the policy-level `when` ----

#[tokio::test]
async fn auth_whose_policy_level_when_does_not_hold_lets_the_request_through_anonymously() {
    let app = echo_backend("app").await;
    let mut a = api_key_auth();
    a.when = vec!["request.url_path.startsWith('/private')".into()];
    let (_p, url) = proxy_with_policies(
        &app,
        vec![guarded("site", "/", "p")],
        vec![("p", only_auth(a))],
    )
    .await;
    let c = h1_client();

    let public = get_with(&c, &format!("{url}/public"), &[("x-user", "alice")]).await;
    assert_eq!(public.status, StatusCode::OK);
    assert_eq!(
        public.upstream_header("x-user"),
        None,
        "a spoofed identity header is stripped even when the policy does not apply"
    );
    let private = get_with(&c, &format!("{url}/private/x"), &[]).await;
    assert_eq!(private.status, StatusCode::UNAUTHORIZED);
    assert_eq!(www_authenticate(&private), [APIKEY_CHALLENGE]);
    let with_key = get_with(&c, &format!("{url}/private/x"), &[("x-api-key", API_KEY)]).await;
    assert_eq!(with_key.status, StatusCode::OK);
    assert_eq!(with_key.upstream_header("x-user").as_deref(), Some("alice"));
}

// ---- CEL attributes as the request path fills them ----

/// `request.host` is documented (cel.rs `Attrs::host`) as lower-case, and routing ignores the
/// case of the Host header; a policy keyed on the host must not be escaped by changing case.
#[tokio::test]
async fn request_host_is_lower_case_so_a_host_predicate_cannot_be_escaped() {
    let app = echo_backend("app").await;
    let mut a = api_key_auth();
    a.when = vec!["request.host == 'admin.example'".into()];
    let (_p, url) = proxy_with_policies(
        &app,
        vec![guarded("admin", "/", "p")],
        vec![("p", only_auth(a))],
    )
    .await;
    let c = h1_client();
    let lower = get_host(&c, &url, "admin.example").await;
    assert_eq!(lower.status, StatusCode::UNAUTHORIZED);
    let upper = get_host(&c, &url, "ADMIN.example:80").await;
    assert_eq!(
        upper.status,
        StatusCode::UNAUTHORIZED,
        "changing the case of Host skipped authentication"
    );
    assert_eq!(app.hits(), 0);
}

#[tokio::test]
async fn cel_sees_method_host_path_scheme_headers_and_source() {
    let app = echo_backend("app").await;
    let mut a = auth(vec![]);
    a.authorization = vec![AuthzRule {
        name: "everything".into(),
        policy: Default::default(),
        predicate: [
            "request.method == 'POST'",
            "request.host == 'shop.example'",
            "request.path == '/cart/items?id=7'",
            "request.url_path == '/cart/items'",
            "request.scheme == 'http'",
            "request.headers['x-team'] == 'blue'",
            "source.address == '127.0.0.1'",
            "source.port > 0",
            "auth.identity == null",
        ]
        .join(" && "),
        external: None,
        when: vec![],
    }];
    a.success_headers = vec![(
        "x-seen".into(),
        "request.method + ' ' + request.host + request.url_path".into(),
    )];
    let (_p, url) = proxy_with_policies(
        &app,
        vec![guarded("shop", "/", "p")],
        vec![("p", only_auth(a))],
    )
    .await;
    let c = h1_client();
    let send_as = |method: Method, team: &'static str| {
        let c = c.clone();
        let url = format!("{url}/cart/items?id=7");
        async move {
            send(
                &c,
                Request::builder()
                    .method(method)
                    .uri(url)
                    .header("host", "shop.example:8080")
                    .header("x-team", team)
                    .body(Full::default())
                    .unwrap(),
            )
            .await
        }
    };
    let ok = send_as(Method::POST, "blue").await;
    assert_eq!(ok.status, StatusCode::OK, "{ok:?}");
    assert_eq!(
        ok.upstream_header("x-seen").as_deref(),
        Some("POST shop.example/cart/items")
    );
    assert_eq!(
        send_as(Method::POST, "red").await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        send_as(Method::GET, "blue").await.status,
        StatusCode::FORBIDDEN
    );
}

// ---- routes without policies ----

#[tokio::test]
async fn only_routes_that_name_a_policy_set_enforce_it() {
    let app = echo_backend("app").await;
    let (_p, url) = proxy_with_policies(
        &app,
        vec![
            guarded("private", "/private", "p"),
            route("public", "/", vec![wb("app", 1)]),
        ],
        vec![("p", only_auth(api_key_auth()))],
    )
    .await;
    let c = h1_client();
    assert_eq!(
        get_with(&c, &format!("{url}/private"), &[]).await.status,
        StatusCode::UNAUTHORIZED
    );
    let public = get_with(&c, &format!("{url}/public"), &[("x-user", "alice")]).await;
    assert_eq!(public.status, StatusCode::OK);
    // Without a policy nothing names x-user as an identity header: it passes as sent.
    assert_eq!(public.upstream_header("x-user").as_deref(), Some("alice"));
}

/// A gRPC client reads a denial as a gRPC status: 401 `UNAUTHENTICATED` (16) with the
/// challenge kept, the authorization failure 403 `PERMISSION_DENIED` (7), each with the
/// policy's message in `grpc-message`.
#[tokio::test]
async fn grpc_clients_get_denials_as_grpc_statuses_with_the_policy_message() {
    let app = echo_backend("app").await;
    let (_p, url) = proxy_with_policies(
        &app,
        vec![guarded("shop", "/", "p")],
        vec![("p", only_auth(admins_only()))],
    )
    .await;
    let c = h2c_client();
    let url = format!("{url}/shop.Cart/Add");
    let grpc = [("content-type", "application/grpc"), ("te", "trailers")];
    let none = request(&c, Method::POST, &url, &grpc).await;
    assert_eq!(none.status, StatusCode::OK, "{none:?}");
    assert_eq!(header(&none, "content-type"), Some("application/grpc"));
    assert_eq!(header(&none, "grpc-status"), Some("16"));
    assert_eq!(header(&none, "grpc-message"), Some("who are you?"));
    assert_eq!(www_authenticate(&none), [APIKEY_CHALLENGE]);
    assert!(none.body.is_empty());
    let bob = request(
        &c,
        Method::POST,
        &url,
        &[grpc[0], grpc[1], ("x-api-key", "bob-key")],
    )
    .await;
    assert_eq!(bob.status, StatusCode::OK, "{bob:?}");
    assert_eq!(header(&bob, "grpc-status"), Some("7"));
    assert_eq!(header(&bob, "grpc-message"), Some("Forbidden"));
    assert_eq!(app.hits(), 0);
    // The same denial to a plain HTTP client stays a 401.
    let plain = get_with(&c, &url, &[]).await;
    assert_eq!(plain.status, StatusCode::UNAUTHORIZED);
    assert_eq!(header(&plain, "grpc-status"), None);
}
