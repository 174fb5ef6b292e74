//! AuthPolicy spec to table auth rules.
//!
//! In: one policy, the Secrets the compiler was given. Out: its defaults or overrides as
//! [`AuthEntries`] (methods, authorization rules and success headers by name, deny answers,
//! the policy's `when`), or the `Invalid` problem: a method with zero or several kinds, a
//! credentials block with zero or several sources, a CEL expression that does not compile, a
//! JWT without keys, a basic-auth htpasswd entry that is malformed or weakly hashed
//! ([`basic`]), an introspection `credentialsRef` that does not resolve. `x509` takes the
//! certificate the listener verified (Gateway `spec.tls.frontend`); `oidc` is compiled by
//! [`super::oidc`].
//!
//! Secrets a policy reads must carry the label [`CREDENTIAL_LABEL`]: the controller watches
//! only those (and TLS Secrets), so the compiler ignores unlabelled ones too and `tollgate run`
//! behaves like the cluster. API keys leave here as SHA-256 digests; the identity a key
//! grants is its Secret's metadata, never the key.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use tollgate_api::ObjectKey;
use tollgate_api::policy::{
    ApiKey, ApiKeys, AuthnMethod, AuthzRule, Credentials, DenyResponse, Introspection, Jwt, Method,
};

use super::external;
use super::ratelimit::{check, predicates};
use super::{Contribution, Problem, basic, invalid};
use crate::compile::index::{labels_match, name_of, ns_of};
use crate::crds::auth::{AuthPolicy, AuthRules, AuthenticationSpec, CredentialsSpec, DenySpec};
use crate::crds::common::Strategy;

/// Label a Secret must carry for policies to read it (any value).
pub const CREDENTIAL_LABEL: &str = "tollgate.dev/credential";
/// Key of an API-key Secret's data holding the key.
pub const API_KEY_FIELD: &str = "api_key";

/// The auth rules of one policy (or of a merge of several), by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuthEntries {
    /// Authentication methods.
    pub authentication: BTreeMap<String, AuthnMethod>,
    /// Authorization rules.
    pub authorization: BTreeMap<String, AuthzRule>,
    /// Success headers: name to CEL.
    pub success_headers: BTreeMap<String, String>,
    /// Deny answer when unauthenticated.
    pub unauthenticated: Option<DenyResponse>,
    /// Deny answer when unauthorized.
    pub unauthorized: Option<DenyResponse>,
    /// Policy-level predicates: when one fails the rules do not apply.
    pub when: Vec<String>,
}

/// Converts `policy` into its contribution.
pub fn contribution(
    policy: &AuthPolicy,
    key: &ObjectKey,
    secrets: &[&Secret],
    externals: &external::ExternalBackends<'_, '_>,
) -> Result<Contribution<AuthEntries>, Problem> {
    let spec = &policy.spec;
    let empty = AuthRules::default();
    let (overrides, strategy, rules, when) = match (&spec.rules, &spec.defaults, &spec.overrides) {
        (_, Some(_), Some(_)) => {
            return Err(invalid(
                "spec.defaults and spec.overrides are mutually exclusive",
            ));
        }
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            return Err(invalid(
                "spec.rules cannot be combined with spec.defaults or spec.overrides",
            ));
        }
        (None, Some(d), None) => (false, d.strategy, &d.rules, d.when.as_slice()),
        (None, None, Some(o)) => (true, o.strategy, &o.rules, o.when.as_slice()),
        (r, None, None) => (
            false,
            Strategy::Atomic,
            r.as_ref().unwrap_or(&empty),
            spec.when.as_deref().unwrap_or_default(),
        ),
    };
    if rules.authentication.is_empty() && rules.authorization.is_empty() {
        return Err(invalid(
            "no rules: set at least one authentication method or authorization rule",
        ));
    }
    let mut entries = AuthEntries {
        when: predicates(when, "when")?,
        ..AuthEntries::default()
    };
    for (name, m) in &rules.authentication {
        entries
            .authentication
            .insert(name.clone(), method(name, m, key, secrets)?);
    }
    for (name, r) in &rules.authorization {
        let (predicate, external) = match (&r.predicate, &r.external) {
            (Some(p), None) => (check(p, &format!("authorization.{name}.predicate"))?, None),
            (None, Some(e)) => (
                String::new(),
                Some(external::compile(name, e, key, externals)?),
            ),
            _ => {
                return Err(invalid(format!(
                    "authorization.{name}: set exactly one of predicate, external"
                )));
            }
        };
        entries.authorization.insert(
            name.clone(),
            AuthzRule {
                name: name.clone(),
                policy: key.clone(),
                predicate,
                external,
                when: predicates(&r.when, &format!("authorization.{name}.when"))?,
            },
        );
    }
    if let Some(resp) = &rules.response {
        if let Some(s) = &resp.success {
            for (h, v) in &s.headers {
                let lower = h.to_ascii_lowercase();
                if http::HeaderName::from_bytes(lower.as_bytes()).is_err() {
                    return Err(invalid(format!(
                        "response.success.headers: {h:?} is not a header name"
                    )));
                }
                entries.success_headers.insert(
                    lower,
                    check(&v.expression, &format!("response.success.headers.{h}"))?,
                );
            }
        }
        entries.unauthenticated = resp.unauthenticated.as_ref().map(|d| deny(d, 401));
        entries.unauthorized = resp.unauthorized.as_ref().map(|d| deny(d, 403));
    }
    Ok(Contribution {
        overrides,
        strategy,
        entries,
    })
}

fn deny(d: &DenySpec, default: u16) -> DenyResponse {
    DenyResponse {
        code: d.code.filter(|c| (400..500).contains(c)).unwrap_or(default),
        message: d.message.clone(),
    }
}

fn method(
    name: &str,
    m: &AuthenticationSpec,
    key: &ObjectKey,
    secrets: &[&Secret],
) -> Result<AuthnMethod, Problem> {
    let field = format!("authentication.{name}");
    let kinds = [
        m.api_key.is_some(),
        m.basic.is_some(),
        m.jwt.is_some(),
        m.oauth2_introspection.is_some(),
        m.x509.is_some(),
        m.oidc.is_some(),
    ];
    if kinds.iter().filter(|k| **k).count() != 1 {
        return Err(invalid(format!(
            "{field}: set exactly one of apiKey, basic, jwt, oauth2Introspection, x509, oidc"
        )));
    }
    if let Some(o) = &m.oidc {
        return super::oidc::method(name, o, m, key, secrets);
    }
    let (method, default_prefix) = if let Some(a) = &m.api_key {
        let mut keys: Vec<(ObjectKey, ApiKey)> = secrets
            .iter()
            .filter(|s| a.all_namespaces || ns_of(&s.metadata) == key.namespace)
            .filter(|s| selected(s, &a.selector))
            .filter_map(|s| {
                let value = secret_value(s, API_KEY_FIELD)?;
                Some((
                    ObjectKey::new(ns_of(&s.metadata), name_of(&s.metadata)),
                    ApiKey {
                        sha256: sha256_hex(&value),
                        identity: serde_json::json!({"metadata": {
                            "name": name_of(&s.metadata),
                            "namespace": ns_of(&s.metadata),
                            "labels": s.metadata.labels.clone().unwrap_or_default(),
                            "annotations": s.metadata.annotations.clone().unwrap_or_default(),
                        }}),
                    },
                ))
            })
            .collect();
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        (
            Method::ApiKey(ApiKeys {
                keys: keys.into_iter().map(|(_, k)| k).collect(),
            }),
            "APIKEY",
        )
    } else if let Some(b) = &m.basic {
        (
            Method::Basic(basic::users(b, key, secrets, &field)?),
            "Basic",
        )
    } else if let Some(j) = &m.jwt {
        if j.issuer.is_empty() {
            return Err(invalid(format!("{field}.jwt: issuer is required")));
        }
        match (&j.jwks, &j.jwks_uri) {
            (None, None) => {
                return Err(invalid(format!("{field}.jwt: set jwksUri or jwks")));
            }
            (Some(inline), _) => {
                let v: serde_json::Value = serde_json::from_str(inline)
                    .map_err(|e| invalid(format!("{field}.jwt.jwks: not JSON: {e}")))?;
                if !v.get("keys").is_some_and(serde_json::Value::is_array) {
                    return Err(invalid(format!("{field}.jwt.jwks: no `keys` array")));
                }
            }
            (None, Some(uri)) => url(uri, &format!("{field}.jwt.jwksUri"))?,
        }
        (
            Method::Jwt(Jwt {
                issuer: j.issuer.clone(),
                audiences: j.audiences.clone(),
                jwks_uri: j.jwks_uri.clone(),
                jwks: j.jwks.clone(),
            }),
            "Bearer",
        )
    } else if let Some(i) = &m.oauth2_introspection {
        url(
            &i.endpoint,
            &format!("{field}.oauth2Introspection.endpoint"),
        )?;
        let creds = secrets
            .iter()
            .find(|s| {
                ns_of(&s.metadata) == key.namespace
                    && name_of(&s.metadata) == i.credentials_ref.name
                    && s.metadata
                        .labels
                        .as_ref()
                        .is_some_and(|l| l.contains_key(CREDENTIAL_LABEL))
            })
            .ok_or_else(|| {
                invalid(format!(
                    "{field}.oauth2Introspection.credentialsRef: Secret {}/{} not found (it must carry the label {CREDENTIAL_LABEL})",
                    key.namespace, i.credentials_ref.name
                ))
            })?;
        let get = |k: &str| {
            secret_value(creds, k)
                .and_then(|v| String::from_utf8(v).ok())
                .ok_or_else(|| {
                    invalid(format!(
                        "{field}.oauth2Introspection.credentialsRef: Secret {}/{} has no {k}",
                        key.namespace, i.credentials_ref.name
                    ))
                })
        };
        (
            Method::Introspection(Introspection {
                endpoint: i.endpoint.clone(),
                client_id: get("clientID")?,
                client_secret: get("clientSecret")?,
                cache_ms: u64::from(i.cache_seconds.unwrap_or(10)) * 1000,
            }),
            "Bearer",
        )
    } else {
        // Succeeds only on connections whose client certificate the listener verified
        // (Gateway `spec.tls.frontend`); elsewhere it never authenticates anyone.
        (Method::X509, "")
    };
    Ok(AuthnMethod {
        name: name.to_owned(),
        policy: key.clone(),
        credentials: credentials(m.credentials.as_ref(), default_prefix, &field)?,
        method,
        when: predicates(&m.when, &format!("{field}.when"))?,
    })
}

fn credentials(
    c: Option<&CredentialsSpec>,
    default_prefix: &str,
    field: &str,
) -> Result<Credentials, Problem> {
    let Some(c) = c else {
        return Ok(Credentials::AuthorizationHeader {
            prefix: default_prefix.to_owned(),
        });
    };
    let mut found = Vec::new();
    if let Some(a) = &c.authorization_header {
        found.push(Credentials::AuthorizationHeader {
            prefix: a.prefix.clone(),
        });
    }
    if let Some(h) = &c.custom_header {
        found.push(Credentials::CustomHeader {
            name: h.name.to_ascii_lowercase(),
        });
    }
    if let Some(q) = &c.query_string {
        found.push(Credentials::QueryString {
            name: q.name.clone(),
        });
    }
    if let Some(k) = &c.cookie {
        found.push(Credentials::Cookie {
            name: k.name.clone(),
        });
    }
    match (found.pop(), found.is_empty()) {
        (Some(one), true) => Ok(one),
        _ => Err(invalid(format!(
            "{field}.credentials: set exactly one of authorizationHeader, customHeader, queryString, cookie"
        ))),
    }
}

pub(super) fn url(u: &str, field: &str) -> Result<(), Problem> {
    match u.parse::<http::Uri>() {
        Ok(uri) if matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some() => {
            Ok(())
        }
        _ => Err(invalid(format!("{field}: {u:?} is not an http(s) URL"))),
    }
}

/// Whether `s` carries [`CREDENTIAL_LABEL`] and matches `selector`.
pub(crate) fn selected(s: &Secret, selector: &LabelSelector) -> bool {
    let labels = s.metadata.labels.clone().unwrap_or_default();
    labels.contains_key(CREDENTIAL_LABEL)
        && labels_match(
            selector.match_labels.iter().flatten(),
            selector
                .match_expressions
                .iter()
                .flatten()
                .map(|e| (e.key.as_str(), e.operator.as_str(), e.values.as_deref())),
            &labels,
        )
}

/// A Secret value from `data` (already base64-decoded) or `stringData` (manifests).
pub(crate) fn secret_value(s: &Secret, k: &str) -> Option<Vec<u8>> {
    s.data
        .as_ref()
        .and_then(|d| d.get(k))
        .map(|b| b.0.clone())
        .or_else(|| {
            s.string_data
                .as_ref()
                .and_then(|d| d.get(k))
                .map(|v| v.as_bytes().to_vec())
        })
}

/// The labelled Secret `name` of `namespace` (see [`CREDENTIAL_LABEL`]).
pub(super) fn credential_secret<'s>(
    secrets: &[&'s Secret],
    namespace: &str,
    name: &str,
) -> Option<&'s Secret> {
    secrets.iter().copied().find(|s| {
        ns_of(&s.metadata) == namespace
            && name_of(&s.metadata) == name
            && s.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(CREDENTIAL_LABEL))
    })
}

/// Lower-case hex SHA-256.
pub fn sha256_hex(data: &[u8]) -> String {
    use std::fmt::Write as _;
    let digest = ring::digest::digest(&ring::digest::SHA256, data);
    let mut out = String::with_capacity(64);
    for b in digest.as_ref() {
        let _ = write!(out, "{b:02x}");
    }
    out
}
