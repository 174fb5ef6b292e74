//! TLS termination. In: one HTTPS [`PortConfig`]: the PEM certificates of its listeners and,
//! when the Gateway validates client certificates on the port (`spec.tls.frontend`), its
//! [`ClientValidation`] (CA bundle and mode). Out: a [`PortTls`]: the rustls [`ServerConfig`]
//! (ring provider, TLS 1.2 and 1.3 only, ALPN `h2` and `http/1.1`) and, per accepted
//! connection, [`PortTls::verified_peer_cert`]: the leaf DER of the client certificate the
//! port's CAs verified, the only certificate X.509 authentication ever sees.
//!
//! Server certificates: the resolver picks by SNI across every listener on the port: exact
//! hostname first, then the longest matching wildcard, then the default (the first
//! certificate of the listener without a hostname, else of the first listener). A listener's
//! first certificate serves its hostname; further certificates are parsed (so a bad one
//! rejects the table) but not yet selected by key type.
//!
//! Client certificates, by [`ClientCertMode`] (a CA bundle without a certificate, or one that
//! does not parse, rejects the table like a bad server certificate):
//!
//! - no validation: none is requested, none is ever verified.
//! - `AllowValidOnly`: rustls's `WebPkiClientVerifier`, certificate mandatory. A client
//!   without one, or with one the CAs do not verify (another CA, expired, not for client
//!   auth), fails the handshake; every served connection has a verified certificate.
//! - `AllowInsecureFallback`: the Gateway API serves clients whose certificate is missing *or
//!   invalid*. rustls's verifier rejects an invalid certificate even with
//!   `allow_unauthenticated`, so the handshake runs `FallbackVerifier`: it asks for an
//!   optional certificate and accepts any chain presented, and after the handshake the same
//!   WebPki verifier judges that chain. A certificate that fails is served as if there were
//!   none (not verified, so X.509 authentication answers 401). The handshake signature is
//!   still checked in both modes: a client that does not hold the key of the certificate it
//!   presents (or sends one that cannot be parsed) fails the handshake; that is proof of
//!   possession, not validation.
//!
//! A resumed TLS session carries the certificate of its first handshake, which was verified
//! under the same config (session caches are per config, so per table): trusted as such under
//! `AllowValidOnly`, verified again under `AllowInsecureFallback`.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, ServerConnection,
    SignatureScheme,
};
use rustls_pki_types::{CertificateDer, UnixTime};
use tollgate_api::{Certificate, ClientCertMode, ClientValidation, PortConfig};

use crate::error::{ProxyError, Result};

/// Picks a certificate by SNI.
#[derive(Debug, Default)]
struct SniResolver {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// `(".example.com", key)`, longest suffix first.
    wildcard: Vec<(String, Arc<CertifiedKey>)>,
    default: Option<Arc<CertifiedKey>>,
}

impl SniResolver {
    fn pick(&self, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        if let Some(name) = sni {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            if let Some(k) = self.exact.get(&name) {
                return Some(k.clone());
            }
            if let Some((_, k)) = self
                .wildcard
                .iter()
                .find(|(suffix, _)| name.len() > suffix.len() && name.ends_with(suffix.as_str()))
            {
                return Some(k.clone());
            }
        }
        self.default.clone()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.pick(client_hello.server_name())
    }
}

/// The crypto provider used everywhere (ring).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The TLS side of an HTTPS port, immutable once built.
#[derive(Debug)]
pub struct PortTls {
    /// What the handshake runs.
    pub config: Arc<ServerConfig>,
    client: ClientCerts,
}

/// When a presented client certificate counts as verified.
#[derive(Debug)]
enum ClientCerts {
    /// None is requested: never.
    Off,
    /// `AllowValidOnly`: the handshake verified it (or failed).
    InHandshake,
    /// `AllowInsecureFallback`: the handshake took it unverified; this verifier judges it.
    AfterHandshake(Arc<dyn ClientCertVerifier>),
}

impl PortTls {
    /// The leaf DER of the connection's client certificate when the port's CAs verified it;
    /// `None` without client validation, without a certificate, or with an invalid one.
    pub fn verified_peer_cert(&self, conn: &ServerConnection) -> Option<Arc<[u8]>> {
        self.verified(conn.peer_certificates()?)
    }

    fn verified(&self, chain: &[CertificateDer<'_>]) -> Option<Arc<[u8]>> {
        let (leaf, intermediates) = chain.split_first()?;
        match &self.client {
            ClientCerts::Off => return None,
            ClientCerts::InHandshake => {}
            ClientCerts::AfterHandshake(verifier) => {
                let now = UnixTime::now();
                if let Err(e) = verifier.verify_client_cert(leaf, intermediates, now) {
                    tracing::debug!(error = %e, "client certificate not verified: served as none");
                    return None;
                }
            }
        }
        Some(Arc::from(leaf.as_ref()))
    }
}

/// The handshake half of `AllowInsecureFallback` (see the module docs): asks for a
/// certificate without requiring one and accepts any chain, leaving the verdict to
/// [`PortTls::verified_peer_cert`]; handshake signatures go to the WebPki verifier, so the
/// client must still hold the key of what it presents.
#[derive(Debug)]
struct FallbackVerifier(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for FallbackVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        // Judged after the handshake; only a chain that passes there is ever used.
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The handshake verifier and the post-handshake rule of a port's client validation.
fn client_verifier(
    validation: &ClientValidation,
    provider: &Arc<CryptoProvider>,
) -> std::result::Result<(Arc<dyn ClientCertVerifier>, ClientCerts), String> {
    let mut roots = RootCertStore::empty();
    for ca in rustls_pemfile::certs(&mut validation.ca_pem.as_bytes()) {
        let ca = ca.map_err(|e| format!("client CA PEM: {e}"))?;
        roots
            .add(ca)
            .map_err(|e| format!("client CA certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err("no certificate in the client CA bundle".into());
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    let built = match validation.mode {
        ClientCertMode::AllowValidOnly => builder.build(),
        ClientCertMode::AllowInsecureFallback => builder.allow_unauthenticated().build(),
    };
    let webpki = built.map_err(|e| format!("client certificate verifier: {e}"))?;
    Ok(match validation.mode {
        ClientCertMode::AllowValidOnly => (webpki, ClientCerts::InHandshake),
        ClientCertMode::AllowInsecureFallback => (
            Arc::new(FallbackVerifier(webpki.clone())),
            ClientCerts::AfterHandshake(webpki),
        ),
    })
}

/// Builds the TLS config of an HTTPS port (see [`port_tls`]).
pub fn server_config(port: &PortConfig) -> Result<Arc<ServerConfig>> {
    Ok(port_tls(port)?.config)
}

/// Builds the TLS side of an HTTPS port: certificates by SNI and client validation.
pub fn port_tls(port: &PortConfig) -> Result<PortTls> {
    build(port, &[b"h2", b"http/1.1"])
}

/// The handshake of a TLS port's terminating listeners: certificates by SNI as on HTTPS
/// ports, and no ALPN (the stream after it is the backend's protocol, not HTTP).
pub(crate) fn stream_config(port: &PortConfig) -> Result<Arc<ServerConfig>> {
    Ok(build(port, &[])?.config)
}

fn build(port: &PortConfig, alpn: &[&[u8]]) -> Result<PortTls> {
    let provider = provider();
    let err = |message: String| ProxyError::Tls {
        port: port.port,
        message,
    };
    let mut resolver = SniResolver::default();
    let mut first: Option<Arc<CertifiedKey>> = None;
    // Passthrough listeners never terminate: a certificate on one (a hand-written table) is
    // neither served nor checked.
    for listener in port.listeners.iter().filter(|l| !l.passthrough) {
        let mut keys = Vec::with_capacity(listener.certificates.len());
        for cert in &listener.certificates {
            let key = certified_key(cert, &provider)
                .map_err(|m| err(format!("listener {}: {}: {m}", listener.name, cert.source)))?;
            keys.push(Arc::new(key));
        }
        let Some(key) = keys.into_iter().next() else {
            continue;
        };
        first.get_or_insert_with(|| key.clone());
        match listener.hostname.as_deref().map(str::to_ascii_lowercase) {
            None => {
                resolver.default.get_or_insert(key);
            }
            Some(h) => {
                if let Some(suffix) = h.strip_prefix('*') {
                    resolver.wildcard.push((suffix.to_owned(), key));
                } else {
                    resolver.exact.entry(h).or_insert(key);
                }
            }
        }
    }
    if resolver.default.is_none() {
        resolver.default = first;
    }
    if resolver.default.is_none() {
        return Err(err("no certificate on any listener".into()));
    }
    // Stable sort keeps table order among equal lengths.
    resolver
        .wildcard
        .sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
    let (verifier, client) = match &port.client_validation {
        Some(v) => {
            let (verifier, client) = client_verifier(v, &provider).map_err(err)?;
            (Some(verifier), client)
        }
        None => (None, ClientCerts::Off),
    };
    let builder = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| err(e.to_string()))?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(PortTls {
        config: Arc::new(config),
        client,
    })
}

/// Parses a PEM chain and key (PKCS#1, PKCS#8 or SEC1) into a rustls key.
fn certified_key(
    cert: &Certificate,
    provider: &CryptoProvider,
) -> std::result::Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut cert.cert_pem.as_bytes())
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| format!("certificate PEM: {e}"))?;
    if chain.is_empty() {
        return Err("no certificate in PEM".into());
    }
    let key = rustls_pemfile::private_key(&mut cert.key_pem.as_bytes())
        .map_err(|e| format!("private key PEM: {e}"))?
        .ok_or_else(|| "no private key in PEM".to_owned())?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| format!("private key: {e}"))
}

/// The runtime side of a TLS port (module `stream`), immutable once built. Which listener
/// passes through is the router's to say ([`crate::lifecycle::router::RouteRef::passthrough`]).
#[derive(Debug)]
pub(crate) struct TlsPort {
    /// The handshake of the terminating listeners; `None` when every listener passes through.
    pub(crate) terminate: Option<Arc<ServerConfig>>,
}

impl TlsPort {
    /// Builds the port; a terminating listener's bad certificate rejects the table, as on
    /// HTTPS ports. Passthrough listeners carry no certificates, so the handshake's resolver
    /// holds the terminating listeners' alone.
    pub fn build(port: &PortConfig) -> Result<Self> {
        let terminate = if port.listeners.iter().any(|l| !l.passthrough) {
            Some(stream_config(port)?)
        } else {
            None
        };
        Ok(Self { terminate })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Arc<CertifiedKey> {
        let ck = rcgen::generate_simple_self_signed(vec!["x".into()]).unwrap();
        let cert = Certificate {
            source: "t".into(),
            cert_pem: ck.cert.pem(),
            key_pem: ck.signing_key.serialize_pem(),
        };
        Arc::new(certified_key(&cert, &provider()).unwrap())
    }

    #[test]
    fn exact_then_longest_wildcard_then_default() {
        let (exact, short, long, default) = (key(), key(), key(), key());
        let r = SniResolver {
            exact: HashMap::from([("a.example.com".to_owned(), exact.clone())]),
            wildcard: vec![
                (".b.example.com".to_owned(), long.clone()),
                (".example.com".to_owned(), short.clone()),
            ],
            default: Some(default.clone()),
        };
        assert!(Arc::ptr_eq(&r.pick(Some("A.example.com")).unwrap(), &exact));
        assert!(Arc::ptr_eq(
            &r.pick(Some("x.b.example.com")).unwrap(),
            &long
        ));
        assert!(Arc::ptr_eq(&r.pick(Some("x.example.com")).unwrap(), &short));
        assert!(Arc::ptr_eq(&r.pick(Some("example.com")).unwrap(), &default));
        assert!(Arc::ptr_eq(&r.pick(None).unwrap(), &default));
    }

    /// A CA and the DER of a client certificate it signed for `cn`.
    fn ca_and_client(cn: &str) -> (String, Vec<u8>) {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        let leaf = params
            .signed_by(&KeyPair::generate().unwrap(), &issuer)
            .unwrap();
        (ca.pem(), leaf.der().to_vec())
    }

    fn https_port(client_validation: Option<ClientValidation>) -> PortConfig {
        let ck = rcgen::generate_simple_self_signed(vec!["x".into()]).unwrap();
        PortConfig {
            address: "127.0.0.1".into(),
            port: 8443,
            protocol: tollgate_api::Protocol::Https,
            listeners: vec![tollgate_api::ListenerConfig {
                passthrough: false,
                name: "https".into(),
                hostname: None,
                certificates: vec![Certificate {
                    source: "t".into(),
                    cert_pem: ck.cert.pem(),
                    key_pem: ck.signing_key.serialize_pem(),
                }],
                virtual_hosts: vec![],
            }],
            client_validation,
            client: Default::default(),
        }
    }

    #[test]
    fn certificates_on_passthrough_listeners_are_neither_served_nor_checked() {
        let mut port = https_port(None);
        port.protocol = tollgate_api::Protocol::Tls;
        let mut passthrough = port.listeners[0].clone();
        passthrough.name = "passthrough".into();
        passthrough.passthrough = true;
        passthrough.certificates[0].cert_pem = "not a certificate".into();
        port.listeners.push(passthrough);
        assert!(stream_config(&port).is_ok());
        // The same bad certificate on a terminating listener rejects the port.
        port.listeners[1].passthrough = false;
        assert!(stream_config(&port).is_err());
    }

    fn validation(ca_pem: &str, mode: ClientCertMode) -> Option<ClientValidation> {
        Some(ClientValidation {
            ca_pem: ca_pem.into(),
            mode,
        })
    }

    #[test]
    fn a_client_ca_bundle_that_does_not_parse_rejects_the_port() {
        for (bundle, says) in [
            ("", "no certificate in the client CA bundle"),
            ("not PEM at all", "no certificate in the client CA bundle"),
            (
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                "client CA certificate",
            ),
            (
                "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
                "client CA PEM",
            ),
        ] {
            for mode in [
                ClientCertMode::AllowValidOnly,
                ClientCertMode::AllowInsecureFallback,
            ] {
                let e = port_tls(&https_port(validation(bundle, mode))).unwrap_err();
                let ProxyError::Tls { port, message } = &e else {
                    panic!("{e:?}");
                };
                assert_eq!(*port, 8443);
                assert!(message.starts_with(says), "{bundle:?}: {message}");
            }
        }
    }

    #[test]
    fn only_a_verified_certificate_is_passed_on() {
        let (ca, alice) = ca_and_client("alice");
        let (_, mallory) = ca_and_client("mallory");
        let chain = |der: &[u8]| vec![CertificateDer::from(der.to_vec())];

        let fallback = port_tls(&https_port(validation(
            &ca,
            ClientCertMode::AllowInsecureFallback,
        )))
        .unwrap();
        assert_eq!(
            fallback.verified(&chain(&alice)).as_deref(),
            Some(&alice[..])
        );
        assert_eq!(fallback.verified(&chain(&mallory)), None, "another CA");
        assert_eq!(fallback.verified(&chain(b"garbage")), None);
        assert_eq!(fallback.verified(&[]), None);

        let valid_only =
            port_tls(&https_port(validation(&ca, ClientCertMode::AllowValidOnly))).unwrap();
        // The handshake verified it (or failed): passed on as is.
        assert_eq!(
            valid_only.verified(&chain(&alice)).as_deref(),
            Some(&alice[..])
        );

        let off = port_tls(&https_port(None)).unwrap();
        assert_eq!(off.verified(&chain(&alice)), None);
    }

    #[test]
    fn bad_pem_is_an_error_without_key_material() {
        let cert = Certificate {
            source: "ns/secret".into(),
            cert_pem: "nope".into(),
            key_pem: "SECRET".into(),
        };
        let e = certified_key(&cert, &provider()).unwrap_err();
        assert!(!e.contains("SECRET"));
    }
}
