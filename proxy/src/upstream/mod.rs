//! Upstream selection and connections. In: a route's weighted backends and the table's
//! [`Backend`]s. Out: a picked backend, a picked endpoint (with an in-flight guard and its
//! HTTP/1.1 connection pool, module `pool`), and [`Upstream::send`] to send to it. HTTP/1.1
//! goes through the endpoint's own pool; h2c (`BackendProtocol::H2c`) through hyper-util's
//! pooled HTTP/2-only client, whose one multiplexed connection per endpoint makes its
//! per-request checkout cost matter less.
//!
//! Balancers are rebuilt with each snapshot but carry each endpoint's state (in-flight
//! counter, connection pool) over from the previous snapshot, so least-request stays accurate
//! and connections stay open across swaps; pools are shared by address across backends.

pub(crate) mod h1;
pub(crate) mod io;
pub(crate) mod pool;
pub(crate) mod tls;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::request::Parts;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tollgate_api::{Backend, BackendProtocol, LoadBalancer, WeightedBackend};

use crate::FastMap;
use crate::lifecycle::body::ProxyBody;
use crate::lifecycle::forward::Added;
use crate::upstream::pool::{
    CONNECT_TIMEOUT, EndpointPool, KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_RETRIES,
    PooledBody, Pools, UpstreamError, take_parts,
};

/// The pooled HTTP/2-only client (h2c).
type H2Client = Client<HttpConnector, ProxyBody>;

/// Upstream connections: HTTP/1.1 pools by endpoint address, and the h2c client.
#[derive(Debug)]
pub(crate) struct Upstream {
    pools: Pools,
    h2: H2Client,
    /// TLS clients by settings (module `tls`).
    tls: tls::TlsClients,
}

impl Upstream {
    /// Builds the h2c client and an empty set of pools.
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        // Dead peers are found by TCP keepalive, as on HTTP/1.1 connections, not by HTTP/2
        // PINGs: gRPC servers by default answer a client that PINGs more often than every
        // five minutes (or PINGs an idle connection) with GOAWAY "too_many_pings".
        connector.set_keepalive(Some(KEEPALIVE_IDLE));
        connector.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
        connector.set_keepalive_retries(Some(KEEPALIVE_RETRIES));
        let h2 = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .http2_only(true)
            .build(connector);
        Self {
            pools: Pools::default(),
            h2,
            tls: tls::TlsClients::default(),
        }
    }

    /// Sends `req` (its URI from [`request_uri`] for the same protocol) to `endpoint`.
    pub async fn send(
        &self,
        protocol: BackendProtocol,
        endpoint: &EndpointState,
        req: Request<ProxyBody>,
        added: &Added<'_>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        let (mut parts, body) = req.into_parts();
        self.send_parts(protocol, endpoint, &mut parts, body, added)
            .await
    }

    /// [`Self::send`] of a request's parts, borrowed (see `EndpointPool::send_parts`).
    pub async fn send_parts(
        &self,
        protocol: BackendProtocol,
        endpoint: &EndpointState,
        parts: &mut Parts,
        body: ProxyBody,
        added: &Added<'_>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        match protocol {
            // Tcp backends are only on passthrough ports; never reached from HTTP.
            BackendProtocol::Http1 | BackendProtocol::Tcp => {
                endpoint.pool.send_parts(parts, body, added).await
            }
            // HTTP/2 over TLS: the endpoint's own connection (module `tls`).
            BackendProtocol::H2c if endpoint.pool.tls_client().is_some() => {
                endpoint.pool.send_parts(parts, body, added).await
            }
            // Boxed: the legacy client's future is large, and would otherwise size (and be
            // copied with) every HTTP/1.1 request's future too.
            BackendProtocol::H2c => {
                added.insert_into(&mut parts.headers);
                let req = Request::from_parts(take_parts(parts), body);
                Box::pin(self.h2.request(req))
                    .await
                    .map(|r| r.map(PooledBody::plain))
                    .map_err(UpstreamError::H2)
            }
        }
    }
}

/// The URI of an upstream request: origin form (`/path?query`) for HTTP/1.1, which the
/// connection writes as it is; absolute form for h2c, whose client picks its connection (and
/// `:authority`) from it.
pub(crate) fn request_uri(
    protocol: BackendProtocol,
    authority: &Authority,
    path_and_query: &str,
    current: &Uri,
) -> Result<Uri, http::Error> {
    match protocol {
        BackendProtocol::Http1 | BackendProtocol::Tcp => {
            // The client's request line already says it (the common case): keep it.
            if current.scheme().is_none()
                && current.authority().is_none()
                && current.path_and_query().map(PathAndQuery::as_str) == Some(path_and_query)
            {
                return Ok(current.clone());
            }
            Ok(Uri::from(PathAndQuery::try_from(path_and_query)?))
        }
        BackendProtocol::H2c => Ok(Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(authority.clone())
            .path_and_query(path_and_query)
            .build()?),
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
    /// Idle HTTP/1.1 connections to `addr`.
    pool: Arc<EndpointPool>,
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
    pub fn build(backend: &Backend, prev: Option<&Balancer>, upstream: &Upstream) -> Self {
        let tls = backend.tls.as_ref().map(|t| upstream.tls.get(t));
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
                // An endpoint whose TLS settings changed starts afresh (a pool of its own).
                if let Some(old) = prev.and_then(|p| {
                    p.endpoints
                        .iter()
                        .find(|o| o.addr == addr && o.pool.tls_client() == tls.as_ref())
                }) {
                    return Some(old.clone());
                }
                let authority = Authority::try_from(addr.to_string()).ok()?;
                Some(Arc::new(EndpointState {
                    addr,
                    authority,
                    in_flight: AtomicUsize::new(0),
                    pool: upstream.pools.pool_with(addr, tls.clone()),
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

    /// Picks an endpoint for a retry: the balancer's choice when it is not in `tried`, else
    /// an untried endpoint from a random start, else (every endpoint tried) the balancer's
    /// choice; `None` when there are none.
    pub fn pick_untried(&self, tried: &[SocketAddr]) -> Option<EndpointGuard> {
        let first = self.pick()?;
        let n = self.endpoints.len();
        if n == 1 || !tried.contains(&first.endpoint().addr) {
            return Some(first);
        }
        let start = fastrand::usize(..n);
        (0..n)
            .filter_map(|k| self.endpoints.get((start + k) % n))
            .find(|e| !tried.contains(&e.addr))
            .cloned()
            .map(EndpointGuard::new)
            .or(Some(first))
    }
}

/// Builds every backend's balancer for a new snapshot.
pub(crate) fn build_balancers(
    backends: &std::collections::BTreeMap<String, Backend>,
    prev: Option<&FastMap<String, Arc<Balancer>>>,
    upstream: &Upstream,
) -> FastMap<String, Arc<Balancer>> {
    backends
        .iter()
        .map(|(key, b)| {
            let old = prev.and_then(|p| p.get(key)).map(Arc::as_ref);
            (key.clone(), Arc::new(Balancer::build(b, old, upstream)))
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
            tls: None,
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
        let b = Balancer::build(
            &backend(LoadBalancer::RoundRobin, 3),
            None,
            &Upstream::new(),
        );
        let ports: Vec<u16> = (0..6)
            .map(|_| b.pick().unwrap().endpoint().addr.port())
            .collect();
        assert_eq!(ports, [1000, 1001, 1002, 1000, 1001, 1002]);
    }

    #[test]
    fn least_request_avoids_busy_endpoint() {
        let b = Balancer::build(
            &backend(LoadBalancer::LeastRequest, 2),
            None,
            &Upstream::new(),
        );
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
            Balancer::build(
                &backend(LoadBalancer::RoundRobin, 0),
                None,
                &Upstream::new()
            )
            .pick()
            .is_none()
        );
    }

    #[test]
    fn a_retry_goes_to_an_untried_endpoint_while_there_is_one() {
        for lb in [LoadBalancer::RoundRobin, LoadBalancer::LeastRequest] {
            let b = Balancer::build(&backend(lb, 3), None, &Upstream::new());
            for _ in 0..50 {
                let mut tried = vec![b.pick().unwrap().endpoint().addr];
                let second = b.pick_untried(&tried).unwrap().endpoint().addr;
                assert!(!tried.contains(&second));
                tried.push(second);
                let third = b.pick_untried(&tried).unwrap().endpoint().addr;
                assert!(!tried.contains(&third));
                tried.push(third);
                // All tried: still an endpoint.
                assert!(b.pick_untried(&tried).is_some());
            }
        }
        let one = Balancer::build(
            &backend(LoadBalancer::RoundRobin, 1),
            None,
            &Upstream::new(),
        );
        let only = one.pick().unwrap().endpoint().addr;
        assert_eq!(one.pick_untried(&[only]).unwrap().endpoint().addr, only);
    }

    #[test]
    fn in_flight_state_survives_rebuild() {
        let def = backend(LoadBalancer::LeastRequest, 2);
        let up = Upstream::new();
        let old = Balancer::build(&def, None, &up);
        let _g = old.pick().unwrap();
        let new = Balancer::build(&def, Some(&old), &up);
        let total: usize = new
            .endpoints
            .iter()
            .map(|e| e.in_flight.load(Ordering::Relaxed))
            .sum();
        assert_eq!(total, 1);
    }
}
