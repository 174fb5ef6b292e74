//! ClientPolicy on the real kube-apiserver, applied as `kubectl apply --server-side` does:
//! a Gateway policy reaches Accepted, then Enforced once a subscribed proxy runs a table
//! whose listener port carries its `client` settings, and that proxy then judges requests
//! by the `X-Forwarded-For` address and refuses escaped slashes; the Gateway carries
//! `tollgate.dev/ClientPolicyAffected` until the policy is deleted. The CRD's own rule
//! refuses both ways of reading `X-Forwarded-For` at once. A policy the schema lets through
//! but the compiler refuses is Invalid and, never valid, closes its Gateway's port on the
//! proxy (500 for every request) until fixed; a listener that does not exist is
//! TargetNotFound. (Requests go to the proxy's listener on loopback; the route's Service has
//! no endpoints, so nothing leaves the host.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;
mod support;

use std::time::Duration;

use gateway_types::gateways::Gateway;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use tollgate::crds::{AuthPolicy, ClientPolicy};
use tollgate_api::RouteTable;
use tollgate_api::client::{EscapedSlashes, ForwardedFor};

use k8s_support::{SubscribedProxy, TestEnv, eventually, free_port};

const WAIT: Duration = Duration::from_secs(30);
const AFFECTED: &str = "tollgate.dev/ClientPolicyAffected";

fn gateway_target(section: Option<&str>) -> Value {
    let mut t = json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"});
    if let Some(s) = section {
        t["sectionName"] = json!(s);
    }
    json!([t])
}

fn policy(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "tollgate.dev/v1alpha1", "kind": "ClientPolicy",
        "metadata": {"name": name}, "spec": spec,
    })
}

fn find<'a>(conds: &'a [Condition], t: &str) -> Option<&'a Condition> {
    conds.iter().find(|c| c.type_ == t)
}

/// The policy once `ready` holds for its conditions (panics with the controller log if never).
async fn policy_when(
    env: &TestEnv,
    name: &str,
    log: impl Fn() -> String,
    ready: impl Fn(&[Condition]) -> bool,
) -> ClientPolicy {
    eventually(WAIT, || async {
        let p: ClientPolicy = env.get(name).await;
        ready(&p.status.as_ref()?.conditions).then_some(p)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "ClientPolicy {name} never reached the expected status:\n{}",
            log()
        )
    })
}

/// (type, status, reason) of each condition, in order.
fn triples(conds: &[Condition]) -> Vec<(&str, &str, &str)> {
    conds
        .iter()
        .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str()))
        .collect()
}

fn has(t: &'static str, status: &'static str) -> impl Fn(&[Condition]) -> bool {
    move |c| find(c, t).is_some_and(|c| c.status == status)
}

/// The Gateway's `tollgate.dev/ClientPolicyAffected` condition, if any.
async fn affected(env: &TestEnv) -> Option<Condition> {
    let g: Gateway = env.get("gw").await;
    g.status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == AFFECTED)
}

/// `GET path` through the proxy's listener with extra headers: the status code.
async fn status_of(port: u16, path: &'static str, headers: &'static [(&str, &str)]) -> u16 {
    tokio::task::spawn_blocking(move || support::get_with(port, "shop.example", path, headers))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no answer from the proxy on port {port}"))
        .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_policy_is_enforced_on_the_forwarded_address_until_deleted() {
    let env = TestEnv::new("client-policy").await;
    let listener = free_port();
    env.gateway("gw", &[("http", listener)]).await;
    // A Service without endpoints: a request the policies let through answers 503 at once,
    // one they refuse answers 403, and no traffic leaves loopback.
    env.apply::<k8s_openapi::api::core::v1::Service>(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo"},
        "spec": {"ports": [{"port": 80, "protocol": "TCP"}]},
    }))
    .await;
    env.route("shop", json!([{"name": "gw"}]), "echo", 80).await;
    env.apply::<AuthPolicy>(json!({
        "apiVersion": "tollgate.dev/v1alpha1", "kind": "AuthPolicy",
        "metadata": {"name": "office-only"},
        "spec": {"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "shop"}],
                 "rules": {"authorization": {"office": {
                     "predicate": "cidr('10.0.0.0/8').containsIP(source.address)"}}}},
    }))
    .await;
    env.apply::<ClientPolicy>(policy(
        "behind-balancer",
        json!({"targetRefs": gateway_target(None),
               "clientIP": {"xForwardedFor": {"numTrustedHops": 1}},
               "path": {"escapedSlashes": "Reject"}}),
    ))
    .await;
    let push_port = free_port();
    let push_addr = format!("127.0.0.1:{push_port}");
    let url = format!("https://localhost:{push_port}");
    let ctl = env.controller("a", &["--push-addr", &push_addr, "--controller-url", &url]);
    ctl.wait_ready().await;

    // Accepted at once; Enforced waits for a proxy.
    let p = policy_when(
        &env,
        "behind-balancer",
        || ctl.log(),
        has("Accepted", "True"),
    )
    .await;
    let s = p.status.unwrap();
    assert_eq!(
        triples(&s.conditions)[..2],
        [
            ("Accepted", "True", "Accepted"),
            ("Enforced", "False", "Unknown")
        ],
        "{:?}",
        s.conditions
    );

    let sub = SubscribedProxy::start(&env, &url, "gw").await;
    let p = policy_when(
        &env,
        "behind-balancer",
        || ctl.log(),
        has("Enforced", "True"),
    )
    .await;
    let s = p.status.unwrap();
    assert_eq!(
        triples(&s.conditions),
        [
            ("Accepted", "True", "Accepted"),
            ("Enforced", "True", "Enforced")
        ]
    );
    assert_eq!(s.observed_generation, p.metadata.generation);
    assert!(s.observed_generation.is_some());
    assert_eq!(s.ancestors.len(), 1, "{:?}", s.ancestors);
    let a = &s.ancestors[0];
    assert_eq!(
        (
            a.ancestor_ref.kind.as_str(),
            a.ancestor_ref.namespace.as_str(),
            a.ancestor_ref.name.as_str()
        ),
        ("Gateway", env.ns.as_str(), "gw")
    );
    assert_eq!(
        triples(&a.conditions),
        [
            ("Accepted", "True", "Accepted"),
            ("Enforced", "True", "Enforced")
        ]
    );

    let cond = affected(&env)
        .await
        .unwrap_or_else(|| panic!("no {AFFECTED} on the Gateway:\n{}", ctl.log()));
    assert_eq!(cond.status, "True");
    assert!(cond.message.contains("behind-balancer"), "{}", cond.message);

    // The table the proxy runs carries the settings on the listener's port.
    let table: RouteTable = serde_json::from_str(&sub.table()).expect("the proxy's table");
    let port = table
        .ports
        .iter()
        .find(|p| p.port == listener)
        .expect("the listener's port in the table");
    assert_eq!(
        port.client.forwarded_for,
        Some(ForwardedFor::NumTrustedHops(1))
    );
    assert_eq!(port.client.path.escaped_slashes, EscapedSlashes::Reject);
    assert!(port.client.closed_by.is_empty());

    // And the proxy acts on them: the client is the last X-Forwarded-For entry.
    assert!(
        sub.proxy.local_addr(listener).is_some(),
        "listener not bound"
    );
    assert_eq!(
        status_of(listener, "/", &[]).await,
        403,
        "the peer (127.0.0.1) is outside 10.0.0.0/8"
    );
    assert_eq!(
        status_of(listener, "/", &[("X-Forwarded-For", "10.1.2.3")]).await,
        503,
        "the balancer's entry puts the client in 10.0.0.0/8 (then: no endpoints)"
    );
    assert_eq!(
        status_of(listener, "/", &[("X-Forwarded-For", "10.1.2.3, 192.0.2.7")]).await,
        403,
        "an entry the client wrote itself, left of the balancer's, is not its address"
    );
    assert_eq!(
        status_of(listener, "/a%2Fb", &[("X-Forwarded-For", "10.1.2.3")]).await,
        400,
        "escapedSlashes: Reject"
    );

    // Deleting the policy takes the condition off the Gateway and the settings out of the
    // proxy's table.
    let api: Api<ClientPolicy> = Api::namespaced(env.client.clone(), &env.ns);
    api.delete("behind-balancer", &DeleteParams::default())
        .await
        .unwrap();
    eventually(WAIT, || async {
        affected(&env).await.is_none().then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("{AFFECTED} stayed on the Gateway:\n{}", ctl.log()));
    eventually(WAIT, || async {
        let t: RouteTable = serde_json::from_str(&sub.table()).ok()?;
        let p = t.ports.iter().find(|p| p.port == listener)?;
        p.client.forwarded_for.is_none().then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("the proxy kept the settings:\n{}", ctl.log()));
    assert_eq!(
        status_of(listener, "/", &[("X-Forwarded-For", "10.1.2.3")]).await,
        403,
        "without the policy the peer is the client again"
    );
    sub.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crd_refuses_both_numtrustedhops_and_trustedcidrs() {
    let env = TestEnv::new("client-policy-crd").await;
    let api: Api<ClientPolicy> = Api::namespaced(env.client.clone(), &env.ns);
    let mut both = policy(
        "both",
        json!({"targetRefs": gateway_target(None),
               "clientIP": {"xForwardedFor": {"numTrustedHops": 1,
                                              "trustedCIDRs": ["10.0.0.0/8"]}}}),
    );
    both["metadata"]["namespace"] = json!(env.ns);
    let err = api
        .patch(
            "both",
            &PatchParams::apply("test"),
            &Patch::Apply(both.clone()),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("exactly one of numTrustedHops and trustedCIDRs"),
        "{err}"
    );
    // A plain create (what client-side `kubectl apply` sends for a new object) too.
    let obj: ClientPolicy = serde_json::from_value(both).unwrap();
    let err = api.create(&Default::default(), &obj).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("exactly one of numTrustedHops and trustedCIDRs"),
        "{err}"
    );
    assert!(api.get_opt("both").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_policy_closes_its_listeners_until_fixed_and_a_missing_one_is_not_found() {
    let env = TestEnv::new("client-policy-bad").await;
    let listener = free_port();
    env.gateway("gw", &[("http", listener)]).await;
    // Passes the schema (a string), refused by the compiler: never valid, so it closes.
    env.apply::<ClientPolicy>(policy(
        "bad-cidr",
        json!({"targetRefs": gateway_target(None),
               "clientIP": {"xForwardedFor": {"trustedCIDRs": ["10.0.0.0/33"]}}}),
    ))
    .await;
    let push_port = free_port();
    let push_addr = format!("127.0.0.1:{push_port}");
    let url = format!("https://localhost:{push_port}");
    let ctl = env.controller("a", &["--push-addr", &push_addr, "--controller-url", &url]);
    ctl.wait_ready().await;

    let p = policy_when(&env, "bad-cidr", || ctl.log(), has("Accepted", "False")).await;
    let s = p.status.unwrap();
    assert_eq!(
        triples(&s.conditions),
        [
            ("Accepted", "False", "Invalid"),
            ("Stalled", "True", "Invalid")
        ]
    );
    let msg = &s.conditions[0].message;
    assert!(msg.contains("trustedCIDRs"), "{msg}");
    assert!(msg.contains("listeners it targets answer 500"), "{msg}");
    assert_eq!(s.observed_generation, p.metadata.generation);
    // It closes the Gateway's port, so it affects the Gateway.
    let cond = eventually(WAIT, || affected(&env))
        .await
        .unwrap_or_else(|| panic!("no {AFFECTED} on the Gateway:\n{}", ctl.log()));
    assert!(cond.message.contains("bad-cidr"), "{}", cond.message);

    // The proxy runs the port closed: every request answers 500.
    let sub = SubscribedProxy::start(&env, &url, "gw").await;
    let closed_by = || {
        let t: RouteTable = serde_json::from_str(&sub.table()).ok()?;
        let p = t.ports.iter().find(|p| p.port == listener)?;
        Some(
            p.client
                .closed_by
                .iter()
                .map(|k| k.to_string())
                .collect::<Vec<_>>(),
        )
    };
    let by = eventually(WAIT, || async { closed_by() })
        .await
        .unwrap_or_else(|| panic!("the proxy never got a table:\n{}", ctl.log()));
    assert_eq!(by, [format!("{}/bad-cidr", env.ns)]);
    assert_eq!(status_of(listener, "/", &[]).await, 500);

    // One created while the controller runs.
    env.apply::<ClientPolicy>(policy(
        "lost",
        json!({"targetRefs": gateway_target(Some("no-such-listener")),
               "path": {"mergeSlashes": false}}),
    ))
    .await;
    let p = policy_when(&env, "lost", || ctl.log(), has("Accepted", "False")).await;
    let s = p.status.unwrap();
    assert_eq!(
        triples(&s.conditions),
        [
            ("Accepted", "False", "TargetNotFound"),
            ("Stalled", "True", "TargetNotFound")
        ]
    );
    let msg = &s.conditions[0].message;
    assert!(msg.contains("no-such-listener"), "{msg}");
    assert!(s.ancestors.is_empty(), "{:?}", s.ancestors);

    // The fix is picked up: Accepted at the new generation, then Enforced on the proxy.
    env.apply::<ClientPolicy>(policy(
        "bad-cidr",
        json!({"targetRefs": gateway_target(None),
               "clientIP": {"xForwardedFor": {"trustedCIDRs": ["10.0.0.0/8"]}}}),
    ))
    .await;
    let p = policy_when(&env, "bad-cidr", || ctl.log(), has("Enforced", "True")).await;
    let s = p.status.unwrap();
    assert_eq!(
        triples(&s.conditions),
        [
            ("Accepted", "True", "Accepted"),
            ("Enforced", "True", "Enforced")
        ]
    );
    assert_eq!(p.metadata.generation, Some(2));
    assert_eq!(s.observed_generation, Some(2));
    assert_eq!(s.ancestors.len(), 1);
    // The port opens again, with the policy's settings; no route: 404.
    eventually(WAIT, || async { closed_by().filter(|b| b.is_empty()) })
        .await
        .unwrap_or_else(|| panic!("the port stayed closed:\n{}", ctl.log()));
    let t: RouteTable = serde_json::from_str(&sub.table()).unwrap();
    let p = t.ports.iter().find(|p| p.port == listener).unwrap();
    assert_eq!(
        p.client.forwarded_for,
        Some(ForwardedFor::TrustedCidrs(vec!["10.0.0.0/8".into()]))
    );
    assert_eq!(status_of(listener, "/", &[]).await, 404);
    sub.proxy.shutdown().await;
}
