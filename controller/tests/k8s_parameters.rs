//! GatewayParameters against a real kube-apiserver: what `provision` applies for them (an
//! autoscaler the API server accepts, the hand-over of replicas to it, a disruption budget,
//! drift reverted), and the controller resolving them from a GatewayClass and a Gateway
//! (merge order, `InvalidParameters`, proxy objects left alone while invalid).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gateway_types::gatewayclasses::GatewayClass;
use gateway_types::gateways::Gateway;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tollgate::crds::{GatewayParameters, GatewayParametersSpec};
use tollgate::k8s::provision::{self, FIELD_MANAGER, HANDOVER_MANAGER, ProvisionConfig};

mod k8s_support;

use k8s_support::{TestEnv, eventually};

const NAME: &str = "edge-tollgate";

fn config() -> ProvisionConfig {
    ProvisionConfig {
        proxy_image: "example.com/tollgate-proxy:test".into(),
        service_type: "ClusterIP".into(),
        ..ProvisionConfig::default()
    }
}

fn spec(value: serde_json::Value) -> GatewayParametersSpec {
    serde_json::from_value(value).unwrap()
}

/// Gateway `edge` of the test's class, with `infrastructure` as its `spec.infrastructure`.
async fn gateway(env: &TestEnv, infrastructure: serde_json::Value) -> Gateway {
    env.apply(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "edge"},
        "spec": {
            "gatewayClassName": env.class,
            "infrastructure": infrastructure,
            "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]
        }
    }))
    .await
}

async fn deployment(env: &TestEnv) -> Deployment {
    env.get::<Deployment>(NAME).await
}

fn replicas(d: &Deployment) -> Option<i32> {
    d.spec.as_ref().and_then(|s| s.replicas)
}

/// The managers that own the Deployment's `spec.replicas`.
fn replica_owners(d: &Deployment) -> Vec<String> {
    d.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:spec/f:replicas").is_some())
        })
        .filter_map(|m| m.manager.clone())
        .collect()
}

async fn exists<K>(env: &TestEnv) -> bool
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::namespaced(env.client.clone(), &env.ns)
        .get_opt(NAME)
        .await
        .unwrap()
        .is_some()
}

#[tokio::test]
async fn autoscaling_takes_replicas_over_without_resetting_them_and_gives_them_back() {
    let env = TestEnv::new("gwp-hpa").await;
    let gw = gateway(&env, json!({})).await;
    let cfg = config();
    provision::provision(&env.client, &cfg, &gw, &spec(json!({"replicas": 3})), &[])
        .await
        .unwrap();
    let d = deployment(&env).await;
    assert_eq!(replicas(&d), Some(3));
    assert_eq!(replica_owners(&d), [FIELD_MANAGER]);
    assert!(!exists::<HorizontalPodAutoscaler>(&env).await);

    let scaled = spec(json!({
        "autoscaling": {"minReplicas": 2, "maxReplicas": 6, "targetCPUUtilizationPercentage": 70}
    }));
    provision::provision(&env.client, &cfg, &gw, &scaled, &[])
        .await
        .unwrap();
    // The API server took the autoscaler (autoscaling/v2, validated on admission).
    let hpa = env.get::<HorizontalPodAutoscaler>(NAME).await;
    let hpa_spec = hpa.spec.unwrap();
    assert_eq!((hpa_spec.min_replicas, hpa_spec.max_replicas), (Some(2), 6));
    assert_eq!(hpa_spec.scale_target_ref.name, NAME);
    let target = &hpa_spec.metrics.unwrap()[0]
        .resource
        .clone()
        .unwrap()
        .target;
    assert_eq!(target.average_utilization, Some(70));
    // Not reset to one pod: the count was handed over at its value, and we no longer own it.
    let d = deployment(&env).await;
    assert_eq!(replicas(&d), Some(3));
    assert_eq!(replica_owners(&d), [HANDOVER_MANAGER]);
    // What the autoscaler does to the count is not undone by provisioning again.
    let scale = json!({"spec": {"replicas": 5}});
    Api::<Deployment>::namespaced(env.client.clone(), &env.ns)
        .patch_scale(NAME, &PatchParams::default(), &Patch::Merge(&scale))
        .await
        .unwrap();
    provision::provision(&env.client, &cfg, &gw, &scaled, &[])
        .await
        .unwrap();
    assert_eq!(replicas(&deployment(&env).await), Some(5));

    // Back to a fixed count: the autoscaler is deleted and the count is ours again.
    provision::provision(&env.client, &cfg, &gw, &spec(json!({"replicas": 2})), &[])
        .await
        .unwrap();
    assert!(!exists::<HorizontalPodAutoscaler>(&env).await);
    let d = deployment(&env).await;
    assert_eq!(replicas(&d), Some(2));
    assert!(replica_owners(&d).contains(&FIELD_MANAGER.to_owned()));
}

#[tokio::test]
async fn a_disruption_budget_is_applied_and_removed_with_the_parameters() {
    let env = TestEnv::new("gwp-pdb").await;
    let gw = gateway(&env, json!({})).await;
    let cfg = config();
    let budget = spec(json!({"podDisruptionBudget": {"maxUnavailable": "25%"}}));
    provision::provision(&env.client, &cfg, &gw, &budget, &[])
        .await
        .unwrap();
    let pdb = env.get::<PodDisruptionBudget>(NAME).await;
    let pdb_spec = pdb.spec.unwrap();
    assert_eq!(
        pdb_spec.max_unavailable,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("25%".into()))
    );
    let selector = pdb_spec.selector.unwrap().match_labels.unwrap();
    assert_eq!(selector["gateway.networking.k8s.io/gateway-name"], "edge");
    let owner = &pdb.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Gateway", "edge")
    );

    provision::provision(
        &env.client,
        &cfg,
        &gw,
        &GatewayParametersSpec::default(),
        &[],
    )
    .await
    .unwrap();
    assert!(!exists::<PodDisruptionBudget>(&env).await);
    // Deprovisioning removes an autoscaler and a budget with the rest.
    let both = spec(
        json!({"autoscaling": {"maxReplicas": 2}, "podDisruptionBudget": {"minAvailable": 1}}),
    );
    provision::provision(&env.client, &cfg, &gw, &both, &[])
        .await
        .unwrap();
    provision::deprovision(&env.client, &env.ns, "edge")
        .await
        .unwrap();
    assert!(!exists::<PodDisruptionBudget>(&env).await);
    assert!(!exists::<HorizontalPodAutoscaler>(&env).await);
    assert!(!exists::<Deployment>(&env).await);
}

#[tokio::test]
async fn drift_from_the_parameters_is_reverted_by_the_next_provisioning() {
    let env = TestEnv::new("gwp-drift").await;
    let gw = gateway(&env, json!({})).await;
    let cfg = config();
    let params = spec(json!({
        "replicas": 2,
        "nodeSelector": {"pool": "edge"},
        "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}},
        "service": {"annotations": {"lb.example.com/scheme": "internal"}}
    }));
    provision::provision(&env.client, &cfg, &gw, &params, &[])
        .await
        .unwrap();
    // Someone edits the objects by hand (another field manager, forcing).
    let edit = PatchParams::apply("kubectl-edit").force();
    Api::<Deployment>::namespaced(env.client.clone(), &env.ns)
        .patch(
            NAME,
            &edit,
            &Patch::Apply(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": NAME},
                "spec": {"replicas": 9, "template": {"spec": {
                    "nodeSelector": {"pool": "other"},
                    "containers": [{"name": "proxy", "resources": {"requests": {"cpu": "4"}}}]
                }}}
            })),
        )
        .await
        .unwrap();
    Api::<Service>::namespaced(env.client.clone(), &env.ns)
        .patch(
            NAME,
            &edit,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": NAME, "annotations": {"lb.example.com/scheme": "internet-facing"}}
            })),
        )
        .await
        .unwrap();
    let d = deployment(&env).await;
    assert_eq!(replicas(&d), Some(9), "the edit landed");

    provision::provision(&env.client, &cfg, &gw, &params, &[])
        .await
        .unwrap();
    let d = deployment(&env).await;
    assert_eq!(replicas(&d), Some(2));
    let pod = d.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.node_selector.unwrap()["pool"], "edge");
    let requests = pod.containers[0]
        .resources
        .clone()
        .unwrap()
        .requests
        .unwrap();
    assert_eq!(requests["cpu"].0, "250m");
    let svc = env.get::<Service>(NAME).await;
    assert_eq!(
        svc.metadata.annotations.unwrap()["lb.example.com/scheme"],
        "internal"
    );
}

/// The status of Gateway `edge`'s `Accepted` condition: (status, reason, message).
async fn gateway_accepted(env: &TestEnv) -> Option<(String, String, String)> {
    let gw = env.get::<Gateway>("edge").await;
    let c = gw
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "Accepted")?;
    (c.observed_generation == gw.metadata.generation).then_some((c.status, c.reason, c.message))
}

async fn class_accepted(env: &TestEnv) -> Option<(String, String)> {
    let class = Api::<GatewayClass>::all(env.client.clone())
        .get(&env.class)
        .await
        .unwrap();
    let c = class
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "Accepted")?;
    (c.observed_generation == class.metadata.generation).then_some((c.status, c.reason))
}

#[tokio::test]
async fn the_controller_merges_class_and_gateway_parameters_and_holds_invalid_ones() {
    let env = TestEnv::new("gwp-ctl").await;
    env.apply::<GatewayParameters>(json!({
        "apiVersion": "tollgate.dev/v1alpha1", "kind": "GatewayParameters",
        "metadata": {"name": "class-defaults"},
        "spec": {"replicas": 2, "workers": 2, "logLevel": "warn", "nodeSelector": {"pool": "edge"}}
    }))
    .await;
    env.apply::<GatewayParameters>(json!({
        "apiVersion": "tollgate.dev/v1alpha1", "kind": "GatewayParameters",
        "metadata": {"name": "edge"},
        "spec": {"replicas": 3, "logLevel": "debug"}
    }))
    .await;
    env.apply_cluster::<GatewayClass>(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": env.class},
        "spec": {
            "controllerName": env.controller_name,
            "parametersRef": {"group": "tollgate.dev", "kind": "GatewayParameters",
                              "name": "class-defaults", "namespace": env.ns}
        }
    }))
    .await;
    let own_ref = json!({"parametersRef": {"group": "tollgate.dev", "kind": "GatewayParameters", "name": "edge"}});
    gateway(&env, own_ref).await;
    let controller = env.controller(
        "gwp",
        &[
            "--provision=true",
            "--proxy-image",
            "example/proxy:test",
            "--service-type",
            "ClusterIP",
        ],
    );

    // Merged: the Gateway's replicas and log level, the class's workers and node selector.
    let merged = eventually(Duration::from_secs(60), || async {
        let d = Api::<Deployment>::namespaced(env.client.clone(), &env.ns)
            .get_opt(NAME)
            .await
            .unwrap()?;
        (replicas(&d) == Some(3)).then_some(d)
    })
    .await
    .unwrap_or_else(|| panic!("no Deployment with 3 replicas:\n{}", controller.log()));
    let pod = merged.spec.clone().unwrap().template.spec.unwrap();
    assert_eq!(pod.node_selector.unwrap()["pool"], "edge");
    let c = &pod.containers[0];
    assert!(c.args.as_ref().unwrap().contains(&"--workers=2".to_owned()));
    let log = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "RUST_LOG")
        .unwrap();
    assert_eq!(log.value.as_deref(), Some("debug"));
    let accepted = eventually(Duration::from_secs(30), || async {
        gateway_accepted(&env).await.filter(|a| a.0 == "True")
    })
    .await;
    assert!(accepted.is_some(), "{}", controller.log());
    // The class's status is its own write, which may come after the Gateway's.
    let class = eventually(Duration::from_secs(30), || async {
        class_accepted(&env).await.filter(|a| a.0 == "True")
    })
    .await;
    assert_eq!(
        class,
        Some(("True".into(), "Accepted".into())),
        "{}",
        controller.log()
    );

    // An edit of the parameters alone reaches the proxy objects.
    env.apply::<GatewayParameters>(json!({
        "apiVersion": "tollgate.dev/v1alpha1", "kind": "GatewayParameters",
        "metadata": {"name": "edge"},
        "spec": {"replicas": 4, "logLevel": "debug"}
    }))
    .await;
    let four = eventually(Duration::from_secs(30), || async {
        (replicas(&deployment(&env).await) == Some(4)).then_some(())
    })
    .await;
    assert!(four.is_some(), "{}", controller.log());

    // The Gateway's parameters deleted: InvalidParameters, and the proxy left as it was.
    Api::<GatewayParameters>::namespaced(env.client.clone(), &env.ns)
        .delete("edge", &Default::default())
        .await
        .unwrap();
    let invalid = eventually(Duration::from_secs(30), || async {
        gateway_accepted(&env)
            .await
            .filter(|a| a.1 == "InvalidParameters")
    })
    .await
    .unwrap_or_else(|| panic!("no InvalidParameters:\n{}", controller.log()));
    assert_eq!(invalid.0, "False");
    assert!(invalid.2.contains("not found"), "{}", invalid.2);
    let before = deployment(&env).await;
    assert_eq!(replicas(&before), Some(4));
    // The class's parameters made invalid too: the class says so, the proxy still stands.
    env.apply::<GatewayParameters>(json!({
        "apiVersion": "tollgate.dev/v1alpha1", "kind": "GatewayParameters",
        "metadata": {"name": "class-defaults"},
        "spec": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}
    }))
    .await;
    let class_invalid = eventually(Duration::from_secs(30), || async {
        class_accepted(&env)
            .await
            .filter(|a| a.1 == "InvalidParameters")
    })
    .await;
    assert!(class_invalid.is_some(), "{}", controller.log());
    let after = deployment(&env).await;
    assert_eq!(
        before.metadata.resource_version, after.metadata.resource_version,
        "nothing applied while the parameters are invalid"
    );
    assert!(!exists::<HorizontalPodAutoscaler>(&env).await);
    // Fixed: provisioned again with the class's parameters alone. (An empty
    // `infrastructure` would be applied as null, which the schema refuses.)
    gateway(&env, json!({"labels": {"team": "edge"}})).await;
    env.apply::<GatewayParameters>(json!({
        "apiVersion": "tollgate.dev/v1alpha1", "kind": "GatewayParameters",
        "metadata": {"name": "class-defaults"},
        "spec": {"autoscaling": {"minReplicas": 2, "maxReplicas": 5}}
    }))
    .await;
    let hpa = eventually(Duration::from_secs(30), || async {
        Api::<HorizontalPodAutoscaler>::namespaced(env.client.clone(), &env.ns)
            .get_opt(NAME)
            .await
            .unwrap()
    })
    .await;
    assert!(hpa.is_some(), "{}", controller.log());
    assert_eq!(
        replicas(&deployment(&env).await),
        Some(4),
        "handed over, not reset"
    );
}
