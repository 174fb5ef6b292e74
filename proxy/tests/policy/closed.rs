//! Rules closed by invalid policies (`RouteTable::closed`): every request answers 500, with
//! or without a credential, and never reaches the upstream; other routes keep serving.

use http::StatusCode;
use tollgate_api::ObjectKey;
use tollgate_api::policy::Closed;

use crate::common::*;
use crate::support::*;

#[tokio::test]
async fn a_closed_rule_answers_500_and_never_reaches_the_upstream() {
    let app = echo_backend("app").await;
    let proxy = tollgate_proxy::Proxy::new(tollgate_proxy::ProxyOptions::default());
    let mut t = table(
        1,
        vec![http_port(
            0,
            vec![
                guarded("vault", "/vault", "default/vault/0"),
                guarded("api", "/api", "default/api/0"),
                route("open", "/", vec![wb("app", 1)]),
            ],
        )],
        vec![("app", backend_of(&[&app]))],
    );
    t.policies
        .insert("default/api/0".into(), only_auth(api_key_auth()));
    t.closed.insert(
        "default/vault/0".into(),
        Closed {
            by: vec![ObjectKey::new("default", "never-valid")],
        },
    );
    proxy.apply(t).await.unwrap();
    let url = format!("http://{}", proxy.local_addr(0).unwrap());
    let c = h1_client();

    let bare = get_with(&c, &format!("{url}/vault/x"), &[]).await;
    assert_eq!(bare.status, StatusCode::INTERNAL_SERVER_ERROR);
    let with_key = get_with(&c, &format!("{url}/vault/x"), &[("x-api-key", API_KEY)]).await;
    assert_eq!(with_key.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(app.hits(), 0, "a closed rule never reaches the upstream");

    // The other routes: a valid policy still decides, an open route still serves.
    let denied = get_with(&c, &format!("{url}/api"), &[]).await;
    assert_eq!(denied.status, StatusCode::UNAUTHORIZED);
    let admitted = get_with(&c, &format!("{url}/api"), &[("x-api-key", API_KEY)]).await;
    assert_eq!(admitted.status, StatusCode::OK);
    assert_eq!(get(&c, &format!("{url}/")).await.status, StatusCode::OK);
    assert_eq!(app.hits(), 2);
}
