//! The Node object: registration, Ready status and a Lease heartbeat every 10 s.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use crate::error::Result;
use crate::pod::NodeCtx;

const MANAGER: &str = "tollgate-node-agent";

fn status(ctx: &NodeCtx, since: &Time) -> NodeStatus {
    let now = Time(Timestamp::now());
    let cond = |t: &str, s: &str, reason: &str, msg: &str| NodeCondition {
        type_: t.into(),
        status: s.into(),
        reason: Some(reason.into()),
        message: Some(msg.into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(since.clone()),
    };
    let resources: BTreeMap<String, Quantity> = [
        ("cpu", "2"),
        ("memory", "8Gi"),
        ("pods", "110"),
        ("ephemeral-storage", "20Gi"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), Quantity(v.to_owned())))
    .collect();
    NodeStatus {
        conditions: Some(vec![
            cond(
                "Ready",
                "True",
                "KubeletReady",
                "tollgate-node-agent is posting ready status",
            ),
            cond(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "no memory pressure tracking",
            ),
            cond(
                "DiskPressure",
                "False",
                "KubeletHasNoDiskPressure",
                "no disk pressure tracking",
            ),
            cond(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "no PID pressure tracking",
            ),
        ]),
        // Only the InternalIP: the API server connects to the first address of its preferred
        // types (Hostname first by default), and the node name resolves nowhere.
        addresses: Some(vec![NodeAddress {
            type_: "InternalIP".into(),
            address: ctx.gateway.to_string(),
        }]),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(ctx.kubelet_port),
            }),
        }),
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        node_info: Some(NodeSystemInfo {
            architecture: std::env::consts::ARCH.into(),
            operating_system: "linux".into(),
            os_image: "tollgate loopback node".into(),
            kernel_version: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .into(),
            container_runtime_version: "tollgate-node-agent://0.1.0".into(),
            kubelet_version: "v1.34.12".into(),
            machine_id: String::new(),
            system_uuid: String::new(),
            boot_id: String::new(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Creates or updates the Node and marks it Ready.
pub async fn register(client: &Client, ctx: &NodeCtx, pod_cidr: &str) -> Result<Time> {
    let api = Api::<Node>::all(client.clone());
    let labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", ctx.node_name.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", std::env::consts::ARCH),
        (
            "node.kubernetes.io/exclude-from-external-load-balancers",
            "true",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let node = Node {
        metadata: ObjectMeta {
            name: Some(ctx.node_name.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: Some(pod_cidr.into()),
            pod_cidrs: Some(vec![pod_cidr.into()]),
            ..Default::default()
        }),
        status: None,
    };
    let pp = PatchParams::apply(MANAGER).force();
    api.patch(&ctx.node_name, &pp, &Patch::Apply(&node)).await?;
    let since = Time(Timestamp::now());
    heartbeat(client, ctx, &since).await?;
    Ok(since)
}

pub async fn heartbeat(client: &Client, ctx: &NodeCtx, since: &Time) -> Result<()> {
    let api = Api::<Node>::all(client.clone());
    let patch = serde_json::json!({ "status": status(ctx, since) });
    api.patch_status(
        &ctx.node_name,
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(ctx.node_name.clone()),
            namespace: Some("kube-node-lease".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(ctx.node_name.clone()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    };
    Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
        .patch(
            &ctx.node_name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&lease),
        )
        .await?;
    Ok(())
}

/// Heartbeats forever (errors are logged and retried on the next beat).
pub async fn heartbeat_loop(client: Client, ctx: NodeCtx, since: Time) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        tick.tick().await;
        if let Err(e) = heartbeat(&client, &ctx, &since).await {
            tracing::warn!(%e, "node heartbeat");
        }
    }
}
