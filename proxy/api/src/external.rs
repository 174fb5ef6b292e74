//! External authorization in the route table: what an AuthPolicy `external` authorization
//! rule compiles into.
//!
//! In: nothing. Out: plain serde types, held by [`crate::policy::AuthzRule::external`] and by
//! the HTTPRoute ExternalAuth filter ([`crate::Filter::ExternalAuth`]). The
//! compiler resolves the rule's backendRef to a key of [`crate::RouteTable::backends`] (so the
//! proxy reaches the service through the same balancers, pools and BackendTLSPolicy as a
//! route's backends), lower-cases header names and turns durations into milliseconds.

use serde::{Deserialize, Serialize};

/// One external authorization check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExternalAuthz {
    /// `namespace/policy/rule`: keys the decision cache, so two rules never share answers.
    pub id: String,
    /// Key of the authorization service in [`crate::RouteTable::backends`].
    pub backend: String,
    /// How the service is asked.
    pub protocol: ExternalProtocol,
    /// Request headers sent to the service (lower-case). For HTTP, empty = none; for gRPC,
    /// empty = every header (as Envoy's ext_authz sends them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forward_headers: Vec<String>,
    /// Send the request body, buffered, when it is at most this many bytes; a larger body is
    /// refused with 413 (Envoy's `with_request_body` without `allow_partial_message`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<u64>,
    /// How long one check may take (connect, send, answer), in milliseconds.
    pub timeout_ms: u64,
    /// When the service cannot answer (timeout, connection failure, HTTP 5xx, gRPC error):
    /// `false` denies with 403, `true` lets the request go on.
    #[serde(default)]
    pub fail_open: bool,
    /// How long a decision is reused for the same request attributes; `None` = no cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_ttl_ms: Option<u64>,
}

/// The protocol of an external authorization service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum ExternalProtocol {
    /// A plain HTTP check: an allowing status ([`HttpCheck::allow`]) allows; any other status
    /// denies.
    Http(HttpCheck),
    /// Envoy's `envoy.service.auth.v3.Authorization/Check` over gRPC.
    Grpc,
}

/// HTTP check settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpCheck {
    /// Prefix put before the original path (`""` = the original path as is).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path_prefix: String,
    /// Headers of an allowing (2xx) answer copied to the upstream request (lower-case).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers_to_upstream: Vec<String>,
    /// Headers of an allowing (2xx) answer copied to the client's response (lower-case).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers_to_client: Vec<String>,
    /// Copy every header of an allowing answer to the upstream request (but `Host`, framing,
    /// hop-by-hop and content headers), as the HTTPRoute ExternalAuth filter does without
    /// `allowedResponseHeaders`; `headers_to_upstream` is then empty.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all_headers_to_upstream: bool,
    /// Which statuses of the service allow.
    #[serde(default, skip_serializing_if = "AllowStatus::is_any_2xx")]
    pub allow: AllowStatus,
}

/// The statuses of an HTTP authorization service's answer that allow the request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllowStatus {
    /// Any 2xx (nginx's `auth_request`, Traefik's ForwardAuth): the AuthPolicy `external.http`
    /// rule.
    #[default]
    #[serde(rename = "2xx")]
    Any2xx,
    /// `200` only; another 2xx is an authorization failure (GEP-1494: the HTTPRoute
    /// ExternalAuth filter).
    #[serde(rename = "200")]
    Only200,
}

impl AllowStatus {
    /// True for the default.
    pub fn is_any_2xx(&self) -> bool {
        *self == Self::Any2xx
    }
}
