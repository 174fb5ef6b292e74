//! Policies in the route table: what RateLimitPolicy and AuthPolicy compile into.
//!
//! In: nothing. Out: plain serde types. The compiler resolves targetRefs, applies the
//! defaults/overrides hierarchy and validates every CEL expression; what lands here is the
//! *effective* policy of one route rule, referenced from [`crate::Route::policy`] by key into
//! [`crate::RouteTable::policies`], or a [`Closed`] entry in [`crate::RouteTable::closed`]
//! when an invalid policy closes the rule. The proxy compiles the CEL once per table and enforces in
//! the order authentication, authorization, rate limit.
//!
//! Secrets never appear in clear: API keys travel as SHA-256 digests, basic-auth passwords as
//! the salted slow hashes of their htpasswd entries; the secret material are an introspection
//! client's credentials and an OIDC client's secret and cookie keys, which the proxy needs to
//! call the endpoints and seal sessions (kept out of `Debug`).

use serde::{Deserialize, Serialize};

use crate::ObjectKey;

/// The effective policies of one route rule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicySet {
    /// Authentication and authorization; `None` = open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<Auth>,
    /// Rate limits; every applicable one must admit the request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rate_limits: Vec<RateLimit>,
}

impl PolicySet {
    /// True when nothing is enforced.
    pub fn is_empty(&self) -> bool {
        self.auth.is_none() && self.rate_limits.is_empty()
    }
}

/// A route rule that invalid policies close (fail closed): the proxy answers 500 to every
/// request of it. The compiler emits one where a policy that grants or denies access
/// (AuthPolicy) targets the rule, is invalid, and has no valid version to keep enforcing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Closed {
    /// The invalid policies (`namespace/name`), for logs and for whoever reads the table.
    pub by: Vec<ObjectKey>,
}

// ---------------------------------------------------------------------------------------------
// Rate limits

/// One named limit of a RateLimitPolicy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RateLimit {
    /// Counter namespace: `namespace/policy/limit-name` of the policy that defined the limit.
    /// Every replica and `tollgate run` key counters by it, so they count the same thing.
    pub id: String,
    /// At most `limit` per `window`; all rates must admit.
    pub rates: Vec<Rate>,
    /// Counting algorithm.
    #[serde(default)]
    pub algorithm: Algorithm,
    /// CEL expressions whose values select the counter (one counter per distinct tuple);
    /// empty = one shared counter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counters: Vec<String>,
    /// CEL predicates; the limit applies only when all hold (policy-level `when` included).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<String>,
    /// What a request counts; `None`: 1 per request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
    /// The most bytes of a response body a [`Cost::Response`] that reads `response.body`
    /// keeps to parse; `None`: [`DEFAULT_COST_MAX_BODY_BYTES`]. A longer body is not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_max_body_bytes: Option<u64>,
    /// Whether a refusal is enforced or only reported.
    #[serde(default, skip_serializing_if = "LimitMode::is_enforce")]
    pub mode: LimitMode,
}

/// What one request of a limit counts, from a CEL expression evaluating to an integer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Cost {
    /// Evaluated on the request (the variables of `counters`): the request is admitted when
    /// the counter has room for the whole cost, and counts it.
    Request(String),
    /// Evaluated on the response (`response.status`, `response.headers`, `response.body`):
    /// the request is admitted when the counter has room for one, and the cost is counted
    /// once the response head is known (once its body has ended when the expression reads
    /// `response.body`), so the request after the one that crossed the limit is refused.
    Response(String),
}

/// [`RateLimit::cost_max_body_bytes`] when unset: 1 MiB.
pub const DEFAULT_COST_MAX_BODY_BYTES: u64 = 1 << 20;

/// The largest [`RateLimit::cost_max_body_bytes`]: 16 MiB.
pub const MAX_COST_MAX_BODY_BYTES: u64 = 16 << 20;

/// Whether a limit refuses requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum LimitMode {
    /// Requests over the limit are refused with 429 (the default).
    #[default]
    Enforce,
    /// Counted exactly as `Enforce` would count, reported (metrics, access log), never
    /// refused.
    Shadow,
}

impl LimitMode {
    /// True for [`LimitMode::Enforce`].
    pub fn is_enforce(&self) -> bool {
        matches!(self, Self::Enforce)
    }
}

/// At most `limit` requests per `window_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rate {
    /// Requests admitted per window.
    pub limit: u64,
    /// Window length in milliseconds (> 0).
    pub window_ms: u64,
}

/// Counting algorithm of a limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Algorithm {
    /// Weighted previous + current fixed window (the default).
    #[default]
    SlidingWindow,
    /// Capacity `limit`, refilled at `limit / window`.
    TokenBucket,
    /// Counter reset at each window boundary.
    FixedWindow,
}

// ---------------------------------------------------------------------------------------------
// Authentication and authorization

/// The effective AuthPolicy rules of one route rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Auth {
    /// Policies that contributed, for logs and metrics (`namespace/name`).
    pub sources: Vec<ObjectKey>,
    /// CEL predicates; when one does not hold the auth rules do not apply (the request is
    /// neither authenticated nor denied by them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<String>,
    /// A request is authenticated when any method succeeds; tried in this order (by name).
    /// Empty = anonymous (authorization rules may still apply).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub authentication: Vec<AuthnMethod>,
    /// Every applicable rule must hold, else 403.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub authorization: Vec<AuthzRule>,
    /// Headers set on the upstream request after success: (lower-case name, CEL expression).
    /// The same names are removed from the client's request first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub success_headers: Vec<(String, String)>,
    /// Answer when no method authenticates (default 401).
    #[serde(default = "DenyResponse::unauthenticated")]
    pub unauthenticated: DenyResponse,
    /// Answer when an authorization rule fails (default 403).
    #[serde(default = "DenyResponse::unauthorized")]
    pub unauthorized: DenyResponse,
}

/// One named authentication method.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthnMethod {
    /// Name in the policy (`rules.authentication.<name>`).
    pub name: String,
    /// The AuthPolicy that defined the method: proxies count its decisions under it
    /// (`tollgate_policy_decisions_total`). Empty in tables of compilers that predate it.
    #[serde(default)]
    pub policy: ObjectKey,
    /// Where the credential is read from. Defaults per method: `Authorization: Bearer` for JWT
    /// and introspection, `Authorization: APIKEY` for API keys; ignored for X.509.
    pub credentials: Credentials,
    /// What verifies it.
    pub method: Method,
    /// CEL predicates; the method is tried only when all hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<String>,
}

/// Where a credential is read from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Credentials {
    /// `Authorization: <prefix> <credential>` (prefix compared case-insensitively).
    AuthorizationHeader {
        /// Scheme, e.g. `Bearer`.
        prefix: String,
    },
    /// A request header carrying the bare credential (name lower-case).
    CustomHeader {
        /// Header name.
        name: String,
    },
    /// A query parameter.
    QueryString {
        /// Parameter name.
        name: String,
    },
    /// A cookie.
    Cookie {
        /// Cookie name.
        name: String,
    },
}

/// How a credential is verified.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Method {
    /// API keys from Secrets.
    ApiKey(ApiKeys),
    /// HTTP Basic authentication against htpasswd entries.
    Basic(BasicUsers),
    /// A signed JWT.
    Jwt(Jwt),
    /// OAuth 2.0 token introspection (RFC 7662).
    Introspection(Introspection),
    /// The client certificate the listener verified.
    X509,
    /// OpenID Connect login with a session cookie ([`Oidc`]).
    Oidc(Oidc),
}

/// API keys, held as SHA-256 digests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeys {
    /// One entry per Secret, sorted by Secret.
    pub keys: Vec<ApiKey>,
}

/// One API key.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiKey {
    /// Lower-case hex SHA-256 of the key bytes.
    pub sha256: String,
    /// The identity a caller with this key gets: the Secret's metadata (never the key):
    /// `{"metadata": {"name", "namespace", "labels", "annotations"}}` as JSON.
    pub identity: serde_json::Value,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// Basic-auth users, from htpasswd entries in Secrets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BasicUsers {
    /// One entry per htpasswd line, sorted by Secret then line.
    pub users: Vec<BasicUser>,
}

/// One htpasswd entry.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BasicUser {
    /// The user name.
    pub username: String,
    /// Its password hash in modular crypt format: `$2a$`, `$2b$`, `$2y$` (bcrypt), `$5$`
    /// (SHA-256 crypt) or `$6$` (SHA-512 crypt); the compiler refuses every other format.
    pub hash: String,
    /// The identity a caller with this user gets: `{"username", "metadata": {"name",
    /// "namespace", "labels", "annotations"}}` of the Secret, as JSON (never the hash).
    pub identity: serde_json::Value,
}

impl std::fmt::Debug for BasicUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasicUser")
            .field("username", &self.username)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// JWT verification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Jwt {
    /// Required `iss`.
    pub issuer: String,
    /// `aud` must contain one of these; empty = not checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
    /// Where keys are fetched (and cached) from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_uri: Option<String>,
    /// Inline JWKS JSON (takes precedence over `jwks_uri`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks: Option<String>,
}

/// Token introspection.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Introspection {
    /// Introspection endpoint URL.
    pub endpoint: String,
    /// Client id (from the credentials Secret's `clientID`).
    pub client_id: String,
    /// Client secret (from the credentials Secret's `clientSecret`).
    pub client_secret: String,
    /// How long an answer is cached, in milliseconds.
    #[serde(default = "Introspection::default_cache_ms")]
    pub cache_ms: u64,
}

impl Introspection {
    /// Default answer cache lifetime: 10 s.
    pub fn default_cache_ms() -> u64 {
        10_000
    }
}

impl std::fmt::Debug for Introspection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Introspection")
            .field("endpoint", &self.endpoint)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

/// OpenID Connect login: authorization code flow with PKCE against the issuer's discovery
/// document, the session in an encrypted cookie. The credentials of an `oidc` method are
/// `Cookie { name: cookie_name }`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Oidc {
    /// Issuer URL; the discovery document is `<issuer>/.well-known/openid-configuration` and
    /// must name this issuer.
    pub issuer: String,
    /// Client id; the ID token's `aud` must contain it.
    pub client_id: String,
    /// Client secret (from the `clientSecretRef` Secret's `clientSecret`).
    pub client_secret: String,
    /// Path of the redirect URI (`<scheme>://<host><redirect_path>`), answered by the proxy.
    pub redirect_path: String,
    /// Path that logs out, answered by the proxy; `None` = none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logout_path: Option<String>,
    /// Scopes requested (`openid` first).
    pub scopes: Vec<String>,
    /// Name of the session cookie (chunks `<name>_1`, `<name>_2`, ...; the login in progress
    /// `<name>_login`).
    pub cookie_name: String,
    /// Cookie keys (from the `cookieKeyRef` Secret's `keys`, one per line): the first seals,
    /// every one opens. At least one, each at least 32 bytes.
    pub cookie_keys: Vec<String>,
}

impl std::fmt::Debug for Oidc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oidc")
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("redirect_path", &self.redirect_path)
            .field("logout_path", &self.logout_path)
            .field("scopes", &self.scopes)
            .field("cookie_name", &self.cookie_name)
            .field("cookie_keys", &self.cookie_keys.len())
            .finish_non_exhaustive()
    }
}

/// One named authorization rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthzRule {
    /// Name in the policy.
    pub name: String,
    /// The AuthPolicy that defined the rule (see [`AuthnMethod::policy`]).
    #[serde(default)]
    pub policy: ObjectKey,
    /// CEL predicate that must hold; empty for an [`Self::external`] rule.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub predicate: String,
    /// Ask an external authorization service instead of a predicate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<crate::external::ExternalAuthz>,
    /// CEL predicates; the rule applies only when all hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<String>,
}

/// A denial answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DenyResponse {
    /// Status code.
    pub code: u16,
    /// Body; `None` = a short default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl DenyResponse {
    /// 401.
    pub fn unauthenticated() -> Self {
        Self {
            code: 401,
            message: None,
        }
    }
    /// 403.
    pub fn unauthorized() -> Self {
        Self {
            code: 403,
            message: None,
        }
    }
}
