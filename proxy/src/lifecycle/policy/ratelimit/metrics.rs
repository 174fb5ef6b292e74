//! Prometheus metrics of the rate limiter.
//!
//! In: one observation per decision and per Redis call. Out: metric handles that
//! [`RateLimitMetrics::register`] adds to a registry (the proxy's, prefixed `tollgate`):
//!
//! - `tollgate_ratelimit_decisions_total{policy, outcome}`: decisions by `namespace/policy`
//!   (bounded by the configuration, never by traffic) and `allowed` / `limited` /
//!   `shadow_limited` (a `mode: Shadow` limit that would have refused: the request went on);
//! - `tollgate_ratelimit_cost_errors_total{policy}`: `cost` expressions that gave no
//!   non-negative integer (the request then counted 1);
//! - `tollgate_ratelimit_redis_duration_seconds`: latency of Redis calls that answered;
//! - `tollgate_ratelimit_redis_errors_total{kind}`: failed Redis calls, `kind` one of
//!   `timeout`, `error` (connection, protocol or script), `connect`;
//! - `tollgate_ratelimit_redis_fallback`: 1 while decisions are made with local counters
//!   because Redis is unreachable or slow, else 0.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of `ratelimit_decisions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    policy: Arc<str>,
    outcome: &'static str,
}

/// One policy's decision counters, each looked up on its first use (kept by a compiled limit).
#[derive(Clone, Debug, Default)]
pub(crate) struct DecisionCache {
    allowed: OnceLock<(u64, Counter)>,
    limited: OnceLock<(u64, Counter)>,
}

/// Labels of `ratelimit_cost_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    policy: Arc<str>,
}

/// Labels of `ratelimit_redis_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: &'static str,
}

/// Why a Redis call failed (the `kind` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RedisErrorKind {
    /// No answer within the call timeout.
    Timeout,
    /// Connection, protocol or script error.
    Error,
    /// Could not (re)connect.
    Connect,
}

impl RedisErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Error => "error",
            Self::Connect => "connect",
        }
    }
}

/// The rate limiter's metric handles. Cloning shares them.
#[derive(Clone, Debug)]
pub struct RateLimitMetrics {
    /// Tells instances apart (for [`DecisionCache`]).
    id: u64,
    decisions: Family<DecisionLabels, Counter>,
    cost_errors: Family<PolicyLabels, Counter>,
    redis_duration: Histogram,
    redis_errors: Family<ErrorLabels, Counter>,
    fallback: Gauge,
}

impl Default for RateLimitMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RateLimitMetrics {
    /// Fresh, unregistered handles.
    pub fn new() -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            decisions: Family::default(),
            cost_errors: Family::default(),
            // 0.1 ms .. ~0.8 s: a healthy call is well under a millisecond on a LAN, and the
            // call timeout caps it anyway.
            redis_duration: Histogram::new(exponential_buckets(0.0001, 2.0, 14)),
            redis_errors: Family::default(),
            fallback: Gauge::default(),
        }
    }

    /// Adds every metric to `registry` under `ratelimit_*` (the proxy's registry prefixes
    /// `tollgate_`). Handles are shared, so this may be called before or after use.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "ratelimit_decisions",
            "Rate limit decisions, by policy and outcome (allowed, limited, shadow_limited)",
            self.decisions.clone(),
        );
        registry.register(
            "ratelimit_cost_errors",
            "Rate-limit cost expressions that gave no non-negative integer (counted 1), by policy",
            self.cost_errors.clone(),
        );
        registry.register(
            "ratelimit_redis_duration_seconds",
            "Latency of rate-limit Redis calls that answered",
            self.redis_duration.clone(),
        );
        registry.register(
            "ratelimit_redis_errors",
            "Rate-limit Redis calls that failed, by kind (timeout, error, connect)",
            self.redis_errors.clone(),
        );
        registry.register(
            "ratelimit_redis_fallback",
            "1 while rate limits are enforced with local counters because Redis is unavailable",
            self.fallback.clone(),
        );
    }

    /// Counts one decision (of a shadow limit when `shadow`).
    pub(crate) fn decision(&self, policy: &Arc<str>, allowed: bool, shadow: bool) {
        self.decisions
            .get_or_create(&DecisionLabels {
                policy: policy.clone(),
                outcome: outcome(allowed, shadow),
            })
            .inc();
    }

    /// Counts a cost expression that gave no non-negative integer.
    pub(crate) fn cost_error(&self, policy: &Arc<str>) {
        self.cost_errors
            .get_or_create(&PolicyLabels {
                policy: policy.clone(),
            })
            .inc();
    }

    /// Cost expressions of `policy` that failed, for tests and diagnostics.
    pub fn cost_errors(&self, policy: &str) -> u64 {
        self.cost_errors
            .get(&PolicyLabels {
                policy: policy.into(),
            })
            .map(|c| c.get())
            .unwrap_or(0)
    }

    /// Shadow refusals counted for `policy`, for tests and diagnostics.
    pub fn shadow_refusals(&self, policy: &str) -> u64 {
        self.decisions
            .get(&DecisionLabels {
                policy: policy.into(),
                outcome: outcome(false, true),
            })
            .map(|c| c.get())
            .unwrap_or(0)
    }

    /// [`Self::decision`] through the counters `cache` kept from an earlier call: a
    /// decision then costs one atomic increment, not a label lookup. A cache filled by
    /// another instance is not used.
    /// A limit is shadow or not for its whole life, so its cache's `limited` slot holds
    /// one outcome.
    pub(crate) fn decision_cached(
        &self,
        cache: &DecisionCache,
        policy: &Arc<str>,
        allowed: bool,
        shadow: bool,
    ) {
        let slot = if allowed {
            &cache.allowed
        } else {
            &cache.limited
        };
        let (id, counter) = slot.get_or_init(|| {
            let labels = DecisionLabels {
                policy: policy.clone(),
                outcome: outcome(allowed, shadow),
            };
            (self.id, self.decisions.get_or_create(&labels).clone())
        });
        if *id == self.id {
            counter.inc();
        } else {
            self.decision(policy, allowed, shadow);
        }
    }

    pub(crate) fn redis_latency(&self, d: Duration) {
        self.redis_duration.observe(d.as_secs_f64());
    }

    pub(crate) fn redis_error(&self, kind: RedisErrorKind) {
        self.redis_errors
            .get_or_create(&ErrorLabels {
                kind: kind.as_str(),
            })
            .inc();
    }

    pub(crate) fn set_fallback(&self, on: bool) {
        self.fallback.set(i64::from(on));
    }

    /// The fallback gauge's value (1 = local counters).
    pub fn fallback(&self) -> i64 {
        self.fallback.get()
    }

    /// Decisions counted for `policy` with `allowed` (enforced refusals when false), for
    /// tests and diagnostics.
    pub fn decisions(&self, policy: &str, allowed: bool) -> u64 {
        self.decisions
            .get(&DecisionLabels {
                policy: policy.into(),
                outcome: if allowed { "allowed" } else { "limited" },
            })
            .map(|c| c.get())
            .unwrap_or(0)
    }
}

/// The `outcome` label.
fn outcome(allowed: bool, shadow: bool) -> &'static str {
    match (allowed, shadow) {
        (true, _) => "allowed",
        (false, false) => "limited",
        (false, true) => "shadow_limited",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_counters_count_in_their_own_instance_only() {
        let (a, b) = (RateLimitMetrics::new(), RateLimitMetrics::new());
        let policy: Arc<str> = "shop/per-user".into();
        let cache = DecisionCache::default();
        a.decision_cached(&cache, &policy, true, false);
        a.decision_cached(&cache, &policy, true, false);
        b.decision_cached(&cache, &policy, true, false);
        a.decision_cached(&cache, &policy, false, false);
        assert_eq!(a.decisions("shop/per-user", true), 2);
        assert_eq!(a.decisions("shop/per-user", false), 1);
        assert_eq!(b.decisions("shop/per-user", true), 1);
        assert_eq!(b.decisions("shop/per-user", false), 0);
    }

    #[test]
    fn registers_and_encodes_under_the_tollgate_prefix() {
        let m = RateLimitMetrics::new();
        let mut registry = Registry::with_prefix("tollgate");
        m.register(&mut registry);
        let policy: Arc<str> = "shop/per-user".into();
        m.decision(&policy, true, false);
        m.decision(&policy, true, false);
        m.decision(&policy, false, false);
        m.decision(&policy, false, true);
        m.cost_error(&policy);
        m.redis_latency(Duration::from_micros(300));
        m.redis_error(RedisErrorKind::Timeout);
        m.set_fallback(true);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for want in [
            r#"tollgate_ratelimit_decisions_total{policy="shop/per-user",outcome="allowed"} 2"#,
            r#"tollgate_ratelimit_decisions_total{policy="shop/per-user",outcome="limited"} 1"#,
            r#"tollgate_ratelimit_decisions_total{policy="shop/per-user",outcome="shadow_limited"} 1"#,
            r#"tollgate_ratelimit_cost_errors_total{policy="shop/per-user"} 1"#,
            "tollgate_ratelimit_redis_duration_seconds_count 1",
            r#"tollgate_ratelimit_redis_errors_total{kind="timeout"} 1"#,
            "tollgate_ratelimit_redis_fallback 1",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        assert_eq!(m.decisions("shop/per-user", true), 2);
        assert_eq!(m.fallback(), 1);
    }
}
