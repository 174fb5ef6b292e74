//! Request and connection limits. In: [`crate::ProxyOptions`], and a port's ClientPolicy
//! limits. Out: [`Limits`]: the proxy's, in its shared state, and each connection's own copy
//! with its port's overrides ([`Limits::with`]), read on every request (header and body
//! sizes, body pace, header and idle deadlines, HTTP/2 caps).

use std::time::Duration;

use tollgate_api::client::ClientLimits;

/// How long a client may take to send a request head, by default.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Request and connection limits, copied out of [`crate::ProxyOptions`] (documented there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub max_header_bytes: usize,
    /// Most fields of a request head (431 beyond); our HTTP/1 codec reads at most
    /// `tollgate_h1::MAX_HEADERS`.
    pub max_header_count: usize,
    pub max_body_bytes: u64,
    /// A request head must be whole this long after its first byte.
    pub header_read_timeout: Duration,
    /// An HTTP/1 connection waits this long for the first byte of its next request.
    pub idle_timeout: Duration,
    /// Most open connections from one client address on a port; `None`: no limit.
    pub max_connections_per_client: Option<u32>,
    /// From a request's arrival to its answer's head (504 beyond); `None`: only routes'.
    pub request_timeout: Option<Duration>,
    pub stream_idle_timeout: Duration,
    pub udp_flow_idle_timeout: Duration,
    pub udp_max_flows: usize,
    pub request_body_idle_timeout: Duration,
    pub request_body_timeout: Duration,
    pub request_body_min_rate: u64,
    pub request_body_rate_window: Duration,
    pub http2_stream_idle_timeout: Duration,
    pub http2_idle_timeout: Duration,
    pub http2_max_concurrent_streams: u32,
    pub max_upstream_requests_per_connection: usize,
}

impl Limits {
    /// These limits with a port's ClientPolicy overrides. `idleTimeout` bounds the wait for
    /// a request on both HTTP/1 and HTTP/2 connections.
    pub fn with(mut self, c: &ClientLimits) -> Self {
        let ms = Duration::from_millis;
        let usize_of = |v: u32| usize::try_from(v).unwrap_or(usize::MAX);
        if let Some(v) = c.max_request_headers_bytes {
            self.max_header_bytes = usize_of(v);
        }
        if let Some(v) = c.max_request_headers {
            self.max_header_count = usize_of(v);
        }
        if let Some(v) = c.max_request_body_bytes {
            self.max_body_bytes = v;
        }
        if let Some(v) = c.max_connections_per_client {
            self.max_connections_per_client = Some(v);
        }
        if let Some(v) = c.request_header_timeout_ms {
            self.header_read_timeout = ms(v);
        }
        if let Some(v) = c.idle_timeout_ms {
            self.idle_timeout = ms(v);
            self.http2_idle_timeout = ms(v);
        }
        if let Some(v) = c.request_body_timeout_ms {
            self.request_body_timeout = ms(v);
        }
        if let Some(v) = c.request_timeout_ms {
            self.request_timeout = Some(ms(v));
        }
        if let Some(v) = c.http2_max_concurrent_streams {
            self.http2_max_concurrent_streams = v;
        }
        self
    }
}
