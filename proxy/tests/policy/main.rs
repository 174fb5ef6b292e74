//! Socket tests of the policy phase of the request path (`service.rs`, phase 2b): a proxy
//! serving a table whose routes carry AuthPolicy and RateLimitPolicy sets, real clients and
//! an echo backend on 127.0.0.1. What a client gets (401 with `WWW-Authenticate`, 403, 429
//! with `Retry-After`, `X-RateLimit-*` on admitted answers), what the upstream sees (success
//! headers set, spoofed ones gone), the order of the checks, rules closed by invalid
//! policies (500), cost and shadow limits, and the per-policy decision counters.
//!
//! Rate limits here count per minute in the default sliding window, so the numbers asserted
//! hold whatever the wall clock: a test that crosses a minute boundary carries the previous
//! window's count over, and each test is done long before that count has slid out (a third of
//! a window for a limit of 3). No assertion depends on timing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod authn;
mod basic;
mod client_ip;
mod closed;
#[path = "../common/mod.rs"]
mod common;
mod cost;
mod cost_body;
mod decisions;
mod external_grpc;
mod external_http;
mod external_support;
mod external_tls;
mod front_door;
mod limits;
mod order;
mod support;
