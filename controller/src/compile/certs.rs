//! Listener certificates.
//!
//! In: an HTTPS listener's `tls.certificateRefs`, the Gateway's namespace, Secrets and
//! ReferenceGrants. Out: the [`Certificate`]s the proxy serves and the problems with the refs
//! that could not be used (`RefNotPermitted`, `InvalidCertificateRef`). Without an x509
//! parser we check only that the PEM blocks are there; the proxy NACKs what rustls refuses.

use gateway_api::gateways::GatewayListenersTlsCertificateRefs;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
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
    let mut out = Resolved::default();
    for r in refs {
        match resolve_one(idx, gateway_ns, r) {
            Ok(c) => out.certificates.push(c),
            Err(p) => out.problems.push(p),
        }
    }
    out
}

fn resolve_one(
    idx: &Index<'_>,
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
        from_kind: "Gateway",
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
    if !cert.contains("-----BEGIN CERTIFICATE-----") {
        return Err(invalid("tls.crt holds no PEM certificate"));
    }
    if !(key.contains("-----BEGIN") && key.contains("PRIVATE KEY-----")) {
        return Err(invalid("tls.key holds no PEM private key"));
    }
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
