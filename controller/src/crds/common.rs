//! Pieces both policy kinds share: target references, predicates, merge strategy, status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A reference to the object a policy attaches to, in the policy's namespace (GEP-713).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// `gateway.networking.k8s.io`.
    pub group: String,
    /// `Gateway`, `HTTPRoute` or `GRPCRoute`.
    pub kind: String,
    /// Name of the target.
    pub name: String,
    /// A listener name (Gateway) or rule name (route); the whole target when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
}

/// A CEL predicate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Predicate {
    /// CEL expression that must evaluate to true.
    pub predicate: String,
}

/// How defaults or overrides combine with the policies below or above them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// The more specific policy replaces (defaults) or is replaced by (overrides) this one
    /// as a whole.
    #[default]
    Atomic,
    /// Limits or rules are combined by name; on a name clash the winner's entry is kept.
    Merge,
}

/// Status of a policy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// Generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted` (Accepted, TargetNotFound, Invalid, Conflicted) and `Enforced` (Enforced,
    /// Overridden, Unknown).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Per-target detail (GEP-713): one entry per Gateway the policy reaches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ancestors: Vec<PolicyAncestorStatus>,
}

/// Status of a policy for one ancestor (a Gateway).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyAncestorStatus {
    /// The Gateway.
    pub ancestor_ref: AncestorRef,
    /// `tollgate.dev/gateway-controller`.
    pub controller_name: String,
    /// `Accepted` and `Enforced` for this ancestor.
    pub conditions: Vec<Condition>,
}

/// A reference to a Gateway in a policy's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AncestorRef {
    /// `gateway.networking.k8s.io`.
    pub group: String,
    /// `Gateway`.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}
