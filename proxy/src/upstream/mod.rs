//! Upstream selection and connections. In: a route's weighted backends and the table's
//! [`Backend`]s. Out: a picked backend, a picked endpoint (with an in-flight guard and its
//! HTTP/1.1 connection pool, module `pool`), and [`Upstream::send`] to send to it. HTTP/1.1
//! goes through the endpoint's own pool; h2c (`BackendProtocol::H2c`) through hyper-util's
//! pooled HTTP/2-only client, whose one multiplexed connection per endpoint makes its
//! per-request checkout cost matter less.
//!
//! Balancers (module `balancer`) are rebuilt with each snapshot but carry each endpoint's
//! state (in-flight counter, connection pool, health) and the circuit breaker over from the
//! previous snapshot, so least-request stays accurate, ejections hold and connections stay
//! open across swaps; pools are shared by address across backends. Active health checks
//! (module `health`) probe the endpoints of each new snapshot's checked backends.

pub(crate) mod balancer;
pub(crate) mod breaker;
pub(crate) mod budget;
pub(crate) mod h1;
pub(crate) mod hash;
pub(crate) mod health;
pub(crate) mod io;
pub(crate) mod outlier;
pub(crate) mod pool;
pub(crate) mod tls;

pub(crate) use balancer::{Balancer, EndpointGuard, EndpointState};

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tollgate_api::backend::Connection;
use tollgate_api::{Backend, BackendProtocol, WeightedBackend};

use crate::FastMap;
use crate::lifecycle::body::ProxyBody;
use crate::lifecycle::forward::Added;
use crate::upstream::pool::{
    CONNECT_TIMEOUT, KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_RETRIES, PooledBody, Pools,
    UpstreamError, take_parts,
};

/// The pooled HTTP/2-only client (h2c).
pub(crate) type H2Client = Client<HttpConnector, ProxyBody>;

/// An h2c client whose connections follow `c` (BackendPolicy `connection`): connect timeout,
/// TCP keepalive idle and idle timeout (5 s, 30 s and 60 s unless set).
pub(crate) fn h2c_client(c: &Connection) -> H2Client {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(
        c.connect_timeout_ms
            .map_or(CONNECT_TIMEOUT, Duration::from_millis),
    ));
    // Dead peers are found by TCP keepalive, as on HTTP/1.1 connections, not by HTTP/2
    // PINGs: gRPC servers by default answer a client that PINGs more often than every
    // five minutes (or PINGs an idle connection) with GOAWAY "too_many_pings".
    connector.set_keepalive(Some(
        c.tcp_keepalive_idle_ms
            .map_or(KEEPALIVE_IDLE, Duration::from_millis),
    ));
    connector.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    connector.set_keepalive_retries(Some(KEEPALIVE_RETRIES));
    Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(
            c.idle_timeout_ms
                .map_or(Duration::from_secs(60), Duration::from_millis),
        )
        .http2_only(true)
        .build(connector)
}

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
        Self {
            pools: Pools::default(),
            h2: h2c_client(&Connection::default()),
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
            // Tcp and Udp backends are only on stream and datagram ports, never reached from HTTP.
            BackendProtocol::Http1 | BackendProtocol::Tcp | BackendProtocol::Udp => {
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
                // The endpoint's own client when its BackendPolicy shapes connections.
                let client = endpoint.pool.h2c().unwrap_or(&self.h2);
                Box::pin(client.request(req))
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
        BackendProtocol::Http1 | BackendProtocol::Tcp | BackendProtocol::Udp => {
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

/// Builds every backend's balancer for a new snapshot; a consistent-hash expression that
/// does not compile refuses the table.
pub(crate) fn build_balancers(
    backends: &std::collections::BTreeMap<String, Backend>,
    prev: Option<&FastMap<String, Arc<Balancer>>>,
    upstream: &Upstream,
) -> Result<FastMap<String, Arc<Balancer>>, crate::ProxyError> {
    backends
        .iter()
        .map(|(key, b)| {
            let old = prev.and_then(|p| p.get(key)).map(Arc::as_ref);
            let mut balancer = Balancer::build(b, old, upstream).map_err(|source| {
                crate::ProxyError::HashExpression {
                    backend: key.clone(),
                    source,
                }
            })?;
            balancer.key = Arc::from(key.as_str());
            Ok((key.clone(), Arc::new(balancer)))
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
    use super::*;

    #[test]
    fn zero_weight_never_picked() {
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
    }
}
