//! `tollgate controller --push-addr` on the real kube-apiserver with a real proxy subscribed
//! over mTLS (the proxy crate's subscriber, certificates from the Secret the controller
//! issues): Programmed is Pending until a proxy runs the current version, then True; the
//! proxy applies the Gateway's table; an EndpointSlice change reaches the proxy in under a
//! second. (The API server refuses loopback endpoint addresses and tests send no traffic
//! off loopback, so the table the proxy applied is read from its last-known-good file.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;

use std::time::{Duration, Instant};

use gateway_types::gateways::Gateway;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;
use tollgate_api::ObjectKey;
use tollgate_proxy::{Proxy, ProxyOptions};

use k8s_support::{TestEnv, eventually, free_port};

const WAIT: Duration = Duration::from_secs(30);

fn programmed(g: &Gateway) -> Option<(String, String, String)> {
    let c = g
        .status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Programmed")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The table the proxy last applied, when it mentions `needle`.
fn applied(state: &std::path::Path, needle: &str) -> Option<String> {
    let t = std::fs::read_to_string(state.join("table.json")).ok()?;
    t.contains(needle).then_some(t)
}

async fn slice(env: &TestEnv, ip: &str) {
    env.apply::<EndpointSlice>(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "echo-1", "labels": {"kubernetes.io/service-name": "echo"}},
        "addressType": "IPv4",
        "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribed_proxy_programs_the_gateway_and_follows_endpoints() {
    let env = TestEnv::new("push").await;
    let listener = free_port();
    env.gateway("gw", &[("http", listener)]).await;
    env.apply::<k8s_openapi::api::core::v1::Service>(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo"},
        "spec": {"ports": [{"port": 80, "protocol": "TCP"}]},
    }))
    .await;
    slice(&env, "10.3.0.1").await;
    env.route("r", json!([{"name": "gw"}]), "echo", 80).await;

    let push_port = free_port();
    let push_addr = format!("127.0.0.1:{push_port}");
    let url = format!("https://localhost:{push_port}");
    let ctl = env.controller("a", &["--push-addr", &push_addr, "--controller-url", &url]);
    ctl.wait_ready().await;

    // No proxy yet: Pending, naming no version (a restart numbers tables afresh).
    let pending = eventually(WAIT, || async {
        let g: Gateway = env.get("gw").await;
        // Not the CRD's default (Unknown/Pending) that every new Gateway starts with.
        programmed(&g).filter(|p| p.0 == "False" && p.1 == "Pending")
    })
    .await
    .unwrap_or_else(|| panic!("not Pending:\n{}", ctl.log()));
    assert_eq!(pending.0, "False");
    assert_eq!(pending.2, "waiting for a proxy to connect");

    // The proxy's client certificate, as the controller issued it.
    let secret: Secret = eventually(WAIT, || async {
        let api: kube::Api<Secret> = kube::Api::namespaced(env.client.clone(), &env.ns);
        api.get_opt("gw-tollgate-proxy-tls").await.ok()?
    })
    .await
    .unwrap_or_else(|| panic!("no proxy Secret:\n{}", ctl.log()));
    let dir = std::env::temp_dir().join(format!("tollgate-push-{}", env.ns));
    let tls = dir.join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    for (k, v) in secret.data.unwrap() {
        std::fs::write(tls.join(k), v.0).unwrap();
    }
    let proxy = Proxy::new(ProxyOptions::default());
    let cfg = tollgate_proxy::subscribe::SubscribeConfig::new(
        url.clone(),
        ObjectKey::new(env.ns.as_str(), "gw"),
        "proxy-1",
        &tls,
        dir.join("state"),
    );
    let sub = tollgate_proxy::subscribe::spawn(proxy.clone(), cfg).await;

    let state = dir.join("state");
    eventually(WAIT, || async { applied(&state, "10.3.0.1") })
        .await
        .unwrap_or_else(|| panic!("proxy never applied a table:\n{}", ctl.log()));
    assert!(proxy.local_addr(listener).is_some(), "listener not bound");
    let ok = eventually(WAIT, || async {
        let g: Gateway = env.get("gw").await;
        programmed(&g).filter(|p| p.0 == "True")
    })
    .await
    .unwrap_or_else(|| panic!("never Programmed:\n{}", ctl.log()));
    assert_eq!(ok.1, "Programmed");
    assert_eq!(ok.2, "programmed on 1 connected proxies");

    // An EndpointSlice change reaches the proxy in under a second.
    let before = sub.status().version();
    let start = Instant::now();
    slice(&env, "10.3.0.2").await;
    let served = eventually(Duration::from_secs(5), || async {
        applied(&state, "10.3.0.2")
    })
    .await;
    let took = start.elapsed();
    assert!(served.is_some(), "{}", ctl.log());
    assert!(sub.status().version() > before);
    println!("EndpointSlice change served by the proxy after {took:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    // Programmed stays True through the new version (no flapping).
    let g: Gateway = env.get("gw").await;
    assert_eq!(programmed(&g).unwrap().0, "True");
    proxy.shutdown().await;
}
