//! One pod on this node: its network namespace, files, container processes, probes.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use tokio::process::{Child, Command};

use crate::config::Config;
use crate::env::{self, PodFacts};
use crate::error::{Error, Result, io};
use crate::netns::{self, PodNet};
use crate::probe;

/// What the agent knows about its node, shared by all pods.
#[derive(Debug, Clone)]
pub struct NodeCtx {
    pub node_name: String,
    pub bridge: String,
    pub gateway: Ipv4Addr,
    pub prefix_len: u8,
    pub service_cidr: String,
    pub api_host: String,
    pub api_port: u16,
    pub state_dir: PathBuf,
    pub config_path: PathBuf,
    /// The port of the kubelet log endpoint on the bridge address.
    pub kubelet_port: u16,
}

#[derive(Debug, Clone)]
pub enum State {
    Waiting {
        reason: String,
        message: String,
    },
    Running {
        since: Time,
    },
    Terminated {
        code: i32,
        reason: String,
        started: Time,
        finished: Time,
    },
}

#[derive(Debug)]
pub struct ContainerRt {
    pub spec: Container,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub child: Option<Child>,
    pub state: State,
    pub last_termination: Option<State>,
    pub restarts: i32,
    pub ready: bool,
    pub started_at: Option<Instant>,
    pub next_restart: Option<Instant>,
    pub next_probe: Option<Instant>,
    pub probe_successes: i32,
    pub probe_failures: i32,
}

impl ContainerRt {
    /// A container not started yet, in `state`, with nothing resolved.
    pub fn new(spec: Container, state: State) -> Self {
        Self {
            spec,
            argv: Vec::new(),
            env: Vec::new(),
            child: None,
            state,
            last_termination: None,
            restarts: 0,
            ready: false,
            started_at: None,
            next_restart: None,
            next_probe: None,
            probe_successes: 0,
            probe_failures: 0,
        }
    }
}

#[derive(Debug)]
pub struct PodRt {
    pub namespace: String,
    pub name: String,
    pub net: PodNet,
    pub ip: Ipv4Addr,
    pub dir: PathBuf,
    pub restart_policy: String,
    pub grace: Duration,
    pub containers: Vec<ContainerRt>,
    pub start_time: Time,
    /// Mount points created on the host (directories, empty files). Not removed when the
    /// pod stops: other pods may have mounts on them, and removing a mount point on the host
    /// detaches those mounts in every namespace. The agent removes them when it stops.
    pub created: Vec<PathBuf>,
    /// A failure of the pod as a whole (reason, message).
    pub failure: Option<(String, String)>,
}

fn now() -> Time {
    Time(Timestamp::now())
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Creates missing directories up to `path` (recording the ones it created).
fn ensure_dir(path: &Path, created: &mut Vec<PathBuf>) -> Result<()> {
    let mut missing = Vec::new();
    let mut p = Some(path);
    while let Some(d) = p {
        if d.exists() {
            break;
        }
        missing.push(d.to_owned());
        p = d.parent();
    }
    for d in missing.into_iter().rev() {
        std::fs::create_dir(&d).map_err(io(format!("creating mount point {}", d.display())))?;
        created.push(d);
    }
    Ok(())
}

impl PodRt {
    /// Sets up the pod and starts its containers. Errors that concern one container (an image
    /// nobody mapped, a missing Secret) are kept in that container's state, not returned.
    pub async fn start(
        client: &Client,
        ctx: &NodeCtx,
        pod: &Pod,
        ip: Ipv4Addr,
        hosts: &str,
    ) -> Result<Self> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let dir = ctx.state_dir.join("pods").join(&uid);
        std::fs::create_dir_all(dir.join("logs"))
            .map_err(io(format!("creating {}", dir.display())))?;
        let net = PodNet::for_uid(&uid);
        let mut rt = PodRt {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            net,
            ip,
            dir,
            restart_policy: spec
                .restart_policy
                .clone()
                .unwrap_or_else(|| "Always".into()),
            grace: Duration::from_secs(
                spec.termination_grace_period_seconds
                    .unwrap_or(30)
                    .clamp(0, 30) as u64,
            ),
            containers: spec
                .containers
                .iter()
                .map(|c| {
                    ContainerRt::new(
                        c.clone(),
                        State::Waiting {
                            reason: "ContainerCreating".into(),
                            message: String::new(),
                        },
                    )
                })
                .collect(),
            start_time: now(),
            created: Vec::new(),
            failure: None,
        };
        rt.net
            .create(
                &ctx.bridge,
                ip,
                ctx.prefix_len,
                ctx.gateway,
                &ctx.service_cidr,
            )
            .await?;
        rt.write_hosts(hosts)?;
        let config = Config::load(&ctx.config_path)?;
        let facts = PodFacts {
            pod,
            pod_ip: ip.to_string(),
            host_ip: ctx.gateway.to_string(),
            node_name: &ctx.node_name,
            api_host: ctx.api_host.clone(),
            api_port: ctx.api_port,
        };
        let volumes = match env::write_volumes(client, &facts, &rt.dir.join("volumes")).await {
            Ok(v) => v,
            Err(e) => {
                rt.fail_all("CreateContainerConfigError", &e.to_string());
                return Ok(rt);
            }
        };
        for c in &mut rt.containers {
            let Some(mapping) = config.lookup(c.spec.image.as_deref().unwrap_or_default()) else {
                c.state = State::Waiting {
                    reason: "ImageNotMapped".into(),
                    message: format!(
                        "image {:?} matches no prefix in {} (the node agent runs local binaries, it pulls nothing)",
                        c.spec.image.as_deref().unwrap_or_default(),
                        ctx.config_path.display()
                    ),
                };
                continue;
            };
            c.argv = mapping.argv(
                c.spec.command.as_deref().unwrap_or(&[]),
                c.spec.args.as_deref().unwrap_or(&[]),
            );
            match env::container_env(client, &facts, &c.spec).await {
                Ok(e) => {
                    c.argv = c.argv.iter().map(|a| env::expand(a, &e)).collect();
                    c.env = e;
                }
                Err(e) => {
                    c.state = State::Waiting {
                        reason: "CreateContainerConfigError".into(),
                        message: e.to_string(),
                    };
                    continue;
                }
            }
            let script = match write_script(&rt.dir, &c.spec, &volumes, &mut rt.created) {
                Ok(s) => s,
                Err(e) => {
                    c.state = State::Waiting {
                        reason: "CreateContainerConfigError".into(),
                        message: e.to_string(),
                    };
                    continue;
                }
            };
            if let Err(e) = spawn(c, &rt.net.netns, &script, &rt.dir) {
                c.state = State::Waiting {
                    reason: "CreateContainerError".into(),
                    message: e.to_string(),
                };
            }
        }
        Ok(rt)
    }

    /// Nothing runs and some container waits for a Secret or ConfigMap that was missing when
    /// the pod was set up: the kubelet retries those, and so does the agent.
    pub fn waiting_on_config(&self) -> bool {
        self.failure.is_none()
            && self
                .containers
                .iter()
                .all(|c| matches!(c.state, State::Waiting { .. }))
            && self.containers.iter().any(|c| {
                matches!(&c.state, State::Waiting { reason, .. } if reason == "CreateContainerConfigError")
            })
    }

    fn fail_all(&mut self, reason: &str, message: &str) {
        for c in &mut self.containers {
            c.state = State::Waiting {
                reason: reason.into(),
                message: message.into(),
            };
        }
    }

    /// Rewrites the pod's /etc/hosts in place (same inode: the bind mounts see it).
    pub fn write_hosts(&self, services: &str) -> Result<()> {
        let text = format!(
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{}\t{}\n{}",
            self.ip, self.name, services
        );
        let path = self.dir.join("hosts");
        if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
            return Ok(());
        }
        std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))
    }

    /// Reaps exited containers, restarts them per the restart policy, runs due probes.
    pub async fn tick(&mut self) {
        let ip = self.ip;
        for c in &mut self.containers {
            if let Some(child) = &mut c.child
                && let Ok(Some(status)) = child.try_wait()
            {
                let code = status.code().unwrap_or(137);
                let started = match &c.state {
                    State::Running { since } => since.clone(),
                    _ => now(),
                };
                c.state = State::Terminated {
                    code,
                    reason: if code == 0 {
                        "Completed".into()
                    } else {
                        "Error".into()
                    },
                    started,
                    finished: now(),
                };
                c.child = None;
                c.ready = false;
                let restart = match self.restart_policy.as_str() {
                    "Never" => false,
                    "OnFailure" => code != 0,
                    _ => true,
                };
                if restart {
                    let backoff = Duration::from_secs(1 << c.restarts.clamp(0, 5));
                    c.next_restart = Some(Instant::now() + backoff);
                }
            }
            if let Some(at) = c.next_restart
                && Instant::now() >= at
            {
                c.next_restart = None;
                c.last_termination = Some(c.state.clone());
                c.restarts += 1;
                let script = self.dir.join(format!("run-{}.sh", c.spec.name));
                if let Err(e) = spawn(c, &self.net.netns, &script, &self.dir) {
                    c.state = State::Waiting {
                        reason: "CreateContainerError".into(),
                        message: e.to_string(),
                    };
                }
            }
            if c.child.is_none() {
                continue;
            }
            let Some(p) = c.spec.readiness_probe.clone() else {
                c.ready = true;
                continue;
            };
            let started = c.started_at.unwrap_or_else(Instant::now);
            let due = c.next_probe.unwrap_or(
                started + Duration::from_secs(p.initial_delay_seconds.unwrap_or(0).max(0) as u64),
            );
            if Instant::now() < due {
                continue;
            }
            let pid = c.child.as_ref().and_then(Child::id);
            let ok = probe::run(&p, &c.spec, ip, pid).await;
            c.next_probe = Some(
                Instant::now() + Duration::from_secs(p.period_seconds.unwrap_or(10).max(1) as u64),
            );
            if ok {
                c.probe_failures = 0;
                c.probe_successes += 1;
                if c.probe_successes >= p.success_threshold.unwrap_or(1).max(1) {
                    c.ready = true;
                }
            } else {
                c.probe_successes = 0;
                c.probe_failures += 1;
                if c.probe_failures >= p.failure_threshold.unwrap_or(3).max(1) {
                    c.ready = false;
                }
            }
        }
    }

    /// Stops every process (TERM, then KILL after the grace period) and deletes the namespace
    /// and the pod's files.
    pub async fn stop(&mut self) {
        for c in &mut self.containers {
            c.next_restart = None;
            if let Some(pid) = c.child.as_ref().and_then(Child::id) {
                let _ = netns::run("kill", &["-TERM", "--", &format!("-{pid}")]).await;
            }
        }
        let deadline = Instant::now() + self.grace;
        for c in &mut self.containers {
            if let Some(child) = &mut c.child {
                let left = deadline.saturating_duration_since(Instant::now());
                if tokio::time::timeout(left, child.wait()).await.is_err() {
                    if let Some(pid) = child.id() {
                        let _ = netns::run("kill", &["-KILL", "--", &format!("-{pid}")]).await;
                    }
                    let _ = child.wait().await;
                }
            }
            c.child = None;
        }
        // Anything that left its process group but still lives in the namespace.
        if let Ok(pids) = netns::run("ip", &["netns", "pids", &self.net.netns]).await {
            for pid in pids.split_whitespace() {
                let _ = netns::run("kill", &["-KILL", pid]).await;
            }
        }
        self.net.delete().await;
        // Keep the logs (under the state dir, which `cluster.sh down` deletes).
        let _ = std::fs::remove_dir_all(self.dir.join("volumes"));
    }
}

/// The per-container wrapper: bind-mounts /etc/hosts and the volumes in the container's own
/// mount namespace, then execs the program.
fn write_script(
    pod_dir: &Path,
    c: &Container,
    volumes: &std::collections::BTreeMap<String, PathBuf>,
    created: &mut Vec<PathBuf>,
) -> Result<PathBuf> {
    let mut s = String::from("#!/bin/sh\nset -e\n");
    s.push_str(&format!(
        "mount --bind {} /etc/hosts\n",
        shell_quote(&pod_dir.join("hosts").to_string_lossy())
    ));
    // Mounts over a directory that holds the pod's own files (the CoreDNS of the conformance
    // suite mounts its ConfigMap at /root, above the agent's state dir) come last: after them,
    // the sources of the others would be hidden.
    let mut mounts: Vec<&VolumeMount> = c.volume_mounts.iter().flatten().collect();
    mounts.sort_by_key(|m| pod_dir.starts_with(&m.mount_path));
    // A mount above the program itself (that CoreDNS's /root above a binary in the cache dir)
    // would hide it: the program is opened first and run from that descriptor.
    let above: Vec<String> = mounts
        .iter()
        .map(|m| format!("{}/*", shell_quote(m.mount_path.trim_end_matches('/'))))
        .collect();
    if !above.is_empty() {
        s.push_str(&format!(
            "case \"$1\" in {}) [ -f \"$1\" ] && exec 9<\"$1\" && prog_fd=9 ;; esac\n",
            above.join("|")
        ));
    }
    for m in mounts {
        let Some(vol) = volumes.get(&m.name) else {
            return Err(Error::Pod(format!(
                "volumeMount {}: no such volume",
                m.name
            )));
        };
        let mut src = vol.clone();
        if let Some(sub) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            if sub.split('/').any(|x| x == "..") {
                return Err(Error::Pod(format!("subPath {sub:?} is not allowed")));
            }
            src = src.join(sub);
        }
        let target = PathBuf::from(&m.mount_path);
        if src.is_dir() {
            ensure_dir(&target, created)?;
        } else {
            if let Some(parent) = target.parent() {
                ensure_dir(parent, created)?;
            }
            if !target.exists() {
                std::fs::write(&target, b"")
                    .map_err(io(format!("creating mount point {}", target.display())))?;
                created.push(target.clone());
            }
        }
        let (src, target) = (
            shell_quote(&src.to_string_lossy()),
            shell_quote(&m.mount_path),
        );
        s.push_str(&format!("mount --bind {src} {target}\n"));
        if m.read_only == Some(true) {
            s.push_str(&format!("mount -o remount,bind,ro {target}\n"));
        }
    }
    if let Some(wd) = c.working_dir.as_deref().filter(|w| !w.is_empty()) {
        s.push_str(&format!("cd {}\n", shell_quote(wd)));
    }
    s.push_str("if [ -n \"${prog_fd:-}\" ]; then shift; exec /proc/self/fd/9 \"$@\"; fi\n");
    s.push_str("exec \"$@\"\n");
    let path = pod_dir.join(format!("run-{}.sh", c.name));
    std::fs::write(&path, s).map_err(io(format!("writing {}", path.display())))?;
    Ok(path)
}

/// Starts the container: `ip netns exec NS unshare -m sh SCRIPT ARGV...`, in its own process
/// group, output appended to `logs/<container>.log`.
fn spawn(c: &mut ContainerRt, netns_name: &str, script: &Path, pod_dir: &Path) -> Result<()> {
    let log_path = pod_dir.join("logs").join(format!("{}.log", c.spec.name));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io(format!("opening {}", log_path.display())))?;
    let log2 = log.try_clone().map_err(io("duplicating the log file"))?;
    let child = Command::new("ip")
        .args([
            "netns",
            "exec",
            netns_name,
            "unshare",
            "-m",
            "--propagation",
            "private",
            "/bin/sh",
        ])
        .arg(script)
        .args(&c.argv)
        .env_clear()
        .envs(c.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .current_dir(pod_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log2))
        .process_group(0)
        .kill_on_drop(false)
        .spawn()
        .map_err(io(format!("starting container {}", c.spec.name)))?;
    if let Some(pid) = child.id() {
        let _ = std::fs::write(
            pod_dir.join(format!("{}.pid", c.spec.name)),
            pid.to_string(),
        );
    }
    c.child = Some(child);
    c.state = State::Running { since: now() };
    c.started_at = Some(Instant::now());
    c.next_probe = None;
    c.probe_successes = 0;
    c.probe_failures = 0;
    Ok(())
}
