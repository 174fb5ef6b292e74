//! The node agent against a real cluster (`e2e/cluster.sh up --full`): a Deployment of a
//! mapped image becomes Ready pods with IPs that answer from the host, with env and volumes
//! resolved and logs readable through the API server; a ClusterIP and a LoadBalancer Service reach them; an unmapped image is reported;
//! deleting the Deployment removes the processes and network namespaces; a pod slow to stop
//! holds up no other pod.
//!
//! Skips (passes with a message) without KUBECONFIG, as non-root, or when no Node
//! `tollgate-node` exists (a cluster started without `--full`), unless
//! `TOLLGATE_REQUIRE_FULL=1` (e2e/test-all.sh sets it after `up --full`): then a skip fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret, Service};
use kube::api::{DeleteParams, ListParams, LogParams, PostParams, PropagationPolicy};
use kube::{Api, Client, ResourceExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TIMEOUT: Duration = Duration::from_secs(60);

/// Why the test cannot run here: a skip, or a failure under `TOLLGATE_REQUIRE_FULL=1`.
fn skip(why: &str) -> Option<Client> {
    assert!(
        std::env::var_os("TOLLGATE_REQUIRE_FULL").is_none_or(|v| v != "1"),
        "TOLLGATE_REQUIRE_FULL=1 but {why}"
    );
    eprintln!("skipping: {why}");
    None
}

async fn client_or_skip() -> Option<Client> {
    if std::env::var_os("KUBECONFIG").is_none() {
        return skip("KUBECONFIG is not set (run e2e/cluster.sh up --full)");
    }
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(str::to_owned))
        .unwrap_or_default();
    if uid.split_whitespace().nth(1) != Some("0") {
        return skip("the node agent tests need root (network namespaces)");
    }
    let client = Client::try_default().await.expect("client");
    if Api::<Node>::all(client.clone())
        .get_opt("tollgate-node")
        .await
        .expect("get node")
        .is_none()
    {
        return skip("no Node tollgate-node (the cluster was started without --full)");
    }
    Some(client)
}

fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("valid object")
}

/// GET http://addr/ over a fresh connection; the body, or None on any failure.
async fn get(addr: String) -> Option<String> {
    get_path(&addr, "/").await
}

/// GET http://addr{path} over a fresh connection; the body of a 200, or None.
async fn get_path(addr: &str, path: &str) -> Option<String> {
    let fut = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .ok()?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.ok()?;
        let text = String::from_utf8_lossy(&out).into_owned();
        (text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.0 200"))
            .then(|| text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned())
    };
    tokio::time::timeout(Duration::from_secs(3), fut)
        .await
        .ok()
        .flatten()
}

/// Creates a namespace named `prefix-<random>` and waits for its default ServiceAccount (the
/// controller manager creates it; pods need it).
async fn fresh_namespace(client: &Client, prefix: &str) -> String {
    let ns = format!("{prefix}-{}", fastrand::u32(..));
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &obj(serde_json::json!({"metadata": {"name": ns}})),
        )
        .await
        .unwrap();
    let sas = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client.clone(), &ns);
    eventually("ServiceAccount default", || async {
        sas.get_opt("default").await.ok().flatten()
    })
    .await;
    ns
}

/// Polls `f` until it returns Some, failing after TIMEOUT with `what`.
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {TIMEOUT:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pid_of(p: &Pod) -> u32 {
    let id = p
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .container_id
        .clone()
        .unwrap();
    id.strip_prefix("process://").unwrap().parse().unwrap()
}

fn netns_list() -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn netns_name(p: &Pod) -> String {
    let id: String = p
        .uid()
        .unwrap()
        .chars()
        .filter(|c| c.is_ascii_hexdigit())
        .take(10)
        .collect();
    format!("tg-{id}")
}

#[tokio::test]
async fn deployment_services_and_teardown() {
    let Some(client) = client_or_skip().await else {
        return;
    };
    let ns = fresh_namespace(&client, "tg-node").await;
    let pp = PostParams::default();
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    secrets
        .create(&pp, &obj(serde_json::json!({"metadata": {"name": "s"}, "stringData": {"password": "hunter2"}})))
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(
            &pp,
            &obj(serde_json::json!({"metadata": {"name": "c"}, "data": {"mode": "fast"}})),
        )
        .await
        .unwrap();

    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);
    deployments
        .create(
            &pp,
            &obj(serde_json::json!({
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {
                            "terminationGracePeriodSeconds": 5,
                            "containers": [{
                                "name": "web",
                                "image": "tollgate.test/http:latest",
                                "ports": [{"name": "http", "containerPort": 8080}],
                                "env": [
                                    {"name": "PORT", "value": "8080"},
                                    {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "s", "key": "password"}}},
                                    {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "mode"}}},
                                    {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                                    {"name": "GREETING", "value": "mode=$(MODE)"}
                                ],
                                "volumeMounts": [{"name": "secret", "mountPath": "/etc/tg-test-secret", "readOnly": true}],
                                "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}
                            }],
                            "volumes": [{"name": "secret", "secret": {"secretName": "s"}}]
                        }
                    }
                }
            })),
        )
        .await
        .unwrap();

    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let lp = ListParams::default().labels("app=web");
    let running: Vec<Pod> = eventually("2 Ready pods with IPs", || async {
        let list = pods.list(&lp).await.ok()?;
        let ok: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| ready(p) && p.metadata.deletion_timestamp.is_none())
            .collect();
        (ok.len() == 2
            && ok
                .iter()
                .all(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some()))
        .then_some(ok)
    })
    .await;

    for p in &running {
        let ip = p.status.as_ref().unwrap().pod_ip.clone().unwrap();
        assert!(ip.starts_with("10.244.0."), "pod IP {ip}");
        assert_eq!(
            p.spec.as_ref().unwrap().node_name.as_deref(),
            Some("tollgate-node")
        );
        let body = get(format!("{ip}:8080")).await.expect("GET pod IP");
        assert_eq!(body, format!("hello from {}\n", p.name_any()));
        // The process sees the resolved environment and the mounted Secret.
        let pid = pid_of(p);
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let env: BTreeMap<String, String> = environ
            .split(|b| *b == 0)
            .filter_map(|kv| {
                String::from_utf8_lossy(kv)
                    .split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
            })
            .collect();
        assert_eq!(env.get("PASSWORD").map(String::as_str), Some("hunter2"));
        assert_eq!(env.get("MODE").map(String::as_str), Some("fast"));
        assert_eq!(env.get("GREETING").map(String::as_str), Some("mode=fast"));
        assert_eq!(env.get("MY_IP"), Some(&ip));
        assert_eq!(
            env.get("KUBERNETES_SERVICE_HOST").map(String::as_str),
            Some("10.96.0.1")
        );
        let out = std::process::Command::new("nsenter")
            .args([
                "-t",
                &pid.to_string(),
                "-m",
                "cat",
                "/etc/tg-test-secret/password",
            ])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hunter2");
        assert!(netns_list().contains(&netns_name(p)));
        // `kubectl logs`: the API server reads the log through the agent's kubelet endpoint.
        let log = pods
            .logs(&p.name_any(), &LogParams::default())
            .await
            .unwrap();
        assert_eq!(log, "listening on 0.0.0.0:8080\n");
    }

    let services = Api::<Service>::namespaced(client.clone(), &ns);
    let svc = |name: &str, kind: &str, port: u16| {
        obj::<Service>(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"type": kind, "selector": {"app": "web"}, "ports": [{"name": "http", "port": port, "targetPort": "http"}]}
        }))
    };
    let cip = services
        .create(&pp, &svc("web", "ClusterIP", 80))
        .await
        .unwrap();
    let cluster_ip = cip.spec.unwrap().cluster_ip.unwrap();
    let body = eventually("the ClusterIP answers", || get(format!("{cluster_ip}:80"))).await;
    assert!(body.starts_with("hello from web-"), "{body}");

    services
        .create(&pp, &svc("web-lb", "LoadBalancer", 8090))
        .await
        .unwrap();
    let lb_ip = eventually("status.loadBalancer.ingress", || async {
        let s = services.get("web-lb").await.ok()?;
        s.status?.load_balancer?.ingress?.first()?.ip.clone()
    })
    .await;
    assert!(
        lb_ip.starts_with("127.0.1."),
        "LoadBalancer address {lb_ip}"
    );
    let body = eventually("the LoadBalancer answers", || get(format!("{lb_ip}:8090"))).await;
    assert!(body.starts_with("hello from web-"), "{body}");

    // An image nobody mapped is reported, not run.
    pods.create(
        &pp,
        &obj(serde_json::json!({
            "metadata": {"name": "unmapped"},
            "spec": {"containers": [{"name": "c", "image": "example.invalid/nothing:1"}]}
        })),
    )
    .await
    .unwrap();
    let reason = eventually("ImageNotMapped on the unmapped pod", || async {
        let p = pods.get("unmapped").await.ok()?;
        let st = p.status?;
        let w = st.container_statuses?.first()?.state.clone()?.waiting?;
        Some((st.reason?, w.reason?, w.message?))
    })
    .await;
    assert_eq!(reason.0, "ImageNotMapped");
    assert_eq!(reason.1, "ImageNotMapped");
    assert!(
        reason.2.contains("example.invalid/nothing:1"),
        "{}",
        reason.2
    );

    // One pod going away leaves the other's mounts alone (they share host mount points).
    pods.delete(&running[0].name_any(), &DeleteParams::default())
        .await
        .unwrap();
    let first = netns_name(&running[0]);
    eventually("the first pod's namespace to be deleted", || {
        let first = first.clone();
        async move { (!netns_list().contains(&first)).then_some(()) }
    })
    .await;
    let pid = pid_of(&running[1]).to_string();
    for file in [
        "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "/etc/tg-test-secret/password",
    ] {
        let out = std::process::Command::new("nsenter")
            .args(["-t", &pid, "-m", "cat", file])
            .output()
            .unwrap();
        assert!(
            out.status.success() && !out.stdout.is_empty(),
            "{file} vanished from the surviving pod"
        );
    }

    // Deleting the Deployment (foreground: the pods go first) stops processes and namespaces.
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        ..Default::default()
    };
    deployments.delete("web", &dp).await.unwrap();
    eventually("the pods to be gone", || async {
        pods.list(&lp)
            .await
            .ok()
            .filter(|l| l.items.is_empty())
            .map(|_| ())
    })
    .await;
    for p in &running {
        let name = netns_name(p);
        eventually("the network namespace to be deleted", || {
            let name = name.clone();
            async move { (!netns_list().contains(&name)).then_some(()) }
        })
        .await;
        let pid = pid_of(p);
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} still runs"
        );
    }
    let none = get(format!("{cluster_ip}:80")).await;
    assert!(
        none.is_none(),
        "the ClusterIP still answers without endpoints: {none:?}"
    );

    Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
}

/// What the kubelet does and the conformance suite relies on: a pod whose Secret does not
/// exist yet waits in CreateContainerConfigError and starts once the Secret is created; a
/// volume mounted over a directory above the agent's state dir (the suite's CoreDNS mounts
/// its ConfigMap at /root) does not hide the pod's other volumes.
#[tokio::test]
async fn late_secret_and_mount_above_the_state_dir() {
    let Some(client) = client_or_skip().await else {
        return;
    };
    let ns = fresh_namespace(&client, "tg-node-late").await;
    let pp = PostParams::default();
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(
            &pp,
            &obj(serde_json::json!({"metadata": {"name": "conf"}, "data": {"conf.txt": "from the configmap"}})),
        )
        .await
        .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    pods.create(
        &pp,
        &obj(serde_json::json!({
            "metadata": {"name": "late"},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "files",
                    "image": "tollgate.test/python-http",
                    "args": ["8080", "--directory", "/"],
                    "volumeMounts": [
                        {"name": "conf", "mountPath": "/root"},
                        {"name": "late", "mountPath": "/etc/tg-test-late"}
                    ],
                    "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}
                }],
                "volumes": [
                    {"name": "conf", "configMap": {"name": "conf"}},
                    {"name": "late", "secret": {"secretName": "late"}}
                ]
            }
        })),
    )
    .await
    .unwrap();

    let waiting = eventually(
        "CreateContainerConfigError for the missing Secret",
        || async {
            let p = pods.get("late").await.ok()?;
            let w = p
                .status?
                .container_statuses?
                .first()?
                .state
                .clone()?
                .waiting?;
            (w.reason.as_deref() == Some("CreateContainerConfigError")).then_some(w)
        },
    )
    .await;
    // The namespace's name holds "late" too: the message must name the Secret itself.
    assert!(
        waiting.message.as_deref().unwrap_or("").contains("late"),
        "{waiting:?}"
    );
    assert!(
        waiting
            .message
            .as_deref()
            .unwrap_or("")
            .contains(&format!("secret {ns}/late not found")),
        "{waiting:?}"
    );

    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(
            &pp,
            &obj(serde_json::json!({"metadata": {"name": "late"}, "stringData": {"value": "arrived"}})),
        )
        .await
        .unwrap();
    let ip = eventually("the pod Ready once its Secret exists", || async {
        let p = pods.get("late").await.ok()?;
        ready(&p).then(|| p.status?.pod_ip).flatten()
    })
    .await;
    let addr = format!("{ip}:8080");
    let fetch = |path: &'static str| get_path(&addr, path);
    assert_eq!(
        fetch("/etc/tg-test-late/value").await.as_deref(),
        Some("arrived")
    );
    assert_eq!(
        fetch("/root/conf.txt").await.as_deref(),
        Some("from the configmap")
    );
    assert!(
        fetch("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
            .await
            .is_some_and(|n| n == ns),
        "the service-account volume is mounted too"
    );

    Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
}

/// A pod that ignores SIGTERM keeps its whole grace period, and meanwhile the agent goes on
/// with every other pod (as a kubelet's per-pod workers do): a pod created after the slow one
/// was deleted runs while the slow one is still being stopped.
#[tokio::test]
async fn a_pod_slow_to_stop_holds_up_no_other_pod() {
    let Some(client) = client_or_skip().await else {
        return;
    };
    let ns = fresh_namespace(&client, "tg-node-slow").await;
    let pp = PostParams::default();
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    // The image maps to /bin/sh (e2e/full.sh); `command` replaces the mapping's entrypoint.
    let pod = |name: &str, grace: u32, script: &str| {
        obj::<Pod>(serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": grace,
                "containers": [{
                    "name": "sh",
                    "image": "tollgate.test/sh",
                    "command": ["sh", "-c", script],
                }],
            },
        }))
    };
    pods.create(
        &pp,
        &pod("stubborn", 30, "trap '' TERM; while :; do sleep 1; done"),
    )
    .await
    .unwrap();
    eventually("the stubborn pod Ready", || async {
        ready(&pods.get("stubborn").await.ok()?).then_some(())
    })
    .await;
    pods.delete("stubborn", &DeleteParams::default())
        .await
        .unwrap();

    pods.create(&pp, &pod("next", 1, "exec sleep 1000"))
        .await
        .unwrap();
    eventually("the next pod Ready", || async {
        ready(&pods.get("next").await.ok()?).then_some(())
    })
    .await;
    let stubborn = pods.get_opt("stubborn").await.unwrap();
    assert!(
        stubborn.is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
        "the next pod ran only after the stubborn one was gone"
    );

    Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
}
