//! TLS to backends (BackendTLSPolicy). In: a backend's [`BackendTls`] from the table. Out: a
//! [`TlsClient`] (rustls client configurations, built once per distinct settings when a
//! table is swapped in) that an endpoint's pool (module `pool`) dials with, and the TLS
//! exchanges of such a pool: HTTP/1.1 on the project's codec over the TLS stream, or HTTP/2
//! (hyper) when ALPN picked `h2`.
//!
//! - Verification: the chain must lead to the policy's CAs (or the system roots). The name
//!   checked is the SNI (`validation.hostname`), or, when `subjectAltNames` is set, any one of
//!   those (DNS names as rustls matches them; URIs compared exactly), never the hostname then.
//! - ALPN: the compiler says what to offer. `h2` alone: HTTP/2 on every connection (gRPC).
//!   `h2` and `http/1.1`: the first handshake of an endpoint's pool learns what the backend
//!   picks; HTTP/2 then goes over one multiplexed connection per endpoint, HTTP/1.1 over the
//!   pool as for plaintext. Upgrades (WebSocket, CONNECT) always dial with `http/1.1` alone.
//! - Connections: the TCP connect is the pool's (BackendPolicy `connection`: connect timeout,
//!   keepalive); the handshake then gets the same connect timeout. A handshake that fails
//!   (unknown CA, wrong name, a client certificate the backend refuses) is
//!   [`UpstreamError::Tls`]: a connect error (502, retried on another endpoint like any
//!   connect error) counted under its own kind. Settings that cannot be built (a PEM the
//!   compiler would have refused, in a hand-written table) make every exchange fail the same
//!   way: never plaintext, never unverified.
//!
//! Pools are keyed by address and settings, so connections made under one policy are never
//! used under another (module `pool`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use http::header::{HOST, UPGRADE};
use http::request::Parts;
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri, Version};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, verify_server_name};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tollgate_api::BackendTls;
use tollgate_api::backend_tls::{ALPN_H2, ALPN_HTTP11, SubjectAltName, Trust};

use crate::lifecycle::body::ProxyBody;
use crate::lifecycle::forward::Added;
use crate::upstream::h1;
use crate::upstream::io::UpstreamIo;
use crate::upstream::pool::{EndpointPool, PooledBody, UpstreamError, take_parts};

/// How a backend's ALPN offer is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alpn {
    /// HTTP/1.1 only.
    H1,
    /// HTTP/2 only (whatever the handshake says: a server without ALPN still gets HTTP/2).
    H2,
    /// Either; the backend picks.
    Either,
}

/// The rustls side of one backend's TLS settings, shared by its endpoints' pools.
pub(crate) struct TlsClient {
    /// The settings it was built from: the pools' key.
    pub(crate) settings: BackendTls,
    server_name: ServerName<'static>,
    alpn: Alpn,
    /// Configurations, or why they could not be built.
    configs: Result<Configs, String>,
}

struct Configs {
    /// ALPN as the table says.
    main: Arc<ClientConfig>,
    /// `http/1.1` alone (upgrades, and a backend that picked HTTP/1.1).
    h1: Arc<ClientConfig>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient")
            .field("source", &self.settings.source)
            .field("server_name", &self.server_name)
            .field("alpn", &self.alpn)
            .field("ok", &self.configs.is_ok())
            .finish()
    }
}

impl PartialEq for TlsClient {
    fn eq(&self, other: &Self) -> bool {
        self.settings == other.settings
    }
}

impl Eq for TlsClient {}

impl std::hash::Hash for TlsClient {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.settings.hash(state);
    }
}

impl TlsClient {
    /// Builds the configurations for `settings`; one that cannot be built is logged and
    /// fails every exchange.
    pub(crate) fn new(settings: &BackendTls) -> Self {
        let offered = |p: &str| settings.alpn.iter().any(|a| a == p);
        let alpn = match (offered(ALPN_H2), offered(ALPN_HTTP11)) {
            (true, true) => Alpn::Either,
            (true, false) => Alpn::H2,
            _ => Alpn::H1,
        };
        let (server_name, configs) = match ServerName::try_from(settings.server_name.clone()) {
            Ok(name) => (name, configs(settings)),
            Err(e) => (
                ServerName::IpAddress(std::net::Ipv4Addr::UNSPECIFIED.into()),
                Err(format!("server name {:?}: {e}", settings.server_name)),
            ),
        };
        if let Err(e) = &configs {
            tracing::error!(policy = %settings.source, error = %e, "backend TLS settings unusable; requests to the backend fail");
        }
        Self {
            settings: settings.clone(),
            server_name,
            alpn,
            configs,
        }
    }

    /// Fails when the settings could not be built: checked before dialling, so such a backend
    /// is never connected to at all.
    pub(crate) fn usable(&self) -> Result<(), UpstreamError> {
        match &self.configs {
            Ok(_) => Ok(()),
            Err(e) => Err(UpstreamError::Tls(std::io::Error::other(e.clone()))),
        }
    }

    /// Completes a handshake on `tcp` within `timeout`. `h1_only`: offer `http/1.1` alone.
    async fn handshake(
        &self,
        tcp: TcpStream,
        h1_only: bool,
        timeout: Duration,
    ) -> Result<TlsStream<TcpStream>, UpstreamError> {
        let configs = self
            .configs
            .as_ref()
            .map_err(|e| UpstreamError::Tls(std::io::Error::other(e.clone())))?;
        let config = if h1_only { &configs.h1 } else { &configs.main };
        let connector = TlsConnector::from(Arc::clone(config));
        tokio::time::timeout(timeout, connector.connect(self.server_name.clone(), tcp))
            .await
            .map_err(|_| UpstreamError::Tls(std::io::ErrorKind::TimedOut.into()))?
            .map_err(UpstreamError::Tls)
    }

    /// A handshake on `tcp` offering what the table says, and whether HTTP/2 is to be spoken
    /// on the connection (the backend picked it by ALPN, or must be spoken to so). Requests'
    /// fresh connections and health checks (module `health`) are made with it.
    pub(crate) async fn handshake_negotiated(
        &self,
        tcp: TcpStream,
        timeout: Duration,
    ) -> Result<(TlsStream<TcpStream>, bool), UpstreamError> {
        let stream = self.handshake(tcp, false, timeout).await?;
        let h2 = match self.alpn {
            Alpn::H2 => true,
            _ => stream.get_ref().1.alpn_protocol() == Some(ALPN_H2.as_bytes()),
        };
        Ok((stream, h2))
    }
}

fn configs(s: &BackendTls) -> Result<Configs, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = Arc::new(match &s.trust {
        Trust::Pem(pem) => {
            let mut roots = RootCertStore::empty();
            for c in rustls_pemfile::certs(&mut pem.as_bytes()) {
                let c = c.map_err(|e| format!("CA PEM: {e}"))?;
                roots.add(c).map_err(|e| format!("CA certificate: {e}"))?;
            }
            if roots.is_empty() {
                return Err("no CA certificate".into());
            }
            roots
        }
        Trust::System => system_roots(),
    });
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?;
    let builder = if s.subject_alt_names.is_empty() {
        builder.with_root_certificates(roots)
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(SanVerifier {
                roots,
                names: s.subject_alt_names.clone(),
                provider,
            }))
    };
    let mut config = match &s.client_certificate {
        None => builder.with_no_client_auth(),
        Some(c) => {
            let chain: Vec<CertificateDer<'static>> =
                rustls_pemfile::certs(&mut c.cert_pem.as_bytes())
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("client certificate {}: {e}", c.source))?;
            let key = rustls_pemfile::private_key(&mut c.key_pem.as_bytes())
                .map_err(|_| format!("client key {}: not PEM", c.source))?
                .ok_or_else(|| format!("client key {}: none", c.source))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("client certificate {}: {e}", c.source))?
        }
    };
    config.alpn_protocols = s.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    let mut h1 = config.clone();
    h1.alpn_protocols = if s.alpn.is_empty() {
        Vec::new()
    } else {
        vec![ALPN_HTTP11.as_bytes().to_vec()]
    };
    Ok(Configs {
        main: Arc::new(config),
        h1: Arc::new(h1),
    })
}

/// The system's trust roots (`wellKnownCACertificates: System`), read once per process.
fn system_roots() -> RootCertStore {
    static ROOTS: std::sync::OnceLock<RootCertStore> = std::sync::OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let loaded = rustls_native_certs::load_native_certs();
            for e in &loaded.errors {
                tracing::warn!(error = %e, "backend TLS: loading system trust roots");
            }
            let mut roots = RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(loaded.certs);
            if added == 0 {
                tracing::warn!(
                    "backend TLS: no system trust roots; backends verified against them will fail"
                );
            }
            roots
        })
        .clone()
}

/// Verifies a backend against `subjectAltNames`: the chain as rustls's own verifier does,
/// then any one of the names (the SNI plays no part, as the spec asks).
#[derive(Debug)]
struct SanVerifier {
    roots: Arc<RootCertStore>,
    names: Vec<SubjectAltName>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for SanVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        let mut uris: Option<Vec<String>> = None;
        for name in &self.names {
            let ok = match name {
                SubjectAltName::Hostname(h) => ServerName::try_from(h.as_str())
                    .is_ok_and(|n| verify_server_name(&cert, &n).is_ok()),
                SubjectAltName::Uri(u) => uris
                    .get_or_insert_with(|| uri_sans(end_entity))
                    .iter()
                    .any(|have| have == u),
            };
            if ok {
                return Ok(ServerCertVerified::assertion());
            }
        }
        Err(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName,
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The URI subject alternative names of a certificate (empty when it does not parse: the
/// chain check before this has parsed it already).
fn uri_sans(cert: &CertificateDer<'_>) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(san)) = parsed.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|g| match g {
            GeneralName::URI(u) => Some((*u).to_owned()),
            _ => None,
        })
        .collect()
}

/// One [`TlsClient`] per distinct settings, shared while some pool uses it.
#[derive(Debug, Default)]
pub(crate) struct TlsClients {
    by_settings: Mutex<HashMap<BackendTls, Weak<TlsClient>>>,
}

impl TlsClients {
    /// The client for `settings` (at table build time, not per request).
    pub(crate) fn get(&self, settings: &BackendTls) -> Arc<TlsClient> {
        let mut map = self
            .by_settings
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, w| w.strong_count() > 0);
        if let Some(c) = map.get(settings).and_then(Weak::upgrade) {
            return c;
        }
        let c = Arc::new(TlsClient::new(settings));
        map.insert(settings.clone(), Arc::downgrade(&c));
        c
    }
}

/// What an endpoint's backend picked by ALPN, once a handshake told.
const UNKNOWN: u8 = 0;
const PICKED_H1: u8 = 1;

/// The TLS side of one endpoint's pool: the client, and the HTTP/2 connection when the
/// backend speaks it.
#[derive(Debug)]
pub(crate) struct TlsState {
    pub(crate) client: Arc<TlsClient>,
    h2: Mutex<Option<SendRequest<ProxyBody>>>,
    picked: AtomicU8,
}

impl TlsState {
    pub(crate) fn new(client: Arc<TlsClient>) -> Self {
        Self {
            client,
            h2: Mutex::new(None),
            picked: AtomicU8::new(UNKNOWN),
        }
    }

    /// The live HTTP/2 connection, if any.
    fn h2(&self) -> Option<SendRequest<ProxyBody>> {
        let mut slot = self.h2.lock().unwrap_or_else(PoisonError::into_inner);
        match slot.as_ref() {
            Some(s) if !s.is_closed() => Some(s.clone()),
            Some(_) => {
                *slot = None;
                None
            }
            None => None,
        }
    }

    fn keep_h2(&self, sender: &SendRequest<ProxyBody>) {
        *self.h2.lock().unwrap_or_else(PoisonError::into_inner) = Some(sender.clone());
    }

    /// A TLS connection for HTTP/1.1 on `tcp` (module `pool`'s fresh connection).
    pub(crate) async fn connect_h1(
        &self,
        tcp: TcpStream,
        timeout: Duration,
    ) -> Result<UpstreamIo, UpstreamError> {
        let tls = self.client.handshake(tcp, true, timeout).await?;
        Ok(UpstreamIo::Tls(Box::new(tls)))
    }
}

/// A fresh connection, as the backend chose by ALPN.
enum Fresh {
    H1(h1::Conn),
    H2(SendRequest<ProxyBody>),
}

impl EndpointPool {
    /// [`EndpointPool::send_parts`] for a TLS endpoint: HTTP/2 when the backend speaks it
    /// (or must be spoken to so), else the HTTP/1.1 exchanges over TLS connections.
    pub(crate) async fn send_tls(
        self: &Arc<Self>,
        tls: &TlsState,
        parts: &mut Parts,
        body: ProxyBody,
        added: &Added<'_>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        let upgrade = parts.headers.contains_key(UPGRADE) || parts.method == http::Method::CONNECT;
        let alpn = tls.client.alpn;
        if !upgrade && alpn != Alpn::H1 {
            if let Some(sender) = tls.h2() {
                return send_h2(sender, self.addr(), parts, body, added).await;
            }
            if alpn == Alpn::H2 || tls.picked.load(Ordering::Relaxed) != PICKED_H1 {
                match self.connect_fresh(tls).await? {
                    Fresh::H2(sender) => {
                        tls.keep_h2(&sender);
                        return send_h2(sender, self.addr(), parts, body, added).await;
                    }
                    Fresh::H1(conn) => {
                        // HTTP/1.1 from now on, this connection first.
                        tls.picked.store(PICKED_H1, Ordering::Relaxed);
                        self.reuse_conn(conn);
                    }
                }
            }
        }
        self.send_h1(parts, body, added).await
    }

    /// Dials offering what the table says and reads the backend's pick.
    async fn connect_fresh(&self, tls: &TlsState) -> Result<Fresh, UpstreamError> {
        tls.client.usable()?;
        let tcp = self.connect_tcp().await?;
        let (stream, h2) = tls
            .client
            .handshake_negotiated(tcp, self.connect_timeout())
            .await?;
        if !h2 {
            return Ok(Fresh::H1(h1::Conn::new(UpstreamIo::Tls(Box::new(stream)))));
        }
        let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| UpstreamError::Connect(std::io::Error::other(e)))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream HTTP/2 (TLS) connection ended");
            }
        });
        Ok(Fresh::H2(sender))
    }
}

/// Sends a request over an HTTP/2 connection: `https` and the request's Host as
/// `:authority` (the endpoint's address when there is none), every field but Host as is.
async fn send_h2(
    mut sender: SendRequest<ProxyBody>,
    addr: SocketAddr,
    parts: &mut Parts,
    body: ProxyBody,
    added: &Added<'_>,
) -> Result<Response<PooledBody>, UpstreamError> {
    added.insert_into(&mut parts.headers);
    let mut parts = take_parts(parts);
    let authority = parts
        .headers
        .remove(HOST)
        .and_then(|h| Authority::try_from(h.as_bytes()).ok())
        .or_else(|| Authority::try_from(addr.to_string()).ok());
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut uri = Uri::builder().scheme(Scheme::HTTPS).path_and_query(path);
    if let Some(a) = authority {
        uri = uri.authority(a);
    }
    parts.uri = uri
        .build()
        .map_err(|e| UpstreamError::Connect(std::io::Error::other(e)))?;
    parts.version = Version::HTTP_2;
    // Not ready: the connection is gone and nothing was sent (a connect error, retried).
    sender
        .ready()
        .await
        .map_err(|e| UpstreamError::Connect(std::io::Error::other(e)))?;
    sender
        .send_request(Request::from_parts(parts, body))
        .await
        .map(|r| r.map(PooledBody::plain))
        .map_err(UpstreamError::Http2)
}
