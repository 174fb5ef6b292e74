//! An optional kind (the controller watches TLSRoute this way) on the real kube-apiserver:
//! while its CRD is not installed the store counts as listed and empty, so the controller
//! starts and serves everything else; once the CRD is installed the watch starts by itself
//! and the store follows the objects. A test CRD stands in for TLSRoute so the cluster's
//! Gateway API CRDs (which other tests use) are never removed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tollgate::k8s::lenient::Lenient;
use tollgate::k8s::metrics::Metrics;
use tollgate::k8s::stores::{Kind, Relevance, watch_optional};

use k8s_support::{TestEnv, eventually};

/// A kind no cluster serves until this test installs it.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "optional.test.tollgate.dev",
    version = "v1",
    kind = "Widget",
    namespaced
)]
struct WidgetSpec {
    size: u32,
}

const WAIT: Duration = Duration::from_secs(30);

async fn crd_absent(crds: &Api<CustomResourceDefinition>) {
    let name = Widget::crd_name();
    let _ = crds.delete(name, &DeleteParams::default()).await;
    let gone = eventually(WAIT, || async {
        crds.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(gone.is_some(), "CRD {name} still present");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_crd_is_an_empty_store_until_it_is_installed() {
    let env = TestEnv::new("optional-crd").await;
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    crd_absent(&crds).await;

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let metrics = Arc::new(Metrics::new());
    let api: Api<Lenient<Widget>> = Api::all(env.client.clone());
    let (store, task) = watch_optional(
        api,
        Kind::TlsRoute,
        Duration::from_millis(200),
        &tx,
        &metrics,
    );

    // Not served: listed (ready) and empty, well within the wait.
    tokio::time::timeout(WAIT, store.wait_until_ready())
        .await
        .expect("store of a kind the API server does not serve never became ready")
        .unwrap();
    assert!(store.state().is_empty());

    // Installed later: the watch starts on its own and the store follows the objects.
    crds.create(&PostParams::default(), &Widget::crd())
        .await
        .unwrap();
    let widgets: Api<Widget> = Api::namespaced(env.client.clone(), &env.ns);
    let created = eventually(WAIT, || async {
        // The CRD takes a moment to be Established; creating fails until then.
        let w = json!({
            "apiVersion": "optional.test.tollgate.dev/v1", "kind": "Widget",
            "metadata": {"name": "w1"}, "spec": {"size": 3},
        });
        widgets
            .patch("w1", &PatchParams::apply("test").force(), &Patch::Apply(w))
            .await
            .ok()
    })
    .await;
    assert!(created.is_some(), "could not create a Widget");
    let seen = eventually(WAIT, || async {
        store
            .state()
            .iter()
            .find_map(|w| w.as_ok().map(|w| w.spec.size))
    })
    .await;
    assert_eq!(seen, Some(3));
    // The first full list after installation asks for a full reconcile.
    let mut full = false;
    while let Ok(c) = rx.try_recv() {
        full |= c.kind == Kind::TlsRoute && c.relevance == Relevance::Full;
    }
    assert!(full, "no full-relevance change after the CRD appeared");

    task.abort();
    crd_absent(&crds).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_rbac_forbids_is_an_empty_store_too() {
    // A controller whose ClusterRole predates TLSRoutes: listing them is forbidden (403).
    let api: Api<Lenient<gateway_api::tlsroutes::TlsRoute>> = forbidden().await;
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let metrics = Arc::new(Metrics::new());
    let (store, task) = watch_optional(api, Kind::TlsRoute, Duration::from_secs(30), &tx, &metrics);
    tokio::time::timeout(WAIT, store.wait_until_ready())
        .await
        .expect("a store of a forbidden kind never became ready")
        .unwrap();
    assert!(store.state().is_empty());
    task.abort();
}

/// The API of `K` for a user RBAC grants nothing, checked to answer 403.
async fn forbidden<K>() -> Api<Lenient<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let kc = kube::config::Kubeconfig::read_from(k8s_support::kubeconfig()).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.auth_info.impersonate = Some("tollgate-test-no-rbac".into());
    let nobody = kube::Client::try_from(cfg).unwrap();
    let api: Api<Lenient<K>> = Api::all(nobody);
    let denied = api.list_metadata(&Default::default()).await.unwrap_err();
    assert!(
        matches!(&denied, kube::Error::Api(s) if s.code == 403),
        "{denied}"
    );
    api
}
