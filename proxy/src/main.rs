//! `tollgate-proxy`: the data plane as its own process.
//!
//! `--table FILE` serves a route table (JSON, as `tollgate compile` writes it) and applies
//! the file again whenever its content changes; a file that does not parse or a table that
//! does not apply is logged and the previous table keeps serving.
//!
//! `--controller https://HOST:PORT --gateway NS/NAME --tls-dir DIR --state-dir DIR [--id ID]`
//! subscribes to the controller instead (see `tollgate_proxy::subscribe`): the last known
//! good table in `--state-dir` serves at once, then every version the controller streams.
//! `/readyz` turns 200 once a table is applied.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use tollgate_api::{ObjectKey, RouteTable};
use tollgate_proxy::policy::RateLimitArgs;
use tollgate_proxy::subscribe::{self, SubscribeConfig};
use tollgate_proxy::{
    AccessLogArgs, ClientLimitArgs, ExplainAccess, HttpCache, Metrics, Proxy, ProxyOptions,
    serve_admin_with,
};

/// jemalloc: the request path allocates a few buffers per request (hyper's read buffers, header
/// blocks, channels); glibc malloc spent ~2.2k instructions per proxied request on them.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
use tracing::{error, info, warn};

#[derive(Parser)]
#[command(name = "tollgate-proxy", version, about = "The Tollgate data plane")]
struct Args {
    /// Route table to serve (JSON); re-read when it changes.
    #[arg(
        long,
        conflicts_with = "controller",
        required_unless_present = "controller"
    )]
    table: Option<PathBuf>,
    /// The controller's push address (`https://HOST:PORT`) to subscribe to.
    #[arg(long, requires_all = ["gateway", "tls_dir", "state_dir"])]
    controller: Option<String>,
    /// The Gateway (`NAMESPACE/NAME`) whose table to serve, with `--controller`.
    #[arg(long)]
    gateway: Option<String>,
    /// Directory with tls.crt, tls.key and ca.crt, with `--controller`.
    #[arg(long)]
    tls_dir: Option<PathBuf>,
    /// Directory for the last known good table, with `--controller`.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// This proxy's id in the controller's sync status (default: $POD_NAME, else the host name).
    #[arg(long)]
    id: Option<String>,
    /// Admin address serving /metrics, /healthz, /readyz and /debug/explain.
    #[arg(long, default_value = "127.0.0.1:9902")]
    admin: SocketAddr,
    /// A file holding the token `/debug/explain` callers must send as `Authorization: Bearer`;
    /// without it, only loopback callers are answered.
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
    /// Memory bound of the shared HTTP cache CachePolicy rules use (bytes, or with Ki, Mi,
    /// Gi); 0: no cache.
    #[arg(long, default_value = tollgate_proxy::DEFAULT_CACHE_SIZE, value_parser = tollgate_proxy::parse_cache_size)]
    cache_size: u64,
    /// Access log.
    #[command(flatten)]
    access_log: AccessLogArgs,
    /// Runtime worker threads (default: one per core); 1 runs everything on one thread.
    #[arg(long)]
    workers: Option<usize>,
    /// Rate-limit storage.
    #[command(flatten)]
    rate_limit: RateLimitArgs,
    /// Slow-client limits.
    #[command(flatten)]
    client_limits: ClientLimitArgs,
    /// OpenTelemetry tracing.
    #[command(flatten)]
    tracing: tollgate_proxy::otel::TraceArgs,
}

fn parse(path: &Path, text: &[u8]) -> anyhow::Result<RouteTable> {
    serde_json::from_slice(text).with_context(|| format!("parsing {}", path.display()))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = match args.workers {
        Some(1) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Some(n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n.max(1))
            .enable_all()
            .build(),
        None => tokio::runtime::Runtime::new(),
    }
    .context("starting the runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let metrics = Arc::new(Metrics::new());
    let mut options = ProxyOptions {
        metrics: metrics.clone(),
        ..ProxyOptions::default()
    };
    args.access_log.apply(&mut options)?;
    options.rate_limiter = Some(options.rate_limiter(args.rate_limit.storage()?)?);
    args.client_limits.apply(&mut options);
    options.tracing = args.tracing.settings()?;
    options.cache = (args.cache_size > 0).then(|| HttpCache::new(args.cache_size, &metrics));
    let cache = options.cache.clone();
    let proxy = Proxy::new(options);
    let token = match &args.admin_token_file {
        Some(path) => Some(tollgate_proxy::read_admin_token(path)?),
        None => None,
    };
    let mut gateway_key = args.gateway.clone().unwrap_or_default();
    // The subscription, kept alive until shutdown.
    let mut subscription = None;
    let ready: Arc<dyn Fn() -> bool + Send + Sync> = match (&args.table, &args.controller) {
        (Some(table), _) => {
            let table = table.clone();
            let live = proxy.clone();
            let stamp = Stamp::of(&table);
            let mut last =
                std::fs::read(&table).with_context(|| format!("reading {}", table.display()))?;
            let parsed = parse(&table, &last)?;
            gateway_key = parsed.gateway.to_string();
            proxy.apply(parsed).await.context("applying the table")?;
            info!(table = %table.display(), version = proxy.version(), "serving");
            let watched = proxy.clone();
            tokio::spawn(async move { watch_file(&watched, &table, &mut last, stamp).await });
            Arc::new(move || live.version() > 0)
        }
        (None, Some(controller)) => {
            let config = subscribe_config(&args, controller)?;
            let sub = subscribe::spawn(proxy.clone(), config).await;
            let status = sub.status();
            subscription = Some(sub);
            Arc::new(move || status.ready())
        }
        (None, None) => anyhow::bail!("one of --table or --controller is required"),
    };

    let admin = tokio::net::TcpListener::bind(args.admin)
        .await
        .with_context(|| format!("binding the admin address {}", args.admin))?;
    let explain = ExplainAccess {
        proxies: Arc::new(std::sync::RwLock::new(
            [(gateway_key, proxy.clone())].into_iter().collect(),
        )),
        token,
        cache,
    };
    tokio::spawn(async move {
        if let Err(e) = serve_admin_with(admin, metrics, move || ready(), explain).await {
            warn!(error = %e, "admin server stopped");
        }
    });

    tollgate_proxy::shutdown_signal().await;
    drop(subscription);
    proxy.shutdown().await;
    Ok(())
}

fn subscribe_config(args: &Args, controller: &str) -> anyhow::Result<SubscribeConfig> {
    let gateway = args.gateway.as_deref().unwrap_or_default();
    let Some((ns, name)) = gateway.split_once('/') else {
        anyhow::bail!("--gateway must be NAMESPACE/NAME, got {gateway:?}");
    };
    let id = args
        .id
        .clone()
        .or_else(|| std::env::var("POD_NAME").ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("pid-{}", std::process::id()));
    let (Some(tls_dir), Some(state_dir)) = (&args.tls_dir, &args.state_dir) else {
        anyhow::bail!("--controller needs --tls-dir and --state-dir");
    };
    Ok(SubscribeConfig::new(
        controller,
        ObjectKey::new(ns, name),
        id,
        tls_dir,
        state_dir,
    ))
}

/// Applies `path` again whenever its content changes. Each distinct content is tried once;
/// failures are logged once.
///
/// The file is compared as bytes: validating it as UTF-8 every second cost more than reading
/// it (a 10k-route table is ~7 MB). It is not read at all while its [`Stamp`] stays the same
/// and settled: reading and comparing 7 MB every second was ~2% of the instructions callgrind
/// counted per request at 10k routes.
async fn watch_file(proxy: &Proxy, path: &Path, last: &mut Vec<u8>, mut seen: Option<Stamp>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        // Taken before the read: a write after it changes the stamp, and the next tick reads.
        let stamp = Stamp::of(path);
        if stamp.is_some_and(|s| s.settled() && Some(s) == seen) {
            continue;
        }
        let Ok(text) = std::fs::read(path) else {
            continue;
        };
        // Only a read that succeeded vouches for the stamp: after a failed one the same
        // stamp must be read again.
        seen = stamp;
        if text == *last {
            continue;
        }
        let outcome = match parse(path, &text) {
            Ok(table) => proxy.apply(table).await.map_err(anyhow::Error::from),
            Err(e) => Err(e),
        };
        *last = text;
        match outcome {
            Ok(()) => info!(version = proxy.version(), "table applied"),
            Err(e) => {
                error!(error = %format!("{e:#}"), "table not applied; the previous one keeps serving")
            }
        }
    }
}

/// What `stat` says of a file: the same stamp means the same content, once it has settled.
/// Within a moment of a write, a second write of the same length can keep the stamp (file
/// times move in coarse ticks; git's "racy clean" case), so a recent stamp proves nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: std::time::SystemTime,
    len: u64,
    inode: u64,
    device: u64,
}

impl Stamp {
    /// How long after its last write a file's stamp is trusted.
    const SETTLE: Duration = Duration::from_secs(2);

    fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(path).ok()?;
        Some(Self {
            modified: meta.modified().ok()?,
            len: meta.len(),
            inode: meta.ino(),
            device: meta.dev(),
        })
    }

    /// Written at least [`Self::SETTLE`] ago (a clock that went back: not settled).
    fn settled(&self) -> bool {
        self.modified.elapsed().is_ok_and(|age| age >= Self::SETTLE)
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    #[test]
    fn a_stamp_proves_the_content_only_once_the_file_has_settled() {
        let dir = std::env::temp_dir().join(format!("tollgate-stamp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("table.json");
        std::fs::write(&path, "{\"a\":1}").unwrap();
        let fresh = Stamp::of(&path).unwrap();
        // Just written: not trusted, so a same-length rewrite in the same tick is still read.
        assert!(!fresh.settled());

        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(SystemTime::now() - Duration::from_secs(10))
            .unwrap();
        let old = Stamp::of(&path).unwrap();
        assert!(old.settled());
        assert_eq!(Stamp::of(&path), Some(old));

        // Any write moves the time (and here the length); a rename, the inode.
        std::fs::write(&path, "{\"a\":12}").unwrap();
        assert_ne!(Stamp::of(&path), Some(old));
        let other = dir.join("next.json");
        std::fs::write(&other, "{\"a\":12}").unwrap();
        let before = Stamp::of(&path).unwrap();
        std::fs::rename(&other, &path).unwrap();
        let after = Stamp::of(&path).unwrap();
        assert_ne!(after.inode, before.inode);
        assert_eq!(Stamp::of(&dir.join("missing")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
