//! Metrics of authentication and authorization. In: one outcome per checked request, one
//! result per JWKS fetch and per introspection call. Out: prometheus-client families that the
//! proxy registers once with [`AuthMetrics::register`].
//!
//! Labels are fixed strings only (method type, outcome, result): never a policy name, a
//! subject or a URI, so the series count is bounded by the code, not by traffic or config.
//!
//! The per-request counters (outcomes, cache lookups) are kept once looked up: a label lookup
//! in a family hashes the labels with SipHash under a lock, which cost more than the rest of
//! an API key check. A series still appears on its first use, as with a plain lookup.

use std::sync::{Arc, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The method type a request was decided by (the `method` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MethodKind {
    /// API key.
    ApiKey,
    /// HTTP Basic (htpasswd).
    Basic,
    /// Signed JWT.
    Jwt,
    /// OAuth 2.0 token introspection.
    Introspection,
    /// TLS client certificate.
    X509,
    /// OpenID Connect session cookie.
    Oidc,
    /// No method decided: the policy has no authentication methods (anonymous), or every
    /// method was skipped by its `when` predicates.
    None,
}

impl MethodKind {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ApiKey => "apiKey",
            Self::Basic => "basic",
            Self::Jwt => "jwt",
            Self::Introspection => "introspection",
            Self::X509 => "x509",
            Self::Oidc => "oidc",
            Self::None => "none",
        }
    }
}

impl MethodKind {
    const COUNT: usize = 7;

    fn index(self) -> usize {
        match self {
            Self::ApiKey => 0,
            Self::Jwt => 1,
            Self::Introspection => 2,
            Self::X509 => 3,
            Self::None => 4,
            Self::Basic => 5,
            Self::Oidc => 6,
        }
    }
}

/// How a checked request ended (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Authenticated (or anonymous) and every applicable authorization rule held.
    Allowed,
    /// No method authenticated: credential missing or invalid.
    Unauthenticated,
    /// Authenticated, but an authorization rule did not hold.
    Forbidden,
    /// Denied because verification could not run (keys unavailable, introspection endpoint
    /// unreachable or timing out): authentication never fails open.
    Error,
    /// The policy's own `when` did not hold: neither authenticated nor denied by it.
    Skipped,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Unauthenticated => "unauthenticated",
            Self::Forbidden => "forbidden",
            Self::Error => "error",
            Self::Skipped => "skipped",
        }
    }
}

impl Outcome {
    const COUNT: usize = 6;

    fn index(self) -> usize {
        match self {
            Self::Allowed => 0,
            Self::Unauthenticated => 1,
            Self::Forbidden => 2,
            Self::Error => 3,
            Self::Skipped => 4,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    method: &'static str,
    outcome: &'static str,
}

/// A cache of verification answers (the `cache` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cache {
    /// Verified JWTs.
    Jwt,
    /// Introspection answers.
    Introspection,
}

impl Cache {
    fn as_str(self) -> &'static str {
        match self {
            Self::Jwt => "jwt",
            Self::Introspection => "introspection",
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Jwt => 0,
            Self::Introspection => 1,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    cache: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExternalLabels {
    protocol: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// Counters of the auth module. Cheap to clone (the families are shared handles).
#[derive(Debug, Clone, Default)]
pub struct AuthMetrics {
    outcomes: Family<OutcomeLabels, Counter>,
    jwks_fetches: Family<ResultLabels, Counter>,
    introspections: Family<ResultLabels, Counter>,
    cache_lookups: Family<CacheLabels, Counter>,
    /// External authorization checks, by protocol (`http`, `grpc`) and result (see
    /// the module `external`).
    external: Family<ExternalLabels, Counter>,
    /// The per-request series, each kept once looked up (shared by clones, like the families).
    kept: Arc<Kept>,
}

/// Series of [`AuthMetrics`] already looked up in their family (a [`Counter`] shares its value
/// with the family's).
#[derive(Debug)]
struct Kept {
    /// By `MethodKind::index() * Outcome::COUNT + Outcome::index()`.
    outcomes: [OnceLock<Counter>; MethodKind::COUNT * Outcome::COUNT],
    /// By `Cache::index() * 2 + hit`.
    cache_lookups: [OnceLock<Counter>; 4],
}

impl Default for Kept {
    fn default() -> Self {
        Self {
            outcomes: std::array::from_fn(|_| OnceLock::new()),
            cache_lookups: std::array::from_fn(|_| OnceLock::new()),
        }
    }
}

impl AuthMetrics {
    /// Creates unregistered counters (tests can use them as they are).
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the counters in `registry` (the proxy's, prefixed `tollgate`):
    /// `tollgate_auth_requests_total{method, outcome}`,
    /// `tollgate_auth_jwks_fetches_total{result}` and
    /// `tollgate_auth_introspections_total{result}` (`result` = `ok` or `error`) and
    /// `tollgate_auth_cache_lookups_total{cache, result}` (`jwt`/`introspection`, `hit`/`miss`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "auth_requests",
            "Requests checked by an AuthPolicy, by the method type that decided them and outcome",
            self.outcomes.clone(),
        );
        registry.register(
            "auth_jwks_fetches",
            "JWKS fetches, by result",
            self.jwks_fetches.clone(),
        );
        registry.register(
            "auth_introspections",
            "Token introspection calls (cache misses), by result",
            self.introspections.clone(),
        );
        registry.register(
            "auth_cache_lookups",
            "Lookups in the verified-token and introspection caches, by cache and result",
            self.cache_lookups.clone(),
        );
        registry.register(
            "auth_external_checks",
            "External authorization checks, by protocol and result (allowed, denied, error, fail_open, cache_hit)",
            self.external.clone(),
        );
    }

    /// Counts one checked request.
    pub fn outcome(&self, method: MethodKind, outcome: Outcome) {
        let i = method.index() * Outcome::COUNT + outcome.index();
        let lookup = || {
            self.outcomes
                .get_or_create(&OutcomeLabels {
                    method: method.as_str(),
                    outcome: outcome.as_str(),
                })
                .clone()
        };
        match self.kept.outcomes.get(i) {
            Some(slot) => slot.get_or_init(lookup).inc(),
            // Not reached: the index is below the array's length by construction.
            None => lookup().inc(),
        };
    }

    /// The number of requests counted with these labels (for tests and diagnostics).
    pub fn outcome_count(&self, method: MethodKind, outcome: Outcome) -> u64 {
        self.outcomes
            .get(&OutcomeLabels {
                method: method.as_str(),
                outcome: outcome.as_str(),
            })
            .map_or(0, |c| c.get())
    }

    /// Cache hits so far (for tests and diagnostics).
    pub fn cache_hits(&self, cache: Cache) -> u64 {
        self.cache_lookups
            .get(&CacheLabels {
                cache: cache.as_str(),
                result: "hit",
            })
            .map_or(0, |c| c.get())
    }

    /// JWKS fetches so far with this result (for tests and diagnostics).
    pub fn jwks_fetches(&self, ok: bool) -> u64 {
        self.jwks_fetches.get(&result(ok)).map_or(0, |c| c.get())
    }

    pub(crate) fn cache_lookup(&self, cache: Cache, hit: bool) {
        let i = cache.index() * 2 + usize::from(hit);
        let lookup = || {
            self.cache_lookups
                .get_or_create(&CacheLabels {
                    cache: cache.as_str(),
                    result: if hit { "hit" } else { "miss" },
                })
                .clone()
        };
        match self.kept.cache_lookups.get(i) {
            Some(slot) => slot.get_or_init(lookup).inc(),
            // Not reached: the index is below the array's length by construction.
            None => lookup().inc(),
        };
    }

    /// Counts one external authorization check (`protocol`: `http` or `grpc`; `result`:
    /// `allowed`, `denied`, `error`, `fail_open` or `cache_hit`).
    pub(crate) fn external(&self, protocol: &'static str, result: &'static str) {
        self.external
            .get_or_create(&ExternalLabels { protocol, result })
            .inc();
    }

    /// External authorization checks counted with these labels (for tests and diagnostics).
    pub fn external_count(&self, protocol: &'static str, result: &'static str) -> u64 {
        self.external
            .get(&ExternalLabels { protocol, result })
            .map_or(0, |c| c.get())
    }

    pub(crate) fn jwks_fetch(&self, ok: bool) {
        self.jwks_fetches.get_or_create(&result(ok)).inc();
    }

    pub(crate) fn introspection(&self, ok: bool) {
        self.introspections.get_or_create(&result(ok)).inc();
    }
}

fn result(ok: bool) -> ResultLabels {
    ResultLabels {
        result: if ok { "ok" } else { "error" },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_low_cardinality_series() {
        let m = AuthMetrics::new();
        let mut registry = Registry::with_prefix("tollgate");
        m.register(&mut registry);
        m.outcome(MethodKind::Jwt, Outcome::Allowed);
        m.outcome(MethodKind::Jwt, Outcome::Allowed);
        m.outcome(MethodKind::ApiKey, Outcome::Forbidden);
        m.jwks_fetch(false);
        m.introspection(true);
        m.cache_lookup(Cache::Jwt, true);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"tollgate_auth_requests_total{method="jwt",outcome="allowed"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tollgate_auth_requests_total{method="apiKey",outcome="forbidden"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"tollgate_auth_jwks_fetches_total{result="error"} 1"#));
        assert!(text.contains(r#"tollgate_auth_introspections_total{result="ok"} 1"#));
        assert!(text.contains(r#"tollgate_auth_cache_lookups_total{cache="jwt",result="hit"} 1"#));
        assert_eq!(m.outcome_count(MethodKind::Jwt, Outcome::Allowed), 2);
        assert_eq!(m.cache_hits(Cache::Jwt), 1);
        assert_eq!(m.jwks_fetches(false), 1);
        assert_eq!(m.outcome_count(MethodKind::X509, Outcome::Allowed), 0);
    }

    #[test]
    fn kept_series_count_each_label_pair_in_its_own_series_across_clones() {
        let kinds = [
            MethodKind::ApiKey,
            MethodKind::Jwt,
            MethodKind::Introspection,
            MethodKind::X509,
            MethodKind::Basic,
            MethodKind::Oidc,
            MethodKind::None,
        ];
        let outcomes = [
            Outcome::Allowed,
            Outcome::Unauthenticated,
            Outcome::Forbidden,
            Outcome::Error,
            Outcome::Skipped,
        ];
        let m = AuthMetrics::new();
        let clone = m.clone();
        let mut n = 0;
        for kind in kinds {
            for outcome in outcomes {
                n += 1;
                // Half through the clone: both keep the same series.
                for i in 0..n {
                    if i % 2 == 0 { &m } else { &clone }.outcome(kind, outcome);
                }
            }
        }
        let mut n = 0;
        for kind in kinds {
            for outcome in outcomes {
                n += 1;
                assert_eq!(m.outcome_count(kind, outcome), n, "{kind:?} {outcome:?}");
            }
        }
        for (cache, hits, misses) in [(Cache::Jwt, 3, 1), (Cache::Introspection, 2, 5)] {
            for _ in 0..hits {
                clone.cache_lookup(cache, true);
            }
            for _ in 0..misses {
                m.cache_lookup(cache, false);
            }
            assert_eq!(m.cache_hits(cache), hits);
            let missed = m
                .cache_lookups
                .get(&CacheLabels {
                    cache: cache.as_str(),
                    result: "miss",
                })
                .map_or(0, |c| c.get());
            assert_eq!(missed, misses);
        }
    }
}
