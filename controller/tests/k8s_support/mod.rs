//! Helpers for tests against the real kube-apiserver of `e2e/cluster.sh`: bring the cluster
//! up once per test binary (a failure to come up fails the test, with the script's output),
//! a client from its kubeconfig, a fresh namespace and unique GatewayClass/controller names per
//! test, server-side apply of JSON objects, and the `tollgate controller` binary as a child
//! process with its own metrics port, killed on drop.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Debug;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Runs `e2e/cluster.sh up` once per test binary and returns the kubeconfig path.
pub fn kubeconfig() -> &'static Path {
    static KUBECONFIG: OnceLock<PathBuf> = OnceLock::new();
    KUBECONFIG.get_or_init(|| {
        let script = workspace().join("e2e/cluster.sh");
        let out = Command::new(&script).arg("up").output().unwrap();
        assert!(
            out.status.success(),
            "e2e/cluster.sh up failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let env = Command::new(&script).arg("env").output().unwrap();
        let text = String::from_utf8_lossy(&env.stdout);
        let path = text
            .lines()
            .find_map(|l| l.strip_prefix("export KUBECONFIG="))
            .unwrap_or_else(|| panic!("no KUBECONFIG in `cluster.sh env`: {text}"))
            .trim_matches(['"', '\''])
            .to_owned();
        PathBuf::from(path)
    })
}

/// A client for the test cluster.
pub async fn client() -> Client {
    Client::try_from(config().await).unwrap()
}

/// The client configuration of the test cluster.
pub async fn config() -> kube::Config {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig()).unwrap();
    kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap()
}

/// A random lowercase suffix.
pub fn suffix() -> String {
    use std::hash::{BuildHasher, RandomState};
    let n = RandomState::new().hash_one((Instant::now(), std::thread::current().id()));
    format!("{:08x}", n as u32)
}

/// One test's corner of the cluster.
pub struct TestEnv {
    pub client: Client,
    /// A fresh namespace.
    pub ns: String,
    /// A GatewayClass name no other test uses (created by [`TestEnv::new`]).
    pub class: String,
    /// The controllerName of that class, owned by this test's controllers.
    pub controller_name: String,
    /// A scratch directory of the test (logs, files it writes).
    pub dir: PathBuf,
}

impl TestEnv {
    /// Creates the namespace and the GatewayClass.
    pub async fn new(name: &str) -> Self {
        kubeconfig();
        let client = client().await;
        let s = suffix();
        let ns = format!("{name}-{s}");
        let env = Self {
            client,
            class: format!("tg-{name}-{s}"),
            controller_name: format!("tollgate.dev/test-{name}-{s}"),
            dir: std::env::temp_dir().join(format!("tollgate-k8s-{ns}")),
            ns,
        };
        std::fs::create_dir_all(&env.dir).unwrap();
        env.apply_cluster::<k8s_openapi::api::core::v1::Namespace>(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": env.ns},
        }))
        .await;
        env.apply_cluster::<gateway_types::gatewayclasses::GatewayClass>(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": env.class},
            "spec": {"controllerName": env.controller_name},
        }))
        .await;
        env
    }

    /// Server-side applies a namespaced object into the test namespace (unless it names one).
    pub async fn apply<K>(&self, mut obj: Value) -> K
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug,
    {
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or(&self.ns)
            .to_owned();
        obj["metadata"]["namespace"] = json!(ns);
        let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
        let api: Api<K> = Api::namespaced(self.client.clone(), &ns);
        api.patch(
            &name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(obj),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {ns}/{name}: {e}"))
    }

    /// Server-side applies a cluster-scoped object.
    pub async fn apply_cluster<K>(&self, obj: Value) -> K
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
            + Clone
            + DeserializeOwned
            + Debug,
    {
        let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
        let api: Api<K> = Api::all(self.client.clone());
        api.patch(
            &name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(obj),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {name}: {e}"))
    }

    /// Reads a namespaced object of the test namespace.
    pub async fn get<K>(&self, name: &str) -> K
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug,
    {
        Api::<K>::namespaced(self.client.clone(), &self.ns)
            .get(name)
            .await
            .unwrap()
    }

    /// Whether HTTPRoute `route` carries a status of this test's controller.
    pub async fn has_status(&self, route: &str) -> bool {
        self.has_our_status(&self.get(route).await)
    }

    /// Whether `r` carries a status of this test's controller.
    pub fn has_our_status(&self, r: &gateway_types::experimental::httproutes::HttpRoute) -> bool {
        r.status.as_ref().is_some_and(|s| {
            s.parents
                .iter()
                .any(|p| p.controller_name == self.controller_name)
        })
    }

    /// A Gateway of the test class with one HTTP listener per `(name, port)`.
    pub async fn gateway(&self, name: &str, listeners: &[(&str, u16)]) {
        let ls: Vec<Value> = listeners
            .iter()
            .map(|(n, p)| json!({"name": n, "port": p, "protocol": "HTTP"}))
            .collect();
        self.apply::<gateway_types::gateways::Gateway>(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": name},
            "spec": {"gatewayClassName": self.class, "listeners": ls},
        }))
        .await;
    }

    /// A Service with one port and an EndpointSlice with one ready endpoint.
    pub async fn service(&self, name: &str, port: u16, ip: &str) {
        self.apply::<k8s_openapi::api::core::v1::Service>(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"ports": [{"port": port, "protocol": "TCP"}]},
        }))
        .await;
        self.apply::<k8s_openapi::api::discovery::v1::EndpointSlice>(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
        }))
        .await;
    }

    /// An HTTPRoute with the given parentRefs and one rule to `backend:port` (path prefix
    /// `path`).
    pub async fn route(&self, name: &str, parents: Value, backend: &str, port: u16) {
        self.apply::<gateway_types::experimental::httproutes::HttpRoute>(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": name},
            "spec": {"parentRefs": parents,
                     "rules": [{"backendRefs": [{"name": backend, "port": port}]}]},
        }))
        .await;
    }

    /// Starts `tollgate controller` for this test's class with `extra` arguments.
    pub fn controller(&self, id: &str, extra: &[&str]) -> ControllerProc {
        ControllerProc::start(self, id, extra)
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `tollgate controller`, killed when dropped.
pub struct ControllerProc {
    child: Child,
    log: PathBuf,
    /// Its metrics port.
    pub metrics_port: u16,
}

impl ControllerProc {
    fn start(env: &TestEnv, id: &str, extra: &[&str]) -> Self {
        let metrics_port = free_port();
        let log = env.dir.join(format!("controller-{id}-{}.log", suffix()));
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let kubeconfig = kubeconfig().to_str().unwrap().to_owned();
        let metrics = format!("127.0.0.1:{metrics_port}");
        let mut args = vec!["controller"];
        // A test may name its own kubeconfig (e.g. [`Relay::kubeconfig`]).
        if !extra.contains(&"--kubeconfig") {
            args.extend(["--kubeconfig", kubeconfig.as_str()]);
        }
        // A test may name its own namespace (one that does not exist yet, say).
        if !extra.contains(&"--namespace") {
            args.extend(["--namespace", env.ns.as_str()]);
        }
        args.extend([
            "--id",
            id,
            "--metrics-addr",
            &metrics,
            "--controller-name",
            &env.controller_name,
        ]);
        if !extra.iter().any(|a| a.starts_with("--provision")) {
            args.push("--provision=false");
        }
        args.extend_from_slice(extra);
        let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(&args)
            .env("RUST_LOG", "info,tollgate=debug")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap();
        Self {
            child,
            log,
            metrics_port,
        }
    }

    /// Everything the process has written so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET path` on the metrics port: (status, body).
    pub fn http_get(&self, path: &str) -> Option<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.metrics_port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut raw = String::new();
        s.read_to_string(&mut raw).ok()?;
        let status = raw.split(' ').nth(1)?.parse().ok()?;
        let body = raw.split_once("\r\n\r\n")?.1.to_owned();
        Some((status, body))
    }

    /// Waits until `/readyz` says ready.
    pub async fn wait_ready(&self) {
        let ok = eventually(Duration::from_secs(60), || async {
            (self.http_get("/readyz")?.0 == 200).then_some(())
        })
        .await;
        assert!(ok.is_some(), "controller not ready:\n{}", self.log());
    }

    /// The sum of every sample of metric `name` (any labels) whose label text contains
    /// `filter`.
    pub fn metric(&self, name: &str, filter: &str) -> f64 {
        let (_, body) = self.http_get("/metrics").unwrap_or_default();
        body.lines()
            .filter(|l| {
                l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && l.contains(filter)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Kills the process at once (SIGKILL: no Lease release).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops the process with SIGTERM and waits for it (SIGKILL after 10 s).
    pub fn terminate(&mut self) {
        self.terminate_within(Duration::from_secs(10));
    }

    /// Sends SIGTERM and waits up to `limit` for the process to exit; kills it after that.
    /// True when it exited by itself.
    pub fn terminate_within(&mut self, limit: Duration) -> bool {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
        false
    }
}

impl Drop for ControllerProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `f` every 100 ms until it returns `Some`, for at most `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The conditions of a status list as `(type, status, reason)`, sorted.
pub fn summary(
    conds: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = conds
        .iter()
        .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
        .collect();
    v.sort();
    v
}

/// `(type, status, reason)` for literals.
pub fn conds(list: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = list
        .iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect();
    v.sort();
    v
}

/// A `tollgate-proxy` subscribed to a controller's push server as the proxy of Gateway
/// `env.ns/gateway`, with the client certificate the controller issued in
/// `<gateway>-tollgate-proxy-tls`.
pub struct SubscribedProxy {
    /// The proxy.
    pub proxy: tollgate_proxy::Proxy,
    /// The subscription (dropped with the proxy).
    pub subscription: tollgate_proxy::subscribe::Subscription,
    /// Its state directory (`table.json` is the last table it applied).
    pub state: PathBuf,
}

impl SubscribedProxy {
    /// Waits for the proxy Secret, writes it out and subscribes to `url`.
    pub async fn start(env: &TestEnv, url: &str, gateway: &str) -> Self {
        let secret_name = format!("{gateway}-tollgate-proxy-tls");
        let secret: k8s_openapi::api::core::v1::Secret =
            eventually(Duration::from_secs(30), || async {
                let api: Api<k8s_openapi::api::core::v1::Secret> =
                    Api::namespaced(env.client.clone(), &env.ns);
                api.get_opt(&secret_name).await.ok()?
            })
            .await
            .unwrap_or_else(|| panic!("no proxy Secret {secret_name}"));
        let dir = std::env::temp_dir().join(format!("tollgate-proxy-{}-{gateway}", env.ns));
        let tls = dir.join("tls");
        std::fs::create_dir_all(&tls).unwrap();
        for (k, v) in secret.data.unwrap() {
            std::fs::write(tls.join(k), v.0).unwrap();
        }
        let proxy = tollgate_proxy::Proxy::new(tollgate_proxy::ProxyOptions::default());
        let cfg = tollgate_proxy::subscribe::SubscribeConfig::new(
            url.to_owned(),
            tollgate_api::ObjectKey::new(env.ns.as_str(), gateway),
            "proxy-1",
            &tls,
            dir.join("state"),
        );
        let subscription = tollgate_proxy::subscribe::spawn(proxy.clone(), cfg).await;
        Self {
            proxy,
            subscription,
            state: dir.join("state"),
        }
    }

    /// The table the proxy last applied (empty before the first).
    pub fn table(&self) -> String {
        std::fs::read_to_string(self.state.join("table.json")).unwrap_or_default()
    }
}

/// A TCP relay in front of the API server that can be frozen: from then on it passes no byte
/// either way and answers no new connection, though every connection stays open, the way a
/// stalled network path or an API server that stopped answering looks to a client.
pub struct Relay {
    /// Where clients connect.
    pub addr: std::net::SocketAddr,
    state: tokio::sync::watch::Sender<RelayState>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Relays to the test cluster's API server.
    pub async fn start() -> Self {
        let target = api_server_addr();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = tokio::sync::watch::channel(RelayState::Open).0;
        let rx = state.subscribe();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *rx.borrow() == RelayState::Cut {
                    continue;
                }
                let rx = rx.clone();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pipe(cr, sw, rx.clone()), pipe(sr, cw, rx));
                });
            }
        });
        Self { addr, state, task }
    }

    /// Stops passing bytes; connections stay open.
    pub fn freeze(&self) {
        self.state.send_replace(RelayState::Frozen);
    }

    /// Closes every connection and closes new ones at once: requests fail fast, as against
    /// an API server that is down or refusing.
    pub fn cut(&self) {
        self.state.send_replace(RelayState::Cut);
    }

    /// Passes bytes (and connections) again.
    pub fn thaw(&self) {
        self.state.send_replace(RelayState::Open);
    }

    /// A copy of the test cluster's kubeconfig, written to `path`, whose server is this relay.
    pub fn kubeconfig(&self, path: &Path) -> PathBuf {
        let text = std::fs::read_to_string(kubeconfig()).unwrap();
        let server = format!("https://{}", api_server_addr());
        assert!(text.contains(&server), "{server} not in the kubeconfig");
        std::fs::write(
            path,
            text.replace(&server, &format!("https://{}", self.addr)),
        )
        .unwrap();
        path.to_owned()
    }

    /// A client of the test cluster that connects through this relay.
    pub async fn client(&self) -> Client {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig()).unwrap();
        let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        cfg.cluster_url = format!("https://{}", self.addr).parse().unwrap();
        Client::try_from(cfg).unwrap()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a [`Relay`] does with its connections.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum RelayState {
    Open,
    Frozen,
    Cut,
}

/// Waits while the relay is frozen; false once it is cut (or gone).
async fn passing(state: &mut tokio::sync::watch::Receiver<RelayState>) -> bool {
    matches!(
        state
            .wait_for(|s| *s != RelayState::Frozen)
            .await
            .as_deref(),
        Ok(RelayState::Open)
    )
}

/// Copies `from` to `to`, holding each chunk while the relay is frozen; ends (closing both
/// halves) when it is cut.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut state: tokio::sync::watch::Receiver<RelayState>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !passing(&mut state).await {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = state.wait_for(|s| *s == RelayState::Cut) => return,
        };
        if !passing(&mut state).await {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// The API server's address, from the kubeconfig.
fn api_server_addr() -> std::net::SocketAddr {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig()).unwrap();
    let server = kc.clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.server.clone())
        .unwrap();
    let uri: http::Uri = server.parse().unwrap();
    format!("{}:{}", uri.host().unwrap(), uri.port_u16().unwrap())
        .parse()
        .unwrap()
}

/// A ClusterRole `name` with `rules`, to apply with [`TestEnv::apply_cluster`].
pub fn cluster_role(name: &str, rules: Value) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name}, "rules": rules,
    })
}

/// A ClusterRoleBinding `name` of the ClusterRole `name` to the user `user`.
pub fn cluster_role_binding(name: &str, user: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    })
}

impl TestEnv {
    /// Grants `user` the RBAC `rules`: a ClusterRole `name` and its ClusterRoleBinding.
    pub async fn grant(&self, name: &str, user: &str, rules: Value) {
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
        let role: ClusterRole = self.apply_cluster(cluster_role(name, rules)).await;
        let _: ClusterRoleBinding = self.apply_cluster(cluster_role_binding(name, user)).await;
        for rule in rules_of(&role) {
            wait_allowed(&self.client, user, &rule).await;
        }
    }
}

/// The first group, resource, verb and resource name of each of `role`'s rules: one access
/// each rule grants.
fn rules_of(
    role: &k8s_openapi::api::rbac::v1::ClusterRole,
) -> Vec<k8s_openapi::api::authorization::v1::ResourceAttributes> {
    use k8s_openapi::api::authorization::v1::ResourceAttributes;
    let first = |v: &Option<Vec<String>>| v.as_ref().and_then(|v| v.first().cloned());
    role.rules
        .iter()
        .flatten()
        .map(|r| ResourceAttributes {
            group: first(&r.api_groups),
            resource: first(&r.resources),
            verb: r.verbs.first().cloned(),
            name: first(&r.resource_names),
            ..Default::default()
        })
        .collect()
}

/// Waits until the API server's authorizer allows `user` the access `attrs`: a binding takes
/// effect once the authorizer's caches have seen it, a moment after it is written.
async fn wait_allowed(
    client: &Client,
    user: &str,
    attrs: &k8s_openapi::api::authorization::v1::ResourceAttributes,
) {
    use k8s_openapi::api::authorization::v1::{SubjectAccessReview, SubjectAccessReviewSpec};
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()),
            resource_attributes: Some(attrs.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    let allowed = eventually(Duration::from_secs(30), || async {
        let answer = reviews.create(&Default::default(), &review).await.ok()?;
        answer.status.is_some_and(|s| s.allowed).then_some(())
    })
    .await;
    assert!(allowed.is_some(), "{user} was never allowed {attrs:?}");
}

/// A copy of the test cluster's kubeconfig, written into `env.dir`, that acts as `user`
/// (`as:`, impersonation): for a `tollgate controller` whose permissions RBAC decides.
pub fn kubeconfig_as(env: &TestEnv, user: &str) -> PathBuf {
    let admin = std::fs::read_to_string(kubeconfig()).unwrap();
    let key_line = admin
        .lines()
        .find(|l| l.trim_start().starts_with("client-key:"))
        .expect("a client-key line in the test kubeconfig")
        .to_owned();
    let indent = &key_line[..key_line.len() - key_line.trim_start().len()];
    let acting = admin.replace(&key_line, &format!("{key_line}\n{indent}as: {user}"));
    let path = env.dir.join(format!("{user}.kubeconfig"));
    std::fs::write(&path, acting).unwrap();
    path
}

/// A client of the test cluster acting as `user` (impersonation: RBAC decides what it may do).
pub async fn client_as(user: &str) -> Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig()).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.auth_info.impersonate = Some(user.to_owned());
    Client::try_from(cfg).unwrap()
}
