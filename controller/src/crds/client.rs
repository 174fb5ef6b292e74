//! ClientPolicy: what a Gateway's listeners do for their clients. Where the client address
//! comes from behind load balancers (PROXY protocol, trusted `X-Forwarded-For` hops), how
//! paths are normalized, request and connection limits, and response compression.
//!
//! Attachment: a Gateway, or one listener (`sectionName`). These act per port (a port's
//! listeners share one socket), so the listeners of one port must end up with the same
//! settings; a listener policy that would split a port is `Conflicted`. An HTTPRoute (or one
//! rule) may be targeted for `limits.maxRequestBodyBytes` and `compression: {disabled: true}`
//! alone.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{PolicyStatus, TargetRef};

/// Client address, path options and limits for a Gateway or one of its listeners.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tollgate.dev",
    version = "v1alpha1",
    kind = "ClientPolicy",
    plural = "clientpolicies",
    shortname = "cp",
    namespaced,
    status = "PolicyStatus",
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Enforced","type":"string","jsonPath":".status.conditions[?(@.type==\"Enforced\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("!has(self.spec.clientIP) || !has(self.spec.clientIP.xForwardedFor) || (has(self.spec.clientIP.xForwardedFor.numTrustedHops) != has(self.spec.clientIP.xForwardedFor.trustedCIDRs))").message("spec.clientIP.xForwardedFor needs exactly one of numTrustedHops and trustedCIDRs")
)]
#[serde(rename_all = "camelCase")]
pub struct ClientPolicySpec {
    /// What the policy attaches to: Gateways, or listeners of them by `sectionName`; or
    /// HTTPRoutes, or rules of them by `sectionName`, for `limits.maxRequestBodyBytes` and
    /// `compression: {disabled: true}` only (1 to 16 targets).
    #[schemars(length(min = 1, max = 16))]
    pub target_refs: Vec<TargetRef>,
    /// Where the client address comes from. Unset: the connection's peer.
    #[serde(rename = "clientIP", default, skip_serializing_if = "Option::is_none")]
    pub client_ip: Option<ClientIp>,
    /// Path normalization options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathSpec>,
    /// Request and connection limits; unset ones keep the proxy's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsSpec>,
    /// Response compression (gzip, brotli, zstd) for clients that accept it. Unset: none.
    /// On an HTTPRoute only `{disabled: true}`, which keeps its responses uncompressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<CompressionSpec>,
}

/// Response compression of the targeted listeners' ports: the coding is chosen from the
/// request's `Accept-Encoding` (its q-values; ties go to the earlier of `algorithms`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompressionSpec {
    /// Codings offered, the preferred first: `zstd`, `br`, `gzip` (default all three in
    /// this order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 3))]
    #[schemars(extend("items" = {"type": "string", "enum": ["zstd", "br", "gzip"]}))]
    pub algorithms: Option<Vec<String>>,
    /// A response declaring a shorter `Content-Length` is not compressed, 0 to 16 MiB
    /// (default 1024); one of unknown length (chunked, streamed) is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 16_777_216))]
    pub min_bytes: Option<u64>,
    /// Media types compressed (`text/html`, or `text/*` for every subtype), compared
    /// without parameters and case; 1 to 64. Default: text/html, text/plain, text/css,
    /// text/javascript, text/xml, text/markdown, text/csv, application/javascript,
    /// application/json, application/xml, application/xhtml+xml, application/rss+xml,
    /// application/atom+xml, application/ld+json, application/manifest+json,
    /// application/problem+json, image/svg+xml. gRPC (`application/grpc*`) never is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub content_types: Option<Vec<String>>,
    /// gzip's compression level, 1 (fastest) to 9 (smallest); default 5 (most of level 6's
    /// ratio for less CPU; nginx's `gzip_comp_level` counts the same way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 9))]
    pub gzip_level: Option<u8>,
    /// `true`: no compression here (with no other field). On a listener, over its
    /// Gateway's; on an HTTPRoute or one rule, over the port's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
}

/// Request and connection limits of the targeted listeners' ports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LimitsSpec {
    /// Most bytes of a request head, 1 KiB to 1 MiB (default 64 KiB): 431 beyond.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1024, max = 1_048_576))]
    pub max_request_headers_bytes: Option<u32>,
    /// Most header fields of a request, 1 to 100 (default 100): 431 beyond.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub max_request_headers: Option<u32>,
    /// Most bytes of a request body (default 10 MiB): 413 beyond.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_request_body_bytes: Option<u64>,
    /// Most open connections from one client address on a port (after any PROXY header);
    /// more are closed unanswered. Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_connections_per_client: Option<u32>,
    /// How long a request head may take from its first byte (default 30s): the connection
    /// is closed beyond (and a PROXY header must come within it too, at most 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_header_timeout: Option<String>,
    /// How long a connection may wait for a request (HTTP/1: its first byte, default 30s;
    /// HTTP/2: no stream in flight, default 75s) before it is closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
    /// How long a request body may take from its start (default 300s): 408 beyond.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_body_timeout: Option<String>,
    /// How long from a request's arrival to its answer's head (no default): 504 beyond. A
    /// route's own `timeouts.request` applies too, the shorter first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout: Option<String>,
    /// Most open streams of an HTTP/2 connection, 1 to 10000 (default 100); more are
    /// refused (REFUSED_STREAM, which clients retry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10_000))]
    pub http2_max_concurrent_streams: Option<u32>,
}

/// The client address: used by CEL `source.address`, rate-limit counters, the
/// `X-Forwarded-For` the gateway sends and the access log.
///
/// With both, the PROXY header's source is the peer from which `X-Forwarded-For` is read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientIp {
    /// Trust `X-Forwarded-For` entries written by proxies in front of the gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x_forwarded_for: Option<XForwardedFor>,
    /// Read a PROXY protocol (v1 or v2) header at the start of each connection, as L4 load
    /// balancers send it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocolSpec>,
}

/// Which `X-Forwarded-For` entry is the client: exactly one of the two fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct XForwardedFor {
    /// The number of proxies in front of the gateway, each appending its peer: the client
    /// is the entry this many places from the right (1: the last entry). A request with
    /// fewer entries did not come through them: its peer is the client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub num_trusted_hops: Option<u32>,
    /// Networks of the proxies in front of the gateway (`10.0.0.0/8`, `2001:db8::/32`, or a
    /// single address): from the peer leftwards, the first address outside them is the
    /// client. A peer outside them is the client itself (its `X-Forwarded-For` is not read).
    #[serde(
        rename = "trustedCIDRs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 64))]
    pub trusted_cidrs: Option<Vec<String>>,
}

/// PROXY protocol on the targeted listeners' ports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyProtocolSpec {
    /// `true` (default): a connection without a valid header is closed. `false`: one
    /// without it is served with its own address (then any client that can reach the port
    /// can send a header naming any address: use it only while moving a balancer over).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
    /// The balancers' networks: only a peer in them may send a header; any other peer is
    /// closed unanswered when the header is required, and served with its own address when
    /// it is not. Unset: any peer that reaches the port (NodePorts, other pods included).
    #[serde(
        rename = "trustedCIDRs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 64))]
    pub trusted_cidrs: Option<Vec<String>>,
}

/// Path normalization options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PathSpec {
    /// Merge `//` into `/` before matching (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_slashes: Option<bool>,
    /// `%2F` and `%5C` in a path: `Keep` (default; matched as opaque characters and
    /// forwarded as sent), `Reject` (400, for a raw `\` too) or `Unescape` (`%2F` decoded to
    /// a separator before dot-segments are removed; `%5C` kept, a `\` is never one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escaped_slashes: Option<EscapedSlashesSpec>,
}

/// What to do with `%2F` and `%5C` in a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum EscapedSlashesSpec {
    /// Keep them encoded.
    Keep,
    /// Refuse the request (400).
    Reject,
    /// Decode them.
    Unescape,
}
