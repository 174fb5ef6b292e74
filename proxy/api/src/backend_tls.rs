//! TLS from the proxy to a backend: what a BackendTLSPolicy (and the Gateway's
//! `spec.tls.backend`) compile to.
//!
//! In: nothing. Out: [`BackendTls`], carried by a [`crate::Backend`] whose Service port a
//! valid BackendTLSPolicy targets. A backend without it is spoken to in plaintext; one whose
//! policy is invalid never reaches the table (its backendRefs are unresolved and answered
//! with 500), so a proxy never has to decide to send plaintext where TLS was asked for.

use serde::{Deserialize, Serialize};

use crate::Certificate;

/// How to speak TLS to one backend.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendTls {
    /// The policy it came from (`namespace/name`), for logs.
    pub source: String,
    /// SNI sent (BackendTLSPolicy `validation.hostname`); also the name the backend's
    /// certificate must match when [`Self::subject_alt_names`] is empty.
    pub server_name: String,
    /// When set, the certificate must carry one of these instead of [`Self::server_name`]
    /// (`validation.subjectAltNames`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<SubjectAltName>,
    /// The CAs the backend's chain must lead to.
    pub trust: Trust,
    /// ALPN protocols offered, most preferred first: `h2` alone for a backend that must be
    /// spoken to over HTTP/2 (gRPC), `h2` and `http/1.1` when either will do (the server
    /// picks), `http/1.1` alone for WebSocket ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alpn: Vec<String>,
    /// The certificate the proxy presents (Gateway `spec.tls.backend.clientCertificateRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<Certificate>,
}

/// A name the backend's certificate may carry (BackendTLSPolicy `subjectAltNames`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", content = "value")]
pub enum SubjectAltName {
    /// A DNS name (`dNSName`); `*.example.com` in the certificate matches one label.
    Hostname(String),
    /// A URI (`uniformResourceIdentifier`), compared exactly (SPIFFE IDs).
    #[serde(rename = "URI")]
    Uri(String),
}

/// Trust anchors for a backend's certificate.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Trust {
    /// These PEM CA certificates (`caCertificateRefs`).
    Pem(String),
    /// The system's roots (`wellKnownCACertificates: System`), as the proxy's host has them.
    System,
}

/// ALPN protocol id of HTTP/2.
pub const ALPN_H2: &str = "h2";
/// ALPN protocol id of HTTP/1.1.
pub const ALPN_HTTP11: &str = "http/1.1";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_leaves_defaults_out() {
        let t = BackendTls {
            source: "ns/p".into(),
            server_name: "abc.example.com".into(),
            subject_alt_names: vec![
                SubjectAltName::Hostname("abc.example.com".into()),
                SubjectAltName::Uri("spiffe://td/ns/a".into()),
            ],
            trust: Trust::Pem("PEM".into()),
            alpn: vec![],
            client_certificate: None,
        };
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(
            json,
            r#"{"source":"ns/p","serverName":"abc.example.com","subjectAltNames":[{"type":"Hostname","value":"abc.example.com"},{"type":"URI","value":"spiffe://td/ns/a"}],"trust":{"pem":"PEM"}}"#
        );
        assert_eq!(serde_json::from_str::<BackendTls>(&json).unwrap(), t);
        let system = BackendTls {
            trust: Trust::System,
            ..t
        };
        let json = serde_json::to_string(&system).unwrap();
        assert!(json.contains(r#""trust":"system""#), "{json}");
    }
}
