//! CachePolicy: the proxy's shared HTTP cache (RFC 9111) for an HTTPRoute, one rule of it
//! (`sectionName`), or every HTTPRoute of a Gateway.
//!
//! The proxy runs a rule's AuthPolicy and RateLimitPolicy before it looks in the cache, so a
//! hit is authorized and counted as any other request.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{PolicyStatus, TargetRef};

/// Caching of GET and HEAD answers for HTTPRoutes.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tollgate.dev",
    version = "v1alpha1",
    kind = "CachePolicy",
    plural = "cachepolicies",
    shortname = "cachep",
    namespaced,
    status = "PolicyStatus",
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Enforced","type":"string","jsonPath":".status.conditions[?(@.type==\"Enforced\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CachePolicySpec {
    /// What the policy attaches to: HTTPRoutes (one rule by `sectionName`) or Gateways (every
    /// HTTPRoute rule they serve), 1 to 16. A rule's own policy wins over its route's, a
    /// route's over its Gateway's.
    #[schemars(length(min = 1, max = 16))]
    pub target_refs: Vec<TargetRef>,
    /// Freshness of an answer that carries none (no `max-age`, `s-maxage` or `Expires`), for
    /// the statuses RFC 9110 calls heuristically cacheable (200, 203, 204, 300, 301, 308,
    /// 404, 405, 410, 414, 501). Unset: such answers are not stored.
    #[serde(
        rename = "defaultTTL",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub default_ttl: Option<String>,
    /// Upper bound of any answer's freshness. Unset: the answer's own.
    #[serde(rename = "maxTTL", default, skip_serializing_if = "Option::is_none")]
    pub max_ttl: Option<String>,
    /// How long past its freshness a stored answer is served while one request refreshes it.
    /// Unset: never. `must-revalidate`, `proxy-revalidate`, `s-maxage` and `no-cache`
    /// answers are never served stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_while_revalidate: Option<String>,
    /// How long past its freshness a stored answer is served when the upstream fails (5xx,
    /// no connection, no healthy endpoint). Unset: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_if_error: Option<String>,
    /// Largest body stored (default 1 MiB, at most 64 MiB); a larger answer is streamed to
    /// the client and not stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 67_108_864))]
    pub max_entry_bytes: Option<u64>,
    /// What the key holds besides the method, scheme, normalized host and path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<CacheKeySpec>,
    /// Methods whose answers are stored: `GET`, `HEAD` (default both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2))]
    #[schemars(extend("items" = {"type": "string", "enum": ["GET", "HEAD"]}))]
    pub methods: Option<Vec<String>>,
    /// Store answers that carry `Set-Cookie` (default false: never, as one client's cookie
    /// would go to every other).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_set_cookie: Option<bool>,
}

/// The parts of the key a policy chooses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheKeySpec {
    /// Query parameters in the key. Unset: the whole query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<QueryKeySpec>,
    /// CEL expressions whose values join the key (up to 8), e.g. `auth.identity.sub` (then
    /// a request with `Authorization` may be answered from the cache: the entry is its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8))]
    pub expressions: Option<Vec<String>>,
}

/// Which query parameters are in the key: exactly one of the two lists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueryKeySpec {
    /// Only these parameters (1 to 64 names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub include: Option<Vec<String>>,
    /// Every parameter but these (1 to 64 names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub exclude: Option<Vec<String>>,
}
