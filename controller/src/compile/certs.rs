//! Listener certificates.
//!
//! In: an HTTPS listener's `tls.certificateRefs`, the Gateway's namespace, Secrets and
//! ReferenceGrants. Out: the [`Certificate`]s the proxy serves and the problems with the refs
//! that could not be used (`RefNotPermitted`, `InvalidCertificateRef`).
//!
//! The proxy refuses a whole table when one certificate fails to load, which would block every
//! later update of the Gateway; so a Secret is checked here the way the proxy loads it
//! ([`check_key_pair`]) and a bad one rejects only its listener. Messages say what is wrong and
//! never carry key material.

use gateway_types::gateways::GatewayListenersTlsCertificateRefs;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use rustls::crypto::ring::sign::any_supported_type;
use rustls::sign::CertifiedKey;
use rustls::{Error as TlsError, InconsistentKeys};
use rustls_pemfile::Item;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tollgate_api::Certificate;

use super::conditions::{Problem, reason};
use super::grants::{CrossRef, GATEWAY_GROUP, permitted};
use super::index::Index;

/// Secret type a certificateRef must point to.
pub const TLS_SECRET_TYPE: &str = "kubernetes.io/tls";

/// Resolved certificates of one listener.
#[derive(Debug, Default)]
pub struct Resolved {
    /// Usable certificates, in ref order.
    pub certificates: Vec<Certificate>,
    /// One problem per unusable ref.
    pub problems: Vec<Problem>,
}

/// Resolves `refs` of a listener of a Gateway in `gateway_ns`.
pub fn resolve(
    idx: &Index<'_>,
    gateway_ns: &str,
    refs: &[GatewayListenersTlsCertificateRefs],
) -> Resolved {
    resolve_for(idx, "Gateway", gateway_ns, refs)
}

/// [`resolve`] for the refs of a `from_kind` object (`Gateway` or `ListenerSet`, the kind a
/// ReferenceGrant must name) in `from_ns`.
pub fn resolve_for(
    idx: &Index<'_>,
    from_kind: &str,
    from_ns: &str,
    refs: &[GatewayListenersTlsCertificateRefs],
) -> Resolved {
    let mut out = Resolved::default();
    for r in refs {
        match resolve_one(idx, from_kind, from_ns, r) {
            Ok(c) => out.certificates.push(c),
            Err(p) => out.problems.push(p),
        }
    }
    out
}

fn resolve_one(
    idx: &Index<'_>,
    from_kind: &str,
    gateway_ns: &str,
    r: &GatewayListenersTlsCertificateRefs,
) -> Result<Certificate, Problem> {
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("Secret");
    let ns = r.namespace.as_deref().unwrap_or(gateway_ns);
    if !(group.is_empty() || group == "core") || kind != "Secret" {
        return Err(Problem::new(
            reason::INVALID_CERTIFICATE_REF,
            format!(
                "certificateRef {ns}/{} has unsupported kind {group}/{kind}; only core Secrets are supported",
                r.name
            ),
        ));
    }
    let cross = CrossRef {
        from_group: GATEWAY_GROUP,
        from_kind,
        from_namespace: gateway_ns,
        to_group: "",
        to_kind: "Secret",
        to_namespace: ns,
        to_name: &r.name,
    };
    if !permitted(idx, &cross) {
        return Err(Problem::new(
            reason::REF_NOT_PERMITTED,
            format!(
                "certificateRef to Secret {ns}/{} is not permitted by any ReferenceGrant",
                r.name
            ),
        ));
    }
    let Some(secret) = idx.secrets.get(&(ns, r.name.as_str())) else {
        return Err(Problem::new(
            reason::INVALID_CERTIFICATE_REF,
            format!("Secret {ns}/{} not found", r.name),
        ));
    };
    let invalid = |what: &str| {
        Problem::new(
            reason::INVALID_CERTIFICATE_REF,
            format!("Secret {ns}/{} {what}", r.name),
        )
    };
    if secret.type_.as_deref() != Some(TLS_SECRET_TYPE) {
        return Err(invalid("is not of type kubernetes.io/tls"));
    }
    let cert = pem_field(secret, "tls.crt").ok_or_else(|| invalid("has no PEM tls.crt"))?;
    let key = pem_field(secret, "tls.key").ok_or_else(|| invalid("has no PEM tls.key"))?;
    check_key_pair(&cert, &key).map_err(|what| invalid(&what))?;
    Ok(Certificate {
        source: format!("{ns}/{}", r.name),
        cert_pem: cert,
        key_pem: key,
    })
}

/// A non-empty UTF-8 field from `data` (or `stringData`, which files may carry).
fn pem_field(secret: &Secret, field: &str) -> Option<String> {
    let from_data = secret
        .data
        .as_ref()
        .and_then(|d| d.get(field))
        .and_then(|ByteString(b)| String::from_utf8(b.clone()).ok());
    let value = from_data.or_else(|| {
        secret
            .string_data
            .as_ref()
            .and_then(|d| d.get(field))
            .cloned()
    })?;
    (!value.trim().is_empty()).then_some(value)
}

/// Checks a PEM certificate chain and private key the way the proxy loads them (rustls with the
/// ring provider): at least one certificate, exactly one private key of a supported type, a
/// leaf that parses as an X.509 end-entity certificate, and a key that matches the leaf.
///
/// Only parsing is checked, not trust: a self-signed (CA) certificate served as the leaf is
/// fine for a server; whether clients trust it is theirs to decide. The error completes the
/// sentence "Secret ns/name ..." and never includes key bytes.
pub fn check_key_pair(cert_pem: &str, key_pem: &str) -> Result<(), String> {
    let chain: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|_| "tls.crt is not valid PEM".to_owned())?;
    let Some(leaf) = chain.first() else {
        return Err("tls.crt holds no PEM certificate".to_owned());
    };
    webpki::EndEntityCert::try_from(leaf).map_err(|e| {
        format!("tls.crt: the first certificate is not a valid X.509 certificate ({e})")
    })?;

    let mut keys: Vec<PrivateKeyDer<'static>> = Vec::new();
    for item in rustls_pemfile::read_all(&mut key_pem.as_bytes()) {
        // The parser's error can quote the offending input: say only that it failed.
        match item.map_err(|_| "tls.key is not valid PEM".to_owned())? {
            Item::Pkcs1Key(k) => keys.push(k.into()),
            Item::Pkcs8Key(k) => keys.push(k.into()),
            Item::Sec1Key(k) => keys.push(k.into()),
            _ => {}
        }
    }
    let key = match keys.as_slice() {
        [] => return Err("tls.key holds no PEM private key".to_owned()),
        [key] => key,
        more => {
            return Err(format!(
                "tls.key holds {} private keys; exactly one is needed",
                more.len()
            ));
        }
    };
    let signing_key = any_supported_type(key).map_err(|_| {
        "tls.key: the private key does not parse or is of an unsupported type (RSA, ECDSA P-256/P-384 and Ed25519 are supported)"
            .to_owned()
    })?;
    match CertifiedKey::new(chain, signing_key).keys_match() {
        // The proxy accepts a key whose public half it cannot compute; so do we.
        Ok(()) | Err(TlsError::InconsistentKeys(InconsistentKeys::Unknown)) => Ok(()),
        Err(TlsError::InconsistentKeys(InconsistentKeys::KeyMismatch)) => {
            Err("tls.key does not match the certificate in tls.crt".to_owned())
        }
        Err(e) => Err(format!("tls.crt and tls.key do not load together ({e})")),
    }
}
