//! The CA, server and client certificates of table distribution.
//!
//! In: nothing (a fresh CA) or the PEM stored in the CA Secret. Out: [`ServerTls`] for the
//! [`super::PushServer`], [`ClientTls`] for each Gateway's proxies, and (in `secrets`) the
//! Kubernetes Secrets holding them: [`ensure_ca`] and [`ensure_proxy_secret`].
//!
//! Keys are ECDSA P-256. Lifetimes: CA 365 days, rotated when it expires within 30 days;
//! proxy client certificates 90 days (never past the CA), reissued within 7 days of expiry;
//! the server certificate lives as long as the CA that issued it. A client certificate's
//! subject CN is the Gateway identity `NAMESPACE/NAME` ([`proxy_identity`]), which the push
//! server checks against the Gateway a stream asks for.
//!
//! Rotation: the new CA keeps the old CA certificate as "previous" and the trust bundle
//! ([`Ca::trust_bundle`]) holds both, so the push server keeps accepting proxies whose client
//! certificates the old CA issued until [`ensure_proxy_secret`] reissues them. The new server
//! certificate is signed by the new CA at once: a proxy whose mounted `ca.crt` predates the
//! rotation cannot verify it until kubelet refreshes the reissued Secret (about a minute; the
//! proxy re-reads its files at every reconnect and serves its last table meanwhile). Signing
//! with the old key until every proxy has the new bundle would close that gap; it is not done.
//!
//! Use from the controller: at start `ensure_ca`, then `ca.issue_server(&[service DNS names])`
//! and [`super::PushServer::start`]; per accepted Gateway [`ensure_proxy_secret`] (mount the
//! Secret it names at the proxy's `--tls-dir`); periodically (say hourly) `ensure_ca` again
//! and, when its certificate changed, [`super::PushServer::set_tls`] with a new server
//! certificate and `ensure_proxy_secret` for every Gateway.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

mod secrets;

pub use secrets::{
    CA_CERT_KEY, CA_KEY_KEY, CA_PREVIOUS_KEY, ensure_ca, ensure_ca_owned, ensure_proxy_secret,
    proxy_secret_name,
};

/// How long a new CA is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(365 * 86_400);
/// A CA expiring within this is rotated by [`ensure_ca`].
pub const CA_ROTATE_BEFORE: Duration = Duration::from_secs(30 * 86_400);
/// How long a proxy client certificate is valid (never past its CA).
pub const CLIENT_VALIDITY: Duration = Duration::from_secs(90 * 86_400);
/// A proxy certificate expiring within this is reissued by [`ensure_proxy_secret`].
pub const CLIENT_RENEW_BEFORE: Duration = Duration::from_secs(7 * 86_400);

/// Errors creating, reading or storing certificates.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen failed to generate or sign.
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// Stored material does not parse.
    #[error("{what}: {message}")]
    Parse {
        /// What was parsed.
        what: String,
        /// Why it failed.
        message: String,
    },
    /// A Kubernetes API call failed.
    #[error("{action} Secret {namespace}/{name}: {source}")]
    Api {
        /// What was attempted.
        action: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Why (boxed: kube errors are large).
        source: Box<kube::Error>,
    },
    /// Another writer kept winning the race for a Secret.
    #[error("Secret {namespace}/{name}: gave up after repeated conflicts")]
    Conflict {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

/// What the push server needs: its certificate chain and key, and the CA that signs proxies.
#[derive(Clone)]
pub struct ServerTls {
    /// PEM chain of the server certificate.
    pub cert_pem: String,
    /// PEM key of the server certificate.
    pub key_pem: String,
    /// PEM of the CA that client certificates must chain to.
    pub ca_pem: String,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

/// What one proxy needs: its client certificate and key, and the CA bundle to verify the
/// server with. Stored as `tls.crt`, `tls.key` and `ca.crt`.
#[derive(Clone)]
pub struct ClientTls {
    /// PEM client certificate.
    pub cert_pem: String,
    /// PEM key.
    pub key_pem: String,
    /// PEM trust bundle (current CA, then the previous one during a rotation).
    pub ca_pem: String,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").finish_non_exhaustive()
    }
}

/// The identity (client certificate CN) of the proxies of Gateway `namespace/name`.
pub fn proxy_identity(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The push CA: its certificate and key, and the certificate of the CA it replaced.
#[derive(Clone)]
pub struct Ca {
    cert_pem: String,
    key_pem: String,
    previous_pem: Option<String>,
    /// Expiry, seconds since the Unix epoch.
    not_after: i64,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("not_after", &self.not_after)
            .field("has_previous", &self.previous_pem.is_some())
            .finish_non_exhaustive()
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

fn parse_err(what: &str, message: impl std::fmt::Display) -> PkiError {
    PkiError::Parse {
        what: what.to_owned(),
        message: message.to_string(),
    }
}

/// Validity from an hour ago (clock skew) until `not_after` (Unix seconds).
fn set_validity(params: &mut CertificateParams, not_after: i64) -> Result<(), PkiError> {
    let at =
        |t: i64| time::OffsetDateTime::from_unix_timestamp(t).map_err(|e| parse_err("validity", e));
    params.not_before = at(unix_now() - 3_600)?;
    params.not_after = at(not_after)?;
    Ok(())
}

impl Ca {
    /// A new self-signed CA valid for [`CA_VALIDITY`].
    pub fn generate() -> Result<Self, PkiError> {
        Self::generate_valid_for(CA_VALIDITY)
    }

    /// A new self-signed CA valid for `validity` (short ones are for tests of rotation).
    pub fn generate_valid_for(validity: Duration) -> Result<Self, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(
            DnType::CommonName,
            format!("tollgate push CA {}", unix_now()),
        );
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let not_after = unix_now().saturating_add(secs(validity));
        set_validity(&mut params, not_after)?;
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            previous_pem: None,
            not_after,
        })
    }

    /// Loads a CA from PEM (as stored in the CA Secret).
    pub fn from_pem(
        cert_pem: &str,
        key_pem: &str,
        previous_pem: Option<&str>,
    ) -> Result<Self, PkiError> {
        let ca = Self {
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            previous_pem: previous_pem
                .filter(|p| !p.trim().is_empty())
                .map(str::to_owned),
            not_after: not_after(cert_pem)?,
        };
        // Fail now rather than at the first issue.
        ca.issuer()?;
        Ok(ca)
    }

    /// A new CA replacing this one: the trust bundle keeps this one's certificate.
    pub fn rotate(&self) -> Result<Self, PkiError> {
        let mut next = Self::generate()?;
        next.previous_pem = Some(self.cert_pem.clone());
        Ok(next)
    }

    fn issuer(&self) -> Result<Issuer<'static, KeyPair>, PkiError> {
        let key = KeyPair::from_pem(&self.key_pem).map_err(|e| parse_err("CA key", e))?;
        Issuer::from_ca_cert_pem(&self.cert_pem, key).map_err(|e| parse_err("CA certificate", e))
    }

    /// PEM certificate of the current CA.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// PEM key of the current CA (for storing it; never log it).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// PEM certificate of the CA this one replaced, during a rotation.
    pub fn previous_pem(&self) -> Option<&str> {
        self.previous_pem.as_deref()
    }

    /// Expiry of the current CA.
    pub fn not_after(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(u64::try_from(self.not_after).unwrap_or(0))
    }

    /// True when the CA expires within `within`.
    pub fn expires_within(&self, within: Duration) -> bool {
        self.not_after <= unix_now().saturating_add(secs(within))
    }

    /// Every CA certificate to trust: the current one, then the previous one.
    pub fn trust_bundle(&self) -> String {
        let mut out = self.cert_pem.clone();
        if let Some(prev) = &self.previous_pem {
            if !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(prev);
        }
        out
    }

    /// The push server's certificate: SANs `dns_names` plus `127.0.0.1`, valid as long as the
    /// CA; the client CA is the trust bundle.
    pub fn issue_server(&self, dns_names: &[String]) -> Result<ServerTls, PkiError> {
        let mut sans: Vec<String> = dns_names.to_vec();
        sans.push("127.0.0.1".to_owned());
        let mut params = CertificateParams::new(sans)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "tollgate push server");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, self.not_after)?;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer()?)?;
        Ok(ServerTls {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            ca_pem: self.trust_bundle(),
        })
    }

    /// A proxy client certificate with CN `identity` (see [`proxy_identity`]).
    pub fn issue_client(&self, identity: &str) -> Result<ClientTls, PkiError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, identity.to_owned());
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        let not_after = unix_now()
            .saturating_add(secs(CLIENT_VALIDITY))
            .min(self.not_after);
        set_validity(&mut params, not_after)?;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer()?)?;
        Ok(ClientTls {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            ca_pem: self.trust_bundle(),
        })
    }

    /// True when `cert_pem` is signed by the current CA, names `identity`, and does not
    /// expire within `within`.
    pub fn is_current_client(&self, cert_pem: &str, identity: &str, within: Duration) -> bool {
        let check = || -> Option<bool> {
            let ca_der = first_der(&self.cert_pem)?;
            let leaf_der = first_der(cert_pem)?;
            let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).ok()?;
            let (_, leaf) = x509_parser::parse_x509_certificate(&leaf_der).ok()?;
            let signed = leaf.verify_signature(Some(ca.public_key())).is_ok();
            let fresh =
                leaf.validity().not_after.timestamp() > unix_now().saturating_add(secs(within));
            let named = common_name(&leaf_der).as_deref() == Some(identity);
            Some(signed && fresh && named)
        };
        check().unwrap_or(false)
    }
}

/// DER of the first certificate in a PEM string.
fn first_der(pem: &str) -> Option<Vec<u8>> {
    parse_certs(pem)
        .ok()?
        .into_iter()
        .next()
        .map(|c| c.to_vec())
}

/// Expiry (Unix seconds) of the first certificate in `pem`.
pub(crate) fn not_after(pem: &str) -> Result<i64, PkiError> {
    let der = first_der(pem).ok_or_else(|| parse_err("certificate", "no PEM certificate"))?;
    let (_, cert) =
        x509_parser::parse_x509_certificate(&der).map_err(|e| parse_err("certificate", e))?;
    Ok(cert.validity().not_after.timestamp())
}

/// The subject CN of a DER certificate.
pub(crate) fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_owned)
}

/// Every certificate in a PEM string.
pub(crate) fn parse_certs(pem: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = rustls_pemfile::certs(&mut pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err("no PEM certificate".into());
    }
    Ok(certs)
}

/// The first private key in a PEM string.
pub(crate) fn parse_key(pem: &str) -> Result<PrivateKeyDer<'static>, String> {
    rustls_pemfile::private_key(&mut pem.as_bytes())
        .map_err(|e| format!("PEM key: {e}"))?
        .ok_or_else(|| "no PEM private key".to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn issued_certificates_name_their_identity_and_chain_to_the_ca() {
        let ca = Ca::generate().unwrap();
        let client = ca.issue_client(&proxy_identity("ns", "gw")).unwrap();
        assert!(ca.is_current_client(&client.cert_pem, "ns/gw", CLIENT_RENEW_BEFORE));
        assert!(!ca.is_current_client(&client.cert_pem, "ns/other", CLIENT_RENEW_BEFORE));
        assert!(!ca.is_current_client(&client.cert_pem, "ns/gw", CLIENT_VALIDITY * 2));
        let other = Ca::generate().unwrap();
        assert!(!other.is_current_client(&client.cert_pem, "ns/gw", CLIENT_RENEW_BEFORE));
        let der = first_der(&client.cert_pem).unwrap();
        assert_eq!(common_name(&der).as_deref(), Some("ns/gw"));
        let server = ca.issue_server(&["push.example".into()]).unwrap();
        assert!(parse_key(&server.key_pem).is_ok());
        assert!(!ca.expires_within(CA_ROTATE_BEFORE));
    }

    #[test]
    fn rotation_keeps_the_old_ca_in_the_bundle() {
        let old = Ca::generate_valid_for(Duration::from_secs(86_400)).unwrap();
        assert!(old.expires_within(CA_ROTATE_BEFORE));
        let new = old.rotate().unwrap();
        assert_eq!(parse_certs(&new.trust_bundle()).unwrap().len(), 2);
        let loaded = Ca::from_pem(new.cert_pem(), new.key_pem(), new.previous_pem()).unwrap();
        assert_eq!(loaded.trust_bundle(), new.trust_bundle());
        assert!(!loaded.expires_within(CA_ROTATE_BEFORE));
    }
}
