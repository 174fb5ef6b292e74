//! Service networking without iptables: a userspace TCP or UDP forwarder per service port.
//!
//! * ClusterIP: the address is added (as a /32) to the bridge, so it is local to the host;
//!   pods reach it through their route for the service range. The agent listens on
//!   `clusterIP:port` and forwards each connection to a ready endpoint (EndpointSlices).
//! * LoadBalancer: the Service gets `127.0.1.N` in `status.loadBalancer.ingress` and the agent
//!   listens on `127.0.1.N:port` the same way. A `spec.loadBalancerIP` is honoured when it is
//!   a free address of 127.0.1.0/24; any other leaves the Service without an address.
//! * `default/kubernetes` (no endpoints: the API server runs on loopback) forwards to the API
//!   server.
//! * DNS: `/etc/hosts` lines for every Service, written into each pod's hosts file.
//!
//! UDP ports are forwarded per client address: its first datagram picks a ready endpoint and
//! the client keeps it (answers come back from the service address) until 60 s without an
//! answer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinHandle;

use crate::netns;

/// Where one listener sends connections: the current endpoints, replaced as they change.
type Targets = Arc<RwLock<Vec<SocketAddr>>>;

/// A service port's transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    fn of(protocol: Option<&str>) -> Option<Self> {
        match protocol.unwrap_or("TCP") {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            _ => None,
        }
    }
}

/// How long a UDP client keeps its endpoint without an answer from it.
const UDP_FLOW_IDLE: Duration = Duration::from_secs(60);

/// One Service name as the pods' /etc/hosts sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostEntry {
    pub namespace: String,
    pub name: String,
    pub ip: String,
}

/// The /etc/hosts lines for a pod in `namespace` (short names only for its own namespace).
pub fn hosts_for(namespace: &str, entries: &[HostEntry]) -> String {
    let mut out = String::new();
    for e in entries {
        let (n, ns) = (&e.name, &e.namespace);
        out.push_str(&format!(
            "{}\t{n}.{ns}.svc.cluster.local {n}.{ns}.svc {n}.{ns}",
            e.ip
        ));
        if ns == namespace {
            out.push_str(&format!(" {n}"));
        }
        out.push('\n');
    }
    out
}

pub struct Proxier {
    client: Client,
    bridge: String,
    api_server: SocketAddr,
    listeners: HashMap<(SocketAddr, Proto), (JoinHandle<()>, Targets)>,
    cluster_ips: BTreeSet<Ipv4Addr>,
    /// LoadBalancer address per Service (namespace/name).
    lb_ips: BTreeMap<String, Ipv4Addr>,
}

impl Proxier {
    pub fn new(client: Client, bridge: String, api_server: SocketAddr) -> Self {
        Self {
            client,
            bridge,
            api_server,
            listeners: HashMap::new(),
            cluster_ips: BTreeSet::new(),
            lb_ips: BTreeMap::new(),
        }
    }

    /// Brings listeners, bridge addresses and LoadBalancer statuses in line with the stores;
    /// returns the hosts entries.
    pub async fn sync(
        &mut self,
        services: &Store<Service>,
        slices: &Store<EndpointSlice>,
    ) -> Vec<HostEntry> {
        let mut want: HashMap<(SocketAddr, Proto), Vec<SocketAddr>> = HashMap::new();
        let mut hosts = Vec::new();
        let mut want_ips = BTreeSet::new();
        let slices = slices.state();
        let mut services = services.state();
        services.sort_by_key(|s| (s.namespace(), s.name_any()));
        // Addresses already handed out survive restarts of the agent (read back from status).
        for svc in &services {
            let key = format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any());
            if let Some(ip) = lb_status_ip(svc) {
                self.lb_ips.entry(key).or_insert(ip);
            }
        }
        let mut live_lb = BTreeSet::new();
        for svc in &services {
            let ns = svc.namespace().unwrap_or_default();
            let name = svc.name_any();
            let Some(spec) = &svc.spec else { continue };
            let ready = ready_endpoints(&slices, &ns, &name, Proto::Tcp);
            let ready_udp = ready_endpoints(&slices, &ns, &name, Proto::Udp);
            let cluster_ip = spec
                .cluster_ip
                .as_deref()
                .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
            if let Some(ip) = cluster_ip {
                hosts.push(HostEntry {
                    namespace: ns.clone(),
                    name: name.clone(),
                    ip: ip.to_string(),
                });
            } else if spec.cluster_ip.as_deref() == Some("None") {
                let ips: BTreeSet<IpAddr> = ready
                    .values()
                    .chain(ready_udp.values())
                    .flatten()
                    .map(SocketAddr::ip)
                    .collect();
                for ip in ips {
                    hosts.push(HostEntry {
                        namespace: ns.clone(),
                        name: name.clone(),
                        ip: ip.to_string(),
                    });
                }
            }
            let is_api = ns == "default" && name == "kubernetes";
            let lb = spec.type_.as_deref() == Some("LoadBalancer");
            let lb_ip = if lb {
                self.lb_ip(&ns, &name, spec.load_balancer_ip.as_deref())
            } else {
                None
            };
            if lb {
                live_lb.insert(format!("{ns}/{name}"));
            }
            for port in spec.ports.iter().flatten() {
                let Some(proto) = Proto::of(port.protocol.as_deref()) else {
                    continue;
                };
                let ready = match proto {
                    Proto::Tcp => &ready,
                    Proto::Udp => &ready_udp,
                };
                let Ok(p) = u16::try_from(port.port) else {
                    continue;
                };
                let targets = if is_api {
                    vec![self.api_server]
                } else {
                    ready
                        .get(port.name.as_deref().unwrap_or(""))
                        .cloned()
                        .unwrap_or_default()
                };
                if let Some(ip) = cluster_ip {
                    want_ips.insert(ip);
                    want.insert((SocketAddr::from((ip, p)), proto), targets.clone());
                }
                if let Some(ip) = lb_ip {
                    want.insert((SocketAddr::from((ip, p)), proto), targets);
                }
            }
            if lb && lb_status_ip(svc) != lb_ip {
                self.publish_lb(&ns, &name, lb_ip).await;
            }
        }
        self.lb_ips.retain(|k, _| live_lb.contains(k));
        for ip in want_ips.difference(&self.cluster_ips.clone()) {
            let addr = format!("{ip}/32");
            match netns::run("ip", &["addr", "replace", &addr, "dev", &self.bridge]).await {
                Ok(_) => {
                    self.cluster_ips.insert(*ip);
                }
                Err(e) => tracing::warn!(%e, "adding service address"),
            }
        }
        for ip in self.cluster_ips.clone().difference(&want_ips) {
            self.listeners.retain(|(a, _), (h, _)| {
                let keep = a.ip() != IpAddr::V4(*ip);
                if !keep {
                    h.abort();
                }
                keep
            });
            let addr = format!("{ip}/32");
            let _ = netns::run("ip", &["addr", "del", &addr, "dev", &self.bridge]).await;
            self.cluster_ips.remove(ip);
        }
        self.listeners.retain(|addr, (h, _)| {
            let keep = want.contains_key(addr);
            if !keep {
                h.abort();
            }
            keep
        });
        for (key @ (addr, proto), targets) in want {
            if let Some((h, t)) = self.listeners.get(&key)
                && !h.is_finished()
            {
                if let Ok(mut t) = t.write() {
                    *t = targets;
                }
                continue;
            }
            let t: Targets = Arc::new(RwLock::new(targets));
            let started = match proto {
                Proto::Tcp => TcpListener::bind(addr)
                    .await
                    .map(|l| tokio::spawn(serve(l, t.clone()))),
                Proto::Udp => UdpSocket::bind(addr)
                    .await
                    .map(|s| tokio::spawn(serve_udp(Arc::new(s), t.clone()))),
            };
            match started {
                Ok(h) => {
                    self.listeners.insert(key, (h, t));
                }
                Err(e) => tracing::warn!(%addr, ?proto, %e, "cannot listen for a service"),
            }
        }
        hosts.sort();
        hosts
    }

    /// The LoadBalancer address of a Service: the `spec.loadBalancerIP` it asks for when that
    /// is a free address of the pool 127.0.1.0/24 (None, no address, for any other request:
    /// the provider cannot give it, as a cloud's leaves such a Service pending), else the
    /// address it has, else the first free one.
    fn lb_ip(&mut self, ns: &str, name: &str, requested: Option<&str>) -> Option<Ipv4Addr> {
        let key = format!("{ns}/{name}");
        if let Some(req) = requested.filter(|r| !r.is_empty()) {
            let ip = req
                .parse::<Ipv4Addr>()
                .ok()
                .filter(|ip| ip.octets()[..3] == [127, 0, 1] && !matches!(ip.octets()[3], 0 | 255));
            let taken = |ip: &Ipv4Addr| self.lb_ips.iter().any(|(k, v)| v == ip && *k != key);
            match ip {
                Some(ip) if !taken(&ip) => {
                    self.lb_ips.insert(key, ip);
                    return Some(ip);
                }
                _ => {
                    self.lb_ips.remove(&key);
                    return None;
                }
            }
        }
        if let Some(ip) = self.lb_ips.get(&key) {
            return Some(*ip);
        }
        let used: BTreeSet<Ipv4Addr> = self.lb_ips.values().copied().collect();
        let ip = (1..=254u8)
            .map(|n| Ipv4Addr::new(127, 0, 1, n))
            .find(|ip| !used.contains(ip))
            .unwrap_or(Ipv4Addr::new(127, 0, 1, 254));
        self.lb_ips.insert(key, ip);
        Some(ip)
    }

    /// Writes the Service's `status.loadBalancer` (no ingress when `ip` is None).
    async fn publish_lb(&self, ns: &str, name: &str, ip: Option<Ipv4Addr>) {
        let api = Api::<Service>::namespaced(self.client.clone(), ns);
        let ingress = match ip {
            Some(ip) => serde_json::json!([ { "ip": ip.to_string(), "ipMode": "Proxy" } ]),
            None => serde_json::json!(null),
        };
        let patch = serde_json::json!({
            "status": { "loadBalancer": { "ingress": ingress } }
        });
        if let Err(e) = api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(%ns, %name, %e, "publishing the LoadBalancer address");
        }
    }

    /// Closes every listener and removes the service addresses from the bridge.
    pub async fn shutdown(&mut self) {
        for (_, (h, _)) in self.listeners.drain() {
            h.abort();
        }
        for ip in std::mem::take(&mut self.cluster_ips) {
            let addr = format!("{ip}/32");
            let _ = netns::run("ip", &["addr", "del", &addr, "dev", &self.bridge]).await;
        }
    }
}

fn lb_status_ip(svc: &Service) -> Option<Ipv4Addr> {
    let ingress = svc
        .status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?;
    ingress
        .iter()
        .find_map(|i| i.ip.as_deref()?.parse::<Ipv4Addr>().ok())
        .filter(|ip| ip.octets()[..3] == [127, 0, 1])
}

/// Ready endpoints of a Service's `proto` ports by port name (EndpointSlices labelled with the
/// service name).
fn ready_endpoints(
    slices: &[Arc<EndpointSlice>],
    ns: &str,
    name: &str,
    proto: Proto,
) -> HashMap<String, Vec<SocketAddr>> {
    let mut out: HashMap<String, Vec<SocketAddr>> = HashMap::new();
    for s in slices {
        if s.namespace().as_deref() != Some(ns)
            || s.labels()
                .get("kubernetes.io/service-name")
                .map(String::as_str)
                != Some(name)
            || s.address_type != "IPv4"
        {
            continue;
        }
        for port in s.ports.iter().flatten() {
            let (Some(p), Some(true)) = (
                port.port.and_then(|p| u16::try_from(p).ok()),
                Some(Proto::of(port.protocol.as_deref()) == Some(proto)),
            ) else {
                continue;
            };
            let list = out
                .entry(port.name.clone().unwrap_or_default())
                .or_default();
            for ep in &s.endpoints {
                if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                    continue;
                }
                for a in &ep.addresses {
                    if let Ok(ip) = a.parse::<IpAddr>() {
                        list.push(SocketAddr::new(ip, p));
                    }
                }
            }
            list.sort();
            list.dedup();
        }
    }
    out
}

async fn serve(listener: TcpListener, targets: Targets) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let candidates = targets.read().map(|t| t.clone()).unwrap_or_default();
        tokio::spawn(async move {
            if candidates.is_empty() {
                return; // dropping the connection closes it: no endpoint is ready
            }
            let target = candidates[fastrand::usize(..candidates.len())];
            let connect = tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(target));
            if let Ok(Ok(mut outbound)) = connect.await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

/// Forwards each client's datagrams to the endpoint its first one picked, and the endpoint's
/// answers back from `socket`, until the endpoint is quiet for [`UDP_FLOW_IDLE`].
///
/// The answering tasks belong to this one: aborting it (the Service port went away) ends them
/// too, so the socket is closed at once and its address free for the next Service.
async fn serve_udp(socket: Arc<UdpSocket>, targets: Targets) {
    let flows: Arc<std::sync::Mutex<HashMap<SocketAddr, Arc<UdpSocket>>>> = Arc::default();
    let mut answering = tokio::task::JoinSet::new();
    let mut buf = vec![0u8; 65_536];
    loop {
        while answering.try_join_next().is_some() {}
        let Ok((n, client)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        let known = flows.lock().ok().and_then(|f| f.get(&client).cloned());
        let upstream = match known {
            Some(u) => u,
            None => {
                let candidates = targets.read().map(|t| t.clone()).unwrap_or_default();
                if candidates.is_empty() {
                    continue; // no endpoint is ready: dropped, as the network may
                }
                let target = candidates[fastrand::usize(..candidates.len())];
                let Ok(u) = UdpSocket::bind("0.0.0.0:0").await else {
                    continue;
                };
                if u.connect(target).await.is_err() {
                    continue;
                }
                let u = Arc::new(u);
                if let Ok(mut f) = flows.lock() {
                    f.insert(client, u.clone());
                }
                answering.spawn(answer_udp(socket.clone(), u.clone(), client, flows.clone()));
                u
            }
        };
        let _ = upstream.send(&buf[..n]).await;
    }
}

/// Sends one flow's answers to its client until the endpoint is quiet for [`UDP_FLOW_IDLE`].
async fn answer_udp(
    socket: Arc<UdpSocket>,
    upstream: Arc<UdpSocket>,
    client: SocketAddr,
    flows: Arc<std::sync::Mutex<HashMap<SocketAddr, Arc<UdpSocket>>>>,
) {
    let mut buf = vec![0u8; 65_536];
    while let Ok(Ok(n)) = tokio::time::timeout(UDP_FLOW_IDLE, upstream.recv(&mut buf)).await {
        let _ = socket.send_to(&buf[..n], client).await;
    }
    if let Ok(mut f) = flows.lock() {
        f.remove(&client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_has_short_names_only_in_the_own_namespace() {
        let e = vec![
            HostEntry {
                namespace: "a".into(),
                name: "web".into(),
                ip: "10.96.0.10".into(),
            },
            HostEntry {
                namespace: "b".into(),
                name: "db".into(),
                ip: "10.96.0.11".into(),
            },
        ];
        assert_eq!(
            hosts_for("a", &e),
            "10.96.0.10\tweb.a.svc.cluster.local web.a.svc web.a web\n\
             10.96.0.11\tdb.b.svc.cluster.local db.b.svc db.b\n"
        );
    }
}
