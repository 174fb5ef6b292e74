//! RateLimitPolicy and AuthPolicy on the real kube-apiserver: applied like `kubectl apply`,
//! they reach Accepted and Enforced (Enforced only once a subscribed proxy runs a table with
//! them); invalid CEL and missing targets get their reasons; an API-key Secret is read only
//! when labelled, and deleting it takes the key out of the proxy's table.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use serde_json::{Value, json};
use tollgate::crds::{AuthPolicy, RateLimitPolicy};

use k8s_support::{SubscribedProxy, TestEnv, eventually, free_port};

const WAIT: Duration = Duration::from_secs(30);

fn target(kind: &str, name: &str) -> Value {
    json!([{"group": "gateway.networking.k8s.io", "kind": kind, "name": name}])
}

async fn rlp(env: &TestEnv, name: &str, spec: Value) {
    env.apply::<RateLimitPolicy>(json!({
        "apiVersion": "tollgate.dev/v1alpha1", "kind": "RateLimitPolicy",
        "metadata": {"name": name}, "spec": spec,
    }))
    .await;
}

fn find<'a>(conds: &'a [Condition], t: &str) -> Option<&'a Condition> {
    conds.iter().find(|c| c.type_ == t)
}

/// (type, status, reason) of the policy's conditions once `ready` holds for them.
async fn rlp_conds(
    env: &TestEnv,
    name: &str,
    ready: impl Fn(&[Condition]) -> bool,
) -> Vec<(String, String, String)> {
    let got = eventually(WAIT, || async {
        let p: RateLimitPolicy = env.get(name).await;
        let c = p.status?.conditions;
        ready(&c).then_some(c)
    })
    .await
    .unwrap_or_else(|| panic!("RateLimitPolicy {name} never reached the expected status"));
    got.into_iter()
        .map(|c| (c.type_, c.status, c.reason))
        .collect()
}

fn has(t: &'static str, status: &'static str) -> impl Fn(&[Condition]) -> bool {
    move |c| find(c, t).is_some_and(|c| c.status == status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_reach_accepted_and_rejections_carry_their_reasons() {
    let env = TestEnv::new("policy").await;
    env.gateway("gw", &[("http", 80)]).await;
    env.service("echo", 8080, "10.1.0.1").await;
    env.route("shop", json!([{"name": "gw"}]), "echo", 8080)
        .await;
    rlp(
        &env,
        "good",
        json!({"targetRefs": target("HTTPRoute", "shop"),
               "limits": {"per-ip": {"rates": [{"limit": 10, "window": "1s"}],
                                     "counters": [{"expression": "source.address"}]}}}),
    )
    .await;
    rlp(
        &env,
        "bad-cel",
        json!({"targetRefs": target("Gateway", "gw"),
               "limits": {"a": {"rates": [{"limit": 1, "window": "1s"}],
                                "when": [{"predicate": "request.method =="}]}}}),
    )
    .await;
    rlp(
        &env,
        "lost",
        json!({"targetRefs": target("HTTPRoute", "no-such-route"),
               "limits": {"a": {"rates": [{"limit": 1, "window": "1s"}]}}}),
    )
    .await;
    let ctl = env.controller("a", &[]);
    ctl.wait_ready().await;

    let good = rlp_conds(&env, "good", has("Accepted", "True")).await;
    assert_eq!(
        good,
        [
            ("Accepted".into(), "True".into(), "Accepted".into()),
            ("Enforced".into(), "True".into(), "Enforced".into()),
        ],
        "{}",
        ctl.log()
    );
    let p: RateLimitPolicy = env.get("good").await;
    let s = p.status.unwrap();
    assert_eq!(s.observed_generation, p.metadata.generation);
    assert_eq!(s.ancestors.len(), 1);
    assert_eq!(s.ancestors[0].ancestor_ref.name, "gw");
    assert_eq!(s.ancestors[0].ancestor_ref.namespace, env.ns);

    let bad = rlp_conds(&env, "bad-cel", has("Accepted", "False")).await;
    assert_eq!(
        bad,
        [
            ("Accepted".into(), "False".into(), "Invalid".into()),
            ("Stalled".into(), "True".into(), "Invalid".into()),
        ]
    );
    let lost = rlp_conds(&env, "lost", has("Accepted", "False")).await;
    assert_eq!(
        lost,
        [
            ("Accepted".into(), "False".into(), "TargetNotFound".into()),
            ("Stalled".into(), "True".into(), "TargetNotFound".into()),
        ]
    );

    // The route shows the policy affecting it.
    let route: gateway_types::experimental::httproutes::HttpRoute = env.get("shop").await;
    let parent = &route.status.unwrap().parents[0];
    let affected = find(&parent.conditions, "tollgate.dev/RateLimitPolicyAffected").unwrap();
    assert!(affected.message.contains("good"), "{}", affected.message);

    // The CRD's own validation refuses limits together with defaults.
    let api: Api<RateLimitPolicy> = Api::namespaced(env.client.clone(), &env.ns);
    let both = json!({"apiVersion": "tollgate.dev/v1alpha1", "kind": "RateLimitPolicy",
        "metadata": {"name": "both", "namespace": env.ns},
        "spec": {"targetRefs": target("Gateway", "gw"),
                 "limits": {"a": {"rates": [{"limit": 1, "window": "1s"}]}},
                 "defaults": {"limits": {}}}});
    let err = api
        .patch(
            "both",
            &kube::api::PatchParams::apply("test"),
            &kube::api::Patch::Apply(both),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cannot be combined"), "{err}");

    // A fix is picked up: the invalid policy becomes Accepted.
    rlp(
        &env,
        "bad-cel",
        json!({"targetRefs": target("Gateway", "gw"),
               "limits": {"a": {"rates": [{"limit": 1, "window": "1s"}],
                                "when": [{"predicate": "request.method == 'POST'"}]}}}),
    )
    .await;
    rlp_conds(&env, "bad-cel", has("Accepted", "True")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enforced_waits_for_a_proxy_and_api_key_secrets_follow_their_labels() {
    let env = TestEnv::new("policy-push").await;
    let listener = free_port();
    env.gateway("gw", &[("http", listener)]).await;
    env.service("echo", 80, "10.4.0.1").await;
    env.route("shop", json!([{"name": "gw"}]), "echo", 80).await;
    env.apply::<AuthPolicy>(json!({
        "apiVersion": "tollgate.dev/v1alpha1", "kind": "AuthPolicy",
        "metadata": {"name": "keys"},
        "spec": {"targetRefs": target("HTTPRoute", "shop"),
                 "rules": {"authentication": {"partners": {
                     "apiKey": {"selector": {"matchLabels": {"app": "shop"}}},
                     "credentials": {"customHeader": {"name": "x-api-key"}}}}}},
    }))
    .await;
    env.apply::<Secret>(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "partner-a", "labels": {"app": "shop", "tollgate.dev/credential": "true"}},
        "stringData": {"api_key": "key-of-partner-a"},
    }))
    .await;
    let push_port = free_port();
    let push_addr = format!("127.0.0.1:{push_port}");
    let url = format!("https://localhost:{push_port}");
    let ctl = env.controller("a", &["--push-addr", &push_addr, "--controller-url", &url]);
    ctl.wait_ready().await;

    let ap = |want: &'static str| {
        let env = &env;
        async move {
            eventually(WAIT, || async {
                let p: AuthPolicy = env.get("keys").await;
                let c = p.status?.conditions;
                let e = find(&c, "Enforced")?.clone();
                (e.status == want).then_some(e)
            })
            .await
        }
    };
    let pending = ap("False")
        .await
        .unwrap_or_else(|| panic!("Enforced never False:\n{}", ctl.log()));
    assert_eq!(pending.reason, "Unknown", "{}", pending.message);
    let p: AuthPolicy = env.get("keys").await;
    let c = p.status.unwrap().conditions;
    let r = find(&c, "Reconciling").expect("Reconciling while proxies catch up");
    assert_eq!(
        (r.status.as_str(), r.reason.as_str()),
        ("True", "WaitingForProxies")
    );

    // Subscribe a proxy with the certificate the controller issued.
    let sub = SubscribedProxy::start(&env, &url, "gw").await;
    let digest = tollgate::compile::policies::auth::sha256_hex(b"key-of-partner-a");
    let table = || sub.table();
    eventually(WAIT, || async { table().contains(&digest).then_some(()) })
        .await
        .unwrap_or_else(|| panic!("the proxy never got the key:\n{}", ctl.log()));
    assert!(
        !table().contains("key-of-partner-a"),
        "the key itself never leaves the controller"
    );
    let enforced = ap("True")
        .await
        .unwrap_or_else(|| panic!("never Enforced:\n{}", ctl.log()));
    assert_eq!(enforced.reason, "Enforced");
    let p: AuthPolicy = env.get("keys").await;
    assert!(
        find(&p.status.unwrap().conditions, "Reconciling").is_none(),
        "no Reconciling once enforced"
    );

    // Unlabelling the Secret revokes the key: the next table lacks its digest.
    env.apply::<Secret>(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "partner-a", "labels": {"app": "other", "tollgate.dev/credential": "true"}},
        "stringData": {"api_key": "key-of-partner-a"},
    }))
    .await;
    eventually(WAIT, || async {
        (!table().contains(&digest)).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("the key stayed in the table:\n{}", ctl.log()));
    sub.proxy.shutdown().await;
}
