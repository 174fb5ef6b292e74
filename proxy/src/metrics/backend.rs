//! Backend metrics: retries, the circuit breaker, the retry budget, outlier ejections and
//! health checks (module `upstream`). Registered with the others under `tollgate_`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::ReasonLabels;

/// Labels of `tollgate_health_checks_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// Labels of `tollgate_health_check_transitions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToLabels {
    to: &'static str,
}

/// Labels of `tollgate_backend_healthy_endpoints`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    backend: String,
}

/// Labels of `tollgate_circuit_breaker_rejections_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    limit: &'static str,
}

/// The handles.
#[derive(Debug, Default)]
pub(crate) struct BackendMetrics {
    upstream_retries: Family<ReasonLabels, Counter>,
    breaker_rejections: Family<LimitLabels, Counter>,
    ejections: Counter,
    budget_exhausted: Counter,
    health_checks: Family<ResultLabels, Counter>,
    health_transitions: Family<ToLabels, Counter>,
    healthy_endpoints: Family<BackendLabels, Gauge>,
}

impl BackendMetrics {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "upstream_retries",
            "Upstream attempts made again under a route's retry rule, by why the last failed (connect, reset, timeout, status)",
            self.upstream_retries.clone(),
        );
        registry.register(
            "circuit_breaker_rejections",
            "Requests and retries a backend's circuit breaker refused, by limit (max_requests, max_pending_requests, max_retries)",
            self.breaker_rejections.clone(),
        );
        registry.register(
            "upstream_ejections",
            "Endpoints ejected by outlier detection",
            self.ejections.clone(),
        );
        registry.register(
            "upstream_retry_budget_exhausted",
            "Retries not made because the backend's retry budget was spent",
            self.budget_exhausted.clone(),
        );
        registry.register(
            "health_checks",
            "Active health checks of endpoints, by result (pass, fail)",
            self.health_checks.clone(),
        );
        registry.register(
            "health_check_transitions",
            "Endpoints that active health checks took out or brought back, by the state they went to (healthy, unhealthy)",
            self.health_transitions.clone(),
        );
        registry.register(
            "backend_healthy_endpoints",
            "Endpoints available now (neither ejected nor failing health checks), by backend; for backends with outlier detection or health checks",
            self.healthy_endpoints.clone(),
        );
    }

    /// Counts an endpoint ejected by outlier detection.
    pub(crate) fn upstream_ejection(&self) {
        self.ejections.inc();
    }

    /// Counts one active health check.
    pub(crate) fn health_check(&self, passed: bool) {
        let result = if passed { "pass" } else { "fail" };
        self.health_checks
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Counts an endpoint that health checks took out (`healthy` false) or brought back.
    pub(crate) fn health_transition(&self, healthy: bool) {
        let to = if healthy { "healthy" } else { "unhealthy" };
        self.health_transitions
            .get_or_create(&ToLabels { to })
            .inc();
    }

    /// Records how many endpoints of `backend` are available now.
    pub(crate) fn set_healthy_endpoints(&self, backend: &str, available: usize) {
        self.healthy_endpoints
            .get_or_create(&BackendLabels {
                backend: backend.to_owned(),
            })
            .set(i64::try_from(available).unwrap_or(i64::MAX));
    }

    /// Drops the healthy-endpoints series of a backend no longer watched, so a removed
    /// backend does not show its last count for ever.
    pub(crate) fn remove_healthy_endpoints(&self, backend: &str) {
        self.healthy_endpoints.remove(&BackendLabels {
            backend: backend.to_owned(),
        });
    }

    /// Counts an upstream attempt made again, by why the one before failed.
    pub(crate) fn upstream_retry(&self, reason: crate::lifecycle::retry::RetryReason) {
        self.upstream_retries
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Counts a request or retry a circuit breaker refused.
    pub(crate) fn circuit_breaker_rejected(&self, limit: crate::upstream::breaker::Limit) {
        self.breaker_rejections
            .get_or_create(&LimitLabels {
                limit: limit.as_str(),
            })
            .inc();
    }

    /// Counts a retry the backend's budget refused.
    pub(crate) fn retry_budget_exhausted(&self) {
        self.budget_exhausted.inc();
    }
}
