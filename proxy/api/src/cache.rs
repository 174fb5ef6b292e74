//! What a CachePolicy asks of one route rule: the proxy's shared HTTP cache (RFC 9111)
//! stores its answers and serves them again.
//!
//! In: nothing (the compiler fills [`CacheRule`] from the CachePolicy on the rule, its
//! HTTPRoute or its Gateway). Out: the rule's `cache` in the table. The proxy runs the
//! rule's policies (authentication, rate limits) before it looks in the cache, so every hit
//! is authorized and counted.

use serde::{Deserialize, Serialize};

use crate::ObjectKey;

/// How one rule's answers are cached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheRule {
    /// The CachePolicy this comes from (purge, logs).
    pub policy: ObjectKey,
    /// Freshness of an answer without explicit freshness (`max-age`, `s-maxage`,
    /// `Expires`), for the statuses RFC 9110 §15.1 calls heuristically cacheable; `None`:
    /// such answers are not stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_ttl_ms: Option<u64>,
    /// Upper bound of any answer's freshness; `None`: the answer's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ttl_ms: Option<u64>,
    /// How long past its freshness a stored answer is served while one request refreshes
    /// it in the background (0: never).
    #[serde(default)]
    pub stale_while_revalidate_ms: u64,
    /// How long past its freshness a stored answer is served when the upstream fails (5xx,
    /// no connection, no healthy endpoint); 0: never.
    #[serde(default)]
    pub stale_if_error_ms: u64,
    /// Largest body stored; a larger answer is streamed to the client and not stored.
    pub max_entry_bytes: u64,
    /// Which query parameters are part of the key.
    #[serde(default, skip_serializing_if = "QueryKey::is_all")]
    pub query: QueryKey,
    /// CEL expressions whose values are part of the key (`auth.identity.sub`), checked by
    /// the compiler.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expressions: Vec<String>,
    /// Methods whose answers are stored and served (upper case): `GET`, `HEAD`.
    pub methods: Vec<String>,
    /// Answers carrying `Set-Cookie` are stored too (they never are by default).
    #[serde(default, skip_serializing_if = "crate::is_false")]
    pub store_set_cookie: bool,
}

/// The query parameters in the cache key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum QueryKey {
    /// The whole query, as sent.
    #[default]
    All,
    /// Only these parameters (by name, case-sensitive), in the order sent.
    Include(Vec<String>),
    /// Every parameter but these.
    Exclude(Vec<String>),
}

impl QueryKey {
    /// The default: the whole query.
    pub fn is_all(&self) -> bool {
        matches!(self, QueryKey::All)
    }
}
