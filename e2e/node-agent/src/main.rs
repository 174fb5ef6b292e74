//! tollgate-node-agent: the node of `e2e/cluster.sh up --full`. See e2e/README.md.

mod agent;
mod config;
mod env;
mod error;
mod logs;
mod netns;
mod node;
mod pod;
mod probe;
mod services;
mod status;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Notify;

use crate::error::{Error, Result, io};
use crate::pod::NodeCtx;

#[derive(Debug, Parser)]
#[command(about = "Runs pods bound to one loopback node as local processes in network namespaces")]
struct Args {
    /// Name of the Node this agent registers.
    #[arg(long, default_value = "tollgate-node")]
    node_name: String,
    /// Image mapping (YAML), read again for each pod start.
    #[arg(long)]
    config: PathBuf,
    /// Where pod files (volumes, hosts, logs) live.
    #[arg(long)]
    state_dir: PathBuf,
    /// The bridge the harness created; pod veths are attached to it.
    #[arg(long, default_value = "tgbr0")]
    bridge: String,
    /// The bridge's address; pods are allocated from its /24.
    #[arg(long, default_value = "10.244.0.1")]
    gateway: Ipv4Addr,
    #[arg(long, default_value = "10.96.0.0/16")]
    service_cidr: String,
    /// Where `default/kubernetes` connections go (the API server on loopback).
    #[arg(long, default_value = "127.0.0.1:6443")]
    api_server: SocketAddr,
    /// KUBERNETES_SERVICE_HOST/PORT for pods: the `kubernetes` Service.
    #[arg(long, default_value = "10.96.0.1")]
    api_service_host: String,
    #[arg(long, default_value_t = 443)]
    api_service_port: u16,
    /// Port of the kubelet log endpoint (`kubectl logs`) on the bridge address.
    #[arg(long, default_value_t = 10250)]
    kubelet_port: u16,
}

fn watch<K>(api: Api<K>, notify: Arc<Notify>) -> reflector::Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(api, watcher::Config::default()).default_backoff(),
    );
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                tracing::warn!(%e, "watch");
            }
            notify.notify_one();
        }
    });
    store
}

async fn run(args: Args) -> Result<()> {
    let client = Client::try_default().await?;
    std::fs::create_dir_all(&args.state_dir)
        .map_err(io(format!("creating {}", args.state_dir.display())))?;
    let ctx = NodeCtx {
        node_name: args.node_name.clone(),
        bridge: args.bridge.clone(),
        gateway: args.gateway,
        prefix_len: 24,
        service_cidr: args.service_cidr.clone(),
        api_host: args.api_service_host.clone(),
        api_port: args.api_service_port,
        state_dir: args.state_dir.clone(),
        config_path: args.config.clone(),
        kubelet_port: args.kubelet_port,
    };
    netns::run("ip", &["link", "show", &args.bridge])
        .await
        .map_err(|_| {
            Error::Pod(format!(
                "bridge {} does not exist (e2e/cluster.sh up --full creates it)",
                args.bridge
            ))
        })?;
    for ns in netns::leftover_namespaces().await {
        tracing::info!(%ns, "deleting a namespace left by an earlier run");
        if let Ok(pids) = netns::run("ip", &["netns", "pids", &ns]).await {
            for pid in pids.split_whitespace() {
                let _ = netns::run("kill", &["-KILL", pid]).await;
            }
        }
        let _ = netns::run("ip", &["netns", "delete", &ns]).await;
    }
    let octets = args.gateway.octets();
    let pod_cidr = format!("{}.{}.{}.0/24", octets[0], octets[1], octets[2]);
    let since = node::register(&client, &ctx, &pod_cidr).await?;
    tokio::spawn(node::heartbeat_loop(client.clone(), ctx.clone(), since));
    tracing::info!(node = %ctx.node_name, "registered, Ready");

    let notify = Arc::new(Notify::new());
    let pods = watch(Api::<Pod>::all(client.clone()), notify.clone());
    let services = watch(Api::<Service>::all(client.clone()), notify.clone());
    let slices = watch(Api::<EndpointSlice>::all(client.clone()), notify.clone());
    let log_index = logs::LogIndex::default();
    let log_addr = SocketAddr::from((args.gateway, args.kubelet_port));
    let index = log_index.clone();
    tokio::spawn(async move {
        if let Err(e) = logs::serve(log_addr, index).await {
            tracing::warn!(%e, "kubelet log endpoint (kubectl logs will not work)");
        }
    });
    let mut agent = agent::Agent::new(client.clone(), ctx, log_index);
    let mut proxier = services::Proxier::new(client, args.bridge.clone(), args.api_server);

    let mut term = signal(SignalKind::terminate()).map_err(io("installing a SIGTERM handler"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(io("installing a SIGINT handler"))?;
    loop {
        let hosts = proxier.sync(&services, &slices).await;
        agent.sync(&pods, &hosts).await;
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    tracing::info!("shutting down: stopping every pod");
    agent.shutdown().await;
    proxier.shutdown().await;
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}
