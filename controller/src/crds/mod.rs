//! Tollgate's own CRDs: RateLimitPolicy, AuthPolicy, ClientPolicy, BackendPolicy,
//! CachePolicy and GatewayParameters (group `tollgate.dev`, `v1alpha1`).
//!
//! In: nothing. Out: the Rust types (serde + JSON schema) the controller watches and the
//! compiler reads, and [`crd_yaml`], the CRD manifests `tollgate crdgen` writes to crds/.
//! The shape follows Kuadrant's v1 policies; attachment follows GEP-713 (targetRefs to a
//! Gateway, HTTPRoute or GRPCRoute in the policy's namespace, `sectionName` = listener or rule).

pub mod auth;
pub mod backend;
pub mod cache;
pub mod client;
pub mod common;
pub mod external;
pub mod parameters;
pub mod ratelimit;
pub mod reference;

pub use auth::{AuthPolicy, AuthPolicySpec};
pub use backend::{BackendPolicy, BackendPolicySpec};
pub use cache::{CachePolicy, CachePolicySpec};
pub use client::{ClientPolicy, ClientPolicySpec};
pub use common::{PolicyStatus, Predicate, Strategy, TargetRef};
pub use parameters::{GatewayParameters, GatewayParametersSpec};
pub use ratelimit::{RateLimitPolicy, RateLimitPolicySpec};

use kube::CustomResourceExt;

/// Group of every Tollgate CRD.
pub const GROUP: &str = "tollgate.dev";

/// Every CRD as the API server gets it, sorted by name.
pub fn crds()
-> [k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition; 6]
{
    let mut crds = [
        AuthPolicy::crd(),
        BackendPolicy::crd(),
        CachePolicy::crd(),
        ClientPolicy::crd(),
        GatewayParameters::crd(),
        RateLimitPolicy::crd(),
    ];
    for crd in &mut crds {
        status_defaults_to_unobserved(crd);
    }
    crds
}

/// The CRD manifests, one `(file name, YAML)` per kind, sorted by file name.
pub fn crd_yaml() -> Result<Vec<(String, String)>, serde_yaml_ng::Error> {
    crds()
        .iter()
        .map(|crd| {
            let name = format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("crd"));
            serde_yaml_ng::to_string(crd).map(|y| (name, y))
        })
        .collect()
}

/// A new object is served with `status.observedGeneration: 0` until the controller writes its
/// status, so kstatus (Flux) and Argo CD read it as in progress rather than current.
fn status_defaults_to_unobserved(
    crd: &mut k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSON;
    for v in &mut crd.spec.versions {
        if let Some(status) = v
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("status"))
        {
            status.default = Some(JSON(serde_json::json!({"observedGeneration": 0})));
        }
    }
}
