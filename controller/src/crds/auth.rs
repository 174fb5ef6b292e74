//! AuthPolicy: who may call (authentication methods, any one suffices), what they may do
//! (authorization predicates, all must hold), and what the upstream learns (success headers).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{PolicyStatus, Predicate, Strategy, TargetRef};

/// Authentication and authorization for Gateways and routes.
///
/// A bare spec (`rules`, `when`) sets defaults; or wrap them in `defaults:` or `overrides:`
/// with a `strategy`.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tollgate.dev",
    version = "v1alpha1",
    kind = "AuthPolicy",
    plural = "authpolicies",
    shortname = "ap",
    namespaced,
    status = "PolicyStatus",
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Enforced","type":"string","jsonPath":".status.conditions[?(@.type==\"Enforced\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("!has(self.spec.rules) || (!has(self.spec.defaults) && !has(self.spec.overrides))").message("spec.rules cannot be combined with spec.defaults or spec.overrides"),
    validation = Rule::new("!(has(self.spec.defaults) && has(self.spec.overrides))").message("spec.defaults and spec.overrides are mutually exclusive")
)]
#[serde(rename_all = "camelCase")]
pub struct AuthPolicySpec {
    /// What the policy attaches to (1 to 16 targets).
    #[schemars(length(min = 1, max = 16))]
    pub target_refs: Vec<TargetRef>,
    /// Rules (bare form = defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<AuthRules>,
    /// Predicates that gate the whole policy in the bare form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<Vec<Predicate>>,
    /// Defaults: replaced (atomic) or completed (merge) by more specific policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<AuthRuleSet>,
    /// Overrides: replace (atomic) or win by name over (merge) more specific policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrides: Option<AuthRuleSet>,
}

/// Rules with a merge strategy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthRuleSet {
    /// `atomic` (default) or `merge`.
    #[serde(default)]
    pub strategy: Strategy,
    /// The rules.
    #[serde(default)]
    pub rules: AuthRules,
    /// Predicates that gate the whole rule set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<Predicate>,
}

/// Authentication, authorization and response rules.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthRules {
    /// Methods by name; a request is authenticated when any one succeeds.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub authentication: BTreeMap<String, AuthenticationSpec>,
    /// Rules by name; every applicable one must hold.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub authorization: BTreeMap<String, AuthorizationSpec>,
    /// What to send upstream on success and to the client on denial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<ResponseSpec>,
}

/// One authentication method: exactly one of `apiKey`, `basic`, `jwt`, `oauth2Introspection`,
/// `x509`, `oidc`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthenticationSpec {
    /// API keys from Secrets (key `api_key`) selected by label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<ApiKeySpec>,
    /// HTTP Basic authentication (RFC 7617) against htpasswd entries from Secrets (key
    /// `htpasswd`) selected by label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic: Option<BasicSpec>,
    /// JSON Web Tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt: Option<JwtSpec>,
    /// OAuth 2.0 token introspection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth2_introspection: Option<IntrospectionSpec>,
    /// The client certificate the listener verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x509: Option<X509Spec>,
    /// OpenID Connect login for browsers (authorization code flow with PKCE, session cookie).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oidc: Option<OidcSpec>,
    /// Where the credential is read from (default: `Authorization: Bearer`,
    /// `Authorization: APIKEY` for API keys, `Authorization: Basic` for basic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CredentialsSpec>,
    /// The method is tried only when every predicate holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<Predicate>,
}

/// API-key Secrets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeySpec {
    /// Labels of the Secrets holding the keys (each Secret's `api_key` entry). Secrets must
    /// also carry the label `tollgate.dev/credential` for the controller to see them.
    pub selector: LabelSelector,
    /// Also look outside the policy's namespace.
    #[serde(default)]
    pub all_namespaces: bool,
}

/// htpasswd Secrets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BasicSpec {
    /// Labels of the Secrets holding the users (each Secret's `htpasswd` entry: lines of
    /// `user:hash`, bcrypt `$2y$`/`$2b$`/`$2a$`, SHA-256 crypt `$5$` or SHA-512 crypt `$6$`;
    /// MD5, SHA-1, DES crypt and plain text are refused). Secrets must also carry the label
    /// `tollgate.dev/credential` for the controller to see them.
    pub selector: LabelSelector,
    /// Also look outside the policy's namespace.
    #[serde(default)]
    pub all_namespaces: bool,
}

/// JWT verification.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JwtSpec {
    /// Required `iss`.
    pub issuer: String,
    /// Accepted `aud` values (any one); empty = not checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
    /// Where to fetch the keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_uri: Option<String>,
    /// Inline JWKS JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks: Option<String>,
}

/// Token introspection.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IntrospectionSpec {
    /// Endpoint URL.
    pub endpoint: String,
    /// Secret in the policy's namespace with `clientID` and `clientSecret`.
    pub credentials_ref: LocalRef,
    /// How long answers are cached, in seconds (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_seconds: Option<u32>,
}

/// OpenID Connect login. The proxy answers `redirectPath` and `logoutPath` itself; a browser
/// without a valid session is sent to the issuer to log in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OidcSpec {
    /// Issuer URL (its `/.well-known/openid-configuration` is read).
    pub issuer: String,
    /// Client id registered at the issuer.
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// Secret in the policy's namespace with the client secret under `clientSecret`.
    pub client_secret_ref: LocalRef,
    /// Path of the redirect URI registered at the issuer (e.g. `/oauth2/callback`).
    pub redirect_path: String,
    /// Path that ends the session (e.g. `/logout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logout_path: Option<String>,
    /// Secret in the policy's namespace with the session cookie keys under `keys`, one per
    /// line, each at least 32 bytes: the first seals new cookies, every one opens them.
    pub cookie_key_ref: LocalRef,
    /// Scopes to request (default `openid`, `profile`, `email`; `openid` is always added).
    /// Add `offline_access` where the issuer needs it for a refresh token.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// Session cookie name (default `tollgate_session`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie_name: Option<String>,
}

/// A reference to an object in the same namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LocalRef {
    /// Name.
    pub name: String,
}

/// Client-certificate authentication (no settings).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct X509Spec {}

/// Where a credential is read from: exactly one field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsSpec {
    /// `Authorization: <prefix> <credential>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization_header: Option<PrefixSpec>,
    /// A header carrying the bare credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_header: Option<NameSpec>,
    /// A query parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_string: Option<NameSpec>,
    /// A cookie.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<NameSpec>,
}

/// An authorization scheme prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PrefixSpec {
    /// E.g. `Bearer`.
    pub prefix: String,
}

/// A header, parameter or cookie name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NameSpec {
    /// The name.
    pub name: String,
}

/// One authorization rule: exactly one of `predicate` and `external`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AuthorizationSpec {
    /// CEL predicate that must hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicate: Option<String>,
    /// Ask an external authorization service (HTTP or Envoy ext_authz gRPC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<super::external::ExternalAuthSpec>,
    /// The rule applies only when every predicate holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<Predicate>,
}

/// Responses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResponseSpec {
    /// Added to the upstream request on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success: Option<SuccessSpec>,
    /// Answer when authentication fails (default 401).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unauthenticated: Option<DenySpec>,
    /// Answer when authorization fails (default 403).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unauthorized: Option<DenySpec>,
}

/// Headers set upstream on success (and stripped from the client's request).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SuccessSpec {
    /// Header name to value expression.
    #[serde(default)]
    pub headers: BTreeMap<String, ValueExpr>,
}

/// A value computed by CEL.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ValueExpr {
    /// CEL expression.
    pub expression: String,
}

/// A denial answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DenySpec {
    /// Status code (4xx).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 400, max = 499))]
    pub code: Option<u16>,
    /// Response body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
