//! Two `tollgate controller` replicas on the real kube-apiserver: only the Lease holder
//! writes; when it dies (SIGKILL, no release) the other takes the Lease and writes status
//! within 15 s; a clean shutdown hands over at once; only the leader serves proxies, and the
//! next leader takes them over; the Lease carries our owner; a leader whose requests hang steps
//! down, and one stopped while a reconcile hangs exits at once. Also: endpoint churn holds
//! back no route, provisioning is wired in, and a failed provisioning is retried without
//! another change and during endpoint churn. (EndpointSlice-only changes taking the fast way
//! is `k8s_endpoints_path`: it counts full passes, which these tests' objects would add to.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gateway_types::experimental::httproutes::HttpRoute;
use gateway_types::gateways::Gateway;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use serde_json::json;

use k8s_support::{ControllerProc, TestEnv, eventually};

const WAIT: Duration = Duration::from_secs(30);

async fn holder(env: &TestEnv) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    leases
        .get_opt("tollgate-controller")
        .await
        .ok()??
        .spec?
        .holder_identity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_replica_takes_over_once_a_dead_leaders_lease_runs_out() {
    let env = TestEnv::new("leader").await;
    env.gateway("gw", &[("http", 80)]).await;
    env.service("echo", 80, "10.2.0.1").await;
    env.route("r1", json!([{"name": "gw"}]), "echo", 80).await;
    let mut a = Some(env.controller("a", &[]));
    let mut b = Some(env.controller("b", &[]));
    let first = eventually(WAIT, || holder(&env))
        .await
        .expect("no lease holder");
    let ok = eventually(WAIT, || async { env.has_status("r1").await.then_some(()) }).await;
    assert!(ok.is_some(), "no status written");
    let (leader, follower) = if first == "a" {
        (a.take().unwrap(), b.take().unwrap())
    } else {
        (b.take().unwrap(), a.take().unwrap())
    };
    follower.wait_ready().await;
    assert_eq!(
        follower.metric("tollgate_controller_status_writes_total", ""),
        0.0,
        "the follower wrote:\n{}",
        follower.log()
    );
    assert_eq!(follower.metric("tollgate_controller_leader", ""), 0.0);
    assert_eq!(leader.metric("tollgate_controller_leader", ""), 1.0);

    let mut leader: ControllerProc = leader;
    leader.kill();
    let killed = Instant::now();
    env.route("r2", json!([{"name": "gw"}]), "echo", 80).await;
    let ok = eventually(Duration::from_secs(30), || async {
        env.has_status("r2").await.then_some(())
    })
    .await;
    let took = killed.elapsed();
    assert!(ok.is_some(), "no failover:\n{}", follower.log());
    // The 15 s Lease, a 2 s round to notice, and the new leader's first status write.
    assert!(took < Duration::from_secs(25), "failover took {took:?}");
    assert_ne!(holder(&env).await.as_deref(), Some(first.as_str()));
    assert_eq!(follower.metric("tollgate_controller_leader", ""), 1.0);
    println!("failover: status written {took:?} after the leader was killed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_shutdown_hands_the_lease_over_at_once() {
    let env = TestEnv::new("handover").await;
    env.gateway("gw", &[("http", 80)]).await;
    let mut a = env.controller("a", &[]);
    a.wait_ready().await;
    eventually(WAIT, || async {
        (holder(&env).await? == "a").then_some(())
    })
    .await
    .expect("a never led");
    let b = env.controller("b", &[]);
    b.wait_ready().await;
    a.terminate();
    let stopped = Instant::now();
    eventually(WAIT, || async {
        (holder(&env).await? == "b").then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("b never led:\n{}", b.log()));
    assert!(
        stopped.elapsed() < Duration::from_secs(5),
        "{:?}",
        stopped.elapsed()
    );
}

/// EndpointSlice updates every 100 ms against a 500 ms quiet period: changes never stop
/// arriving, and a route created meanwhile still gets its status while they go on (a batch
/// closes ten quiet periods after its first change at the latest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_churn_holds_back_no_route() {
    let env = TestEnv::new("churn").await;
    env.gateway("gw", &[("http", 80)]).await;
    env.service("echo", 80, "10.2.0.2").await;
    env.route("r0", json!([{"name": "gw"}]), "echo", 80).await;
    let ctl = env.controller("a", &["--debounce-ms", "500"]);
    ctl.wait_ready().await;
    eventually(WAIT, || async { env.has_status("r0").await.then_some(()) })
        .await
        .expect("no status for r0");
    let churn = churn(&env, "echo");
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.route("r", json!([{"name": "gw"}]), "echo", 80).await;
    let seen = eventually(WAIT, || async { env.has_status("r").await.then_some(()) }).await;
    let updates = churn.stop().await;
    assert!(
        seen.is_some(),
        "no status for r within {WAIT:?} while {updates} endpoint updates came in:\n{}",
        ctl.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioning_creates_the_proxy_and_fills_addresses() {
    let env = TestEnv::new("prov").await;
    env.gateway("gw", &[("http", 80)]).await;
    let ctl = env.controller(
        "a",
        &["--provision=true", "--proxy-image", "example/proxy:test"],
    );
    ctl.wait_ready().await;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
    let d = eventually(WAIT, || async {
        deployments.get_opt("gw-tollgate").await.ok()?
    })
    .await
    .unwrap_or_else(|| panic!("no Deployment:\n{}", ctl.log()));
    let image = d.spec.unwrap().template.spec.unwrap().containers[0]
        .image
        .clone();
    assert_eq!(image.as_deref(), Some("example/proxy:test"));
    let addresses = eventually(WAIT, || async {
        let g: Gateway = env.get("gw").await;
        let a = g.status?.addresses?;
        (!a.is_empty()).then_some(a)
    })
    .await
    .unwrap_or_else(|| panic!("no addresses:\n{}", ctl.log()));
    // No load balancer fulfils the Service here: the cluster IP stands in.
    let svc: k8s_openapi::api::core::v1::Service = env.get("gw-tollgate").await;
    let ip = svc.spec.unwrap().cluster_ip.unwrap();
    assert_eq!(addresses[0].value, ip);
    assert_eq!(addresses[0].r#type.as_deref(), Some("IPAddress"));
    // Deleting the Gateway deprovisions.
    Api::<Gateway>::namespaced(env.client.clone(), &env.ns)
        .delete("gw", &Default::default())
        .await
        .unwrap();
    let gone = eventually(WAIT, || async {
        deployments
            .get_opt("gw-tollgate")
            .await
            .ok()
            .and_then(|d| d.is_none().then_some(()))
    })
    .await;
    assert!(gone.is_some(), "Deployment left behind:\n{}", ctl.log());
}

/// A Gateway whose provisioning fails (an admission policy refuses its Deployment) is
/// provisioned once the cause is gone, with no change to any object the controller watches: a
/// failed provisioning is retried on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_provisioning_is_retried_without_another_change() {
    let env = TestEnv::new("reprov").await;
    let policy = refuse_deployments(&env).await;
    env.gateway("gw", &[("http", 80)]).await;
    let ctl = env.controller(
        "a",
        &["--provision=true", "--proxy-image", "example/proxy:test"],
    );
    ctl.wait_ready().await;
    wait_refused(&ctl).await;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
    assert!(deployments.get_opt("gw-tollgate").await.unwrap().is_none());

    // Nothing the controller watches changes: only its own retry can provision now.
    allow_deployments(&env, &policy).await;
    let provisioned = eventually(WAIT, || async {
        deployments.get_opt("gw-tollgate").await.ok()?
    })
    .await;
    assert!(
        provisioned.is_some(),
        "not provisioned after the policy went:\n{}",
        ctl.log()
    );
}

/// The same, while EndpointSlice changes keep coming: the endpoints passes they cause do not
/// provision, and neither forget the failed provisioning nor keep pushing its retry back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_provisioning_is_retried_during_endpoint_churn() {
    let env = TestEnv::new("reprovchurn").await;
    let policy = refuse_deployments(&env).await;
    env.gateway("gw", &[("http", 80)]).await;
    env.service("echo", 80, "10.2.0.2").await;
    env.route("r0", json!([{"name": "gw"}]), "echo", 80).await;
    let ctl = env.controller(
        "a",
        &[
            "--provision=true",
            "--proxy-image",
            "example/proxy:test",
            "--debounce-ms",
            "500",
        ],
    );
    ctl.wait_ready().await;
    wait_refused(&ctl).await;
    let churn = churn(&env, "echo");
    // A reconcile of the churn has run since the refused first one (an endpoints pass, which
    // does not provision, unless the owed provisioning made it a full one).
    let reconciles = || ctl.metric("tollgate_controller_reconciles_total", "");
    let passed = eventually(WAIT, || async { (reconciles() >= 2.0).then_some(()) }).await;
    assert!(
        passed.is_some(),
        "no reconcile of the churn:\n{}",
        ctl.log()
    );
    allow_deployments(&env, &policy).await;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
    let provisioned = eventually(WAIT, || async {
        deployments.get_opt("gw-tollgate").await.ok()?
    })
    .await;
    let updates = churn.stop().await;
    assert!(
        provisioned.is_some(),
        "not provisioned after the policy went, {updates} endpoint updates later:\n{}",
        ctl.log()
    );
}

/// An admission webhook that never answers (every Deployment write waits out its 10 s
/// timeout) and eight Gateways to provision: a route created meanwhile still gets its status
/// within a minute, where one pass over all eight would take 80 s before writing any status
/// (a provisioning pass stops starting work after its budget; the rest waits for the next).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_webhook_holds_back_no_route() {
    use base64::Engine as _;
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use kube::api::DeleteParams;
    let env = TestEnv::new("hangwebhook").await;
    // Accepts connections and never says a word (not even a TLS handshake).
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let listener = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            held.push(conn);
        }
    });
    let ca = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .cert
        .pem();
    let name = format!("tollgate-test-{}", env.ns);
    let _: ValidatingWebhookConfiguration = env
        .apply_cluster(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": "hang.tollgate.test",
                "clientConfig": {
                    "url": format!("https://127.0.0.1:{port}/"),
                    "caBundle": base64::engine::general_purpose::STANDARD.encode(ca),
                },
                "rules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                           "operations": ["CREATE", "UPDATE"], "resources": ["deployments"]}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": env.ns}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 10,
            }],
        }))
        .await;
    for i in 0..8 {
        env.gateway(&format!("gw{i}"), &[("http", 80)]).await;
    }
    env.service("echo", 80, "10.2.0.2").await;
    let ctl = env.controller(
        "a",
        &["--provision=true", "--proxy-image", "example/proxy:test"],
    );
    ctl.wait_ready().await;
    wait_refused(&ctl).await;
    env.route("r", json!([{"name": "gw0"}]), "echo", 80).await;
    let written = eventually(Duration::from_secs(60), || async {
        env.has_status("r").await.then_some(())
    })
    .await;
    Api::<ValidatingWebhookConfiguration>::all(env.client.clone())
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    listener.abort();
    assert!(
        written.is_some(),
        "no status for the route within 60 s while provisioning hung:\n{}",
        ctl.log()
    );
    // Once the webhook is gone, every Gateway is provisioned.
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
    let all = eventually(Duration::from_secs(90), || async {
        let n = deployments
            .list(&Default::default())
            .await
            .ok()?
            .items
            .len();
        (n == 8).then_some(())
    })
    .await;
    assert!(
        all.is_some(),
        "not every Gateway provisioned:\n{}",
        ctl.log()
    );
}

/// Refuses every Deployment created or updated in the test's namespace (a
/// ValidatingAdmissionPolicy and its binding, both named after the namespace); returns once
/// the API server enforces it, with the name to pass to [`allow_deployments`].
async fn refuse_deployments(env: &TestEnv) -> String {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    use kube::api::PostParams;
    let name = format!("tollgate-test-{}", env.ns);
    let _: ValidatingAdmissionPolicy = env
        .apply_cluster(json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["apps"], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["deployments"],
                }]},
                "validations": [{"expression": "false", "message": "no Deployments in this test namespace"}],
            },
        }))
        .await;
    let _: ValidatingAdmissionPolicyBinding = env
        .apply_cluster(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": env.ns,
                }}},
            },
        }))
        .await;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
    // The API server enforces a new policy after a moment: wait until a dry run is refused.
    let probe: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "spec": {
            "selector": {"matchLabels": {"app": "probe"}},
            "template": {"metadata": {"labels": {"app": "probe"}},
                         "spec": {"containers": [{"name": "c", "image": "example/probe"}]}},
        },
    }))
    .unwrap();
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let enforced = eventually(WAIT, || async {
        deployments
            .create(&dry, &probe)
            .await
            .is_err()
            .then_some(())
    })
    .await;
    assert!(
        enforced.is_some(),
        "the admission policy never refused a Deployment"
    );
    name
}

/// Removes what [`refuse_deployments`] made.
async fn allow_deployments(env: &TestEnv, name: &str) {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    use kube::api::DeleteParams;
    Api::<ValidatingAdmissionPolicyBinding>::all(env.client.clone())
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    Api::<ValidatingAdmissionPolicy>::all(env.client.clone())
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

/// Waits until the controller logs a refused provisioning.
async fn wait_refused(ctl: &ControllerProc) {
    let refused = eventually(WAIT, || async {
        ctl.log()
            .contains("provisioning failed; will retry")
            .then_some(())
    })
    .await;
    assert!(
        refused.is_some(),
        "provisioning was not refused:\n{}",
        ctl.log()
    );
}

/// Applies a changed EndpointSlice of `service` (its one address flipping between two) every
/// 100 ms until the returned flag is raised; the task returns how many updates it made.
fn churn(env: &TestEnv, service: &str) -> Churn {
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, client, ns) = (stop.clone(), env.client.clone(), env.ns.clone());
    let service = service.to_owned();
    let task = tokio::spawn(async move {
        let slices: Api<EndpointSlice> = Api::namespaced(client, &ns);
        let name = format!("{service}-churn");
        let mut updates = 0u32;
        while !flag.load(Ordering::SeqCst) {
            let ip = format!("10.2.0.{}", 3 + updates % 2);
            let slice: EndpointSlice = serde_json::from_value(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
                "addressType": "IPv4",
                "ports": [{"port": 80, "protocol": "TCP"}],
                "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
            }))
            .unwrap();
            let pp = kube::api::PatchParams::apply("churn").force();
            slices
                .patch(&name, &pp, &kube::api::Patch::Apply(&slice))
                .await
                .unwrap();
            updates += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        updates
    });
    Churn { stop, task }
}

/// A running [`churn`].
struct Churn {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<u32>,
}

impl Churn {
    /// Stops it, checking it was still going (what the test observed happened during the
    /// churn); returns how many updates it made.
    async fn stop(self) -> u32 {
        let churning = !self.task.is_finished();
        self.stop.store(true, Ordering::SeqCst);
        let updates = self.task.await.unwrap();
        assert!(churning, "the churn ended early (after {updates} updates)");
        updates
    }
}

/// `Programmed` of a Gateway: its status, or `None` before one is written.
fn programmed(g: &Gateway) -> Option<String> {
    g.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Programmed")
        .map(|c| c.status.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_serves_proxies_and_the_next_leader_takes_them_over() {
    let env = TestEnv::new("pushlead").await;
    env.gateway("gw", &[("http", k8s_support::free_port())])
        .await;
    env.service("echo", 80, "10.4.0.1").await;
    env.route("r", json!([{"name": "gw"}]), "echo", 80).await;
    let push = |port: u16| {
        (
            format!("127.0.0.1:{port}"),
            format!("https://localhost:{port}"),
        )
    };
    let (addr_a, url_a) = push(k8s_support::free_port());
    let (addr_b, url_b) = push(k8s_support::free_port());
    let mut a = env.controller("a", &["--push-addr", &addr_a, "--controller-url", &url_a]);
    a.wait_ready().await;
    eventually(WAIT, || async {
        (holder(&env).await? == "a").then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("a never led:\n{}", a.log()));
    let b = env.controller("b", &["--push-addr", &addr_b, "--controller-url", &url_b]);
    b.wait_ready().await;

    // A proxy that reaches the follower is turned away (503) and keeps trying: it never
    // streams, and the leader, which sees no proxy, does not call the Gateway Programmed.
    let proxy = k8s_support::SubscribedProxy::start(&env, &url_b, "gw").await;
    let streamed = eventually(Duration::from_secs(3), || async {
        proxy.subscription.status().connected().then_some(())
    })
    .await;
    assert!(
        streamed.is_none(),
        "a follower served a proxy:\n{}",
        b.log()
    );
    assert!(proxy.table().is_empty(), "{}", proxy.table());
    let g: Gateway = env.get("gw").await;
    assert_ne!(programmed(&g).as_deref(), Some("True"), "{:?}", g.status);
    assert!(
        b.log().contains("turns proxies away"),
        "the follower never said why:\n{}",
        b.log()
    );

    // The leader steps down: b leads, accepts the proxy, which gets the table, and b writes
    // Programmed=True from it.
    a.terminate();
    eventually(WAIT, || async {
        (holder(&env).await? == "b").then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("b never led:\n{}", b.log()));
    eventually(WAIT, || async {
        proxy.table().contains("10.4.0.1").then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("the proxy never got b's table:\n{}", b.log()));
    eventually(WAIT, || async {
        let g: Gateway = env.get("gw").await;
        (programmed(&g).as_deref() == Some("True")).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("b never programmed the Gateway:\n{}", b.log()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_carries_our_owner_from_creation_or_from_the_next_renewal() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use tollgate::k8s::leader::{Elector, LeaderConfig};
    let env = TestEnv::new("leaseowner").await;
    // Any object will do as the owner (no garbage collector runs on this cluster).
    let cm: ConfigMap = env
        .apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}))
        .await;
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "owner".into(),
        uid: cm.metadata.uid.clone().unwrap(),
        controller: None,
        block_owner_deletion: None,
    };
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    let owners = |l: Lease| -> Vec<String> {
        l.metadata
            .owner_references
            .into_iter()
            .flatten()
            .map(|o| o.uid)
            .collect()
    };
    let metrics = std::sync::Arc::new(tollgate::k8s::metrics::Metrics::new());
    let elector = |name: &str, owner: Option<OwnerReference>| {
        Elector::new(
            env.client.clone(),
            LeaderConfig {
                owner,
                ..LeaderConfig::new(&env.ns, name, "me")
            },
            metrics.clone(),
        )
    };

    // Created by us: owned from the start.
    let mut e = elector("created", Some(owner.clone()));
    e.tick().await;
    assert!(*e.subscribe().borrow(), "did not lead");
    assert_eq!(
        owners(leases.get("created").await.unwrap()),
        std::slice::from_ref(&owner.uid)
    );

    // Created without an owner (an older controller): the next renewal adds it, once.
    let mut old = elector("renewed", None);
    old.tick().await;
    assert!(owners(leases.get("renewed").await.unwrap()).is_empty());
    let mut e = elector("renewed", Some(owner.clone()));
    for _ in 0..2 {
        e.tick().await;
        assert_eq!(
            owners(leases.get("renewed").await.unwrap()),
            std::slice::from_ref(&owner.uid)
        );
    }
    assert!(*e.subscribe().borrow(), "did not keep leading");
}

/// A controller whose runtime is busy (a compile of thousands of routes holding a worker, as
/// on a loaded 2-core host) keeps renewing its Lease: the elector runs on a thread and a
/// connection of its own. The control shows the same elector as a task of the busy runtime,
/// as it was before: its Lease is not renewed while the runtime is blocked.
#[tokio::test(flavor = "current_thread")]
async fn a_busy_runtime_does_not_starve_lease_renewals() {
    use tollgate::k8s::leader::{self, Elector, LeaderConfig, LeaseClient};
    let env = TestEnv::new("leasebusy").await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    let metrics = Arc::new(tollgate::k8s::metrics::Metrics::new());
    let cfg = |name: &str| LeaderConfig {
        lease_duration: Duration::from_secs(4),
        renew_period: Duration::from_millis(500),
        renew_deadline: Duration::from_millis(1500),
        ..LeaderConfig::new(&env.ns, name, "me")
    };
    let renewed = |l: &Lease| {
        l.spec
            .as_ref()
            .and_then(|s| s.renew_time.clone())
            .expect("renewTime")
            .0
    };
    let block = Duration::from_secs(6);

    let running = leader::spawn(
        LeaseClient::Own(Box::new(k8s_support::config().await)),
        cfg("own-thread"),
        metrics.clone(),
    )
    .unwrap();
    let mut leading = running.leading.clone();
    tokio::time::timeout(Duration::from_secs(10), leading.wait_for(|l| *l))
        .await
        .expect("did not lead")
        .unwrap();
    // Blocks the runtime (this test's only thread) for longer than the Lease lasts.
    std::thread::sleep(block);
    let lease = leases.get("own-thread").await.unwrap();
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(renewed(&lease));
    assert!(
        age.as_secs_f64() < 2.0,
        "renewed {age:?} ago while the runtime was blocked"
    );
    assert!(*running.leading.borrow(), "stepped down");
    running.stop().await;

    // The control: an elector task of the blocked runtime.
    let mut task = Elector::new(env.client.clone(), cfg("same-runtime"), metrics);
    let task_leading = task.subscribe();
    task.tick().await;
    assert!(*task_leading.borrow(), "the control did not lead");
    let handle = tokio::spawn(async move { task.run().await });
    tokio::task::yield_now().await;
    std::thread::sleep(block);
    let lease = leases.get("same-runtime").await.unwrap();
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(renewed(&lease));
    assert!(
        age.as_secs_f64() >= 5.0,
        "the control renewed {age:?} ago: the blocked runtime still ran it"
    );
    handle.abort();
}

/// An elector on a 4 s Lease (500 ms rounds, 1.5 s deadline) whose requests go through
/// `relay`, after its first round, which it leads.
async fn leading_through(
    env: &TestEnv,
    relay: &k8s_support::Relay,
    name: &str,
) -> (
    tollgate::k8s::leader::Elector,
    tokio::sync::watch::Receiver<bool>,
) {
    use tollgate::k8s::leader::{Elector, LeaderConfig};
    let metrics = std::sync::Arc::new(tollgate::k8s::metrics::Metrics::new());
    let mut e = Elector::new(
        relay.client().await,
        LeaderConfig {
            lease_duration: Duration::from_secs(4),
            renew_period: Duration::from_millis(500),
            renew_deadline: Duration::from_millis(1500),
            ..LeaderConfig::new(&env.ns, name, "me")
        },
        metrics,
    );
    let leading = e.subscribe();
    e.tick().await;
    assert!(*leading.borrow(), "did not lead");
    (e, leading)
}

/// Rounds until `e` leads again (at most 10).
async fn leads_again(
    e: &mut tollgate::k8s::leader::Elector,
    leading: &tokio::sync::watch::Receiver<bool>,
) {
    for _ in 0..10 {
        e.tick().await;
        if *leading.borrow() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("did not lead again once requests were answered");
}

/// A leader whose requests stop being answered (a stalled connection, an API server that
/// hangs) steps down instead of waiting on the request and believing it leads after its Lease
/// ran out and another replica took it.
#[tokio::test]
async fn a_leader_whose_requests_hang_steps_down() {
    let env = TestEnv::new("leasehang").await;
    let relay = k8s_support::Relay::start().await;
    let (mut e, leading) = leading_through(&env, &relay, "hang").await;

    relay.freeze();
    // Each round gives up on its request; the one after the renew deadline steps down. A
    // round that waited on the request instead would hit this generous bound.
    let mut rounds = 0;
    while *leading.borrow() {
        rounds += 1;
        assert!(
            rounds <= 10,
            "still leading after {rounds} rounds without a renewal"
        );
        tokio::time::timeout(Duration::from_secs(60), e.tick())
            .await
            .expect("a lease round waited on a request that is never answered");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Requests answered again: it takes the Lease back (it still holds it by name), within a
    // few rounds however slow the API server is.
    relay.thaw();
    leads_again(&mut e, &leading).await;
}

/// A leader whose renewals fail at once (the API server refusing or down, each request an
/// error, not a wait) steps down once the renew deadline has passed since its last renewal,
/// however many rounds failed in between: a failed round is not a renewal. (Each failed round
/// used to restart the deadline, so such a leader led on after its Lease ran out, beside the
/// replica that took it.)
#[tokio::test]
async fn a_leader_whose_renewals_fail_fast_steps_down() {
    let env = TestEnv::new("leasecut").await;
    let relay = k8s_support::Relay::start().await;
    let (mut e, leading) = leading_through(&env, &relay, "cut").await;

    relay.cut();
    let cut = std::time::Instant::now();
    // Rounds every 500 ms for 5 s: past the 4 s Lease, by which another replica may lead.
    while cut.elapsed() < Duration::from_secs(5) && *leading.borrow() {
        e.tick().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        !*leading.borrow(),
        "still leading {:?} after its renewals began failing (Lease 4 s, deadline 1.5 s)",
        cut.elapsed()
    );

    relay.thaw();
    leads_again(&mut e, &leading).await;
}

/// Leadership lost while a reconcile waits on the API server: the leader's requests stop being
/// answered just as a change is reconciled; its lease round gives up and it steps down while
/// the reconcile's status write still waits. Once requests are answered again it leads again
/// and writes the route's status. (The controller used to hold the leadership channel's read
/// guard across the reconcile: the elector's send then blocked a runtime worker and the whole
/// process stopped for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_lost_during_a_reconcile_stops_nothing() {
    let env = TestEnv::new("leadlost").await;
    let (relay, ctl) = controller_behind_a_relay(&env, &[]).await;
    env.route("first", json!([{"name": "gw"}]), "echo", 80)
        .await;
    eventually(WAIT, || async {
        env.has_status("first").await.then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("no status for the first route:\n{}", ctl.log()));

    change_then_freeze(&env, &relay).await;
    let stepped_down = eventually(Duration::from_secs(60), || async {
        ctl.log().contains("leading=false").then_some(())
    })
    .await;
    assert!(stepped_down.is_some(), "never stepped down:\n{}", ctl.log());
    relay.thaw();
    let written = eventually(Duration::from_secs(60), || async {
        env.has_status("r").await.then_some(())
    })
    .await;
    assert!(
        written.is_some(),
        "no status for the route after requests were answered again:\n{}",
        ctl.log()
    );
}

/// A leader whose API server stops answering in the middle of a long status pass (300 routes
/// to write, each write given up after 2 s, 16 at a time) loses the Lease to a second replica
/// and abandons the pass: once its requests are answered again it writes nothing more as a
/// follower, while the new leader writes every status. (Before, the pass went on writing what
/// it had computed as leader, against the new leader's writes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_the_lease_mid_reconcile_stops_writing() {
    const ROUTES: usize = 300;
    let env = TestEnv::new("leadmid").await;
    let (relay, a) = controller_behind_a_relay(&env, &["--api-timeout-secs", "2"]).await;
    let b = env.controller("b", &[]);
    b.wait_ready().await;
    let names: Vec<String> = (0..ROUTES).map(|i| format!("r{i:03}")).collect();
    for chunk in names.chunks(30) {
        futures_util::future::join_all(
            chunk
                .iter()
                .map(|n| env.route(n, json!([{"name": "gw"}]), "echo", 80)),
        )
        .await;
    }
    // The changes have passed the relay; the pass that writes their statuses starts after
    // the 2 s quiet period, against a relay that no longer answers.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    relay.freeze();
    let stepped_down = eventually(Duration::from_secs(60), || async {
        a.log().contains("leading=false").then_some(())
    })
    .await;
    assert!(stepped_down.is_some(), "a never stepped down:\n{}", a.log());
    // Frozen until b has taken the Lease (a, still its holder by name, would take it back).
    let b_leads = eventually(Duration::from_secs(60), || async {
        b.log().contains("leading=true").then_some(())
    })
    .await;
    assert!(b_leads.is_some(), "b never took over:\n{}", b.log());
    relay.thaw();
    // The new leader writes every status...
    let routes: Api<HttpRoute> = Api::namespaced(env.client.clone(), &env.ns);
    let all = eventually(Duration::from_secs(90), || async {
        let list = routes.list(&Default::default()).await.ok()?;
        let done = list.items.iter().filter(|r| env.has_our_status(r)).count();
        (done == ROUTES).then_some(())
    })
    .await;
    assert!(all.is_some(), "not every route got a status:\n{}", b.log());
    // ...and the former leader, answered again, wrote none after it stepped down (a pass
    // that went on would have written the rest of its 300 within seconds of the thaw).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let log = a.log();
    let after = &log[log.find("leading=false").unwrap()..];
    assert!(
        !after.contains("status written"),
        "the former leader wrote statuses after it stepped down:\n{log}"
    );
    assert!(
        log.contains("leadership lost during a reconcile"),
        "the pass was not abandoned:\n{log}"
    );
}

/// SIGTERM while a reconcile waits on an API server that stopped answering (calls given up
/// only after 120 s here): the controller exits without waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_a_hung_reconcile() {
    let env = TestEnv::new("hungstop").await;
    let (relay, mut ctl) = controller_behind_a_relay(&env, &["--api-timeout-secs", "120"]).await;
    change_then_freeze(&env, &relay).await;
    // The reconcile of the change has begun and waits on the relay.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !env.has_status("r").await,
        "the status passed the frozen relay"
    );
    let exited = tokio::task::block_in_place(|| ctl.terminate_within(Duration::from_secs(30)));
    assert!(exited, "still running 30 s after SIGTERM:\n{}", ctl.log());
    assert!(ctl.log().contains("shutting down"), "{}", ctl.log());
    relay.thaw();
}

/// A Gateway `gw`, a Service `echo`, and a Ready controller (with `extra` arguments) whose
/// requests to the API server all go through a relay the test can freeze. Its quiet period
/// is 2 s, so that a change passes the relay well before the reconcile it starts.
async fn controller_behind_a_relay(
    env: &TestEnv,
    extra: &[&str],
) -> (k8s_support::Relay, ControllerProc) {
    env.gateway("gw", &[("http", 80)]).await;
    env.service("echo", 80, "10.2.0.2").await;
    let relay = k8s_support::Relay::start().await;
    let kubeconfig = relay.kubeconfig(&env.dir.join("relay.kubeconfig"));
    let mut args = vec![
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--debounce-ms",
        "2000",
    ];
    args.extend_from_slice(extra);
    let ctl = env.controller("a", &args);
    ctl.wait_ready().await;
    (relay, ctl)
}

/// Creates the route `r` (to `echo` through `gw`); the relay stops answering once the change
/// has passed it, before the reconcile that writes its status begins.
async fn change_then_freeze(env: &TestEnv, relay: &k8s_support::Relay) {
    env.route("r", json!([{"name": "gw"}]), "echo", 80).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    relay.freeze();
}
