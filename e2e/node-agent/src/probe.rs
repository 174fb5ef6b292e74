//! Readiness probes: httpGet, tcpSocket and exec, each bounded by the probe's timeout.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;

/// Resolves a probe port (a number or the name of a container port).
pub fn port(container: &Container, p: &IntOrString) -> Option<u16> {
    match p {
        IntOrString::Int(n) => u16::try_from(*n).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|cp| cp.name.as_deref() == Some(name.as_str()))
            .and_then(|cp| u16::try_from(cp.container_port).ok()),
    }
}

/// Runs the probe once; `pid` is the container's process (exec probes enter its namespaces).
pub async fn run(probe: &Probe, container: &Container, ip: Ipv4Addr, pid: Option<u32>) -> bool {
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    tokio::time::timeout(timeout, run_inner(probe, container, ip, pid))
        .await
        .unwrap_or(false)
}

async fn run_inner(probe: &Probe, container: &Container, ip: Ipv4Addr, pid: Option<u32>) -> bool {
    if let Some(h) = &probe.http_get {
        let Some(p) = port(container, &h.port) else {
            return false;
        };
        let host = h.host.clone().unwrap_or_else(|| ip.to_string());
        let Ok(mut s) = TcpStream::connect((ip, p)).await else {
            return false;
        };
        if h.scheme.as_deref() == Some("HTTPS") {
            // No TLS client here: a completed TCP connect counts (documented limitation).
            return true;
        }
        let mut req = format!(
            "GET {} HTTP/1.1\r\nHost: {host}:{p}\r\nUser-Agent: kube-probe/1.34\r\nAccept: */*\r\nConnection: close\r\n",
            h.path.as_deref().unwrap_or("/")
        );
        for hd in h.http_headers.iter().flatten() {
            req.push_str(&format!("{}: {}\r\n", hd.name, hd.value));
        }
        req.push_str("\r\n");
        if s.write_all(req.as_bytes()).await.is_err() {
            return false;
        }
        let mut buf = [0u8; 64];
        let mut n = 0;
        while n < 12 {
            match s.read(&mut buf[n..]).await {
                Ok(0) | Err(_) => break,
                Ok(k) => n += k,
            }
        }
        let head = String::from_utf8_lossy(&buf[..n]);
        let code: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (200..400).contains(&code)
    } else if let Some(t) = &probe.tcp_socket {
        let Some(p) = port(container, &t.port) else {
            return false;
        };
        TcpStream::connect(SocketAddr::from((ip, p))).await.is_ok()
    } else if let Some(e) = &probe.exec {
        let (Some(pid), Some(cmd)) = (pid, e.command.as_ref()) else {
            return false;
        };
        if cmd.is_empty() {
            return false;
        }
        let pid = pid.to_string();
        Command::new("nsenter")
            .args(["-t", &pid, "-m", "-n", "--"])
            .args(cmd)
            .kill_on_drop(true)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .await
            .map(|s| s.success())
            .unwrap_or(false)
    } else {
        false
    }
}
