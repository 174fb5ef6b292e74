//! TLS client certificates as identities. In: the DER of a client certificate that the TLS
//! layer already verified against the port's client CAs (module `tls`; this module does not
//! verify chains). Out: the identity JSON policies see as `auth.identity`:
//!
//! ```json
//! {
//!   "sub": "CN=alice, O=Example",     // the subject DN (same as "subject")
//!   "subject": "CN=alice, O=Example",
//!   "cn": "alice",                    // first common name, or null
//!   "issuer": "CN=Example CA",
//!   "serial": "0a1b2c",               // lower-case hex
//!   "dns": ["alice.example.com"],     // subjectAltName entries by type
//!   "uri": ["spiffe://example.com/alice"],
//!   "email": ["alice@example.com"],
//!   "ip": ["10.0.0.1"]
//! }
//! ```

use std::net::IpAddr;

use serde_json::{Value, json};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer;

/// Why a certificate could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum X509Error {
    /// The bytes are not a DER X.509 certificate.
    #[error("not a DER X.509 certificate: {0}")]
    Parse(String),
    /// The subjectAltName extension is malformed (or repeated).
    #[error("bad subjectAltName: {0}")]
    SubjectAltName(String),
}

/// The identity of a verified client certificate (see the module docs for the shape).
pub fn identity(der: &[u8]) -> Result<Value, X509Error> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| X509Error::Parse(e.to_string()))?;
    let subject = cert.subject().to_string();
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned);
    let (mut dns, mut uri, mut email, mut ip) = (vec![], vec![], vec![], vec![]);
    let san = cert
        .subject_alternative_name()
        .map_err(|e| X509Error::SubjectAltName(e.to_string()))?;
    for name in san.iter().flat_map(|s| s.value.general_names.iter()) {
        match name {
            GeneralName::DNSName(n) => dns.push(*n),
            GeneralName::URI(n) => uri.push(*n),
            GeneralName::RFC822Name(n) => email.push(*n),
            GeneralName::IPAddress(b) => {
                if let Some(a) = ip_addr(b) {
                    ip.push(a.to_string());
                }
            }
            _ => {}
        }
    }
    let serial: String = cert
        .tbs_certificate
        .raw_serial()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(json!({
        "sub": subject,
        "subject": subject,
        "cn": cn,
        "issuer": cert.issuer().to_string(),
        "serial": serial,
        "dns": dns,
        "uri": uri,
        "email": email,
        "ip": ip,
    }))
}

fn ip_addr(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => <[u8; 4]>::try_from(b).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(b).ok().map(IpAddr::from),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};

    fn cert(cn: Option<&str>, sans: Vec<SanType>) -> Vec<u8> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        if let Some(cn) = cn {
            dn.push(DnType::CommonName, cn);
        }
        dn.push(DnType::OrganizationName, "Example");
        params.distinguished_name = dn;
        params.subject_alt_names = sans;
        params.serial_number = Some(vec![0x0a, 0x1b, 0x2c].into());
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn subject_and_sans_become_the_identity() {
        let der = cert(
            Some("alice"),
            vec![
                SanType::DnsName("alice.example.com".try_into().unwrap()),
                SanType::URI("spiffe://example.com/ns/shop/sa/alice".try_into().unwrap()),
                SanType::Rfc822Name("alice@example.com".try_into().unwrap()),
                SanType::IpAddress("10.0.0.1".parse().unwrap()),
            ],
        );
        let id = identity(&der).unwrap();
        assert_eq!(id["cn"], "alice");
        assert_eq!(id["subject"], "CN=alice, O=Example");
        assert_eq!(id["sub"], id["subject"]);
        assert_eq!(id["issuer"], "CN=alice, O=Example", "self-signed");
        assert_eq!(id["serial"], "0a1b2c");
        assert_eq!(id["dns"], json!(["alice.example.com"]));
        assert_eq!(id["uri"], json!(["spiffe://example.com/ns/shop/sa/alice"]));
        assert_eq!(id["email"], json!(["alice@example.com"]));
        assert_eq!(id["ip"], json!(["10.0.0.1"]));
    }

    #[test]
    fn a_certificate_without_cn_or_sans_still_has_a_subject() {
        let id = identity(&cert(None, vec![])).unwrap();
        assert_eq!(id["cn"], Value::Null);
        assert_eq!(id["subject"], "O=Example");
        assert_eq!(id["dns"], json!([]));
    }

    #[test]
    fn garbage_is_refused() {
        assert!(matches!(identity(b"not a cert"), Err(X509Error::Parse(_))));
    }
}
