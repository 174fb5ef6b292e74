//! A certificate authority made in the test (rcgen) and the leaf certificates it signs, for
//! TLS servers the proxy connects to (backends, authorization services) and client
//! certificates. In: names. Out: PEM and DER certificates and keys, and a rustls server
//! config serving a leaf.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A self-signed CA.
pub struct Ca {
    pub pem: String,
    pub der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

/// A leaf certificate and its key.
pub struct Leaf {
    pub cert_pem: String,
    pub cert_der: CertificateDer<'static>,
    pub key_der: Vec<u8>,
    pub key_pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Self {
            pem: cert.pem(),
            der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for these DNS names, and these URIs as subject alternative names.
    pub fn leaf(&self, dns: &[&str], uris: &[&str]) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(dns.iter().map(|d| (*d).to_owned()).collect::<Vec<_>>())
                .unwrap();
        for u in uris {
            params
                .subject_alt_names
                .push(SanType::URI((*u).try_into().unwrap()));
        }
        params
            .distinguished_name
            .push(DnType::CommonName, dns.first().copied().unwrap_or("client"));
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
            key_pem: key.serialize_pem(),
        }
    }
}

impl Leaf {
    /// A server config serving this certificate, offering `alpn`, asking for no client
    /// certificate.
    pub fn server_config(&self, alpn: &[&str]) -> Arc<ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![self.cert_der.clone()], self.key())
            .unwrap();
        config.alpn_protocols = alpn.iter().map(|a| a.as_bytes().to_vec()).collect();
        Arc::new(config)
    }

    /// The key, for rustls.
    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()))
    }
}
