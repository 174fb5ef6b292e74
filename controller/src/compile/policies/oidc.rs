//! The `oidc` authentication method of an AuthPolicy.
//!
//! In: one method's [`OidcSpec`], the policy's key and the Secrets the compiler was given.
//! Out: the table's [`Method::Oidc`] with the client secret and the cookie keys read from
//! their Secrets, and `Cookie { name }` credentials; or the `Invalid` problem: a Secret that
//! does not resolve or lacks its key, a cookie key shorter than 32 bytes, an issuer that is
//! not an http(s) URL, paths that are not absolute or collide, a bad cookie name, or a
//! `credentials` block (the session cookie is the credential).
//!
//! The Secrets (labelled [`CREDENTIAL_LABEL`] like every Secret a policy reads):
//! - `clientSecretRef`: `clientSecret`, the client's secret at the issuer;
//! - `cookieKeyRef`: `keys`, one key per line (blank lines ignored), each at least 32 bytes
//!   (`openssl rand -base64 32` makes one). The first seals new cookies, every one opens
//!   them: to rotate, put a new key first, and drop the old one once the sessions it sealed
//!   have ended.

use k8s_openapi::api::core::v1::Secret;
use tollgate_api::ObjectKey;
use tollgate_api::policy::{AuthnMethod, Credentials, Method, Oidc};

use super::auth::{CREDENTIAL_LABEL, credential_secret, secret_value, url};
use super::ratelimit::predicates;
use super::{Problem, invalid};
use crate::crds::auth::{AuthenticationSpec, OidcSpec};

/// Default session cookie name.
pub const DEFAULT_COOKIE_NAME: &str = "tollgate_session";
/// Key of the client secret in the `clientSecretRef` Secret.
pub const CLIENT_SECRET_FIELD: &str = "clientSecret";
/// Key of the cookie keys in the `cookieKeyRef` Secret.
pub const COOKIE_KEYS_FIELD: &str = "keys";
/// Shortest cookie key accepted, in bytes.
pub const MIN_COOKIE_KEY_BYTES: usize = 32;

/// Compiles the method `name` (its spec `m`, whose `oidc` is `o`) of the policy `key`.
pub fn method(
    name: &str,
    o: &OidcSpec,
    m: &AuthenticationSpec,
    key: &ObjectKey,
    secrets: &[&Secret],
) -> Result<AuthnMethod, Problem> {
    let field = format!("authentication.{name}.oidc");
    if m.credentials.is_some() {
        return Err(invalid(format!(
            "authentication.{name}.credentials: not used by oidc (the session cookie is the credential); remove it"
        )));
    }
    url(&o.issuer, &format!("{field}.issuer"))?;
    if o.client_id.is_empty() {
        return Err(invalid(format!("{field}.clientID: required")));
    }
    path(&o.redirect_path, &format!("{field}.redirectPath"))?;
    if let Some(p) = &o.logout_path {
        path(p, &format!("{field}.logoutPath"))?;
        if *p == o.redirect_path {
            return Err(invalid(format!(
                "{field}.logoutPath: must differ from redirectPath"
            )));
        }
    }
    let cookie_name = o
        .cookie_name
        .clone()
        .unwrap_or_else(|| DEFAULT_COOKIE_NAME.to_owned());
    if cookie_name.is_empty()
        || cookie_name.len() > 64
        || !cookie_name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
    {
        return Err(invalid(format!(
            "{field}.cookieName: {cookie_name:?} must be 1 to 64 of A-Z a-z 0-9 _ - ."
        )));
    }
    let client_secret = read(
        secrets,
        key,
        &o.client_secret_ref.name,
        CLIENT_SECRET_FIELD,
        &format!("{field}.clientSecretRef"),
    )?;
    let client_secret = String::from_utf8(client_secret).map_err(|_| {
        invalid(format!(
            "{field}.clientSecretRef: {CLIENT_SECRET_FIELD} is not UTF-8"
        ))
    })?;
    let raw_keys = read(
        secrets,
        key,
        &o.cookie_key_ref.name,
        COOKIE_KEYS_FIELD,
        &format!("{field}.cookieKeyRef"),
    )?;
    let raw_keys = String::from_utf8(raw_keys).map_err(|_| {
        invalid(format!(
            "{field}.cookieKeyRef: {COOKIE_KEYS_FIELD} is not UTF-8"
        ))
    })?;
    let cookie_keys: Vec<String> = raw_keys
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    if cookie_keys.is_empty() {
        return Err(invalid(format!(
            "{field}.cookieKeyRef: Secret {}/{} has no key in {COOKIE_KEYS_FIELD}",
            key.namespace, o.cookie_key_ref.name
        )));
    }
    if let Some(i) = cookie_keys
        .iter()
        .position(|k| k.len() < MIN_COOKIE_KEY_BYTES)
    {
        return Err(invalid(format!(
            "{field}.cookieKeyRef: key #{} of Secret {}/{} is shorter than {MIN_COOKIE_KEY_BYTES} bytes",
            i + 1,
            key.namespace,
            o.cookie_key_ref.name
        )));
    }
    let mut scopes = vec!["openid".to_owned()];
    let asked: Vec<&str> = if o.scopes.is_empty() {
        vec!["profile", "email"]
    } else {
        o.scopes.iter().map(String::as_str).collect()
    };
    for s in asked {
        if s.is_empty()
            || !s
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
        {
            return Err(invalid(format!(
                "{field}.scopes: {s:?} is not a scope token"
            )));
        }
        if !scopes.iter().any(|have| have == s) {
            scopes.push(s.to_owned());
        }
    }
    Ok(AuthnMethod {
        name: name.to_owned(),
        policy: key.clone(),
        credentials: Credentials::Cookie {
            name: cookie_name.clone(),
        },
        method: Method::Oidc(Oidc {
            issuer: o.issuer.clone(),
            client_id: o.client_id.clone(),
            client_secret,
            redirect_path: o.redirect_path.clone(),
            logout_path: o.logout_path.clone(),
            scopes,
            cookie_name,
            cookie_keys,
        }),
        when: predicates(&m.when, &format!("authentication.{name}.when"))?,
    })
}

/// An absolute path without query or fragment.
fn path(p: &str, field: &str) -> Result<(), Problem> {
    let ok = p.starts_with('/')
        && !p.starts_with("//")
        && !p.contains(['?', '#'])
        && p.parse::<http::uri::PathAndQuery>().is_ok();
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "{field}: {p:?} is not an absolute path (no query)"
        )))
    }
}

/// The value of `field` of the labelled Secret `name` in the policy's namespace.
fn read(
    secrets: &[&Secret],
    key: &ObjectKey,
    name: &str,
    field: &str,
    context: &str,
) -> Result<Vec<u8>, Problem> {
    let secret = credential_secret(secrets, &key.namespace, name).ok_or_else(|| {
        invalid(format!(
            "{context}: Secret {}/{name} not found (it must carry the label {CREDENTIAL_LABEL})",
            key.namespace
        ))
    })?;
    secret_value(secret, field)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            invalid(format!(
                "{context}: Secret {}/{name} has no {field}",
                key.namespace
            ))
        })
}
