//! Upstream selection and connections. In: a route's weighted backends and the table's
//! [`Backend`]s. Out: a picked backend, a picked endpoint (with an in-flight guard), and
//! pooled keep-alive clients to send to it: one HTTP/1.1 client and one HTTP/2-only client
//! (for `BackendProtocol::H2c`), shared by every snapshot so pools survive table swaps.
//!
//! Balancers are rebuilt with each snapshot but carry each endpoint's in-flight counter over
//! from the previous snapshot, so least-request stays accurate across swaps.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::uri::Authority;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tollgate_api::{Backend, BackendProtocol, LoadBalancer, WeightedBackend};

use crate::body::ProxyBody;

/// A pooled client.
pub(crate) type HttpClient = Client<HttpConnector, ProxyBody>;

/// The shared upstream clients.
#[derive(Debug, Clone)]
pub(crate) struct Upstream {
    h1: HttpClient,
    h2: HttpClient,
}

impl Upstream {
    /// Builds both clients.
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(256);
        let h1 = builder.build(connector.clone());
        let h2 = builder.http2_only(true).build(connector);
        Self { h1, h2 }
    }

    /// The client for a backend protocol.
    pub fn client(&self, protocol: BackendProtocol) -> &HttpClient {
        match protocol {
            BackendProtocol::Http1 => &self.h1,
            BackendProtocol::H2c => &self.h2,
        }
    }
}

/// One endpoint and its in-flight request count.
#[derive(Debug)]
pub(crate) struct EndpointState {
    /// Where to connect.
    pub addr: SocketAddr,
    /// `ip:port` as a URI authority (IPv6 bracketed).
    pub authority: Authority,
    in_flight: AtomicUsize,
}

/// Holds one in-flight slot on an endpoint until dropped.
#[derive(Debug)]
pub(crate) struct EndpointGuard(Arc<EndpointState>);

impl EndpointGuard {
    fn new(ep: Arc<EndpointState>) -> Self {
        ep.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(ep)
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &EndpointState {
        &self.0
    }
}

impl Drop for EndpointGuard {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Endpoints of one backend and how to choose among them.
#[derive(Debug)]
pub(crate) struct Balancer {
    /// Protocol spoken to the endpoints.
    pub protocol: BackendProtocol,
    lb: LoadBalancer,
    endpoints: Vec<Arc<EndpointState>>,
    next: AtomicUsize,
}

impl Balancer {
    /// Builds a balancer, reusing endpoint state from `prev` for endpoints that stay.
    /// Endpoints whose IP does not parse are skipped (the compiler emits only IPs).
    pub fn build(backend: &Backend, prev: Option<&Balancer>) -> Self {
        let endpoints = backend
            .endpoints
            .iter()
            .filter_map(|e| {
                let ip: IpAddr = match e.ip.parse() {
                    Ok(ip) => ip,
                    Err(_) => {
                        tracing::warn!(ip = %e.ip, "skipping endpoint with invalid IP");
                        return None;
                    }
                };
                let addr = SocketAddr::new(ip, e.port);
                if let Some(old) = prev.and_then(|p| p.endpoints.iter().find(|o| o.addr == addr)) {
                    return Some(old.clone());
                }
                let authority = Authority::try_from(addr.to_string()).ok()?;
                Some(Arc::new(EndpointState {
                    addr,
                    authority,
                    in_flight: AtomicUsize::new(0),
                }))
            })
            .collect();
        Self {
            protocol: backend.protocol,
            lb: backend.load_balancer,
            endpoints,
            next: AtomicUsize::new(0),
        }
    }

    /// Picks an endpoint; `None` when there are none.
    pub fn pick(&self) -> Option<EndpointGuard> {
        let n = self.endpoints.len();
        let idx = match (n, self.lb) {
            (0, _) => return None,
            (1, _) => 0,
            (_, LoadBalancer::RoundRobin) => self.next.fetch_add(1, Ordering::Relaxed) % n,
            (_, LoadBalancer::LeastRequest) => {
                // Power of two choices: two distinct random endpoints, fewer in flight wins.
                let a = fastrand::usize(..n);
                let b = (a + 1 + fastrand::usize(..n - 1)) % n;
                let load = |i: usize| self.endpoints[i].in_flight.load(Ordering::Relaxed);
                if load(b) < load(a) { b } else { a }
            }
        };
        self.endpoints.get(idx).cloned().map(EndpointGuard::new)
    }
}

/// Builds every backend's balancer for a new snapshot.
pub(crate) fn build_balancers(
    backends: &std::collections::BTreeMap<String, Backend>,
    prev: Option<&HashMap<String, Arc<Balancer>>>,
) -> HashMap<String, Arc<Balancer>> {
    backends
        .iter()
        .map(|(key, b)| {
            let old = prev.and_then(|p| p.get(key)).map(Arc::as_ref);
            (key.clone(), Arc::new(Balancer::build(b, old)))
        })
        .collect()
}

/// Weighted random choice; `None` when every weight is zero.
pub(crate) fn pick_weighted(backends: &[WeightedBackend]) -> Option<&WeightedBackend> {
    let total: u64 = backends.iter().map(|b| u64::from(b.weight)).sum();
    if total == 0 {
        return None;
    }
    let mut roll = fastrand::u64(..total);
    for b in backends {
        let w = u64::from(b.weight);
        if roll < w {
            return Some(b);
        }
        roll -= w;
    }
    None
}

#[cfg(test)]
mod tests {
    use tollgate_api::Endpoint;

    use super::*;

    fn backend(lb: LoadBalancer, n: u16) -> Backend {
        Backend {
            protocol: BackendProtocol::Http1,
            load_balancer: lb,
            endpoints: (0..n)
                .map(|i| Endpoint {
                    ip: "127.0.0.1".into(),
                    port: 1000 + i,
                })
                .collect(),
        }
    }

    #[test]
    fn round_robin_cycles() {
        let b = Balancer::build(&backend(LoadBalancer::RoundRobin, 3), None);
        let ports: Vec<u16> = (0..6)
            .map(|_| b.pick().unwrap().endpoint().addr.port())
            .collect();
        assert_eq!(ports, [1000, 1001, 1002, 1000, 1001, 1002]);
    }

    #[test]
    fn least_request_avoids_busy_endpoint() {
        let b = Balancer::build(&backend(LoadBalancer::LeastRequest, 2), None);
        let busy: Vec<_> = (0..10)
            .map(|_| EndpointGuard::new(b.endpoints[0].clone()))
            .collect();
        for _ in 0..50 {
            assert_eq!(b.pick().unwrap().endpoint().addr.port(), 1001);
        }
        drop(busy);
        assert_eq!(b.endpoints[0].in_flight.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn zero_weight_never_picked_and_no_endpoints_is_none() {
        let wb = |w| WeightedBackend {
            backend: Some(format!("b{w}")),
            weight: w,
            filters: vec![],
        };
        let list = [wb(0), wb(1)];
        for _ in 0..100 {
            assert_eq!(pick_weighted(&list).unwrap().weight, 1);
        }
        assert!(pick_weighted(&[wb(0)]).is_none());
        assert!(
            Balancer::build(&backend(LoadBalancer::RoundRobin, 0), None)
                .pick()
                .is_none()
        );
    }

    #[test]
    fn in_flight_state_survives_rebuild() {
        let def = backend(LoadBalancer::LeastRequest, 2);
        let old = Balancer::build(&def, None);
        let _g = old.pick().unwrap();
        let new = Balancer::build(&def, Some(&old));
        let total: usize = new
            .endpoints
            .iter()
            .map(|e| e.in_flight.load(Ordering::Relaxed))
            .sum();
        assert_eq!(total, 1);
    }
}
