//! Subscribing to the controller's route tables. In: a [`SubscribeConfig`] (controller URL,
//! Gateway, TLS files, state directory) and the [`Proxy`] to feed. Out: every table the
//! controller streams, applied with [`Proxy::apply`] and answered with an ACK (or a NACK with
//! the error, the old table serving on), and the last applied table kept on disk.
//!
//! Wire protocol (the controller's `push` module documents it in full): over TLS with ALPN
//! `h2` and our client certificate, `POST /v1/tables?gateway=NS/NAME&proxy=ID`; the response
//! body is one compact JSON [`RouteTable`] per line, the request body carries
//! `{"version":N,"ack":true}` or `{"version":N,"ack":false,"error":"..."}` lines back.
//!
//! Last known good: `STATE_DIR/table.json` is applied before connecting, so a proxy serves
//! while the controller is unreachable, across restarts too; each applied table replaces it
//! atomically (write `table.json.tmp`, fsync, rename). The TLS files are read again at every
//! connection attempt, so renewed certificates in a mounted Secret are picked up. Failed
//! attempts back off exponentially (with jitter) up to a cap.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;
use tollgate_api::{ObjectKey, RouteTable};

use crate::Proxy;

/// Name of the last-known-good table in the state directory.
pub const STATE_FILE: &str = "table.json";
/// Largest table line accepted from the controller.
const MAX_TABLE_BYTES: usize = 256 * 1024 * 1024;
/// Limit for TCP connect and for the TLS handshake, each.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 PING interval; the connection is dropped when one goes unanswered for 20 s.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Where and how to subscribe.
#[derive(Debug, Clone)]
pub struct SubscribeConfig {
    /// The controller's push address, `https://HOST:PORT`.
    pub controller: String,
    /// The Gateway whose table to serve.
    pub gateway: ObjectKey,
    /// This proxy's id in the controller's sync status (the pod name).
    pub id: String,
    /// Directory with `tls.crt`, `tls.key` (client certificate) and `ca.crt` (to verify the
    /// controller).
    pub tls_dir: PathBuf,
    /// Directory for the last-known-good table.
    pub state_dir: PathBuf,
    /// First reconnect delay (doubles per failure, with jitter). Default 250 ms.
    pub backoff_min: Duration,
    /// Largest reconnect delay. Default 30 s.
    pub backoff_max: Duration,
}

impl SubscribeConfig {
    /// A config with the default backoff.
    pub fn new(
        controller: impl Into<String>,
        gateway: ObjectKey,
        id: impl Into<String>,
        tls_dir: impl Into<PathBuf>,
        state_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            controller: controller.into(),
            gateway,
            id: id.into(),
            tls_dir: tls_dir.into(),
            state_dir: state_dir.into(),
            backoff_min: Duration::from_millis(250),
            backoff_max: Duration::from_secs(30),
        }
    }
}

/// Why one connection attempt or stream ended.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    /// The controller URL is not `https://HOST:PORT`.
    #[error("controller URL {0:?}: expected https://HOST:PORT")]
    Url(String),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// TLS material or the handshake failed.
    #[error("TLS: {0}")]
    Tls(String),
    /// TCP connect failed or timed out.
    #[error("connecting to {addr}: {message}")]
    Connect {
        /// HOST:PORT.
        addr: String,
        /// Why.
        message: String,
    },
    /// HTTP/2 failed.
    #[error("HTTP/2: {0}")]
    Http(#[from] hyper::Error),
    /// The controller answered something other than 200.
    #[error("controller answered {status}: {body}")]
    Status {
        /// Status code.
        status: StatusCode,
        /// Start of the body.
        body: String,
    },
    /// The stream ended or broke the protocol.
    #[error("stream: {0}")]
    Stream(String),
}

/// Live state of a subscription, for readiness and tests.
#[derive(Debug, Default)]
pub struct SubscribeStatus {
    applied: AtomicBool,
    connected: AtomicBool,
    version: AtomicU64,
    nacks: AtomicU64,
}

impl SubscribeStatus {
    /// True once a table has been applied (from disk or from the controller).
    pub fn ready(&self) -> bool {
        self.applied.load(Ordering::Acquire)
    }
    /// True while a stream to the controller is open.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }
    /// Version of the last table applied (0 = none).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }
    /// Tables rejected so far.
    pub fn nacks(&self) -> u64 {
        self.nacks.load(Ordering::Acquire)
    }
    fn applied(&self, version: u64) {
        self.version.store(version, Ordering::Release);
        self.applied.store(true, Ordering::Release);
    }
}

/// A running subscription; aborted when dropped.
#[derive(Debug)]
pub struct Subscription {
    status: Arc<SubscribeStatus>,
    task: tokio::task::JoinHandle<()>,
}

impl Subscription {
    /// Its live state.
    pub fn status(&self) -> Arc<SubscribeStatus> {
        self.status.clone()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Applies the last-known-good table (if any), then subscribes in the background.
pub async fn spawn(proxy: Proxy, config: SubscribeConfig) -> Subscription {
    let status = Arc::new(SubscribeStatus::default());
    match load_last_known_good(&proxy, &config.state_dir).await {
        Ok(Some(v)) => {
            status.applied(v);
            tracing::info!(version = v, "serving the last known good table");
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "last known good table not applied"),
    }
    let task = tokio::spawn(run(proxy, config, status.clone()));
    Subscription { status, task }
}

/// Applies `STATE_DIR/table.json` if it exists; returns its version.
pub async fn load_last_known_good(
    proxy: &Proxy,
    state_dir: &Path,
) -> Result<Option<u64>, SubscribeError> {
    let path = state_dir.join(STATE_FILE);
    let text = match tokio::fs::read(&path).await {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(SubscribeError::Io { path, source }),
    };
    let table: RouteTable = serde_json::from_slice(&text)
        .map_err(|e| SubscribeError::Stream(format!("{}: {e}", path.display())))?;
    let version = table.version;
    proxy
        .apply(table)
        .await
        .map_err(|e| SubscribeError::Stream(format!("{}: {e}", path.display())))?;
    Ok(Some(version))
}

/// Subscribes forever: connect, stream, and on any failure back off and connect again.
pub async fn run(proxy: Proxy, config: SubscribeConfig, status: Arc<SubscribeStatus>) {
    let mut failures: u32 = 0;
    loop {
        let mut streamed = false;
        let outcome = stream_once(&proxy, &config, &status, &mut streamed).await;
        status.connected.store(false, Ordering::Release);
        failures = failures_before_retry(&outcome, streamed, failures);
        let delay = backoff(&config, failures);
        failures = failures.saturating_add(1);
        match outcome {
            Ok(()) => tracing::info!(?delay, "controller ended the stream; reconnecting"),
            Err(e) => tracing::warn!(error = %e, ?delay, "controller stream failed; reconnecting"),
        }
        tokio::time::sleep(delay).await;
    }
}

/// The failure count the next delay is computed from: reset by a stream that ran; at most 2
/// after a 503, the answer of a controller replica that does not serve proxies (not the
/// leader), so the proxy tries again within a second: the next connection may reach the one
/// that does.
fn failures_before_retry(
    outcome: &Result<(), SubscribeError>,
    streamed: bool,
    failures: u32,
) -> u32 {
    let failures = if streamed { 0 } else { failures };
    match outcome {
        Err(SubscribeError::Status { status, .. })
            if *status == StatusCode::SERVICE_UNAVAILABLE =>
        {
            failures.min(2)
        }
        _ => failures,
    }
}

/// `min * 2^failures`, capped, then a random point in its upper half.
fn backoff(config: &SubscribeConfig, failures: u32) -> Duration {
    let exp = config
        .backoff_min
        .saturating_mul(1u32 << failures.min(20))
        .min(config.backoff_max);
    let half = exp / 2;
    half + half.mul_f64(fastrand::f64())
}

fn read(path: PathBuf) -> Result<String, SubscribeError> {
    std::fs::read_to_string(&path).map_err(|source| SubscribeError::Io { path, source })
}

/// Loads `tls.crt`, `tls.key` and `ca.crt` into a client config (ALPN h2, TLS 1.3/1.2).
pub fn client_config(tls_dir: &Path) -> Result<Arc<ClientConfig>, SubscribeError> {
    let tls = |e: &dyn std::fmt::Display| SubscribeError::Tls(e.to_string());
    let cert = read(tls_dir.join("tls.crt"))?;
    let key = read(tls_dir.join("tls.key"))?;
    let ca = read(tls_dir.join("ca.crt"))?;
    let chain = rustls_pemfile::certs(&mut cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls(&e))?;
    let key = rustls_pemfile::private_key(&mut key.as_bytes())
        .map_err(|e| tls(&e))?
        .ok_or_else(|| SubscribeError::Tls("tls.key: no private key".into()))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca.as_bytes()) {
        roots.add(c.map_err(|e| tls(&e))?).map_err(|e| tls(&e))?;
    }
    let mut config = ClientConfig::builder_with_provider(crate::downstream::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| tls(&e))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| tls(&e))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Splits `https://HOST:PORT[/]` into the connect address and the TLS server name.
fn parse_url(url: &str) -> Result<(String, ServerName<'static>), SubscribeError> {
    let bad = || SubscribeError::Url(url.to_owned());
    let authority = url
        .strip_prefix("https://")
        .ok_or_else(bad)?
        .trim_end_matches('/');
    let (host, port) = authority.rsplit_once(':').ok_or_else(bad)?;
    port.parse::<u16>().map_err(|_| bad())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_owned()).map_err(|_| bad())?;
    Ok((authority.to_owned(), name))
}

/// Minimal percent-encoding for a query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn stream_once(
    proxy: &Proxy,
    config: &SubscribeConfig,
    status: &SubscribeStatus,
    streamed: &mut bool,
) -> Result<(), SubscribeError> {
    let (authority, server_name) = parse_url(&config.controller)?;
    let tls = client_config(&config.tls_dir)?;
    let connect_err = |message: String| SubscribeError::Connect {
        addr: authority.clone(),
        message,
    };
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&authority))
        .await
        .map_err(|_| connect_err("timed out".into()))?
        .map_err(|e| connect_err(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let stream = tokio::time::timeout(
        CONNECT_TIMEOUT,
        TlsConnector::from(tls).connect(server_name, tcp),
    )
    .await
    .map_err(|_| SubscribeError::Tls("handshake timed out".into()))?
    .map_err(|e| SubscribeError::Tls(e.to_string()))?;

    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .initial_stream_window_size(4 * 1024 * 1024)
        .initial_connection_window_size(8 * 1024 * 1024)
        .handshake::<_, AckBody>(TokioIo::new(stream))
        .await?;
    let driver = tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "controller connection ended");
        }
    });
    // Abort the driver however this function returns.
    let _driver = AbortOnDrop(driver);

    let (acks, rx) = mpsc::channel::<Bytes>(16);
    let uri = format!(
        "https://{authority}/v1/tables?gateway={}&proxy={}",
        encode(&config.gateway.to_string()),
        encode(&config.id)
    );
    let req = Request::post(uri)
        .body(AckBody { rx })
        .map_err(|e| SubscribeError::Stream(e.to_string()))?;
    let resp = sender.send_request(req).await?;
    if resp.status() != StatusCode::OK {
        let status = resp.status();
        let body = resp.into_body().collect().await.map(|b| b.to_bytes());
        let body = String::from_utf8_lossy(&body.unwrap_or_default()).into_owned();
        return Err(SubscribeError::Status {
            status,
            body: body.chars().take(200).collect(),
        });
    }
    status.connected.store(true, Ordering::Release);
    tracing::info!(controller = %config.controller, gateway = %config.gateway, "subscribed");
    *streamed = true;

    let mut body = resp.into_body();
    let mut buf = BytesMut::new();
    let mut scanned = 0;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(pos) = buf[scanned..].iter().position(|b| *b == b'\n') {
            let line = buf.split_to(scanned + pos + 1).freeze();
            scanned = 0;
            let (reply, applied) = on_table(proxy, config, status, &line).await;
            acks.send(reply)
                .await
                .map_err(|_| SubscribeError::Stream("ACK stream closed".into()))?;
            // ACK first (it means "serving"), then keep the table for a restart.
            if applied {
                persist(&config.state_dir, line).await;
            }
        }
        scanned = buf.len();
        if buf.len() > MAX_TABLE_BYTES {
            return Err(SubscribeError::Stream("table larger than 256 MiB".into()));
        }
    }
    Ok(())
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[derive(serde::Serialize)]
struct Ack<'a> {
    version: u64,
    ack: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

fn ack_line(version: u64, error: Option<&str>) -> Bytes {
    let mut v = serde_json::to_vec(&Ack {
        version,
        ack: error.is_none(),
        error,
    })
    .unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

#[derive(serde::Deserialize)]
struct VersionOnly {
    #[serde(default)]
    version: u64,
}

/// Applies one table line; returns the ACK or NACK line to send and whether it applied.
async fn on_table(
    proxy: &Proxy,
    config: &SubscribeConfig,
    status: &SubscribeStatus,
    line: &Bytes,
) -> (Bytes, bool) {
    let json = json_of(line);
    let table: RouteTable = match serde_json::from_slice(json) {
        Ok(t) => t,
        Err(e) => {
            let version = serde_json::from_slice::<VersionOnly>(json).map_or(0, |v| v.version);
            return (
                nack(status, version, &format!("table does not parse: {e}")),
                false,
            );
        }
    };
    let version = table.version;
    if table.gateway != config.gateway {
        let msg = format!(
            "table is for Gateway {}, not {}",
            table.gateway, config.gateway
        );
        return (nack(status, version, &msg), false);
    }
    if let Err(e) = proxy.apply(table).await {
        return (nack(status, version, &e.to_string()), false);
    }
    status.applied(version);
    tracing::info!(version, "table from the controller applied");
    (ack_line(version, None), true)
}

/// Saves an applied table line as the last known good one; failures are logged.
async fn persist(state_dir: &Path, line: Bytes) {
    let state_dir = state_dir.to_path_buf();
    match tokio::task::spawn_blocking(move || save(&state_dir, json_of(&line))).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "last known good table not saved"),
        Err(e) => tracing::warn!(error = %e, "last known good table not saved"),
    }
}

/// The JSON of a line, without its `\n`.
fn json_of(line: &Bytes) -> &[u8] {
    line.strip_suffix(b"\n").unwrap_or(line)
}

fn nack(status: &SubscribeStatus, version: u64, error: &str) -> Bytes {
    status.nacks.fetch_add(1, Ordering::AcqRel);
    tracing::error!(
        version,
        error,
        "table from the controller rejected; the previous one keeps serving"
    );
    ack_line(version, Some(error))
}

/// Writes `STATE_DIR/table.json` atomically: temp file, fsync, rename.
pub fn save(state_dir: &Path, json: &[u8]) -> Result<(), SubscribeError> {
    use std::io::Write as _;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SubscribeError::Io { path, source }
    };
    std::fs::create_dir_all(state_dir).map_err(io(state_dir))?;
    let tmp = state_dir.join(format!("{STATE_FILE}.tmp"));
    let dest = state_dir.join(STATE_FILE);
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(json).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, &dest).map_err(io(&dest))
}

/// The request body: ACK/NACK lines from a channel.
struct AckBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for AckBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_503_keeps_the_backoff_short_and_a_stream_resets_it() {
        let refused = Err(SubscribeError::Status {
            status: StatusCode::SERVICE_UNAVAILABLE,
            body: String::new(),
        });
        let other = Err(SubscribeError::Status {
            status: StatusCode::FORBIDDEN,
            body: String::new(),
        });
        assert_eq!(failures_before_retry(&refused, false, 9), 2);
        assert_eq!(failures_before_retry(&refused, false, 1), 1);
        assert_eq!(failures_before_retry(&other, false, 9), 9);
        assert_eq!(failures_before_retry(&Ok(()), true, 9), 0);
        assert_eq!(failures_before_retry(&Ok(()), false, 4), 4);
        let c = SubscribeConfig::new("https://c:1", ObjectKey::new("ns", "gw"), "p", "/t", "/s");
        let after_503 = backoff(&c, failures_before_retry(&refused, false, 20));
        assert!(after_503 <= Duration::from_secs(1), "{after_503:?}");
    }

    #[test]
    fn url_and_backoff() {
        let (a, n) = parse_url("https://127.0.0.1:8443/").unwrap();
        assert_eq!(a, "127.0.0.1:8443");
        assert!(matches!(n, ServerName::IpAddress(_)));
        let (a, _) = parse_url("https://ctl.tollgate.svc:9443").unwrap();
        assert_eq!(a, "ctl.tollgate.svc:9443");
        assert!(parse_url("http://x:1").is_err());
        assert!(parse_url("https://x").is_err());
        let c = SubscribeConfig::new("https://x:1", ObjectKey::new("a", "b"), "p", "/t", "/s");
        for n in 0..40 {
            let d = backoff(&c, n);
            assert!(d <= c.backoff_max, "{d:?}");
            assert!(d >= c.backoff_min / 2, "{d:?}");
        }
        assert_eq!(encode("ns/gw x"), "ns%2Fgw%20x");
    }

    #[test]
    fn ack_lines() {
        assert_eq!(&ack_line(7, None)[..], b"{\"version\":7,\"ack\":true}\n");
        assert_eq!(
            &ack_line(8, Some("bad \"re\""))[..],
            b"{\"version\":8,\"ack\":false,\"error\":\"bad \\\"re\\\"\"}\n"
        );
    }
}
