//! RequestMirror: fire-and-forget copies of a request. In: the forwarded request head, a
//! buffered body, and the mirror backends the route's filters picked (after `per_million`
//! sampling). Out: one detached task per mirror that sends the copy and discards the answer.
//! A mirror never delays or changes the client's response; its failures only count in
//! `tollgate_upstream_errors_total{kind="mirror"}`. At most
//! [`crate::ProxyOptions::max_mirrors_in_flight`] copies are in flight at once; a copy past that
//! is not sent (`kind="mirror_overload"`), so a slow mirror backend cannot exhaust the proxy.
//!
//! Bodies: a request without a body is mirrored as is; a request whose body is declared
//! (`Content-Length`) at most [`MAX_HELD_BODY`] bytes is buffered once and sent to both the
//! main backend and the mirror; a streaming (chunked) or larger body is not mirrored, since
//! copying it would mean buffering without bound or slowing the main request to the mirror.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Uri, Version};
use http_body_util::BodyExt;
use tollgate_api::BackendProtocol;

use crate::lifecycle::body::full;
use crate::lifecycle::forward::Added;
use crate::metrics::UpstreamErrorKind;
use crate::state::{Shared, Snapshot};
use crate::upstream::pool::UpstreamError;
use crate::upstream::request_uri;

/// Largest declared body that is held whole to be mirrored or retried (module `call`).
pub(crate) const MAX_HELD_BODY: u64 = 64 * 1024;

/// How long a mirrored request may take before it is abandoned.
const MIRROR_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether this request is one of the filter's share (see [`tollgate_api::MirrorSampler`]).
pub(crate) fn sampled(m: &tollgate_api::Mirror) -> bool {
    m.sampler.next(m.per_million)
}

/// What to copy.
#[derive(Debug)]
pub(crate) struct MirrorRequest<'a> {
    pub method: &'a Method,
    pub path_and_query: &'a str,
    pub headers: &'a HeaderMap,
    pub body: Bytes,
}

/// Spawns one copy per backend key; unknown keys and backends without endpoints are skipped.
pub(crate) fn spawn(
    shared: &Arc<Shared>,
    snapshot: &Snapshot,
    keys: &[&str],
    req: &MirrorRequest<'_>,
) {
    for key in keys {
        let Some(balancer) = snapshot.backends.get(*key) else {
            continue;
        };
        let Ok(slot) = shared.mirror_slots.clone().try_acquire_owned() else {
            shared
                .metrics
                .upstream_error(UpstreamErrorKind::MirrorOverload);
            continue;
        };
        let Some(guard) = balancer.pick() else {
            shared.metrics.upstream_error(UpstreamErrorKind::Mirror);
            continue;
        };
        let uri = request_uri(
            balancer.protocol,
            &guard.endpoint().authority,
            req.path_and_query,
            &Uri::default(),
        );
        let Ok(uri) = uri else {
            continue;
        };
        let mut builder = Request::builder().method(req.method.clone()).uri(uri);
        builder = builder.version(match balancer.protocol {
            // Tcp and Udp backends are only on stream and datagram ports, never reached from HTTP.
            BackendProtocol::Http1 | BackendProtocol::Tcp | BackendProtocol::Udp => {
                Version::HTTP_11
            }
            BackendProtocol::H2c => Version::HTTP_2,
        });
        let Ok(mut copy) = builder.body(full(req.body.clone())) else {
            continue;
        };
        *copy.headers_mut() = req.headers.clone();
        let shared = shared.clone();
        let protocol = balancer.protocol;
        tokio::spawn(async move {
            let sent = tokio::time::timeout(MIRROR_TIMEOUT, async {
                let resp = shared
                    .upstream
                    // The request's map already holds the added fields (`Call::send`).
                    .send(protocol, guard.endpoint(), copy, &Added::default())
                    .await?;
                // Drain so the pooled connection can be reused.
                let _ = resp.into_body().collect().await;
                Ok::<_, UpstreamError>(())
            })
            .await;
            if !matches!(sent, Ok(Ok(()))) {
                shared.metrics.upstream_error(UpstreamErrorKind::Mirror);
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mirror(per_million: u32) -> tollgate_api::Mirror {
        tollgate_api::Mirror {
            backend: None,
            per_million,
            sampler: Default::default(),
        }
    }

    #[test]
    fn sampling_bounds() {
        let (all, none) = (mirror(1_000_000), mirror(0));
        assert!((0..1000).all(|_| sampled(&all)));
        assert!((0..1000).all(|_| !sampled(&none)));
    }

    #[test]
    fn the_share_is_exact_over_any_run() {
        // 20%: every 5th request; 0.5%: 1 in 200; a fraction of a percent keeps its share.
        for (per_million, n, want) in [(200_000, 500, 100), (5_000, 1000, 5), (333_333, 3000, 999)]
        {
            let m = mirror(per_million);
            let got = (0..n).filter(|_| sampled(&m)).count();
            assert_eq!(got, want, "{per_million} per million of {n}");
        }
        let m = mirror(200_000);
        let picks: Vec<bool> = (0..10).map(|_| sampled(&m)).collect();
        assert_eq!(picks.iter().filter(|p| **p).count(), 2);
        // A clone (a new table) starts again; equality ignores the sampler's state.
        assert_eq!(m.clone(), mirror(200_000));
    }
}
