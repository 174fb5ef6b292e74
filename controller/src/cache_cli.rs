//! `tollgate cache purge`: asks a proxy's admin server (`tollgate run` or `tollgate-proxy`,
//! directly or through `kubectl port-forward`) to remove cache entries. In: the admin
//! address, the token file the proxy was started with, and what to remove. Out: the proxy's
//! answer (`{"purged":N}`), or why it refused.

use std::path::PathBuf;

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The arguments of `tollgate cache purge`.
#[derive(Debug, clap::Args)]
pub struct PurgeArgs {
    /// The admin address (`host:port`).
    #[arg(long, default_value = "127.0.0.1:9901")]
    pub admin: String,
    /// The file holding the token the proxy's `--admin-token-file` names.
    #[arg(long)]
    pub token_file: PathBuf,
    /// Remove the entries of this host.
    #[arg(long)]
    pub host: Option<String>,
    /// Remove the entries of this route (`namespace/name`).
    #[arg(long)]
    pub route: Option<String>,
    /// Remove the entries whose key starts so (`GET https://host/path`).
    #[arg(long)]
    pub prefix: Option<String>,
}

/// Sends the purge; the proxy's answer body on 200.
pub async fn purge(args: &PurgeArgs) -> anyhow::Result<String> {
    let token = std::fs::read_to_string(&args.token_file)
        .with_context(|| format!("reading {}", args.token_file.display()))?;
    let token = token.trim();
    if token.is_empty() {
        bail!("{}: empty", args.token_file.display());
    }
    let mut body = serde_json::Map::new();
    for (k, v) in [
        ("host", &args.host),
        ("route", &args.route),
        ("prefix", &args.prefix),
    ] {
        if let Some(v) = v {
            body.insert(k.into(), serde_json::Value::String(v.clone()));
        }
    }
    let body = serde_json::Value::Object(body).to_string();
    let request = format!(
        "POST /cache/purge HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        args.admin,
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(&args.admin)
        .await
        .with_context(|| format!("connecting to {}", args.admin))?;
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, text) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.split(' ').nth(1).unwrap_or("");
    if status != "200" {
        bail!("{} answered {status}: {}", args.admin, text.trim());
    }
    Ok(text.trim().to_owned())
}
