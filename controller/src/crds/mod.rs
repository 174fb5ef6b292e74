//! Tollgate's own CRDs: RateLimitPolicy and AuthPolicy (group `tollgate.dev`, `v1alpha1`).
//!
//! In: nothing. Out: the Rust types (serde + JSON schema) the controller watches and the
//! compiler reads, and [`crd_yaml`], the CRD manifests `tollgate crdgen` writes to crds/.
//! The shape follows Kuadrant's v1 policies; attachment follows GEP-713 (targetRefs to a
//! Gateway, HTTPRoute or GRPCRoute in the policy's namespace, `sectionName` = listener or rule).

pub mod auth;
pub mod common;
pub mod ratelimit;

pub use auth::{AuthPolicy, AuthPolicySpec};
pub use common::{PolicyStatus, Predicate, Strategy, TargetRef};
pub use ratelimit::{RateLimitPolicy, RateLimitPolicySpec};

use kube::CustomResourceExt;

/// Group of every Tollgate CRD.
pub const GROUP: &str = "tollgate.dev";

/// The CRD manifests, one `(file name, YAML)` per kind, sorted by file name.
pub fn crd_yaml() -> Result<Vec<(String, String)>, serde_yaml_ng::Error> {
    let crds = [AuthPolicy::crd(), RateLimitPolicy::crd()];
    crds.iter()
        .map(|crd| {
            let name = format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("crd"));
            serde_yaml_ng::to_string(crd).map(|y| (name, y))
        })
        .collect()
}
