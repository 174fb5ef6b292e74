//! Request and connection limits. In: [`crate::ProxyOptions`]. Out: [`Limits`], copied
//! into the proxy's shared state and read on every request (header and body sizes, body
//! pace, HTTP/2 caps).

use std::time::Duration;

/// Request and connection limits, copied out of [`crate::ProxyOptions`] (documented there).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_header_bytes: usize,
    pub max_body_bytes: u64,
    pub stream_idle_timeout: Duration,
    pub request_body_idle_timeout: Duration,
    pub request_body_timeout: Duration,
    pub request_body_min_rate: u64,
    pub request_body_rate_window: Duration,
    pub http2_stream_idle_timeout: Duration,
    pub http2_idle_timeout: Duration,
    pub http2_max_concurrent_streams: u32,
    pub max_upstream_requests_per_connection: usize,
}
