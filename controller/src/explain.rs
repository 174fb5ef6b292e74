//! `tollgate explain`: how a Gateway decides one request.
//!
//! In: a directory of manifests (read and compiled as `tollgate run` does), or the admin
//! address of a running `tollgate-proxy` or `tollgate run` (`--admin`, its live table through
//! `/debug/explain`), and the request's parts from the command line. Out: the
//! [`Explanation`] of [`tollgate_proxy::explain`] for the chosen Gateway, as text for people
//! or JSON (`-o json`) for scripts.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tollgate_proxy::explain::{ExplainRequest, Explanation, explain};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Lines for people.
    Text,
    /// One JSON object.
    Json,
}

/// `tollgate explain` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ExplainArgs {
    /// Directory of .yaml/.yml manifests.
    #[arg(required_unless_present = "admin", conflicts_with = "admin")]
    pub dir: Option<PathBuf>,
    /// Ask a running proxy instead: its admin address (`http://127.0.0.1:9902`).
    #[arg(long)]
    pub admin: Option<String>,
    /// With `--admin`: a file holding the token its `/debug/explain` wants.
    #[arg(long, requires = "admin")]
    pub admin_token_file: Option<PathBuf>,
    /// The request's method.
    #[arg(long, default_value = "GET")]
    pub method: String,
    /// The request's Host (a `:port` picks the port).
    #[arg(long)]
    pub host: String,
    /// The request's path and query.
    #[arg(long, default_value = "/")]
    pub path: String,
    /// A request header, `name:value` (repeatable).
    #[arg(short = 'H', long = "header")]
    pub headers: Vec<String>,
    /// The client's address, as policies see it (`source.address`).
    #[arg(long)]
    pub source_ip: Option<IpAddr>,
    /// The listener the request arrives on, by name.
    #[arg(long)]
    pub listener: Option<String>,
    /// The port the request arrives on.
    #[arg(long)]
    pub port: Option<u16>,
    /// The Gateway (`namespace/name`) when the directory has several.
    #[arg(long)]
    pub gateway: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Explains the request `args` describe; returns the text to print.
pub async fn run(args: &ExplainArgs, now: Time) -> anyhow::Result<String> {
    let headers = args
        .headers
        .iter()
        .map(|h| {
            h.split_once(':')
                .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
                .with_context(|| format!("-H {h:?}: expected name:value"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let req = ExplainRequest {
        method: args.method.clone(),
        host: args.host.clone(),
        path: args.path.clone(),
        headers,
        source_ip: args.source_ip,
        listener: args.listener.clone(),
        port: args.port,
    };
    let e = match (&args.dir, &args.admin) {
        (_, Some(admin)) => live(admin, args, &req).await?,
        (Some(dir), None) => offline(dir, args, &req, now).await?,
        (None, None) => bail!("name a directory or --admin"),
    };
    Ok(match args.output {
        Output::Json => format!("{}\n", serde_json::to_string_pretty(&e)?),
        Output::Text => text(&e),
    })
}

/// Compiles `dir` and explains `req` on the chosen Gateway's table.
async fn offline(
    dir: &std::path::Path,
    args: &ExplainArgs,
    req: &ExplainRequest,
    now: Time,
) -> anyhow::Result<Explanation> {
    let mut manifests = crate::manifests::ManifestDir::new(dir);
    let scan = manifests
        .scan(&now)
        .with_context(|| format!("reading {}", dir.display()))?;
    if let Some(e) = scan.errors.first() {
        bail!("{e}");
    }
    let output = crate::compile::compile(scan.inputs);
    let table = match &args.gateway {
        Some(g) => output
            .tables
            .iter()
            .find(|(k, _)| k.to_string() == *g)
            .map(|(_, t)| t)
            .with_context(|| format!("no served Gateway {g} in {}", dir.display()))?,
        None => {
            let mut tables = output.tables.values();
            match (tables.next(), tables.next()) {
                (Some(t), None) => t,
                (None, _) => bail!(
                    "no Gateway of the tollgate class is served by {}",
                    dir.display()
                ),
                (Some(_), Some(_)) => bail!(
                    "several Gateways ({}): name one with --gateway",
                    output
                        .tables
                        .keys()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        }
    };
    Ok(explain(table, req).await?)
}

/// Asks the admin server at `admin` (`http://HOST:PORT`) to explain `req` on its live table.
async fn live(
    admin: &str,
    args: &ExplainArgs,
    req: &ExplainRequest,
) -> anyhow::Result<Explanation> {
    use http_body_util::{BodyExt, Empty};

    let authority = admin
        .strip_prefix("http://")
        .context("--admin: expected http://HOST:PORT (the admin server speaks plain HTTP)")?
        .trim_end_matches('/');
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("method", &req.method);
    query.append_pair("host", &req.host);
    query.append_pair("path", &req.path);
    for (n, v) in &req.headers {
        query.append_pair("header", &format!("{n}:{v}"));
    }
    if let Some(ip) = req.source_ip {
        query.append_pair("source_ip", &ip.to_string());
    }
    if let Some(l) = &req.listener {
        query.append_pair("listener", l);
    }
    if let Some(p) = req.port {
        query.append_pair("port", &p.to_string());
    }
    if let Some(g) = &args.gateway {
        query.append_pair("gateway", g);
    }
    let mut builder = http::Request::get(format!("/debug/explain?{}", query.finish()))
        .header(http::header::HOST, authority);
    if let Some(path) = &args.admin_token_file {
        let token = tollgate_proxy::read_admin_token(path)?;
        builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = builder.body(Empty::<bytes::Bytes>::new())?;
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .with_context(|| format!("connecting to {authority}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        bail!(
            "{admin}/debug/explain answered {status}: {}",
            String::from_utf8_lossy(&body).trim()
        );
    }
    serde_json::from_slice(&body)
        .with_context(|| format!("{admin}/debug/explain answered no explanation"))
}

/// The explanation as lines for people.
pub fn text(e: &Explanation) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Gateway {}", e.gateway);
    match &e.listener {
        Some(l) => {
            let _ = writeln!(
                s,
                "listener {} (port {}), virtual host {}",
                l.name,
                l.port,
                l.virtual_host.as_deref().unwrap_or("(none)")
            );
        }
        None => s.push_str("listener (none)\n"),
    }
    match (&e.route, &e.rule) {
        (Some(route), Some(rule)) => {
            let _ = writeln!(s, "route {route} {}", rule_text(rule));
        }
        _ => s.push_str("route (none)\n"),
    }
    if !e.near_misses.is_empty() {
        s.push_str("near misses:\n");
        for m in &e.near_misses {
            let _ = writeln!(
                s,
                "  {} {}: {}",
                m.route,
                rule_text(&m.rule),
                m.reasons.join("; ")
            );
        }
    }
    if !e.filters.is_empty() {
        s.push_str("filters:\n");
        for f in &e.filters {
            let _ = writeln!(s, "  {f}");
        }
    }
    if !e.policies.is_empty() {
        s.push_str("policies:\n");
        for p in &e.policies {
            let _ = writeln!(s, "  {} {} {}: {}", p.kind, p.name, p.rule, p.outcome);
        }
    }
    if !e.backends.is_empty() {
        s.push_str("backends:\n");
        for b in &e.backends {
            let endpoints = if b.endpoints.is_empty() {
                "no endpoints".to_owned()
            } else {
                b.endpoints.join(", ")
            };
            let _ = writeln!(
                s,
                "  {} (weight {}): {endpoints}",
                b.name.as_deref().unwrap_or("(unresolved)"),
                b.weight
            );
        }
    }
    let _ = writeln!(s, "answer: {}", e.answer);
    s
}

fn rule_text(r: &tollgate_proxy::explain::RuleOut) -> String {
    match &r.name {
        Some(n) => format!("rule {} ({n})", r.index),
        None => format!("rule {}", r.index),
    }
}
