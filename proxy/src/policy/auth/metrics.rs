//! Metrics of authentication and authorization. In: one outcome per checked request, one
//! result per JWKS fetch and per introspection call. Out: prometheus-client families that the
//! proxy registers once with [`AuthMetrics::register`].
//!
//! Labels are fixed strings only (method type, outcome, result): never a policy name, a
//! subject or a URI, so the series count is bounded by the code, not by traffic or config.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The method type a request was decided by (the `method` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MethodKind {
    /// API key.
    ApiKey,
    /// Signed JWT.
    Jwt,
    /// OAuth 2.0 token introspection.
    Introspection,
    /// TLS client certificate.
    X509,
    /// No method decided: the policy has no authentication methods (anonymous), or every
    /// method was skipped by its `when` predicates.
    None,
}

impl MethodKind {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ApiKey => "apiKey",
            Self::Jwt => "jwt",
            Self::Introspection => "introspection",
            Self::X509 => "x509",
            Self::None => "none",
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
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    cache: &'static str,
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
    }

    /// Counts one checked request.
    pub fn outcome(&self, method: MethodKind, outcome: Outcome) {
        self.outcomes
            .get_or_create(&OutcomeLabels {
                method: method.as_str(),
                outcome: outcome.as_str(),
            })
            .inc();
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
        self.cache_lookups
            .get_or_create(&CacheLabels {
                cache: cache.as_str(),
                result: if hit { "hit" } else { "miss" },
            })
            .inc();
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
}
