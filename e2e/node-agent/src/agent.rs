//! The pod loop: bind pending pods to this node, run the ones bound here, report their
//! status, tear down the ones deleted.

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};

use crate::error::{Error, Result};
use crate::logs::LogIndex;
use crate::pod::{NodeCtx, PodRt};
use crate::services::{HostEntry, hosts_for};
use crate::status::{Transitions, pod_status};

/// How often a pod that waits for a missing Secret or ConfigMap is set up again.
const CONFIG_RETRY: Duration = Duration::from_secs(2);

struct Local {
    rt: PodRt,
    started: Instant,
    transitions: Transitions,
    last_sent: Option<serde_json::Value>,
}

pub struct Agent {
    client: Client,
    ctx: NodeCtx,
    pods: HashMap<String, Local>,
    /// Pods being stopped, by UID: the address they still hold (not handed out again until
    /// their namespace is gone) and the task that stops them. A pod's grace period (30 s by
    /// default) runs in that task, so one slow pod does not hold up binding, starting and
    /// probing the others, nor the Service forwarders synced in the same loop.
    stopping: HashMap<String, (Ipv4Addr, tokio::task::JoinHandle<()>)>,
    /// Pod UIDs deleted from the API server after teardown (so they are not deleted twice).
    finished: BTreeSet<String>,
    /// Pod UIDs bound here whose new nodeName the watch has not shown yet.
    bound: BTreeSet<String>,
    /// Where `kubectl logs` finds each running pod's log files.
    logs: LogIndex,
    /// Mount points created on the host, in creation order (see [`PodRt::created`]); also
    /// listed in `<state dir>/created-mount-points` for `cluster.sh down` after a crash.
    mount_points: Vec<std::path::PathBuf>,
}

fn terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn done(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

impl Agent {
    pub fn new(client: Client, ctx: NodeCtx, logs: LogIndex) -> Self {
        // An earlier agent's list (it crashed): still ours to remove at shutdown.
        let mount_points = std::fs::read_to_string(ctx.state_dir.join("created-mount-points"))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.is_empty())
            .map(std::path::PathBuf::from)
            .collect();
        Self {
            client,
            ctx,
            pods: HashMap::new(),
            stopping: HashMap::new(),
            finished: BTreeSet::new(),
            bound: BTreeSet::new(),
            logs,
            mount_points,
        }
    }

    fn pod_api(&self, pod: &Pod) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default())
    }

    fn alloc_ip(&self, pod: &Pod) -> Result<Ipv4Addr> {
        let used: BTreeSet<Ipv4Addr> = self
            .pods
            .values()
            .map(|l| l.rt.ip)
            .chain(self.stopping.values().map(|(ip, _)| *ip))
            .collect();
        let net = self.ctx.gateway.octets();
        let in_range = |ip: &Ipv4Addr| {
            ip.octets()[..3] == net[..3] && !used.contains(ip) && *ip != self.ctx.gateway
        };
        // Keep the address a pod already reported (an agent restart): the API refuses a change.
        if let Some(ip) = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|s| s.parse().ok())
            && in_range(&ip)
        {
            return Ok(ip);
        }
        (2..=254u8)
            .map(|n| Ipv4Addr::new(net[0], net[1], net[2], n))
            .find(in_range)
            .ok_or_else(|| Error::NoIp(format!("{}/{}", self.ctx.gateway, self.ctx.prefix_len)))
    }

    async fn bind(&self, pod: &Pod) -> Result<()> {
        let name = pod.name_any();
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: pod.namespace(),
                uid: None,
                ..Default::default()
            },
            target: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(self.ctx.node_name.clone()),
                ..Default::default()
            },
        };
        let _: serde_json::Value = self
            .pod_api(pod)
            .create_subresource("binding", &name, &PostParams::default(), &binding)
            .await?;
        tracing::info!(pod = %format!("{}/{name}", pod.namespace().unwrap_or_default()), "bound");
        Ok(())
    }

    /// Deletes the pod object for good (the kubelet's final delete with grace period 0).
    async fn finalize(&mut self, pod: &Pod) {
        let uid = pod.uid().unwrap_or_default();
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.pod_api(pod).delete(&pod.name_any(), &dp).await {
            Ok(_) => {
                self.finished.insert(uid);
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                self.finished.insert(uid);
            }
            Err(e) => tracing::warn!(pod = %pod.name_any(), %e, "final delete"),
        }
    }

    /// Stops `local` in a task of its own (see [`Agent::stopping`]).
    fn stop_in_background(&mut self, uid: String, mut local: Local) {
        self.unindex(&local.rt);
        let ip = local.rt.ip;
        let task = tokio::spawn(async move { local.rt.stop().await });
        self.stopping.insert(uid, (ip, task));
    }

    pub async fn sync(&mut self, store: &Store<Pod>, hosts: &[HostEntry]) {
        self.stopping.retain(|_, (_, task)| !task.is_finished());
        let pods = store.state();
        let mut seen = BTreeSet::new();
        for pod in &pods {
            let spec_node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or("");
            let uid = pod.uid().unwrap_or_default();
            if spec_node.is_empty() {
                if !terminating(pod) && !done(pod) && !self.bound.contains(&uid) {
                    match self.bind(pod).await {
                        Ok(()) => {
                            self.bound.insert(uid);
                        }
                        Err(e) => tracing::warn!(pod = %pod.name_any(), %e, "binding"),
                    }
                }
                continue;
            }
            if spec_node != self.ctx.node_name {
                continue;
            }
            seen.insert(uid.clone());
            if terminating(pod) {
                if let Some(local) = self.pods.remove(&uid) {
                    tracing::info!(pod = %pod.name_any(), "stopping");
                    self.stop_in_background(uid.clone(), local);
                }
                // The pod object goes once its processes have (a later pass).
                if !self.stopping.contains_key(&uid) && !self.finished.contains(&uid) {
                    self.finalize(pod).await;
                }
                continue;
            }
            if self
                .pods
                .get(&uid)
                .is_some_and(|l| l.rt.waiting_on_config() && l.started.elapsed() >= CONFIG_RETRY)
                && let Some(mut local) = self.pods.remove(&uid)
            {
                tracing::info!(pod = %pod.name_any(), "setting up again (a Secret or ConfigMap was missing)");
                self.unindex(&local.rt);
                local.rt.stop().await;
            }
            if !self.pods.contains_key(&uid)
                && !done(pod)
                && let Err(e) = self.start(pod, hosts).await
            {
                tracing::warn!(pod = %pod.name_any(), %e, "starting");
            }
            let Some(local) = self.pods.get_mut(&uid) else {
                continue;
            };
            if let Err(e) = local.rt.write_hosts(&hosts_for(&local.rt.namespace, hosts)) {
                tracing::warn!(%e, "updating /etc/hosts");
            }
            local.rt.tick().await;
            let status = pod_status(
                &local.rt,
                &self.ctx.gateway.to_string(),
                &mut local.transitions,
            );
            let value = serde_json::json!({ "status": status });
            if local.last_sent.as_ref() != Some(&value) {
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &local.rt.namespace);
                match api
                    .patch_status(
                        &local.rt.name,
                        &PatchParams::default(),
                        &Patch::Merge(&value),
                    )
                    .await
                {
                    Ok(_) => local.last_sent = Some(value),
                    Err(e) => tracing::warn!(pod = %local.rt.name, %e, "status"),
                }
            }
        }
        // Pods gone from the API server (deleted with grace 0 by someone else).
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|u| !seen.contains(*u))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(local) = self.pods.remove(&uid) {
                tracing::info!(pod = %local.rt.name, "pod is gone, stopping");
                self.stop_in_background(uid, local);
            }
        }
        self.finished.retain(|u| seen.contains(u));
        let unbound: BTreeSet<String> = pods
            .iter()
            .filter(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .unwrap_or("")
                    .is_empty()
            })
            .filter_map(|p| p.uid())
            .collect();
        self.bound.retain(|u| unbound.contains(u));
    }

    async fn start(&mut self, pod: &Pod, hosts: &[HostEntry]) -> Result<()> {
        let ip = self.alloc_ip(pod)?;
        let ns = pod.namespace().unwrap_or_default();
        tracing::info!(pod = %format!("{ns}/{}", pod.name_any()), %ip, "starting");
        let mut rt = PodRt::start(&self.client, &self.ctx, pod, ip, &hosts_for(&ns, hosts)).await?;
        if let Some(msg) = rt.containers.iter().find_map(|c| match &c.state {
            crate::pod::State::Waiting { reason, message } if reason == "ImageNotMapped" => {
                Some(message.clone())
            }
            _ => None,
        }) {
            rt.failure = Some(("ImageNotMapped".into(), msg));
        }
        if !rt.created.is_empty() {
            self.mount_points.extend(rt.created.iter().cloned());
            let list: String = self
                .mount_points
                .iter()
                .map(|p| format!("{}\n", p.display()))
                .collect();
            let file = self.ctx.state_dir.join("created-mount-points");
            if let Err(e) = std::fs::write(&file, list) {
                tracing::warn!(file = %file.display(), %e, "recording mount points");
            }
        }
        let uid = pod.uid().unwrap_or_default();
        if let Ok(mut m) = self.logs.write() {
            m.insert((rt.namespace.clone(), rt.name.clone()), rt.dir.join("logs"));
        }
        self.pods.insert(
            uid,
            Local {
                rt,
                started: Instant::now(),
                transitions: Transitions::default(),
                last_sent: None,
            },
        );
        Ok(())
    }

    fn unindex(&self, rt: &PodRt) {
        if let Ok(mut m) = self.logs.write() {
            m.remove(&(rt.namespace.clone(), rt.name.clone()));
        }
    }

    /// Stops every pod (on shutdown of the agent).
    pub async fn shutdown(&mut self) {
        let pods: Vec<(String, Local)> = self.pods.drain().collect();
        for (uid, local) in pods {
            self.stop_in_background(uid, local);
        }
        for (_, (_, task)) in self.stopping.drain() {
            let _ = task.await;
        }
        // No pod is left, so no mount uses these any more.
        for p in self.mount_points.drain(..).rev() {
            let empty_file = std::fs::metadata(&p).is_ok_and(|m| m.is_file() && m.len() == 0);
            let _ = if empty_file {
                std::fs::remove_file(&p)
            } else {
                std::fs::remove_dir(&p)
            };
        }
        let _ = std::fs::remove_file(self.ctx.state_dir.join("created-mount-points"));
    }
}
