//! Optional kinds (the controller watches TLSRoute, RateLimitPolicy and AuthPolicy this way) on
//! the real kube-apiserver: while a kind's CRD is confirmed absent its store counts as listed
//! and empty, so the controller starts and serves everything else; once the CRD is installed
//! the watch starts by itself and the store follows the objects. What cannot be confirmed
//! (the controller may not list the kind, or may not read CRDs to confirm a 404) counts as
//! none only for a forgiving kind (TLSRoute); a fail-closed kind (the policies) holds its store
//! back until it can be listed. Test CRDs stand in for the real ones so the cluster's CRDs
//! (which other tests use) are never removed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Api, CustomResource, CustomResourceExt, Resource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::task::JoinHandle;
use tollgate::crds::RateLimitPolicy;
use tollgate::k8s::lenient::Lenient;
use tollgate::k8s::metrics::Metrics;
use tollgate::k8s::stores::{Change, Kind, Optional, Relevance, watch_optional};

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

/// A kind no test ever installs.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "optional.test.tollgate.dev",
    version = "v1",
    kind = "Gadget",
    namespaced
)]
struct GadgetSpec {
    size: u32,
}

/// A kind whose CRD serves an older version only: how a cluster with Gateway API v1.5 CRDs
/// serves TCPRoute and UDPRoute (`v1alpha2`) to a controller that reads `v1`.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "optional.test.tollgate.dev",
    version = "v1",
    kind = "Sprocket",
    namespaced
)]
struct SprocketSpec {
    size: u32,
}

/// The same kind at the version its CRD serves.
mod old {
    use super::*;

    #[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    #[kube(
        group = "optional.test.tollgate.dev",
        version = "v1alpha2",
        kind = "Sprocket",
        namespaced
    )]
    pub struct SprocketSpec {
        pub size: u32,
    }
}

const WAIT: Duration = Duration::from_secs(30);

/// The Gateway API v1.5 case of TCPRoute and UDPRoute: the CRD is installed but serves only
/// `v1alpha2`. A forgiving kind counts as none (the controller serves everything else) rather
/// than waiting for a version that will not come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_serving_only_an_older_version_is_an_empty_store() {
    let env = TestEnv::new("optional-crd-version").await;
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let name = old::Sprocket::crd_name();
    let _ = crds.delete(name, &DeleteParams::default()).await;
    let gone = eventually(WAIT, || async {
        crds.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(gone.is_some(), "CRD {name} still present");
    crds.create(&PostParams::default(), &old::Sprocket::crd())
        .await
        .unwrap();
    let established = eventually(WAIT, || async {
        let crd = crds.get_opt(name).await.ok()??;
        crd.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
    })
    .await;
    assert!(established.is_some(), "CRD {name} never Established");

    let api: Api<Lenient<Sprocket>> = Api::all(env.client.clone());
    let (store, _watching) = watch(api, Kind::TcpRoute, Optional::Forgiving);
    listed(
        &store,
        "a kind whose CRD serves only an older version never became ready",
    )
    .await;
    assert!(store.state().is_empty());
    let _ = crds.delete(name, &DeleteParams::default()).await;
}

async fn crd_absent(crds: &Api<CustomResourceDefinition>) {
    let name = Widget::crd_name();
    let _ = crds.delete(name, &DeleteParams::default()).await;
    let gone = eventually(WAIT, || async {
        crds.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(gone.is_some(), "CRD {name} still present");
}

/// Both modes: a CRD confirmed absent (the test's client may read CRDs) is none for a
/// fail-closed kind too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_crd_is_an_empty_store_until_it_is_installed() {
    let env = TestEnv::new("optional-crd").await;
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    crd_absent(&crds).await;

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let metrics = Arc::new(Metrics::new());
    let watches = [Optional::Forgiving, Optional::FailClosed].map(|mode| {
        let api: Api<Lenient<Widget>> = Api::all(env.client.clone());
        let (store, task) = watch_optional(
            api,
            Kind::TlsRoute,
            mode,
            Duration::from_millis(200),
            &tx,
            &metrics,
        );
        (mode, store, task)
    });

    // Not served: listed (ready) and empty, well within the wait.
    for (mode, store, _) in &watches {
        tokio::time::timeout(WAIT, store.wait_until_ready())
            .await
            .unwrap_or_else(|_| {
                panic!("{mode:?}: a store of a kind whose CRD is absent never became ready")
            })
            .unwrap();
        assert!(store.state().is_empty());
    }

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
    for (mode, store, _) in &watches {
        let seen = eventually(WAIT, || async {
            store
                .state()
                .iter()
                .find_map(|w| w.as_ok().map(|w| w.spec.size))
        })
        .await;
        assert_eq!(seen, Some(3), "{mode:?}");
    }
    // The first full list after installation asks for a full reconcile.
    let mut full = 0;
    while let Ok(c) = rx.try_recv() {
        full += usize::from(c.kind == Kind::TlsRoute && c.relevance == Relevance::Full);
    }
    assert!(
        full >= 2,
        "not a full-relevance change from each watch after the CRD appeared"
    );

    for (_, _, task) in watches {
        task.abort();
    }
    crd_absent(&crds).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_rbac_forbids_is_an_empty_store_too() {
    // A controller whose ClusterRole predates TLSRoutes: listing them is forbidden (403).
    let api: Api<Lenient<gateway_types::tlsroutes::TlsRoute>> = forbidden().await;
    let (store, _watch) = watch(api, Kind::TlsRoute, Optional::Forgiving);
    listed(&store, "a store of a forbidden kind never became ready").await;
    assert!(store.state().is_empty());
}

/// The API of `K` for a user RBAC grants nothing, checked to answer 403.
async fn forbidden<K>() -> Api<Lenient<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let api: Api<Lenient<K>> = Api::all(k8s_support::client_as("tollgate-test-no-rbac").await);
    let denied = api.list_metadata(&Default::default()).await.unwrap_err();
    assert!(
        matches!(&denied, kube::Error::Api(s) if s.code == 403),
        "{denied}"
    );
    api
}

/// How long a store held back must stay unlisted to count as held back: many times the
/// 200 ms between attempts of these tests.
const HELD: Duration = Duration::from_secs(3);

/// A fail-closed kind (the policies) that RBAC forbids listing holds its store back (left
/// out, an AuthPolicy's routes would be served unauthenticated); once allowed, the watch
/// starts and the store holds the objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_closed_kind_rbac_forbids_holds_its_store_back() {
    let env = TestEnv::new("optional-forbidden").await;
    env.apply::<RateLimitPolicy>(json!({
        "apiVersion": "tollgate.dev/v1alpha1", "kind": "RateLimitPolicy",
        "metadata": {"name": "held"},
        "spec": {
            "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "r"}],
            "limits": {"l": {"rates": [{"limit": 1, "window": "1m"}]}},
        },
    }))
    .await;
    let user = format!("tollgate-test-{}", env.ns);
    let api: Api<Lenient<RateLimitPolicy>> = Api::all(k8s_support::client_as(&user).await);
    let (store, _watch) = watch(api, Kind::RateLimitPolicy, Optional::FailClosed);
    assert!(
        held_back(&store).await,
        "a fail-closed kind RBAC forbids counted as listed"
    );

    env.grant(
        &user,
        &user,
        json!([{"apiGroups": ["tollgate.dev"], "resources": ["ratelimitpolicies"],
                "verbs": ["list", "watch"]}]),
    )
    .await;
    listed(
        &store,
        "the store was still held back once listing was allowed",
    )
    .await;
    let ns = env.ns.clone();
    let seen = eventually(WAIT, || async {
        store.state().iter().find_map(|p| {
            let m = p.meta();
            (m.namespace.as_deref() == Some(&ns) && m.name.as_deref() == Some("held")).then_some(())
        })
    })
    .await;
    assert!(seen.is_some(), "the policy never reached the store");
}

/// A 404 the controller may not confirm by reading the CRD (RBAC allows listing the kind,
/// not reading CRDs): none for a forgiving kind, held back for a fail-closed one until the
/// CRD can be read and is found absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_counts_as_none_for_a_fail_closed_kind_only_once_the_crd_is_confirmed_absent() {
    let env = TestEnv::new("optional-unconfirmed").await;
    let user = format!("tollgate-test-{}", env.ns);
    env.grant(
        &user,
        &user,
        json!([{"apiGroups": ["optional.test.tollgate.dev"], "resources": ["gadgets"],
                "verbs": ["list", "watch"]}]),
    )
    .await;
    let client = k8s_support::client_as(&user).await;
    let api: Api<Lenient<Gadget>> = Api::all(client.clone());
    // Allowed to list, and not served: 404. Reading the CRD: forbidden.
    let listing = api.list_metadata(&Default::default()).await.unwrap_err();
    assert!(
        matches!(&listing, kube::Error::Api(s) if s.code == 404),
        "{listing}"
    );
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let lookup = crds.get_opt(Gadget::crd_name()).await.unwrap_err();
    assert!(
        matches!(&lookup, kube::Error::Api(s) if s.code == 403),
        "{lookup}"
    );

    let (forgiving, _w1) = watch(api.clone(), Kind::AuthPolicy, Optional::Forgiving);
    let (fail_closed, _w2) = watch(api, Kind::AuthPolicy, Optional::FailClosed);
    listed(
        &forgiving,
        "a forgiving kind in doubt never counted as none",
    )
    .await;
    assert!(
        held_back(&fail_closed).await,
        "a fail-closed kind counted as none on an unconfirmed 404"
    );

    // May read its CRD: confirmed absent, so none.
    env.grant(
        &format!("{user}-crd"),
        &user,
        json!([{"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                "verbs": ["get"], "resourceNames": [Gadget::crd_name()]}]),
    )
    .await;
    listed(
        &fail_closed,
        "a fail-closed kind whose CRD is confirmed absent never counted as none",
    )
    .await;
    assert!(fail_closed.state().is_empty());
}

/// An optional watch of `api` in `mode`, asking again every 200 ms, and its [`Watching`].
fn watch<K>(api: Api<Lenient<K>>, kind: Kind, mode: Optional) -> (Store<Lenient<K>>, Watching)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (tx, changes) = tokio::sync::mpsc::unbounded_channel();
    let metrics = Arc::new(Metrics::new());
    let (store, task) = watch_optional(api, kind, mode, Duration::from_millis(200), &tx, &metrics);
    (
        store,
        Watching {
            task,
            _changes: changes,
        },
    )
}

/// A watch started by [`watch`], aborted when dropped; it holds the change channel open
/// meanwhile (a watch whose receiver is gone stops at its first change).
struct Watching {
    task: JoinHandle<()>,
    _changes: tokio::sync::mpsc::UnboundedReceiver<Change>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until `store` is listed (or counted as none), failing with `what` after [`WAIT`].
async fn listed<K: kube::Resource<DynamicType = ()> + Clone>(
    store: &Store<Lenient<K>>,
    what: &str,
) {
    tokio::time::timeout(WAIT, store.wait_until_ready())
        .await
        .unwrap_or_else(|_| panic!("{what}"))
        .unwrap();
}

/// True when `store` stays unlisted for [`HELD`].
async fn held_back<K: kube::Resource<DynamicType = ()> + Clone>(store: &Store<Lenient<K>>) -> bool {
    tokio::time::timeout(HELD, store.wait_until_ready())
        .await
        .is_err()
}
