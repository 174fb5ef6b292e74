//! Network namespaces and veth pairs, through iproute2's `ip`.
//!
//! Each pod gets `tg-<id>` with `eth0` (one end of a veth pair whose host end `tgv<id>` is a
//! port of the harness's bridge), its address on the pod /24, and a route for the service
//! range via the bridge address. No default route: a pod reaches pods, services and the API
//! server, and nothing else.

use std::net::Ipv4Addr;

use tokio::process::Command;

use crate::error::{Error, Result};

/// Runs a command, returning its stdout; a non-zero exit is an [`Error::Command`].
pub async fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|source| Error::Io {
            what: format!("running {program}"),
            source,
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Command {
            cmd: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// Names of a pod's namespace and host-side veth, from the pod UID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNet {
    pub netns: String,
    pub host_veth: String,
}

pub const NETNS_PREFIX: &str = "tg-";

impl PodNet {
    pub fn for_uid(uid: &str) -> Self {
        let id: String = uid
            .chars()
            .filter(|c| c.is_ascii_hexdigit())
            .take(10)
            .collect();
        Self {
            netns: format!("{NETNS_PREFIX}{id}"),
            host_veth: format!("tgv{id}"),
        }
    }

    /// Creates the namespace and wires it to `bridge` with `ip`/`prefix_len`.
    pub async fn create(
        &self,
        bridge: &str,
        ip: Ipv4Addr,
        prefix_len: u8,
        gateway: Ipv4Addr,
        service_cidr: &str,
    ) -> Result<()> {
        // A leftover of a crashed run would make `netns add` fail.
        self.delete().await;
        let ns = self.netns.as_str();
        run("ip", &["netns", "add", ns]).await?;
        let result = async {
            run(
                "ip",
                &[
                    "link",
                    "add",
                    &self.host_veth,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    ns,
                ],
            )
            .await?;
            run(
                "ip",
                &["link", "set", &self.host_veth, "master", bridge, "up"],
            )
            .await?;
            let addr = format!("{ip}/{prefix_len}");
            run("ip", &["-n", ns, "addr", "add", &addr, "dev", "eth0"]).await?;
            run("ip", &["-n", ns, "link", "set", "lo", "up"]).await?;
            run("ip", &["-n", ns, "link", "set", "eth0", "up"]).await?;
            let gw = gateway.to_string();
            run(
                "ip",
                &[
                    "-n",
                    ns,
                    "route",
                    "add",
                    service_cidr,
                    "via",
                    &gw,
                    "dev",
                    "eth0",
                ],
            )
            .await?;
            Ok(())
        }
        .await;
        if result.is_err() {
            self.delete().await;
        }
        result
    }

    /// Deletes the namespace (which deletes both veth ends); never fails.
    pub async fn delete(&self) {
        let _ = run("ip", &["netns", "delete", &self.netns]).await;
        let _ = run("ip", &["link", "delete", &self.host_veth]).await;
    }
}

/// The namespaces a previous agent left behind (`tg-*`).
pub async fn leftover_namespaces() -> Vec<String> {
    let Ok(out) = run("ip", &["netns", "list"]).await else {
        return Vec::new();
    };
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(NETNS_PREFIX))
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_linux_limits() {
        let n = PodNet::for_uid("0f3c2a1b-9d8e-4c7b-a6f5-e4d3c2b1a090");
        assert_eq!(n.netns, "tg-0f3c2a1b9d");
        assert_eq!(n.host_veth, "tgv0f3c2a1b9d");
        assert!(n.host_veth.len() <= 15);
    }
}
