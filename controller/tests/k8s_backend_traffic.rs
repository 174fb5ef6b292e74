//! XBackendTrafficPolicy on the real kube-apiserver: the controller writes
//! `status.ancestors` (one entry per Gateway whose routes use the targeted Service) next to
//! another implementation's entries, which it keeps as they were, and drops only its own
//! entry when no route of its Gateways uses the Service any more.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;

use std::time::Duration;

use gateway_types::experimental::httproutes::HttpRoute;
use gateway_types::experimental::xbackendtrafficpolicies::XBackendTrafficPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use k8s_support::{TestEnv, conds, eventually, free_port, summary};

const WAIT: Duration = Duration::from_secs(30);
const OTHER: &str = "example.com/other-controller";

/// The policy's ancestor entries as JSON, once `ready` holds for them.
async fn ancestors_when(
    env: &TestEnv,
    log: impl Fn() -> String,
    ready: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    eventually(WAIT, || async {
        let p: XBackendTrafficPolicy = env.get("p").await;
        let a: Vec<Value> =
            serde_json::from_value(serde_json::to_value(p.status?.ancestors).ok()?).ok()?;
        ready(&a).then_some(a)
    })
    .await
    .unwrap_or_else(|| panic!("policy never reached the expected status:\n{}", log()))
}

fn by<'a>(a: &'a [Value], controller: &str) -> Vec<&'a Value> {
    a.iter()
        .filter(|x| x["controllerName"] == controller)
        .collect()
}

fn summary_of(entry: &Value) -> Vec<(String, String, String)> {
    let conditions: Vec<Condition> = serde_json::from_value(entry["conditions"].clone()).unwrap();
    summary(&conditions)
}

#[tokio::test]
async fn policy_status_keeps_other_controllers_entries() {
    let env = TestEnv::new("xbtp").await;
    env.gateway("gw", &[("http", free_port())]).await;
    env.apply::<k8s_openapi::api::core::v1::Service>(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "app"},
        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
    }))
    .await;
    env.route("r", json!([{"name": "gw"}]), "app", 80).await;
    env.apply::<XBackendTrafficPolicy>(json!({
        "apiVersion": "gateway.networking.x-k8s.io/v1alpha1", "kind": "XBackendTrafficPolicy",
        "metadata": {"name": "p"},
        "spec": {
            "targetRefs": [{"group": "", "kind": "Service", "name": "app"}],
            "retryConstraint": {"budget": {"percent": 20, "interval": "10s"}},
        },
    }))
    .await;
    // Another implementation's verdict, written before ours; its ancestorRef leaves out the
    // namespace (optional in the Gateway API), so it must go back exactly as it came.
    let other = json!({
        "ancestorRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "theirs"},
        "controllerName": OTHER,
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "theirs",
                        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}],
    });
    let api: Api<XBackendTrafficPolicy> = Api::namespaced(env.client.clone(), &env.ns);
    api.patch_status(
        "p",
        &PatchParams::apply("other").force(),
        &Patch::Apply(json!({
            "apiVersion": "gateway.networking.x-k8s.io/v1alpha1", "kind": "XBackendTrafficPolicy",
            "metadata": {"name": "p"}, "status": {"ancestors": [other.clone()]},
        })),
    )
    .await
    .unwrap();

    let c = env.controller("c", &[]);
    let ok = conds(&[("Accepted", "True", "Accepted")]);
    let a = ancestors_when(
        &env,
        || c.log(),
        |a| {
            by(a, &env.controller_name)
                .first()
                .is_some_and(|x| summary_of(x) == ok)
        },
    )
    .await;
    let mine = by(&a, &env.controller_name);
    assert_eq!(mine.len(), 1, "{a:#?}");
    assert_eq!(mine[0]["ancestorRef"]["name"], "gw");
    assert_eq!(
        by(&a, OTHER),
        [&other],
        "the other controller's entry changed: {a:#?}"
    );

    // No route of ours uses the Service any more: our entry goes, theirs stays.
    Api::<HttpRoute>::namespaced(env.client.clone(), &env.ns)
        .delete("r", &DeleteParams::default())
        .await
        .unwrap();
    let a = ancestors_when(&env, || c.log(), |a| by(a, &env.controller_name).is_empty()).await;
    assert_eq!(a, [other], "{a:#?}");
}
