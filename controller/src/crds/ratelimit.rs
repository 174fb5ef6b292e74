//! RateLimitPolicy: named limits, each at most `limit` requests per `window`, counted per
//! distinct value of its `counters` (CEL), applying when its `when` predicates hold.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{PolicyStatus, Predicate, Strategy, TargetRef};

/// Rate limits for Gateways and routes.
///
/// A bare spec (`limits`, `when`) sets defaults; or wrap them in `defaults:` or `overrides:`
/// with a `strategy`. Overrides are meaningful on a Gateway: they win over route policies.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tollgate.dev",
    version = "v1alpha1",
    kind = "RateLimitPolicy",
    plural = "ratelimitpolicies",
    shortname = "rlp",
    namespaced,
    status = "PolicyStatus",
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Enforced","type":"string","jsonPath":".status.conditions[?(@.type==\"Enforced\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("!has(self.spec.limits) || (!has(self.spec.defaults) && !has(self.spec.overrides))").message("spec.limits cannot be combined with spec.defaults or spec.overrides"),
    validation = Rule::new("!(has(self.spec.defaults) && has(self.spec.overrides))").message("spec.defaults and spec.overrides are mutually exclusive")
)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitPolicySpec {
    /// What the policy attaches to (1 to 16 targets).
    #[schemars(length(min = 1, max = 16))]
    pub target_refs: Vec<TargetRef>,
    /// Limits by name (bare form = defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<BTreeMap<String, Limit>>,
    /// Predicates that gate every limit of the bare form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<Vec<Predicate>>,
    /// Defaults: replaced (atomic) or completed (merge) by more specific policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<RateLimitRules>,
    /// Overrides: replace (atomic) or win by name over (merge) more specific policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrides: Option<RateLimitRules>,
}

/// Limits with a merge strategy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitRules {
    /// `atomic` (default) or `merge`.
    #[serde(default)]
    pub strategy: Strategy,
    /// Limits by name.
    #[serde(default)]
    pub limits: BTreeMap<String, Limit>,
    /// Predicates that gate every limit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<Predicate>,
}

/// One named limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Limit {
    /// Every rate must admit a request (1 to 8).
    #[schemars(length(min = 1, max = 8))]
    pub rates: Vec<RateSpec>,
    /// `SlidingWindow` (default), `TokenBucket` or `FixedWindow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<AlgorithmSpec>,
    /// One counter per distinct tuple of these values; none = one shared counter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counters: Vec<Counter>,
    /// The limit applies only when every predicate holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<Predicate>,
    /// What one request counts (default: 1): a CEL expression on the request, or on the
    /// response for a cost known only after it (counted then: the next request pays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostSpec>,
    /// `Enforce` (default): requests over the limit are refused with 429. `Shadow`: counted
    /// exactly as `Enforce` would, reported in metrics and the access log, never refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ModeSpec>,
}

/// The cost of a request: exactly one of `request` or `response`, a CEL expression giving a
/// non-negative integer (one that fails or gives anything else counts 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.request) != has(self.response)", "message": "set exactly one of cost.request or cost.response"},
    {"rule": "!has(self.maxBodyBytes) || has(self.response)", "message": "cost.maxBodyBytes goes with cost.response"}
]))]
pub struct CostSpec {
    /// On the request (the variables of `counters`): admitted when the counter has room
    /// for the whole cost, which it then counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// On the response (`response.status`, `response.headers` with lower-case names,
    /// `response.body`: the body parsed as JSON): admitted when the counter has room for
    /// one; the cost is counted once the response head is known, or once the body has
    /// ended when the expression reads `response.body`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<String>,
    /// With a `response` that reads `response.body`: the most bytes of the body kept to
    /// parse (default 1 MiB, at most 16 MiB). The body goes to the client as it arrives
    /// either way; a longer one is not read (`has(response.body)` is false).
    #[serde(
        default,
        rename = "maxBodyBytes",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 16777216))]
    pub max_body_bytes: Option<u64>,
}

/// Whether a limit refuses requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ModeSpec {
    /// Refuse requests over the limit (429).
    Enforce,
    /// Count and report only.
    Shadow,
}

/// At most `limit` requests per `window`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RateSpec {
    /// Requests per window (at least 1).
    #[schemars(range(min = 1))]
    pub limit: u64,
    /// Window: a duration such as `500ms`, `10s`, `1m`, `1h`, `1h30m`.
    pub window: String,
}

/// A counter expression.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Counter {
    /// CEL expression whose value selects the counter.
    pub expression: String,
}

/// Counting algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AlgorithmSpec {
    /// Previous window weighted by its remaining share plus the current one.
    SlidingWindow,
    /// Capacity `limit`, refilled at `limit / window`.
    TokenBucket,
    /// Counter reset at each window boundary.
    FixedWindow,
}
