//! Helpers for tests that run the `tollgate` binary: a child process killed on drop, free
//! ports, a tiny HTTP/1.1 client over loopback, and an HTTP/2 prior-knowledge (h2c) POST as a
//! gRPC client sends it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The GatewayClass `tollgate` and Gateway `default/gw` (an HTTP listener on 127.0.0.1:`port`)
/// that the `tollgate run` tests serve their routes on.
pub fn gateway_yaml(port: u16) -> String {
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: tollgate}}
spec: {{controllerName: tollgate.dev/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw, namespace: default}}
spec:
  gatewayClassName: tollgate
  addresses: [{{type: IPAddress, value: 127.0.0.1}}]
  listeners:
  - {{name: http, protocol: HTTP, port: {port}}}
"#
    )
}

/// A running `tollgate` process, killed when dropped.
pub struct Tollgate {
    child: Child,
    log: std::path::PathBuf,
}

impl Tollgate {
    /// Starts `tollgate ARGS...`, its stdout and stderr captured in a log file.
    pub fn start(args: &[&str], log_dir: &Path) -> Self {
        let log = log_dir.join(format!("tollgate-{}.log", std::process::id()));
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(args)
            .current_dir(workspace())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap();
        Self { child, log }
    }

    /// Sends SIGTERM and waits (up to `limit`) for the process to exit; its exit status, or
    /// None if it is still running.
    pub fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().ok()?;
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().ok()? {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Everything the process has written so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Tollgate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The workspace root.
pub fn workspace() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A parsed HTTP/1.1 response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// Trailers (HTTP/2 responses only).
    pub trailers: Vec<(String, String)>,
}

impl Resp {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// Sends one `GET path` with `Host: host` to `127.0.0.1:port` and reads the whole response
/// (Connection: close). `None` when nothing listens or the exchange fails.
pub fn get(port: u16, host: &str, path: &str) -> Option<Resp> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    parse(&raw)
}

/// A whole HTTP/1.1 response as read off a connection, parsed (a chunked body de-chunked).
pub fn parse_raw(raw: &[u8]) -> Option<Resp> {
    parse(raw)
}

fn parse(raw: &[u8]) -> Option<Resp> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect::<Vec<_>>();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Some(Resp {
        status,
        headers,
        body,
        trailers: Vec::new(),
    })
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Polls `f` until it returns `Some`, for at most `limit`. This bounds a wait for a process
/// to come up or a change to propagate; it asserts nothing about speed.
pub fn eventually<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A fresh, empty directory under the system temp dir.
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tollgate-test-{name}-{}-{}",
        std::process::id(),
        fastrand_u64()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn fastrand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now())
}

/// Sends one `GET path` over TLS to `127.0.0.1:port` with SNI and Host `host`, trusting only
/// the PEM certificate at `ca`. Returns the response and the negotiated ALPN protocol.
pub fn get_tls(port: u16, host: &str, path: &str, ca: &Path) -> Option<Resp> {
    use std::sync::Arc;
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(ca).ok()?;
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        roots.add(cert.ok()?).ok()?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .ok()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from(host.to_string()).ok()?;
    let conn = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    let sock = TcpStream::connect(("127.0.0.1", port)).ok()?;
    sock.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut tls = rustls::StreamOwned::new(conn, sock);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    // A peer that closes without close_notify still gave us the whole response.
    let _ = tls.read_to_end(&mut raw);
    parse(&raw)
}

/// A client certificate chain and its private key, for [`get_mtls`].
pub type ClientCert = (
    Vec<rustls_pki_types::CertificateDer<'static>>,
    rustls_pki_types::PrivateKeyDer<'static>,
);

/// The certificates and the private key of PEM files `cert` and `key`.
pub fn client_cert(cert: &Path, key: &Path) -> ClientCert {
    let certs = rustls_pemfile::certs(&mut std::fs::read(cert).unwrap().as_slice())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls_pemfile::private_key(&mut std::fs::read(key).unwrap().as_slice())
        .unwrap()
        .unwrap();
    (certs, key)
}

/// Like [`get_tls`] with extra `headers`, presenting `client` (if any) when the server asks
/// for a certificate.
/// `Err` carries why no response came: with TLS 1.3 a server refusing the client's
/// certificate (or its absence) answers the client's first read with an alert, which shows
/// here as an `io::Error` wrapping [`rustls::Error::AlertReceived`].
pub fn get_mtls(
    port: u16,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
    ca: &Path,
    client: Option<ClientCert>,
) -> std::io::Result<Resp> {
    use std::io::{Error, ErrorKind};
    use std::sync::Arc;
    let other = |e: &dyn std::fmt::Display| Error::other(e.to_string());
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut std::fs::read(ca)?.as_slice()) {
        roots.add(cert?).map_err(|e| other(&e))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| other(&e))?
    .with_root_certificates(roots);
    let config = match client {
        Some((certs, key)) => builder
            .with_client_auth_cert(certs, key)
            .map_err(|e| other(&e))?,
        None => builder.with_no_client_auth(),
    };
    let name = rustls_pki_types::ServerName::try_from(host.to_string()).map_err(|e| other(&e))?;
    let conn = rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| other(&e))?;
    let sock = TcpStream::connect(("127.0.0.1", port))?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut tls = rustls::StreamOwned::new(conn, sock);
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    tls.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    match tls.read_to_end(&mut raw) {
        // A peer that closes without close_notify still gave us the whole response.
        Err(e) if raw.is_empty() => return Err(e),
        _ => {}
    }
    parse(&raw).ok_or_else(|| Error::new(ErrorKind::InvalidData, "not an HTTP response"))
}

/// Sends one `GET /` with extra headers over plain HTTP/1.1.
pub fn get_with(port: u16, host: &str, path: &str, headers: &[(&str, &str)]) -> Option<Resp> {
    send_with(port, "GET", host, path, headers)
}

/// Sends one bodiless `method path` with extra headers over plain HTTP/1.1.
pub fn send_with(
    port: u16,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<Resp> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    parse(&raw)
}

/// Sends one HTTP/2 prior-knowledge (h2c) `POST path` to `127.0.0.1:port` with `headers` and
/// `body`, as a gRPC client does. `None` when nothing listens or the exchange fails.
pub fn post_h2c(port: u16, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Option<Resp> {
    use http_body_util::BodyExt;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let (mut send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tcp),
        )
        .await
        .ok()?;
        tokio::spawn(conn);
        let mut req = http::Request::post(format!("http://127.0.0.1:{port}{path}"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(http_body_util::Full::new(bytes::Bytes::copy_from_slice(
                body,
            )))
            .ok()?;
        let resp = send.send_request(req).await.ok()?;
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let collected = resp.into_body().collect().await.ok()?;
        let trailers = collected
            .trailers()
            .into_iter()
            .flatten()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = collected.to_bytes();
        Some(Resp {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
            trailers,
        })
    };
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), exchange)
            .await
            .ok()?
    })
}
