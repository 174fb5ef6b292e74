//! Provisioning against a real kube-apiserver (`e2e/cluster.sh up`, then
//! brought up by the shared test support, as every k8s_* test does). Each test creates its own
//! namespace and Gateway, calls `provision`/`deprovision` and reads back what the API server
//! stored.
//!
//! The test cluster has no controller-manager: Deployments never get pods, nothing garbage
//! collects, and no load-balancer provider fills `status.loadBalancer`; the tests play that
//! provider themselves through the Service's status subresource.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::hash::{BuildHasher, RandomState};

use gateway_types::gateways::Gateway;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Service, ServiceAccount, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use tollgate::crds::GatewayParametersSpec;
use tollgate::k8s::provision::{
    self, FIELD_MANAGER, ProvisionConfig, ProvisionError, REPLICAS_ANNOTATION,
};

mod k8s_support;

/// A client for the test cluster (started by `e2e/cluster.sh up` if it is not running).
async fn client() -> Client {
    k8s_support::client().await
}

/// A fresh namespace `prov-<test>-<random>`. Not deleted: without a namespace controller
/// the test cluster would leave it Terminating with its objects anyway, and they are inert.
struct TestNamespace {
    client: Client,
    name: String,
}

impl TestNamespace {
    async fn new(client: &Client, test: &str) -> Self {
        let suffix = RandomState::new().hash_one(std::time::SystemTime::now()) % 0xff_ffff;
        let name = format!("prov-{test}-{suffix:06x}");
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        Self {
            client: client.clone(),
            name,
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

fn config() -> ProvisionConfig {
    ProvisionConfig {
        proxy_image: "example.com/tollgate-proxy:test".into(),
        service_type: "LoadBalancer".into(),
        controller_url: "https://tollgate.tollgate-system.svc:9443".into(),
        controller_namespace: "tollgate-system".into(),
        proxy_args: vec!["--redis-url=redis://redis.cache:6379".into()],
        access_log: tollgate_proxy::AccessLogArgs::default(),
    }
}

/// Provisions `gw` without GatewayParameters.
async fn provision_plain(
    client: &Client,
    config: &ProvisionConfig,
    gw: &Gateway,
) -> Result<Vec<gateway_types::gateways::GatewayStatusAddresses>, ProvisionError> {
    provision::provision(client, config, gw, &GatewayParametersSpec::default(), &[]).await
}

/// Creates Gateway `name` with infrastructure metadata and HTTP/HTTPS listeners.
async fn create_gateway(ns: &TestNamespace, name: &str) -> Gateway {
    let gw: Gateway = serde_json::from_value(serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": ns.name},
        "spec": {
            "gatewayClassName": "tollgate",
            "infrastructure": {
                "labels": {"team": "payments"},
                "annotations": {"example.com/cost-center": "42"}
            },
            "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP"},
                {"name": "alt", "port": 8080, "protocol": "HTTP"}
            ]
        }
    }))
    .unwrap();
    ns.api::<Gateway>()
        .create(&PostParams::default(), &gw)
        .await
        .unwrap()
}

/// (resourceVersion of the ServiceAccount, Deployment, Service).
async fn versions(ns: &TestNamespace, name: &str) -> [String; 3] {
    [
        ns.api::<ServiceAccount>()
            .get(name)
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap(),
        ns.api::<Deployment>()
            .get(name)
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap(),
        ns.api::<Service>()
            .get(name)
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap(),
    ]
}

fn assert_owned_and_labelled(meta: &ObjectMeta, gw: &Gateway) {
    let what = format!("{:?}", meta.name);
    let refs = meta.owner_references.as_ref().expect("owner references");
    assert_eq!(refs.len(), 1, "{what}");
    assert_eq!(refs[0].kind, "Gateway");
    assert_eq!(refs[0].name, gw.metadata.name.clone().unwrap());
    assert_eq!(refs[0].uid, gw.metadata.uid.clone().unwrap());
    assert_eq!(refs[0].controller, Some(true));
    assert_eq!(refs[0].block_owner_deletion, Some(true));
    let labels = meta.labels.as_ref().unwrap();
    assert_eq!(labels["team"], "payments", "{what}");
    assert_eq!(labels["app.kubernetes.io/name"], "tollgate-proxy");
    assert_eq!(labels["app.kubernetes.io/managed-by"], "tollgate");
    assert_eq!(labels["gateway.networking.k8s.io/gateway-name"], "edge");
    assert_eq!(
        meta.annotations.as_ref().unwrap()["example.com/cost-center"],
        "42"
    );
    let managers: Vec<_> = meta
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.as_deref())
        .collect();
    assert!(managers.contains(&FIELD_MANAGER), "{what}: {managers:?}");
}

#[tokio::test]
async fn provision_creates_owned_labelled_objects_and_reapplying_changes_nothing() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "create").await;
    let gw = create_gateway(&ns, "edge").await;

    let addresses = provision_plain(&client, &config(), &gw).await.unwrap();

    let name = "edge-tollgate";
    let sa = ns.api::<ServiceAccount>().get(name).await.unwrap();
    let deploy = ns.api::<Deployment>().get(name).await.unwrap();
    let svc = ns.api::<Service>().get(name).await.unwrap();
    for meta in [&sa.metadata, &deploy.metadata, &svc.metadata] {
        assert_owned_and_labelled(meta, &gw);
    }
    let template = &deploy.spec.as_ref().unwrap().template;
    let pod_meta = template.metadata.as_ref().unwrap();
    assert_eq!(pod_meta.labels.as_ref().unwrap()["team"], "payments");
    assert_eq!(
        pod_meta.annotations.as_ref().unwrap()["example.com/cost-center"],
        "42"
    );
    let container = &template.spec.as_ref().unwrap().containers[0];
    let container_ports: Vec<i32> = container
        .ports
        .iter()
        .flatten()
        .map(|p| p.container_port)
        .collect();
    assert_eq!(container_ports, [80, 8080, 9902]);

    let spec = svc.spec.as_ref().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    let ports: Vec<(Option<String>, i32)> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone(), p.port))
        .collect();
    assert_eq!(
        ports,
        [
            (Some("http-80".into()), 80),
            (Some("http-8080".into()), 8080)
        ]
    );
    // No load balancer yet: the ClusterIP the API server allocated.
    let cluster_ip = spec.cluster_ip.clone().unwrap();
    assert_eq!(addresses.len(), 1);
    assert_eq!(addresses[0].r#type.as_deref(), Some("IPAddress"));
    assert_eq!(addresses[0].value, cluster_ip);

    // The conformance test (GatewayInfrastructure) finds generated objects by this label.
    let by_label = ListParams::default().labels("gateway.networking.k8s.io/gateway-name=edge");
    assert_eq!(
        ns.api::<ServiceAccount>()
            .list(&by_label)
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    let before = versions(&ns, name).await;
    let again = provision_plain(&client, &config(), &gw).await.unwrap();
    assert_eq!(again, addresses);
    assert_eq!(
        versions(&ns, name).await,
        before,
        "re-applying must not churn"
    );
}

#[tokio::test]
async fn load_balancer_ingress_becomes_the_gateway_address() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "lb").await;
    let gw = create_gateway(&ns, "edge").await;
    provision_plain(&client, &config(), &gw).await.unwrap();

    // Play the load-balancer provider.
    let status = serde_json::json!({"status": {"loadBalancer": {"ingress": [
        {"ip": "203.0.113.10"},
        {"hostname": "edge.lb.example.com"}
    ]}}});
    ns.api::<Service>()
        .patch_status(
            "edge-tollgate",
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .unwrap();

    let addresses = provision_plain(&client, &config(), &gw).await.unwrap();
    let pairs: Vec<(String, String)> = addresses
        .into_iter()
        .map(|a| (a.r#type.unwrap(), a.value))
        .collect();
    assert_eq!(
        pairs,
        [
            ("IPAddress".to_string(), "203.0.113.10".to_string()),
            ("Hostname".to_string(), "edge.lb.example.com".to_string()),
        ]
    );
}

#[tokio::test]
async fn cluster_ip_service_type_reports_the_cluster_ip() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "cip").await;
    let gw = create_gateway(&ns, "edge").await;
    // First a LoadBalancer (with node ports), then the operator switches to ClusterIP.
    provision_plain(&client, &config(), &gw).await.unwrap();
    let config = ProvisionConfig {
        service_type: "ClusterIP".into(),
        ..config()
    };
    let addresses = provision_plain(&client, &config, &gw).await.unwrap();
    let svc = ns.api::<Service>().get("edge-tollgate").await.unwrap();
    let spec = svc.spec.unwrap();
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    let node_ports: Vec<_> = spec
        .ports
        .iter()
        .flatten()
        .filter_map(|p| p.node_port)
        .collect();
    assert!(node_ports.is_empty(), "{node_ports:?}");
    assert_eq!(addresses.len(), 1);
    assert_eq!(Some(addresses[0].value.clone()), spec.cluster_ip);
}

#[tokio::test]
async fn gateway_changes_are_applied_and_dropped_fields_removed() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "update").await;
    let mut gw = create_gateway(&ns, "edge").await;
    provision_plain(&client, &config(), &gw).await.unwrap();

    let infra = gw.spec.infrastructure.as_mut().unwrap();
    infra.labels = Some(BTreeMap::from([("tier".into(), "edge".into())]));
    infra.annotations = None;
    gw.spec.listeners.truncate(1);
    gw.metadata.annotations = Some(BTreeMap::from([(REPLICAS_ANNOTATION.into(), "3".into())]));
    provision_plain(&client, &config(), &gw).await.unwrap();

    let deploy = ns.api::<Deployment>().get("edge-tollgate").await.unwrap();
    let labels = deploy.metadata.labels.clone().unwrap();
    assert_eq!(labels.get("tier").map(String::as_str), Some("edge"));
    assert!(!labels.contains_key("team"), "{labels:?}");
    let annotations = deploy.metadata.annotations.clone().unwrap_or_default();
    assert!(
        !annotations.contains_key("example.com/cost-center"),
        "{annotations:?}"
    );
    assert_eq!(deploy.spec.as_ref().unwrap().replicas, Some(3));
    let svc = ns.api::<Service>().get("edge-tollgate").await.unwrap();
    let ports: Vec<i32> = svc
        .spec
        .unwrap()
        .ports
        .iter()
        .flatten()
        .map(|p| p.port)
        .collect();
    assert_eq!(ports, [80]);

    // Dropping the annotation hands replicas back to the API server's default.
    gw.metadata.annotations = None;
    provision_plain(&client, &config(), &gw).await.unwrap();
    let deploy = ns.api::<Deployment>().get("edge-tollgate").await.unwrap();
    assert_eq!(deploy.spec.unwrap().replicas, Some(1));
}

#[tokio::test]
async fn invalid_replicas_annotation_applies_nothing() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "invalid").await;
    let mut gw = create_gateway(&ns, "edge").await;
    gw.metadata.annotations = Some(BTreeMap::from([(
        REPLICAS_ANNOTATION.into(),
        "lots".into(),
    )]));
    let err = provision_plain(&client, &config(), &gw).await.unwrap_err();
    assert!(
        matches!(err, ProvisionError::InvalidGateway { .. }),
        "{err}"
    );
    assert!(
        ns.api::<Deployment>()
            .get_opt("edge-tollgate")
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn deprovision_deletes_the_objects_and_tolerates_missing_ones() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "delete").await;
    let gw = create_gateway(&ns, "edge").await;
    provision_plain(&client, &config(), &gw).await.unwrap();

    provision::deprovision(&client, &ns.name, "edge")
        .await
        .unwrap();
    assert!(
        ns.api::<ServiceAccount>()
            .get_opt("edge-tollgate")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        ns.api::<Service>()
            .get_opt("edge-tollgate")
            .await
            .unwrap()
            .is_none()
    );
    // No garbage collector here, and Deployments are deleted in the background: gone, or
    // at least marked for deletion.
    let deploy = ns
        .api::<Deployment>()
        .get_opt("edge-tollgate")
        .await
        .unwrap();
    assert!(deploy.is_none_or(|d| d.metadata.deletion_timestamp.is_some()));

    // Again, with nothing left: not an error.
    provision::deprovision(&client, &ns.name, "edge")
        .await
        .unwrap();
}

#[tokio::test]
async fn deprovision_leaves_objects_tollgate_did_not_create() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "foreign").await;
    let svc = Service {
        metadata: ObjectMeta {
            name: Some("other-tollgate".into()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort {
                port: 80,
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    ns.api::<Service>()
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    provision::deprovision(&client, &ns.name, "other")
        .await
        .unwrap();
    assert!(
        ns.api::<Service>()
            .get_opt("other-tollgate")
            .await
            .unwrap()
            .is_some()
    );
}

/// Provisioning with nothing but the Helm chart's RBAC: with
/// `TOLLGATE_PROVISION_AS=system:serviceaccount:NS:NAME` (e2e/chart-test.sh applies the
/// chart's ServiceAccount and RBAC, then runs this test with it set) the provisioning calls
/// run impersonating that ServiceAccount. Ignored by plain `cargo test`: it needs the RBAC
/// objects chart-test.sh applies.
#[tokio::test]
#[ignore = "run by e2e/chart-test.sh, which applies the chart's RBAC and sets TOLLGATE_PROVISION_AS"]
async fn provision_works_with_only_the_charts_rbac() {
    let admin = client().await;
    let user = std::env::var("TOLLGATE_PROVISION_AS").expect(
        "TOLLGATE_PROVISION_AS: the ServiceAccount to impersonate (e2e/chart-test.sh sets it)",
    );
    let kc = kube::config::Kubeconfig::read_from(k8s_support::kubeconfig()).unwrap();
    let mut kube_config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube_config.auth_info.impersonate = Some(user.clone());
    let controller = Client::try_from(kube_config).unwrap();

    let ns = TestNamespace::new(&admin, "rbac").await;
    let gw = create_gateway(&ns, "edge").await;
    // The impersonation works: this identity may not create Gateways.
    let denied = Api::<Gateway>::namespaced(controller.clone(), &ns.name)
        .create(&PostParams::default(), &gw)
        .await
        .unwrap_err();
    assert!(
        matches!(&denied, kube::Error::Api(s) if s.code == 403),
        "{user}: {denied}"
    );

    // GatewayParameters add an autoscaler and a disruption budget, which the chart's RBAC
    // must allow too (creating them, then deleting them when the parameters drop them).
    let scaled: GatewayParametersSpec = serde_json::from_value(serde_json::json!({
        "autoscaling": {"maxReplicas": 3},
        "podDisruptionBudget": {"minAvailable": 1}
    }))
    .unwrap();
    let addresses = provision::provision(&controller, &config(), &gw, &scaled, &[])
        .await
        .unwrap_or_else(|e| panic!("provision as {user}: {e}"));
    assert_eq!(addresses.len(), 1);
    assert!(
        ns.api::<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler>()
            .get_opt("edge-tollgate")
            .await
            .unwrap()
            .is_some()
    );
    provision_plain(&controller, &config(), &gw).await.unwrap();
    assert!(
        ns.api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>()
            .get_opt("edge-tollgate")
            .await
            .unwrap()
            .is_none()
    );
    provision::deprovision(&controller, &ns.name, "edge")
        .await
        .unwrap_or_else(|e| panic!("deprovision as {user}: {e}"));
    assert!(
        ns.api::<Service>()
            .get_opt("edge-tollgate")
            .await
            .unwrap()
            .is_none()
    );
}
