//! EndpointSlice-only changes take the fast way on the real kube-apiserver: the controller
//! recompiles and pushes endpoints without a status pass, and writes no status.
//!
//! A test binary of its own: it counts the controller's full reconciles, and the controller
//! watches every namespace, so another test creating routes at the same time (as the
//! `k8s_leader` tests do, in parallel) would add full passes of its own to the count.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;

use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

use k8s_support::{TestEnv, eventually};

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_changes_skip_the_status_pass() {
    let env = TestEnv::new("endpoints").await;
    env.gateway("gw", &[("http", 80)]).await;
    env.service("echo", 80, "10.2.0.2").await;
    env.route("r", json!([{"name": "gw"}]), "echo", 80).await;
    let ctl = env.controller("a", &[]);
    ctl.wait_ready().await;
    eventually(WAIT, || async { env.has_status("r").await.then_some(()) })
        .await
        .expect("no status");
    // The first writes settle (the Gateway's may follow the route's): wait until the count
    // holds still for two seconds.
    let mut writes = ctl.metric("tollgate_controller_status_writes_total", "");
    let started = std::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = ctl.metric("tollgate_controller_status_writes_total", "");
        if now == writes {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "status writes never settled:\n{}",
            ctl.log()
        );
        writes = now;
    }
    let full = ctl.metric("tollgate_controller_reconciles_total", "path=\"full\"");
    for ip in ["10.2.0.3", "10.2.0.4"] {
        env.apply::<EndpointSlice>(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "echo-1", "labels": {"kubernetes.io/service-name": "echo"}},
            "addressType": "IPv4",
            "ports": [{"port": 80, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
        }))
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let fast = eventually(WAIT, || async {
        let n = ctl.metric("tollgate_controller_reconciles_total", "path=\"endpoints\"");
        (n >= 1.0).then_some(n)
    })
    .await;
    assert!(fast.is_some(), "{}", ctl.log());
    assert_eq!(
        ctl.metric("tollgate_controller_reconciles_total", "path=\"full\""),
        full,
        "{}",
        ctl.log()
    );
    assert_eq!(
        ctl.metric("tollgate_controller_status_writes_total", ""),
        writes,
        "{}",
        ctl.log()
    );
}
