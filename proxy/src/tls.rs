//! TLS termination. In: the listeners of one HTTPS [`PortConfig`] with their PEM certificates.
//! Out: a rustls [`ServerConfig`] (ring provider, TLS 1.2 and 1.3 only, ALPN `h2` and
//! `http/1.1`) whose certificate resolver picks by SNI across every listener on the port:
//! exact hostname first, then the longest matching wildcard, then the default (the first
//! certificate of the listener without a hostname, else of the first listener).
//!
//! A listener's first certificate serves its hostname; further certificates are parsed (so a
//! bad one rejects the table) but not yet selected by key type.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::CertificateDer;
use tollgate_api::{Certificate, PortConfig};

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

/// Builds the TLS config of an HTTPS port.
pub fn server_config(port: &PortConfig) -> Result<Arc<ServerConfig>> {
    let provider = provider();
    let err = |message: String| ProxyError::Tls {
        port: port.port,
        message,
    };
    let mut resolver = SniResolver::default();
    let mut first: Option<Arc<CertifiedKey>> = None;
    for listener in &port.listeners {
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
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| err(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
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
