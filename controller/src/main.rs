//! The `tollgate` command: `run` serves manifests from a directory, `validate` checks them,
//! `controller` runs the Kubernetes controller.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use tollgate::run::{RunOptions, Runner, next_change, watch};
use tollgate_proxy::policy::RateLimitArgs;
use tollgate_proxy::{AccessLogArgs, ClientLimitArgs};
use tollgate_proxy::{Metrics, ProxyOptions};
use tracing::{info, warn};

/// jemalloc, as in tollgate-proxy: a reload of `tollgate run` allocates and frees the whole
/// compiled model (about a third of its time went to glibc's malloc/free with 10k routes), and
/// `run` serves requests in-process too. The `system-allocator` feature leaves it out, for heap
/// profilers that follow the C allocator (heaptrack; docs/performance.md).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Quiet period after a file change before `tollgate run` reloads. Short: a file saved in
/// several writes that is read half-written fails to parse, keeps its last good version and
/// is read again on the next event, so a short window only costs an extra reload.
const RUN_DEBOUNCE: Duration = Duration::from_millis(20);

#[derive(Parser)]
#[command(name = "tollgate", version, about = "A Kubernetes-native API gateway")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve every Gateway of the tollgate class described by the manifests in DIR, without a
    /// cluster, and apply changes to the files as they happen.
    Run(Box<RunArgs>),
    /// Serve only the built-in echo backend (the one `run --demo-backend` starts, with its DEMO
    /// introspection endpoint), e.g. as a pod behind the examples on a cluster.
    DemoBackend {
        /// Address to listen on.
        #[arg(long, default_value = "0.0.0.0:9080")]
        listen: SocketAddr,
        /// Name the backend reports in its answers.
        #[arg(long, default_value = "demo-backend")]
        name: String,
    },
    /// Explain how the Gateway of DIR decides a request: listener, route and rule (and the
    /// nearest rules that do not match), filters, policies with their outcome, backends.
    Explain(Box<tollgate::explain::ExplainArgs>),
    /// Print the status each object in DIR would get; exit 1 if any is rejected.
    Validate {
        /// Directory of .yaml/.yml manifests.
        dir: PathBuf,
    },
    /// The shared HTTP cache of a running proxy.
    #[command(subcommand)]
    Cache(CacheCommand),
    /// Run the Kubernetes controller: watch Gateway API objects, compile them, write their
    /// status (leader only), push tables to proxies and provision them.
    Controller(Box<ControllerArgs>),
    /// Compile the manifests in DIR and write each Gateway's route table as JSON to
    /// OUT/NAMESPACE.NAME.json (what `tollgate-proxy --table` serves); exit 1 if any object
    /// is rejected.
    Compile {
        /// Directory of .yaml/.yml manifests.
        dir: PathBuf,
        /// Output directory (created if missing).
        #[arg(long, short)]
        out: PathBuf,
    },
    /// Write the CRDs of Tollgate's own kinds (RateLimitPolicy, AuthPolicy, ClientPolicy, BackendPolicy), generated from
    /// the Rust types, to DIR; with --check, exit 1 if DIR differs instead of writing.
    Crdgen {
        /// Output directory.
        #[arg(default_value = "crds")]
        dir: PathBuf,
        /// Compare instead of writing.
        #[arg(long)]
        check: bool,
        /// Also write (with --check, compare) the CRD reference page, Markdown, to this file
        /// (docs/reference/crds.md in the repository).
        #[arg(long, value_name = "FILE")]
        docs: Option<PathBuf>,
    },
}

/// `tollgate cache ...`.
#[derive(Subcommand)]
enum CacheCommand {
    /// Remove entries (by host, route or key prefix; all of them when none is given) through
    /// the admin server's `POST /cache/purge`.
    Purge(tollgate::cache_cli::PurgeArgs),
}

/// The arguments of `tollgate run`.
#[derive(clap::Args)]
struct RunArgs {
    /// Directory of .yaml/.yml manifests (searched recursively).
    dir: PathBuf,
    /// Admin address serving /metrics, /healthz, /readyz and /debug/explain ("off" to
    /// disable).
    #[arg(long, default_value = "127.0.0.1:9901")]
    admin: String,
    /// A file holding the token `/debug/explain` callers must send as `Authorization: Bearer`;
    /// without it, only loopback callers are answered.
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
    /// Also start the built-in echo backend on this address (used by the quickstart).
    #[arg(long)]
    demo_backend: Option<SocketAddr>,
    /// Access log of every served Gateway.
    #[command(flatten)]
    access_log: AccessLogArgs,
    /// Rate-limit storage.
    #[command(flatten)]
    rate_limit: RateLimitArgs,
    /// Slow-client limits of every served Gateway.
    #[command(flatten)]
    client_limits: ClientLimitArgs,
    /// OpenTelemetry tracing of every served Gateway.
    #[command(flatten)]
    tracing: tollgate_proxy::otel::TraceArgs,
    /// Memory bound of the shared HTTP cache CachePolicy rules use, for every served
    /// Gateway together (bytes, or with Ki, Mi, Gi); 0: no cache.
    #[arg(long, default_value = tollgate_proxy::DEFAULT_CACHE_SIZE, value_parser = tollgate_proxy::parse_cache_size)]
    cache_size: u64,
}

#[derive(clap::Args)]
struct ControllerArgs {
    /// Kubeconfig file (default: in-cluster, else $KUBECONFIG or ~/.kube/config).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The controller's own namespace (Lease, CA Secret); default $POD_NAMESPACE, else
    /// tollgate-system. Created at start when missing (needs `create` on namespaces; else
    /// the controller exits saying so).
    #[arg(long)]
    namespace: Option<String>,
    /// This replica's identity (default: $POD_NAME, else the hostname).
    #[arg(long)]
    id: Option<String>,
    /// Address serving /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:9090")]
    metrics_addr: SocketAddr,
    /// Address of the push server proxies connect to (unset: no push server; Gateway
    /// Programmed then comes from the compiler alone).
    #[arg(long)]
    push_addr: Option<SocketAddr>,
    /// Provision a ServiceAccount, Deployment and Service per accepted Gateway.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    provision: bool,
    /// Proxy image of provisioned Deployments.
    #[arg(long, default_value = "ghcr.io/tollgate-dev/tollgate-proxy:latest")]
    proxy_image: String,
    /// Rate-limit storage of the provisioned proxies (passed on to them).
    #[command(flatten)]
    rate_limit: RateLimitArgs,
    /// Access log of the provisioned proxies (passed on to them; they log to stdout).
    #[command(flatten)]
    access_log: AccessLogArgs,
    /// Type of provisioned Services.
    #[arg(long, default_value = "LoadBalancer")]
    service_type: String,
    /// URL provisioned proxies reach the push server at.
    #[arg(
        long,
        default_value = "https://tollgate-controller.tollgate-system.svc:9443"
    )]
    controller_url: String,
    /// Secret (in --namespace) holding the push CA; created on first start.
    #[arg(long, default_value = "tollgate-push-ca")]
    push_ca_secret: String,
    /// DNS name for the push server certificate (repeatable; the host of --controller-url
    /// and localhost are always included).
    #[arg(long)]
    push_dns_name: Vec<String>,
    /// Name of the leader-election Lease (in --namespace).
    #[arg(long, default_value = "tollgate-controller")]
    lease_name: String,
    /// Seconds after which a status write, Event, provisioning call or the check of
    /// --namespace at start the API server has not answered is given up (and retried).
    #[arg(long, default_value_t = tollgate::k8s::reconcile::API_CALL_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    api_timeout_secs: u64,
    /// Quiet period after a change before recompiling, in milliseconds. Changes that keep
    /// arriving delay a recompile by at most ten quiet periods.
    #[arg(long, default_value_t = 100)]
    debounce_ms: u64,
    /// spec.controllerName of the GatewayClasses this controller owns.
    #[arg(long, default_value = tollgate::compile::CONTROLLER_NAME)]
    controller_name: String,
    /// OpenTelemetry tracing of the controller's reconciles (not of the proxies: their
    /// GatewayParameters `telemetry.tracing` configures those).
    #[command(flatten)]
    tracing: tollgate_proxy::otel::TraceArgs,
}

fn now() -> Time {
    Time(Timestamp::now())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Validate { dir } => match tollgate::validate::validate(&dir, now()) {
            Ok(report) => {
                print!("{}", report.text);
                if report.ok() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
        Command::Cache(CacheCommand::Purge(args)) => {
            let rt = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: starting the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(tollgate::cache_cli::purge(&args)) {
                Ok(text) => {
                    println!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Explain(args) => {
            let rt = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: starting the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(tollgate::explain::run(&args, now())) {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Compile { dir, out } => match compile_to(&dir, &out) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Crdgen { dir, check, docs } => match crdgen(&dir, check, docs.as_deref()) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Controller(args) => {
            init_tracing();
            serve(controller(*args))
        }
        Command::DemoBackend { listen, name } => {
            init_tracing();
            serve(demo_backend(listen, &name))
        }
        Command::Run(args) => {
            init_tracing();
            serve(run(*args))
        }
    }
}

/// Runs `fut` on a new multi-threaded runtime: success, or the error printed and a failure.
fn serve(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(fut) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Writes every table; true when nothing was rejected.
fn compile_to(dir: &std::path::Path, out: &std::path::Path) -> anyhow::Result<bool> {
    let mut manifests = tollgate::manifests::ManifestDir::new(dir);
    let scan = manifests.scan(&now())?;
    for e in &scan.errors {
        eprintln!("error: {e}");
    }
    let output = tollgate::compile::compile(scan.inputs);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for (key, table) in &output.tables {
        let mut table = table.clone();
        table.version = 1;
        let path = out.join(format!("{}.{}.json", key.namespace, key.name));
        let json = serde_json::to_string_pretty(&table)?;
        std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    let rejections = output.rejections();
    for r in &rejections {
        eprintln!("rejected: {r}");
    }
    Ok(rejections.is_empty() && scan.errors.is_empty())
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Serves the demo backend until SIGINT or SIGTERM.
async fn demo_backend(listen: SocketAddr, name: &str) -> anyhow::Result<()> {
    let (bound, task) = tollgate::demo::spawn(listen, name)
        .await
        .with_context(|| format!("starting the demo backend on {listen}"))?;
    info!(address = %bound, "demo backend listening");
    tollgate_proxy::shutdown_signal().await;
    task.abort();
    Ok(())
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let RunArgs {
        dir,
        admin,
        admin_token_file,
        demo_backend,
        access_log,
        rate_limit,
        client_limits,
        tracing,
        cache_size,
    } = args;
    if let Some(addr) = demo_backend {
        let (bound, _task) = tollgate::demo::spawn(addr, "demo-backend")
            .await
            .with_context(|| format!("starting the demo backend on {addr}"))?;
        info!(address = %bound, "demo backend listening");
        // The task lives as long as the runtime.
        std::mem::forget(_task);
    }
    let metrics = Arc::new(Metrics::new());
    let storage = rate_limit.storage()?;
    let limiter = ProxyOptions {
        metrics: metrics.clone(),
        ..ProxyOptions::default()
    }
    .rate_limiter(storage)?;
    let opts = RunOptions {
        dir: dir.clone(),
        access_log,
        rate_limiter: Some(limiter),
        client_limits,
        tracing: tracing.settings()?,
        http_cache: (cache_size > 0).then(|| tollgate_proxy::HttpCache::new(cache_size, &metrics)),
    };
    let mut runner = Runner::new(&opts, metrics.clone())?;
    runner
        .reload(now())
        .await
        .with_context(|| format!("loading {}", dir.display()))?;
    if runner.gateways().is_empty() {
        warn!(dir = %dir.display(), "no Gateway of class controller tollgate.dev/gateway-controller found; run `tollgate validate` for details");
    }
    if admin != "off" {
        let addr: SocketAddr = admin.parse().with_context(|| format!("--admin {admin}"))?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the admin address {addr}"))?;
        info!(address = %addr, "admin listening (/metrics, /healthz, /readyz, /debug/explain)");
        let m = metrics.clone();
        let explain = tollgate_proxy::ExplainAccess {
            proxies: runner.explainable(),
            token: admin_token_file
                .as_deref()
                .map(tollgate_proxy::read_admin_token)
                .transpose()?,
            cache: opts.http_cache.clone(),
        };
        tokio::spawn(async move {
            if let Err(e) = tollgate_proxy::serve_admin_with(listener, m, || true, explain).await {
                warn!(error = %e, "admin server stopped");
            }
        });
    }
    let (_watcher, mut changes) = watch(&dir)?;
    loop {
        tokio::select! {
            changed = next_change(&mut changes, RUN_DEBOUNCE) => {
                if !changed {
                    break;
                }
                if let Err(e) = runner.reload(now()).await {
                    warn!(error = %e, "reload failed; still serving the previous tables");
                }
            }
            () = tollgate_proxy::shutdown_signal() => {
                info!("shutting down");
                break;
            }
        }
    }
    runner.shutdown().await;
    Ok(())
}

async fn controller(args: ControllerArgs) -> anyhow::Result<()> {
    use tollgate::k8s::{controller, leader, metrics, provision, reconcile};
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no in-cluster config and no kubeconfig")?,
    };
    // The leader elector builds a client of its own from this (its own connection).
    let lease_config = config.clone();
    let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
    let namespace = args
        .namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "tollgate-system".to_owned());
    let id = match args.id.clone() {
        Some(id) => id,
        None => std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .ok()
            .filter(|s| !s.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|s| s.trim().to_owned())
            })
            .unwrap_or_else(|| format!("tollgate-{}", std::process::id())),
    };
    let metrics = Arc::new(metrics::Metrics::new());
    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("binding the metrics address {}", args.metrics_addr))?;
    info!(address = %listener.local_addr()?, "metrics listening (/metrics, /healthz, /readyz)");
    tokio::spawn(metrics::serve(listener, metrics.clone()));

    // Before anything is written in it (the Lease, the push CA Secret): a missing namespace
    // is created, or the controller stops here saying what to do, instead of retrying the
    // Lease for ever.
    let api_timeout = Duration::from_secs(args.api_timeout_secs);
    tollgate::k8s::namespace::ensure(&client, &namespace, api_timeout).await?;

    // In a pod of a Deployment (the chart): what we create in our namespace is owned by it.
    let owner = match std::env::var("POD_NAME") {
        Ok(pod) if !pod.is_empty() => {
            tollgate::k8s::owner::own_deployment(&client, &namespace, &pod).await
        }
        _ => None,
    };
    let (push, pki) = match args.push_addr {
        Some(addr) => {
            let (push, pki) = start_push(&client, &args, &namespace, addr, owner.clone()).await?;
            (Some(push), Some(pki))
        }
        None => (None, None),
    };
    let provision = args.provision.then(|| provision::ProvisionConfig {
        proxy_image: args.proxy_image.clone(),
        service_type: args.service_type.clone(),
        controller_url: args.controller_url.clone(),
        controller_namespace: namespace.clone(),
        proxy_args: args.rate_limit.to_flags(),
        access_log: args.access_log.clone(),
    });
    // Refuse inconsistent storage and access log flags here rather than in every proxy.
    args.rate_limit.storage()?;
    if args.access_log.access_log_file.is_some() {
        anyhow::bail!(
            "--access-log-file: provisioned proxies write their access log to stdout (their file system is read-only)"
        );
    }
    args.access_log.settings()?;
    let cfg = controller::ControllerConfig {
        settings: reconcile::Settings {
            controller_name: args.controller_name.clone(),
            push,
            provision,
            pki,
            api_timeout,
            tracing: args.tracing.settings()?,
        },
        leader: leader::LeaderConfig {
            owner,
            ..leader::LeaderConfig::new(&namespace, &args.lease_name, &id)
        },
        lease_config: Some(lease_config),
        debounce: Duration::from_millis(args.debounce_ms),
    };
    info!(id = %id, namespace = %namespace, controller_name = %args.controller_name, "controller starting");
    controller::run(client, cfg, metrics, tollgate_proxy::shutdown_signal()).await?;
    Ok(())
}

/// Loads (or creates) the push CA, starts the push server, and rotates the CA hourly.
async fn start_push(
    client: &kube::Client,
    args: &ControllerArgs,
    namespace: &str,
    addr: SocketAddr,
    owner: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
) -> anyhow::Result<(
    tollgate::push::PushServer,
    tollgate::k8s::reconcile::PushPki,
)> {
    use tollgate::push::{PushServer, pki};
    let ca = pki::ensure_ca_owned(client, namespace, &args.push_ca_secret, owner.as_ref())
        .await
        .context("loading the push CA")?;
    let mut dns = args.push_dns_name.clone();
    let host = args
        .controller_url
        .split("://")
        .last()
        .unwrap_or_default()
        .split(['/', ':'])
        .next()
        .unwrap_or_default()
        .to_owned();
    dns.extend([host, "localhost".to_owned()]);
    dns.retain(|d| !d.is_empty());
    dns.sort();
    dns.dedup();
    let server = PushServer::start(addr, ca.issue_server(&dns)?)
        .await
        .with_context(|| format!("starting the push server on {addr}"))?;
    info!(address = %server.local_addr(), "push server listening");
    let shared = tollgate::k8s::reconcile::PushPki::new(ca);
    let (client, ns, secret) = (
        client.clone(),
        namespace.to_owned(),
        args.push_ca_secret.clone(),
    );
    let (s2, p2) = (server.clone(), shared.clone());
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            match pki::ensure_ca_owned(&client, &ns, &secret, owner.as_ref()).await {
                Ok(ca) if ca.cert_pem() != p2.current().cert_pem() => {
                    match ca.issue_server(&dns).map(|tls| s2.set_tls(tls)) {
                        Ok(Ok(())) => {
                            info!("push CA rotated");
                            p2.replace(ca);
                        }
                        Ok(Err(e)) => warn!(error = %e, "push server TLS not replaced"),
                        Err(e) => warn!(error = %e, "push server certificate not issued"),
                    }
                }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "push CA check failed"),
            }
        }
    });
    Ok((server, shared))
}

/// `tollgate crdgen`: writes (or with `check`, compares) the CRD files. Returns false when
/// checking found a difference.
fn crdgen(
    dir: &std::path::Path,
    check: bool,
    docs: Option<&std::path::Path>,
) -> anyhow::Result<bool> {
    use anyhow::Context as _;
    let mut files: Vec<(PathBuf, String)> = tollgate::crds::crd_yaml()
        .context("serializing the CRDs")?
        .into_iter()
        .map(|(name, yaml)| (dir.join(name), yaml))
        .collect();
    if let Some(page) = docs {
        let md = tollgate::crds::reference::markdown().context("writing the CRD reference")?;
        files.push((page.to_path_buf(), md));
    }
    if check {
        let mut fresh = true;
        for (path, content) in &files {
            let on_disk = std::fs::read_to_string(path).unwrap_or_default();
            if on_disk != *content {
                eprintln!(
                    "{} is stale: run `tollgate crdgen {}{}`",
                    path.display(),
                    dir.display(),
                    docs.map(|d| format!(" --docs {}", d.display()))
                        .unwrap_or_default()
                );
                fresh = false;
            }
        }
        return Ok(fresh);
    }
    for (path, content) in &files {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(path, content).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(true)
}
