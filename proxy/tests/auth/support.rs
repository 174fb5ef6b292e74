//! Fixtures of the auth tests: policies, requests, signed tokens, and loopback HTTP servers
//! standing in for a JWKS endpoint and an introspection endpoint (127.0.0.1 only).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tollgate_api::ObjectKey;
use tollgate_api::policy::{
    ApiKey, ApiKeys, Auth, AuthnMethod, Credentials, DenyResponse, Introspection, Jwt, Method,
};
use tollgate_proxy::policy::auth::{
    AuthMetrics, AuthOptions, AuthOutcome, AuthState, CompiledAuth,
};
use tollgate_proxy::policy::cel::{Activation, Attrs, Expr};

pub const ISSUER: &str = "https://issuer.test";

// ---- policies ----

pub fn auth(methods: Vec<AuthnMethod>) -> Auth {
    Auth {
        sources: vec![ObjectKey::new("shop", "auth")],
        when: vec![],
        authentication: methods,
        authorization: vec![],
        success_headers: vec![],
        unauthenticated: DenyResponse::unauthenticated(),
        unauthorized: DenyResponse::unauthorized(),
    }
}

pub fn method(name: &str, credentials: Credentials, method: Method) -> AuthnMethod {
    AuthnMethod {
        name: name.into(),
        policy: Default::default(),
        credentials,
        method,
        when: vec![],
    }
}

pub fn bearer() -> Credentials {
    Credentials::AuthorizationHeader {
        prefix: "Bearer".into(),
    }
}

pub fn jwt_inline(jwks: &Value, audiences: &[&str]) -> Method {
    Method::Jwt(Jwt {
        issuer: ISSUER.into(),
        audiences: audiences.iter().map(|a| a.to_string()).collect(),
        jwks_uri: None,
        jwks: Some(jwks.to_string()),
    })
}

pub fn jwt_remote(uri: &str) -> Method {
    Method::Jwt(Jwt {
        issuer: ISSUER.into(),
        audiences: vec![],
        jwks_uri: Some(uri.into()),
        jwks: None,
    })
}

pub fn introspection(endpoint: &str, cache_ms: u64) -> Method {
    Method::Introspection(Introspection {
        endpoint: endpoint.into(),
        client_id: "gateway".into(),
        client_secret: "s3cret:&=".into(),
        cache_ms,
    })
}

pub fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// API keys `key → secret name`.
pub fn api_keys(pairs: &[(&str, &str)]) -> Method {
    Method::ApiKey(ApiKeys {
        keys: pairs
            .iter()
            .map(|(key, name)| ApiKey {
                sha256: sha256_hex(key),
                identity: json!({"metadata": {"name": name, "namespace": "shop",
                    "labels": {"tier": "gold"}}}),
            })
            .collect(),
    })
}

pub fn state() -> AuthState {
    AuthState::new(AuthMetrics::new())
}

pub fn state_with(options: AuthOptions) -> AuthState {
    AuthState::with_options(AuthMetrics::new(), options)
}

pub fn build(a: &Auth, s: &AuthState) -> CompiledAuth {
    CompiledAuth::build(a, s).unwrap()
}

// ---- requests ----

pub fn req(method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
    let mut b = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(()).unwrap().into_parts().0
}

pub fn get(headers: &[(&str, &str)]) -> Parts {
    req("GET", "/orders?page=1", headers)
}

/// What a check left behind.
pub struct Checked {
    pub outcome: AuthOutcome,
    pub parts: Parts,
    /// `auth.identity.sub` as the activation sees it after the check.
    pub sub: Option<String>,
}

impl Checked {
    pub fn allowed(&self) -> bool {
        matches!(self.outcome, AuthOutcome::Allowed(_))
    }

    pub fn status(&self) -> u16 {
        match &self.outcome {
            AuthOutcome::Allowed(_) => 200,
            AuthOutcome::Denied(d) => d.status.as_u16(),
        }
    }

    pub fn identity(&self) -> Value {
        match &self.outcome {
            AuthOutcome::Allowed(a) => (*a.identity).clone(),
            AuthOutcome::Denied(d) => panic!("denied: {d:?}"),
        }
    }

    pub fn www_authenticate(&self) -> Vec<String> {
        match &self.outcome {
            AuthOutcome::Allowed(_) => vec![],
            AuthOutcome::Denied(d) => d
                .headers
                .get_all("www-authenticate")
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect(),
        }
    }
}

pub async fn check_with(a: &CompiledAuth, mut parts: Parts, cert: Option<&[u8]>) -> Checked {
    let client_headers = parts.headers.clone();
    let path = parts.uri.path_and_query().unwrap().to_string();
    let method = parts.method.to_string();
    let mut act = Activation::new(&Attrs {
        method: &method,
        host: "shop.example.com",
        path: &path,
        scheme: "https",
        headers: &client_headers,
        source: "127.0.0.1:40000".parse().unwrap(),
    });
    let outcome = a.check(&mut parts, cert, "https", &mut act).await;
    let sub = Expr::compile("auth.identity.sub")
        .unwrap()
        .eval_string(&act);
    Checked {
        outcome,
        parts,
        sub,
    }
}

pub async fn check(a: &CompiledAuth, parts: Parts) -> Checked {
    check_with(a, parts, None).await
}

// ---- keys and tokens ----

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A signing key and the public JWK that verifies it.
#[derive(Clone)]
pub struct SigningKey {
    pub alg: Algorithm,
    pub kid: String,
    pub key: EncodingKey,
    pub jwk: Value,
}

impl SigningKey {
    fn new(alg: Algorithm, kid: &str, key: EncodingKey) -> Self {
        let mut jwk = Jwk::from_encoding_key(&key, alg).unwrap();
        jwk.common.key_id = Some(kid.into());
        jwk.common.key_algorithm = None;
        let jwk = serde_json::to_value(&jwk).unwrap();
        Self {
            alg,
            kid: kid.into(),
            key,
            jwk,
        }
    }

    pub fn rsa(n: u8, alg: Algorithm) -> Self {
        let pem: &[u8] = match n {
            1 => include_bytes!("../fixtures/auth/rsa-1.pem"),
            _ => include_bytes!("../fixtures/auth/rsa-2.pem"),
        };
        Self::new(
            alg,
            &format!("rsa-{n}"),
            EncodingKey::from_rsa_pem(pem).unwrap(),
        )
    }

    pub fn es256() -> Self {
        let pem = include_bytes!("../fixtures/auth/ec-p256.pem");
        Self::new(
            Algorithm::ES256,
            "ec-1",
            EncodingKey::from_ec_pem(pem).unwrap(),
        )
    }

    pub fn es384() -> Self {
        let pem = include_bytes!("../fixtures/auth/ec-p384.pem");
        Self::new(
            Algorithm::ES384,
            "ec-2",
            EncodingKey::from_ec_pem(pem).unwrap(),
        )
    }

    pub fn eddsa() -> Self {
        let pem = include_bytes!("../fixtures/auth/ed25519.pem");
        Self::new(
            Algorithm::EdDSA,
            "ed-1",
            EncodingKey::from_ed_pem(pem).unwrap(),
        )
    }

    pub fn hs256() -> Self {
        Self::new(
            Algorithm::HS256,
            "hmac-1",
            EncodingKey::from_secret(b"test-only shared secret, 32 bytes!").unwrap(),
        )
    }

    /// The same key under another `kid`.
    pub fn with_kid(mut self, kid: &str) -> Self {
        self.kid = kid.into();
        self.jwk["kid"] = kid.into();
        self
    }

    pub fn sign(&self, claims: &Value) -> String {
        let mut h = Header::new(self.alg);
        h.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&h, claims, &self.key).unwrap()
    }
}

pub fn jwks(keys: &[&SigningKey]) -> Value {
    json!({ "keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>() })
}

/// Valid claims for `sub`, expiring in an hour.
pub fn claims(sub: &str) -> Value {
    json!({"iss": ISSUER, "sub": sub, "aud": "shop", "exp": now() + 3600, "role": "user"})
}

pub fn b64(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(v.to_string())
}

pub fn bearer_header(token: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {token}"))
}

pub fn with_bearer(token: &str) -> Parts {
    let (k, v) = bearer_header(token);
    get(&[(k, &v)])
}

// ---- loopback servers ----

/// (authorization header, body) of one request a [`TestServer`] saw.
pub type Seen = (Option<String>, String);

type Handler = dyn Fn(&Parts, &Bytes) -> (StatusCode, Value) + Send + Sync;

/// A loopback HTTP/1.1 server (plain or TLS) answering JSON from a handler; counts and
/// records requests.
#[derive(Clone)]
pub struct TestServer {
    pub addr: SocketAddr,
    pub scheme: &'static str,
    pub hits: Arc<AtomicUsize>,
    /// (authorization header, body) of every request.
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl TestServer {
    pub async fn start(
        delay: Duration,
        handler: impl Fn(&Parts, &Bytes) -> (StatusCode, Value) + Send + Sync + 'static,
    ) -> Self {
        Self::start_with(None, delay, handler).await
    }

    pub async fn start_with(
        tls: Option<TlsAcceptor>,
        delay: Duration,
        handler: impl Fn(&Parts, &Bytes) -> (StatusCode, Value) + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = Self {
            addr: listener.local_addr().unwrap(),
            scheme: if tls.is_some() { "https" } else { "http" },
            hits: Arc::default(),
            seen: Arc::default(),
        };
        let handler: Arc<Handler> = Arc::new(handler);
        let state = server.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (state, handler, tls) = (state.clone(), handler.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        Some(acceptor) => {
                            if let Ok(s) = acceptor.accept(stream).await {
                                serve(s, state, handler, delay).await;
                            }
                        }
                        None => serve(stream, state, handler, delay).await,
                    }
                });
            }
        });
        server
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}://{}{path}", self.scheme, self.addr)
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

async fn serve<S>(io: S, state: TestServer, handler: Arc<Handler>, delay: Duration)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |r: Request<Incoming>| {
        let (state, handler) = (state.clone(), handler.clone());
        async move {
            let (parts, body) = r.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            state.hits.fetch_add(1, Ordering::SeqCst);
            state.seen.lock().unwrap().push((
                parts
                    .headers
                    .get("authorization")
                    .map(|v| v.to_str().unwrap().to_owned()),
                String::from_utf8_lossy(&body).into_owned(),
            ));
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let (status, v) = handler(&parts, &body);
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(v.to_string())))
                    .unwrap(),
            )
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

/// A test CA, a server certificate for 127.0.0.1 signed by it, the acceptor serving that
/// certificate, and a client config trusting only the CA.
pub fn loopback_tls() -> (TlsAcceptor, Arc<rustls::ClientConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls_pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (TlsAcceptor::from(Arc::new(server)), Arc::new(client))
}

/// A JWKS endpoint serving whatever document is in `doc`; `Value::Null` answers 503.
pub async fn jwks_server(doc: Arc<Mutex<Value>>) -> TestServer {
    jwks_server_with(None, doc).await
}

/// [`jwks_server`], over TLS when an acceptor is given.
pub async fn jwks_server_with(tls: Option<TlsAcceptor>, doc: Arc<Mutex<Value>>) -> TestServer {
    TestServer::start_with(tls, Duration::ZERO, move |_, _| {
        let d = doc.lock().unwrap().clone();
        if d.is_null() {
            (StatusCode::SERVICE_UNAVAILABLE, json!({}))
        } else {
            (StatusCode::OK, d)
        }
    })
    .await
}

/// An address nothing listens on (bound, then closed).
pub async fn dead_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}
