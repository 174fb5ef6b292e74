//! How GitOps tools read RateLimitPolicy and AuthPolicy status, on live objects of the real
//! kube-apiserver: kstatus (`status.Compute` of sigs.k8s.io/cli-utils, which Flux's `wait`
//! and health checks use) through e2e/kstatus.sh's `kstatus-check`, and the Argo CD health
//! check the chart ships (charts/tollgate/argocd/health-policy.lua) through a real Lua.
//!
//! Current / Healthy: accepted (enforced, overridden, or nothing served under the targets
//! yet); InProgress / Progressing: proxies not yet running it, or a spec change the
//! controller has not observed; Failed / Degraded: Accepted=False (invalid CEL, target not
//! found, conflicted).
//!
//! With `TOLLGATE_CAPTURE_ARGOCD=DIR` the objects checked here are also written to DIR as
//! YAML (namespace renamed `shop`, managedFields dropped): that is how the samples of
//! charts/tollgate/argocd/testdata were captured.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod argocd_support;
mod k8s_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Resource};
use serde_json::{Value, json};
use tollgate::crds::{AuthPolicy, RateLimitPolicy};

use k8s_support::{
    ControllerProc, SubscribedProxy, TestEnv, eventually, free_port, kubeconfig, workspace,
};

const WAIT: Duration = Duration::from_secs(30);
const RLP: &str = "tollgate.dev/v1alpha1/ratelimitpolicies";
const AP: &str = "tollgate.dev/v1alpha1/authpolicies";

/// `kstatus-check`, built (or found in ~/.cache/tollgate/bin) by `e2e/kstatus.sh path`. A
/// failure to build fails the test.
fn checker() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let out = Command::new(workspace().join("e2e/kstatus.sh"))
            .arg("path")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "e2e/kstatus.sh path failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        assert!(path.is_file(), "e2e/kstatus.sh printed {stdout:?}");
        path
    })
}

/// Runs `kstatus-check` until the object's kstatus is `want` (or `timeout`); returns its
/// output, or panics with it (and `ctx`) when `want` was not reached.
async fn kstatus(
    env: &TestEnv,
    resource: &str,
    name: &str,
    want: &str,
    timeout: Duration,
    ctx: &dyn Fn() -> String,
) -> String {
    let bin = checker();
    let args: Vec<String> = [
        "--kubeconfig",
        kubeconfig().to_str().unwrap(),
        "--resource",
        resource,
        "--namespace",
        &env.ns,
        "--name",
        name,
        "--want",
        want,
        "--timeout",
        &format!("{}ms", timeout.as_millis()),
        "--interval",
        "100ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = tokio::task::spawn_blocking(move || Command::new(bin).args(&args).output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kstatus of {resource} {name}: not {want} ({}):\n{stdout}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        ctx()
    );
    stdout
}

/// The line `kstatus-check` printed for the status it ended on.
fn last_status(out: &str) -> &str {
    out.lines()
        .rev()
        .find(|l| l.starts_with("status="))
        .unwrap_or_default()
}

fn api<K: Resource<DynamicType = ()>>(env: &TestEnv) -> Api<DynamicObject> {
    Api::namespaced_with(env.client.clone(), &env.ns, &ApiResource::erase::<K>(&()))
}

/// The object as the API server returns it (no round trip through our Rust types).
async fn live<K: Resource<DynamicType = ()>>(env: &TestEnv, name: &str) -> Value {
    serde_json::to_value(api::<K>(env).get(name).await.unwrap()).unwrap()
}

/// The live object once the controller has written status for its current generation.
async fn observed<K: Resource<DynamicType = ()>>(
    env: &TestEnv,
    name: &str,
    ctl: &ControllerProc,
) -> Value {
    eventually(WAIT, || async {
        let v = live::<K>(env, name).await;
        let generation = v["metadata"]["generation"].as_i64();
        let observed = v["status"]["observedGeneration"].as_i64();
        (generation.is_some() && generation == observed).then_some(v)
    })
    .await
    .unwrap_or_else(|| panic!("{name}: no status for its generation:\n{}", ctl.log()))
}

/// Argo CD's verdict on `obj`, checked against `want` and a fragment of the message; the
/// object is captured as sample `sample` when asked to (see the module doc).
fn argo(env: &TestEnv, obj: &Value, sample: &str, want: &str, fragment: &str) {
    capture(env, obj, sample);
    let (status, message) = argocd_support::health(&argocd_support::policy_script(), obj);
    assert_eq!(
        (status.as_str(), message.contains(fragment)),
        (want, true),
        "Argo CD health of {sample}: {status}: {message:?} (want {want}, {fragment:?})"
    );
}

fn capture(env: &TestEnv, obj: &Value, sample: &str) {
    let Some(dir) = std::env::var_os("TOLLGATE_CAPTURE_ARGOCD") else {
        return;
    };
    let mut obj = obj.clone();
    let meta = obj["metadata"].as_object_mut().unwrap();
    for k in ["managedFields", "uid", "resourceVersion"] {
        meta.remove(k);
    }
    let text = serde_yaml_ng::to_string(&obj)
        .unwrap()
        .replace(&env.ns, "shop");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(Path::new(&dir).join(format!("{sample}.yaml")), text).unwrap();
}

fn target(kind: &str, name: &str) -> Value {
    json!([{"group": "gateway.networking.k8s.io", "kind": kind, "name": name}])
}

fn limit(n: u32) -> Value {
    json!({"rates": [{"limit": n, "window": "1s"}], "counters": [{"expression": "source.address"}]})
}

async fn rlp(env: &TestEnv, name: &str, spec: Value) {
    env.apply::<RateLimitPolicy>(json!({
        "apiVersion": "tollgate.dev/v1alpha1", "kind": "RateLimitPolicy",
        "metadata": {"name": name}, "spec": spec,
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_policies_read_as_kstatus_and_argo_cd_expect() {
    let env = TestEnv::new("kstatus").await;
    env.gateway("gw", &[("http", 80)]).await;
    env.gateway("idle", &[("http", 81)]).await; // no route: nothing to enforce on
    env.gateway("layered", &[("http", 82)]).await;
    env.service("echo", 8080, "10.5.0.1").await;
    env.route("shop", json!([{"name": "gw"}]), "echo", 8080)
        .await;
    env.route("inner", json!([{"name": "layered"}]), "echo", 8080)
        .await;
    let limits = |name: &str, n: u32| json!({ name: limit(n) });
    rlp(
        &env,
        "good",
        json!({"targetRefs": target("HTTPRoute", "shop"), "limits": limits("per-ip", 10)}),
    )
    .await;
    rlp(
        &env,
        "late",
        json!({"targetRefs": target("HTTPRoute", "shop"), "limits": limits("other", 5)}),
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
        json!({"targetRefs": target("HTTPRoute", "no-such-route"), "limits": limits("a", 1)}),
    )
    .await;
    rlp(
        &env,
        "idle",
        json!({"targetRefs": target("Gateway", "idle"), "limits": limits("a", 1)}),
    )
    .await;
    // Atomic Gateway defaults, replaced on the Gateway's only route by the route's own.
    rlp(
        &env,
        "outvoted",
        json!({"targetRefs": target("Gateway", "layered"), "limits": limits("gw", 100)}),
    )
    .await;
    rlp(
        &env,
        "specific",
        json!({"targetRefs": target("HTTPRoute", "inner"), "limits": limits("route", 3)}),
    )
    .await;

    // Before any controller has seen it, a policy has only the CRD's default status
    // (observedGeneration 0): Argo CD waits.
    let fresh = live::<RateLimitPolicy>(&env, "good").await;
    assert_eq!(fresh["status"], json!({"observedGeneration": 0}), "{fresh}");
    argo(
        &env,
        &fresh,
        "progressing-no-status",
        "Progressing",
        "report status",
    );

    let mut ctl = env.controller("a", &[]);
    ctl.wait_ready().await;

    // [policy, kstatus, Argo CD status, fragment of Argo CD's message, sample]
    #[rustfmt::skip]
    let cases = [
        ["good", "Current", "Healthy", "is enforced", "healthy-enforced"],
        ["specific", "Current", "Healthy", "is enforced", "healthy-route-over-gateway"],
        ["outvoted", "Current", "Healthy", "not in effect (Overridden)", "healthy-overridden"],
        ["idle", "Current", "Healthy", "not in effect (Unknown)", "healthy-nothing-served"],
        ["bad-cel", "Failed", "Degraded", "Invalid: ", "degraded-invalid-cel"],
        ["lost", "Failed", "Degraded", "TargetNotFound: ", "degraded-target-not-found"],
        ["late", "Failed", "Degraded", "Conflicted: ", "degraded-conflicted"],
    ];
    for [name, ks, health, fragment, sample] in cases {
        let obj = observed::<RateLimitPolicy>(&env, name, &ctl).await;
        let out = kstatus(&env, RLP, name, ks, WAIT, &|| ctl.log()).await;
        argo(&env, &obj, sample, health, fragment);
        if ks == "Failed" {
            // kstatus carries the Stalled message, which is the Accepted=False message.
            let accepted = obj["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == "Accepted")
                .unwrap();
            let head = accepted["message"].as_str().unwrap().split(':').next();
            assert!(last_status(&out).contains(head.unwrap()), "{out}");
        }
    }

    // A spec change the controller has not observed (it is stopped): InProgress/Progressing.
    ctl.terminate();
    rlp(
        &env,
        "good",
        json!({"targetRefs": target("HTTPRoute", "shop"), "limits": limits("per-ip", 20)}),
    )
    .await;
    let out = kstatus(&env, RLP, "good", "InProgress", WAIT, &|| ctl.log()).await;
    assert!(
        last_status(&out).contains("generation is 2, but latest observed generation is 1"),
        "{out}"
    );
    let stale = live::<RateLimitPolicy>(&env, "good").await;
    argo(
        &env,
        &stale,
        "progressing-generation",
        "Progressing",
        "observe generation 2",
    );

    // A controller again: the change is observed, Current/Healthy again.
    let ctl = env.controller("b", &[]);
    ctl.wait_ready().await;
    let obj = observed::<RateLimitPolicy>(&env, "good", &ctl).await;
    kstatus(&env, RLP, "good", "Current", WAIT, &|| ctl.log()).await;
    argo(
        &env,
        &obj,
        "healthy-enforced-generation-2",
        "Healthy",
        "is enforced",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auth_policy_is_in_progress_until_a_proxy_runs_it() {
    let env = TestEnv::new("kstatus-push").await;
    let listener = free_port();
    env.gateway("gw", &[("http", listener)]).await;
    env.service("echo", 80, "10.6.0.1").await;
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
        "metadata": {"name": "partner-a",
                     "labels": {"app": "shop", "tollgate.dev/credential": "true"}},
        "stringData": {"api_key": "key-of-partner-a"},
    }))
    .await;
    let push_port = free_port();
    let push_addr = format!("127.0.0.1:{push_port}");
    let url = format!("https://localhost:{push_port}");
    let ctl = env.controller("a", &["--push-addr", &push_addr, "--controller-url", &url]);
    ctl.wait_ready().await;
    let log = || ctl.log();

    // Accepted, but no proxy of the Gateway runs it: Reconciling=True. (Read once the
    // controller has written its status: before, kstatus says InProgress too, for the
    // generation nobody observed yet.)
    let waiting = observed::<AuthPolicy>(&env, "keys", &ctl).await;
    let out = kstatus(&env, AP, "keys", "InProgress", WAIT, &log).await;
    assert!(last_status(&out).contains("waiting for proxies"), "{out}");
    argo(
        &env,
        &waiting,
        "progressing-waiting-for-proxies",
        "Progressing",
        "WaitingForProxies: ",
    );

    // A proxy subscribes with the certificate the controller issued and runs the table.
    let sub = SubscribedProxy::start(&env, &url, "gw").await;
    kstatus(&env, AP, "keys", "Current", WAIT, &log).await;
    let enforced = live::<AuthPolicy>(&env, "keys").await;
    argo(
        &env,
        &enforced,
        "healthy-auth-enforced",
        "Healthy",
        "AuthPolicy is enforced",
    );
    sub.proxy.shutdown().await;
}

/// The manifests examples/gitops/app holds (what the Argo CD Application and the Flux
/// Kustomization sync), applied as those tools would into this test's namespace, with the
/// test's GatewayClass: accepted by the API server, and their policies Current and Healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gitops_example_syncs_to_current_and_healthy_policies() {
    let env = TestEnv::new("kstatus-gitops").await;
    let dir = workspace().join("examples/gitops/app");
    let mut policies = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let mut obj: Value = serde::Deserialize::deserialize(doc).unwrap();
            if obj.is_null() {
                continue;
            }
            let kind = obj["kind"].as_str().unwrap().to_owned();
            // The namespace is the test's; the GatewayClass is the test's (the chart's in a
            // cluster).
            if kind == "Namespace" || kind == "GatewayClass" {
                continue;
            }
            if kind == "Gateway" {
                obj["spec"]["gatewayClassName"] = json!(env.class);
            }
            assert!(
                obj["metadata"].get("namespace").is_none(),
                "{}: {kind} names a namespace; the GitOps tool sets it",
                file.display()
            );
            obj["metadata"]["namespace"] = json!(env.ns);
            let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
            if kind.ends_with("Policy") {
                policies.push((kind.clone(), name.clone()));
            }
            let (group, version) = match obj["apiVersion"].as_str().unwrap().split_once('/') {
                Some((g, v)) => (g.to_owned(), v.to_owned()),
                None => (
                    String::new(),
                    obj["apiVersion"].as_str().unwrap().to_owned(),
                ),
            };
            let gvk = GroupVersionKind::gvk(&group, &version, &kind);
            let (ar, _) = kube::discovery::pinned_kind(&env.client, &gvk)
                .await
                .unwrap();
            Api::<DynamicObject>::namespaced_with(env.client.clone(), &env.ns, &ar)
                .patch(
                    &name,
                    &PatchParams::apply("gitops").force(),
                    &Patch::Apply(obj),
                )
                .await
                .unwrap_or_else(|e| panic!("{}: applying {kind} {name}: {e}", file.display()));
        }
    }
    assert!(
        policies.iter().any(|(k, _)| k == "RateLimitPolicy")
            && policies.iter().any(|(k, _)| k == "AuthPolicy"),
        "{policies:?}"
    );

    let ctl = env.controller("a", &[]);
    ctl.wait_ready().await;
    let log = || ctl.log();
    for (kind, name) in &policies {
        let (resource, obj) = if kind == "RateLimitPolicy" {
            (RLP, observed::<RateLimitPolicy>(&env, name, &ctl).await)
        } else {
            (AP, observed::<AuthPolicy>(&env, name, &ctl).await)
        };
        kstatus(&env, resource, name, "Current", WAIT, &log).await;
        let (status, message) = argocd_support::health(&argocd_support::policy_script(), &obj);
        assert_eq!(status, "Healthy", "{kind} {name}: {message}\n{}", ctl.log());
        assert!(message.contains("is enforced"), "{kind} {name}: {message}");
    }
}

/// kstatus reads an object with neither `status.observedGeneration` nor Reconciling/Stalled
/// conditions as Current, so a policy no controller has seen yet (just applied, or the
/// controller down) passes Flux's `wait` at once. The fix is in the CRDs: a schema default
/// `status: {observedGeneration: 0}` makes the API server serve a fresh policy with
/// observedGeneration 0 < generation 1, which kstatus reads as InProgress until the
/// controller writes status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_no_controller_has_seen_is_in_progress() {
    let env = TestEnv::new("kstatus-fresh").await;
    rlp(
        &env,
        "fresh",
        json!({"targetRefs": target("Gateway", "gw"), "limits": {"a": limit(1)}}),
    )
    .await;
    kstatus(
        &env,
        RLP,
        "fresh",
        "InProgress",
        Duration::from_secs(3),
        &String::new,
    )
    .await;
}
