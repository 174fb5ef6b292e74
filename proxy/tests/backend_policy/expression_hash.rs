//! Consistent hashing on a CEL expression (`HashOn::Expression`): on `auth.identity.sub` from
//! a JWT AuthPolicy, one identity keeps its endpoint and identities spread, and a request
//! whose expression has no value is balanced as without a key; on request headers and path;
//! a table whose expression does not compile is refused and the live one keeps serving.

use std::collections::BTreeSet;

use crate::policy_support::{get_with, jwt_auth, only_auth, token};

use super::*;

/// A proxy over `eps` hashing on `expr`: `/` under a JWT AuthPolicy, `/open` under none.
async fn hashing_on(expr: &str, eps: &[Named]) -> (tollgate_proxy::Proxy, String) {
    let proxy = tollgate_proxy::Proxy::new(tollgate_proxy::ProxyOptions::default());
    proxy.apply(hash_table(1, expr, eps)).await.unwrap();
    let url = format!("http://{}", proxy.local_addr(0).unwrap());
    (proxy, url)
}

fn hash_table(version: u64, expr: &str, eps: &[Named]) -> tollgate_api::RouteTable {
    let addrs: Vec<SocketAddr> = eps.iter().map(|e| e.addr).collect();
    let settings = BackendSettings {
        hash: Some(HashOn::Expression(expr.into())),
        ..BackendSettings::default()
    };
    let mut guarded = route("guarded", "/", vec![wb("b", 1)]);
    guarded.policy = Some("p".into());
    let open = route("open", "/open", vec![wb("b", 1)]);
    let mut t = table(
        version,
        // In table order, as the compiler sorts them: the longer prefix first.
        vec![http_port(0, vec![open, guarded])],
        vec![("b", backend(&addrs, LoadBalancer::ConsistentHash, settings))],
    );
    t.policies.insert("p".into(), only_auth(jwt_auth()));
    t
}

async fn three() -> [Named; 3] {
    [
        named("a", 200, None).await,
        named("b", 200, None).await,
        named("c", 200, None).await,
    ]
}

/// The endpoint that answered `headers` on `url` (its name), asserting a 200.
async fn endpoint(c: &TestClient, url: &str, headers: &[(&str, &str)]) -> String {
    let a = get_with(c, url, headers).await;
    assert_eq!(a.status, StatusCode::OK, "{headers:?}: {a:?}");
    String::from_utf8(a.body.to_vec()).unwrap()
}

#[tokio::test]
async fn an_identity_keeps_its_endpoint_identities_spread_and_none_is_balanced_as_without() {
    let eps = three().await;
    let (_p, base) = hashing_on("auth.identity.sub", &eps).await;
    let url = format!("{base}/orders");
    let c = h1_client();
    let bearer = |sub: &str| format!("Bearer {}", token(sub, "user", 300));
    let alice = bearer("alice");
    let home = endpoint(&c, &url, &[("authorization", &alice)]).await;
    for _ in 0..50 {
        assert_eq!(endpoint(&c, &url, &[("authorization", &alice)]).await, home);
    }
    // A new token of the same identity (another signature, another expiry): the same key.
    let again = format!("Bearer {}", token("alice", "admin", 600));
    assert_eq!(endpoint(&c, &url, &[("authorization", &again)]).await, home);
    // Distinct identities land all over, each on its own endpoint every time.
    let mut used = BTreeSet::new();
    for k in 0..60 {
        let user = bearer(&format!("user-{k}"));
        let first = endpoint(&c, &url, &[("authorization", &user)]).await;
        assert_eq!(endpoint(&c, &url, &[("authorization", &user)]).await, first);
        used.insert(first);
    }
    assert_eq!(used.len(), 3, "{used:?}");
    // No AuthPolicy on /open: no identity, no key; answered, and balanced least-request
    // (not all on one endpoint, as one key would be).
    let mut open = BTreeSet::new();
    for _ in 0..30 {
        open.insert(endpoint(&c, &format!("{base}/open"), &[("authorization", &alice)]).await);
    }
    assert!(open.len() > 1, "{open:?}");
}

#[tokio::test]
async fn an_expression_over_headers_and_path_keys_each_pair_and_a_bad_one_is_refused() {
    let eps = three().await;
    let expr = "request.headers['x-tenant'] + request.url_path";
    let (p, url) = hashing_on(expr, &eps).await;
    let open = format!("{url}/open");
    let c = h1_client();
    let mut used = BTreeSet::new();
    for tenant in ["acme", "globex", "initech", "umbrella", "hooli", "stark"] {
        for path in ["/x", "/y"] {
            let u = format!("{open}{path}");
            let first = endpoint(&c, &u, &[("x-tenant", tenant)]).await;
            for q in 0..10 {
                // The query is not in `request.url_path`: the same key.
                let u = format!("{open}{path}?q={q}");
                assert_eq!(endpoint(&c, &u, &[("x-tenant", tenant)]).await, first);
            }
            used.insert(first);
        }
    }
    assert!(used.len() > 1, "{used:?}");
    // Without the header the expression fails: no key, still answered.
    for _ in 0..10 {
        endpoint(&c, &open, &[]).await;
    }
    // A table whose expression does not compile is refused; the live one serves on.
    let err = p
        .apply(hash_table(2, "request.headers['x-tenant'] +", &eps))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("consistent hash"), "{err}");
    endpoint(&c, &open, &[("x-tenant", "acme")]).await;
}
