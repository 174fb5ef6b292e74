//! Policies in the proxy: CEL, authentication and authorization, rate limits.
//!
//! In: the [`tollgate_api::PolicySet`]s of a table. Out: per request, admit or a denial
//! answer. Compiled once per table (CEL programs, key digests), enforced in the order route
//! match, authentication, authorization, rate limit.

pub mod auth;
pub mod cel;
pub mod decisions;
pub mod enforce;
pub mod ratelimit;

pub use decisions::PolicyDecisions;
pub use enforce::{Enforcer, PolicyError, PolicyRuntime};
pub mod storage_args;

pub use storage_args::RateLimitArgs;
