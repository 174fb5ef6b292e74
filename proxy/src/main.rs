//! `tollgate-proxy`: the data plane as its own process.
//!
//! `--table FILE` serves a route table (JSON, as `tollgate compile` writes it) and applies
//! the file again whenever its content changes; a file that does not parse or a table that
//! does not apply is logged and the previous table keeps serving.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use tollgate_api::RouteTable;
use tollgate_proxy::{Metrics, Proxy, ProxyOptions, serve_admin};
use tracing::{error, info, warn};

#[derive(Parser)]
#[command(name = "tollgate-proxy", version, about = "The Tollgate data plane")]
struct Args {
    /// Route table to serve (JSON); re-read when it changes.
    #[arg(long)]
    table: PathBuf,
    /// Admin address serving /metrics, /healthz and /readyz.
    #[arg(long, default_value = "127.0.0.1:9902")]
    admin: SocketAddr,
    /// Write one JSON access-log line per request to stdout.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    access_log: bool,
}

fn parse(path: &Path, text: &str) -> anyhow::Result<RouteTable> {
    serde_json::from_str(text).with_context(|| format!("parsing {}", path.display()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let metrics = Arc::new(Metrics::new());
    let proxy = Proxy::new(ProxyOptions {
        metrics: metrics.clone(),
        access_log: args.access_log,
        ..ProxyOptions::default()
    });
    let mut last = std::fs::read_to_string(&args.table)
        .with_context(|| format!("reading {}", args.table.display()))?;
    proxy
        .apply(parse(&args.table, &last)?)
        .await
        .context("applying the table")?;
    info!(table = %args.table.display(), version = proxy.version(), "serving");

    let admin = tokio::net::TcpListener::bind(args.admin)
        .await
        .with_context(|| format!("binding the admin address {}", args.admin))?;
    let live = proxy.clone();
    tokio::spawn(async move {
        if let Err(e) = serve_admin(admin, metrics, move || live.version() > 0).await {
            warn!(error = %e, "admin server stopped");
        }
    });

    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                // Each distinct content is tried once; failures are logged once.
                let Ok(text) = std::fs::read_to_string(&args.table) else { continue };
                if text == last {
                    continue;
                }
                let outcome = match parse(&args.table, &text) {
                    Ok(table) => proxy.apply(table).await.map_err(anyhow::Error::from),
                    Err(e) => Err(e),
                };
                last = text;
                match outcome {
                    Ok(()) => info!(version = proxy.version(), "table applied"),
                    Err(e) => error!(error = %format!("{e:#}"), "table not applied; the previous one keeps serving"),
                }
            }
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    proxy.shutdown().await;
    Ok(())
}
