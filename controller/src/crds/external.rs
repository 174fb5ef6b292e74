//! AuthPolicy `external` authorization: delegate the decision to an HTTP service or to a gRPC
//! service speaking Envoy's `envoy.service.auth.v3.Authorization` (OPA-Envoy, Authorino).
//!
//! In: nothing. Out: the serde + JSON schema types of `rules.authorization.<name>.external`,
//! compiled by `compile::policies::external`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An external authorization service: exactly one of `grpc` and `http`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalAuthSpec {
    /// Envoy's ext_authz gRPC protocol (`envoy.service.auth.v3.Authorization/Check`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc: Option<ExternalGrpcSpec>,
    /// A plain HTTP check: a 2xx answer allows, any other denies with that answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<ExternalHttpSpec>,
    /// How long one check may take, like `200ms` or `1s` (default 200ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Let requests through when the service cannot answer (timeout, connection failure,
    /// HTTP 5xx, gRPC error). Default false: they are denied with 403.
    #[serde(default)]
    pub fail_open: bool,
    /// Reuse a decision for requests with the same forwarded attributes (method, host, path,
    /// forwarded headers, body) for this long, like `30s`. Unset: every request is checked.
    #[serde(default, rename = "cacheTTL", skip_serializing_if = "Option::is_none")]
    pub cache_ttl: Option<String>,
}

/// The gRPC service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalGrpcSpec {
    /// The Service (and port) of the authorization service.
    pub backend_ref: ExternalBackendRef,
    /// Request headers sent in the CheckRequest; empty = every header.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forward_headers: Vec<String>,
    /// Send the request body too (buffered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_body: Option<ForwardBodySpec>,
}

/// The HTTP service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalHttpSpec {
    /// The Service (and port) of the authorization service.
    pub backend_ref: ExternalBackendRef,
    /// Prefix put before the request's path in the check request (e.g. `/check`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Request headers sent to the service (besides Host and X-Forwarded-*).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forward_headers: Vec<String>,
    /// Send the request body too (buffered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_body: Option<ForwardBodySpec>,
    /// Headers of an allowing answer that are set on the upstream request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers_to_upstream: Vec<String>,
    /// Headers of an allowing answer that are added to the client's response.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers_to_client: Vec<String>,
}

/// A Service port in the policy's namespace (or another one a ReferenceGrant allows
/// AuthPolicies to reach).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalBackendRef {
    /// API group: empty (core) only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind: `Service` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Service name.
    pub name: String,
    /// Namespace (default: the policy's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Service port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// Body forwarding.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForwardBodySpec {
    /// Largest body sent; a request with a larger body is refused with 413.
    #[schemars(range(min = 1, max = 1048576))]
    pub max_bytes: u32,
}
