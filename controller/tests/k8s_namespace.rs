//! The controller's own namespace (`--namespace`) on the real kube-apiserver: a missing one is
//! created and the controller leads in it; one it may not create stops it within seconds,
//! with a non-zero status and on stderr what to do (it used to retry its Lease every 2 s for
//! ever); one that exists but that it may neither read nor create changes nothing: it leads
//! there as before, asking for no new permission.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use serde_json::{Value, json};

use k8s_support::{TestEnv, eventually, free_port, kubeconfig_as};

const WAIT: Duration = Duration::from_secs(30);

/// The holder of the controller's Lease in `ns`.
async fn holder(env: &TestEnv, ns: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), ns);
    leases
        .get_opt("tollgate-controller")
        .await
        .ok()??
        .spec?
        .holder_identity
}

/// Read access to what the controller watches, and its Lease: what it needs to lead,
/// without `create` on namespaces. `namespaces` gets `namespace_verbs`.
fn rules(namespace_verbs: &[&str]) -> Value {
    let read = ["get", "list", "watch"];
    json!([
        {"apiGroups": ["gateway.networking.k8s.io", "gateway.networking.x-k8s.io", "tollgate.dev",
                       "discovery.k8s.io", "apiextensions.k8s.io"],
         "resources": ["*"], "verbs": read},
        {"apiGroups": [""], "resources": ["services", "secrets", "configmaps"], "verbs": read},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": namespace_verbs},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_namespace_is_created_and_the_controller_leads_in_it() {
    let env = TestEnv::new("nsnew").await;
    let ns = format!("{}-own", env.ns);
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    assert!(namespaces.get_opt(&ns).await.unwrap().is_none());
    let ctl = env.controller("a", &["--namespace", &ns]);
    let led = eventually(WAIT, || holder(&env, &ns)).await;
    assert_eq!(
        led.as_deref(),
        Some("a"),
        "no Lease held in {ns}:\n{}",
        ctl.log()
    );
    assert!(namespaces.get_opt(&ns).await.unwrap().is_some());
    assert!(
        ctl.log().contains("created our namespace"),
        "the creation was not logged:\n{}",
        ctl.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_that_may_not_be_created_stops_the_controller_with_advice() {
    let env = TestEnv::new("nsdeny").await;
    let user = format!("tollgate-test-{}", env.ns);
    // What the chart grants on namespaces: read, not create.
    env.grant(&user, &user, rules(&["get", "list", "watch"]))
        .await;
    let kubeconfig = kubeconfig_as(&env, &user);
    let ns = format!("{}-own", env.ns);
    let stderr = env.dir.join("nsdeny.stderr");
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "controller",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--namespace",
            &ns,
            "--id",
            "a",
            "--metrics-addr",
            &metrics,
            "--controller-name",
            &env.controller_name,
            "--provision=false",
        ])
        .env("RUST_LOG", "info,tollgate=debug")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = started.elapsed();
    let err = std::fs::read_to_string(&stderr).unwrap_or_default();
    let status = status.unwrap_or_else(|| panic!("still running after {took:?}:\n{err}"));
    assert!(!status.success(), "exited with {status}:\n{err}");
    assert!(took < Duration::from_secs(10), "exited after {took:?}");
    let advice = format!(
        "namespace \"{ns}\" does not exist and could not be created (forbidden): create it \
         with `kubectl create namespace {ns}`, or pass --namespace"
    );
    assert!(err.contains(&advice), "no advice on stderr:\n{err}");
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    assert!(namespaces.get_opt(&ns).await.unwrap().is_none());
}

/// A user that may list and watch namespaces but neither get nor create one (tighter than the
/// chart, which grants get): the check learns nothing and the controller goes on as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_namespace_that_may_not_be_read_changes_nothing() {
    let env = TestEnv::new("nsread").await;
    let user = format!("tollgate-test-{}", env.ns);
    env.grant(&user, &user, rules(&["list", "watch"])).await;
    let kubeconfig = kubeconfig_as(&env, &user);
    let ctl = env.controller("a", &["--kubeconfig", kubeconfig.to_str().unwrap()]);
    let led = eventually(WAIT, || holder(&env, &env.ns)).await;
    assert_eq!(
        led.as_deref(),
        Some("a"),
        "no Lease held in {}:\n{}",
        env.ns,
        ctl.log()
    );
    assert!(
        ctl.log().contains("may not read our namespace"),
        "{}",
        ctl.log()
    );
}
