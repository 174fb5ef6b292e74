//! `tollgate_policy_decisions_total{policy, rule, outcome}` as the admin port serves it: each
//! decision counted under the policy and rule that took it, two policies of a kind on one
//! route counted apart, every series of a rule present (at 0) once its table is applied.

use std::sync::Arc;

use http::{Method, StatusCode};
use tollgate_api::policy::{AuthzRule, Closed, LimitMode};
use tollgate_api::{ObjectKey, PolicySet};
use tollgate_proxy::metrics::Metrics;
use tollgate_proxy::{Proxy, ProxyOptions, serve_admin};

use crate::common::*;
use crate::support::*;

/// A proxy serving `t` (its port 0) with its own metrics, and the URL of its admin port.
async fn proxy_with_admin(t: tollgate_api::RouteTable) -> (Proxy, String, String) {
    let metrics = Arc::new(Metrics::new());
    let proxy = Proxy::new(ProxyOptions {
        metrics: metrics.clone(),
        ..ProxyOptions::default()
    });
    proxy.apply(t).await.unwrap();
    let url = format!("http://{}", proxy.local_addr(0).unwrap());
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_url = format!("http://{}", admin.local_addr().unwrap());
    tokio::spawn(serve_admin(admin, metrics, || true));
    (proxy, url, admin_url)
}

/// The `tollgate_policy_decisions_total` lines of the admin port's `/metrics`, sorted.
async fn decisions(c: &TestClient, admin_url: &str) -> Vec<String> {
    let m = get(c, &format!("{admin_url}/metrics")).await;
    assert_eq!(m.status, StatusCode::OK);
    let mut lines: Vec<String> = String::from_utf8(m.body.to_vec())
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("tollgate_policy_decisions_total{"))
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

fn series(policy: &str, rule: &str, outcome: &str, n: u64) -> String {
    format!(
        r#"tollgate_policy_decisions_total{{policy="{policy}",rule="{rule}",outcome="{outcome}"}} {n}"#
    )
}

#[tokio::test]
async fn allowed_denied_and_limited_requests_count_under_their_policy_and_rule() {
    let app = echo_backend("app").await;
    // Two AuthPolicies merged on one route (API keys from one, a rule from the other) and
    // two RateLimitPolicies (a shadow limit and an enforced one).
    let mut keys = api_keys(&[(API_KEY, "alice"), ("bob-key", "bob")]);
    keys.policy = ObjectKey::new("shop", "keys");
    let mut a = auth(vec![keys]);
    a.sources = vec![
        ObjectKey::new("shop", "keys"),
        ObjectKey::new("shop", "rules"),
    ];
    a.authorization = vec![AuthzRule {
        name: "no-delete".into(),
        policy: ObjectKey::new("shop", "rules"),
        predicate: "request.method != 'DELETE'".into(),
        external: None,
        when: vec![],
    }];
    let burst = tollgate_api::policy::RateLimit {
        id: "shop/burst/one".into(),
        mode: LimitMode::Shadow,
        ..per_minute("x", 1, "request.headers['x-api-key']")
    };
    let per_key = tollgate_api::policy::RateLimit {
        id: "shop/quota/per-key".into(),
        ..per_minute("x", 2, "request.headers['x-api-key']")
    };
    let mut t = table(
        1,
        vec![http_port(0, vec![guarded("api", "/", "shop/api/0")])],
        vec![("app", backend_of(&[&app]))],
    );
    t.policies.insert(
        "shop/api/0".into(),
        PolicySet {
            auth: Some(a),
            rate_limits: vec![burst, per_key],
        },
    );
    let (_p, url, admin_url) = proxy_with_admin(t).await;
    let c = h1_client();

    // Applied, not yet asked: every series of every rule is there, at 0.
    let zero = [
        series("shop/burst", "limits.one", "allowed", 0),
        series("shop/burst", "limits.one", "shadow_limited", 0),
        series("shop/keys", "authentication.keys", "authenticated", 0),
        series("shop/keys", "authentication.keys", "error", 0),
        series("shop/keys", "authentication.keys", "unauthenticated", 0),
        series("shop/quota", "limits.per-key", "allowed", 0),
        series("shop/quota", "limits.per-key", "limited", 0),
        series("shop/rules", "authorization.no-delete", "allowed", 0),
        series("shop/rules", "authorization.no-delete", "forbidden", 0),
    ];
    assert_eq!(decisions(&c, &admin_url).await, zero);

    let key = [("x-api-key", API_KEY)];
    let statuses = [
        get_with(&c, &format!("{url}/"), &[]).await.status,
        get_with(&c, &format!("{url}/"), &[("x-api-key", "wrong")])
            .await
            .status,
        get_with(&c, &format!("{url}/"), &key).await.status,
        request(&c, Method::DELETE, &format!("{url}/"), &key)
            .await
            .status,
        get_with(&c, &format!("{url}/"), &key).await.status,
        get_with(&c, &format!("{url}/"), &key).await.status,
    ];
    assert_eq!(
        statuses,
        [
            StatusCode::UNAUTHORIZED,
            StatusCode::UNAUTHORIZED,
            StatusCode::OK,
            StatusCode::FORBIDDEN,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
        ]
    );
    assert_eq!(app.hits(), 2);
    assert_eq!(
        decisions(&c, &admin_url).await,
        [
            // The shadow limit is decided before the enforced one, and never refuses.
            series("shop/burst", "limits.one", "allowed", 1),
            series("shop/burst", "limits.one", "shadow_limited", 2),
            series("shop/keys", "authentication.keys", "authenticated", 4),
            series("shop/keys", "authentication.keys", "error", 0),
            series("shop/keys", "authentication.keys", "unauthenticated", 2),
            series("shop/quota", "limits.per-key", "allowed", 2),
            series("shop/quota", "limits.per-key", "limited", 1),
            series("shop/rules", "authorization.no-delete", "allowed", 3),
            series("shop/rules", "authorization.no-delete", "forbidden", 1),
        ]
    );
}

#[tokio::test]
async fn skipped_and_closed_count_on_the_policy_as_a_whole() {
    let app = echo_backend("app").await;
    let mut a = api_key_auth();
    a.authentication[0].policy = ObjectKey::new("shop", "keys");
    a.sources = vec![ObjectKey::new("shop", "keys")];
    // The policy checks reads only.
    a.when = vec!["request.method == 'GET'".into()];
    let mut t = table(
        1,
        vec![http_port(
            0,
            vec![
                guarded("vault", "/vault", "shop/vault/0"),
                guarded("api", "/api", "shop/api/0"),
            ],
        )],
        vec![("app", backend_of(&[&app]))],
    );
    t.policies.insert("shop/api/0".into(), only_auth(a));
    t.closed.insert(
        "shop/vault/0".into(),
        Closed {
            by: vec![ObjectKey::new("shop", "broken")],
        },
    );
    let (_p, url, admin_url) = proxy_with_admin(t).await;
    let c = h1_client();

    assert_eq!(
        request(&c, Method::POST, &format!("{url}/api"), &[])
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        get_with(&c, &format!("{url}/api"), &[("x-api-key", API_KEY)])
            .await
            .status,
        StatusCode::OK
    );
    for _ in 0..2 {
        assert_eq!(
            get_with(&c, &format!("{url}/vault"), &[]).await.status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
    assert_eq!(
        decisions(&c, &admin_url).await,
        [
            series("shop/broken", "-", "closed", 2),
            series("shop/keys", "-", "skipped", 1),
            series("shop/keys", "authentication.keys", "authenticated", 1),
            series("shop/keys", "authentication.keys", "error", 0),
            series("shop/keys", "authentication.keys", "unauthenticated", 0),
        ]
    );
}
