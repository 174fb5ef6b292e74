//! Authentication and authorization of AuthPolicy. In: a table's [`tollgate_api::policy::Auth`]
//! (compiled once per table with [`CompiledAuth::build`]) and, per request, the request head,
//! the verified client certificate if any, and the request's CEL [`Activation`]. Out:
//! [`AuthOutcome::Allowed`] (identity set in the activation as `auth.identity`, success headers
//! set on the request) or [`AuthOutcome::Denied`] with the answer to send.
//!
//! ```text
//! AuthState::new(metrics)                    once per proxy: HTTP client, JWKS sets, caches
//!   └─ CompiledAuth::build(&auth, &state)     once per table and policy: CEL, keys, digests
//!        └─ check(&mut parts, cert, &mut act)  per request
//!             1. strip every success header name from the client's request; when the
//!                policy's own `when` does not hold, stop here: allowed, anonymous
//!             2. authenticate: methods in order, skipping those whose `when` does not hold;
//!                the first that verifies its credential wins → `auth.identity`
//!                none → `unauthenticated` (default 401) with WWW-Authenticate
//!             3. authorize: every rule whose `when` holds must have a true predicate
//!                else → `unauthorized` (default 403)
//!             4. set success headers from their expressions
//! ```
//!
//! Each method, rule and skipped policy counts its decision under the policy that defined it
//! (`tollgate_policy_decisions_total`, module `counted`), on counters resolved per table.
//!
//! Authentication never fails open: a method that cannot run (JWKS unreachable with no keys,
//! introspection endpoint down or slow) fails, and so does a policy whose every method was
//! skipped by `when`. A CEL predicate that errors is false, so a failing authorization
//! predicate denies.
//!
//! `WWW-Authenticate` carries one challenge per distinct scheme of the configured methods, in
//! order: the `Authorization` prefix of the method when it reads that header, else `Bearer`
//! for JWT and introspection, `APIKEY` for API keys and `Basic` for basic auth, each as `<scheme> realm="<realm>"`.
//! X.509 adds no challenge (it happens in the TLS handshake).
//!
//! Identities (`auth.identity`): JWT claims; the introspection answer; the API key Secret's
//! metadata JSON from the table; for basic auth the user name and its Secret's metadata; for
//! X.509 see [`x509::identity`]; for OIDC the ID token's claims kept in the session cookie.
//! Anonymous (no methods): `null`.
//!
//! An `oidc` method also answers requests itself (module `oidc`): its redirect and logout
//! paths before anything else, and, for a browser navigation no method authenticated, the
//! redirect to the issuer in place of the `unauthenticated` answer. A refreshed session's
//! cookies leave in [`Authenticated::set_cookies`].

mod apikey;
mod basic;
mod counted;
mod credentials;
pub mod external;
mod http;
mod introspect;
mod jwks;
mod jwt;
pub mod metrics;
mod oidc;
mod state;
pub mod x509;

use std::sync::Arc;

use ::http::header::{CONTENT_TYPE, HeaderName, WWW_AUTHENTICATE};
use ::http::request::Parts;
use ::http::{HeaderMap, HeaderValue, Response, StatusCode};
use bytes::Bytes;
use tollgate_api::policy::{Auth, AuthnMethod, DenyResponse, Method};

use self::apikey::ApiKeyVerifier;
use self::basic::BasicVerifier;
use self::counted::{MethodCounters, RuleCounters, WholeCounters};
use self::credentials::Source;
use self::introspect::Introspector;
use self::jwt::JwtVerifier;
use self::oidc::OidcVerifier;
use crate::lifecycle::policy::cel::{Activation, CelError, Expr};
use crate::lifecycle::policy::decisions::policy_label;

pub(crate) use self::counted::sources_label;
pub use self::jwt::LEEWAY_SECS;
pub use self::metrics::{AuthMetrics, Cache, MethodKind, Outcome};
pub use self::state::{AuthOptions, AuthState};
pub(crate) use self::state::{AuthShared, http_uri};

/// Why a policy could not be compiled. The compiler validates the same things, so seeing one
/// of these in the proxy means the table and the proxy disagree.
#[derive(Debug, thiserror::Error)]
pub enum AuthBuildError {
    /// A CEL expression does not compile.
    #[error("{context}: {source}")]
    Cel {
        /// Where: `when`, `authentication.<name>.when`, `authorization.<name>`,
        /// `successHeaders.<name>`.
        context: String,
        /// The CEL error.
        source: CelError,
    },
    /// A credential header name is not a valid header name.
    #[error("authentication.{method}: invalid header name `{name}`")]
    HeaderName {
        /// Method name.
        method: String,
        /// The name.
        name: String,
    },
    /// An API key digest is not 64 hex digits.
    #[error("authentication.{method}: API key #{index}: sha256 is not 64 hex digits")]
    ApiKeyDigest {
        /// Method name.
        method: String,
        /// Position in the key list.
        index: usize,
    },
    /// The OS gave no randomness for a table's secrets.
    #[error("no randomness from the OS: {0}")]
    Random(String),
    /// Inline JWKS unusable, or no key source.
    #[error("authentication.{method}: JWKS: {message}")]
    Jwks {
        /// Method name.
        method: String,
        /// What is wrong.
        message: String,
    },
    /// A JWKS URI or introspection endpoint that is not an absolute http(s) URI.
    #[error("authentication.{method}: `{uri}` is not an absolute http(s) URI")]
    Uri {
        /// Method name.
        method: String,
        /// The URI.
        uri: String,
    },
    /// A success header name is not a valid header name.
    #[error("successHeaders: invalid header name `{0}`")]
    SuccessHeader(String),
    /// A deny response code is not an HTTP status.
    #[error("deny response code {0} is not a valid HTTP status")]
    DenyCode(u16),
    /// An external authorization rule.
    #[error(transparent)]
    External(#[from] external::ExternalBuildError),
    /// The JWT library has no crypto backend (a build misconfiguration).
    #[error("no JWT crypto provider is available")]
    NoCryptoProvider,
}

/// Why one method did not authenticate (internal; never contains a credential).
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// The credential is wrong: a fixed reason for logs.
    Invalid(&'static str),
    /// Verification could not run.
    Unavailable(String),
}

/// The answer to one check.
#[derive(Debug, Clone)]
pub enum AuthOutcome {
    /// Go on (rate limit next). Success headers are set on the request head and the identity
    /// is in the activation.
    Allowed(Authenticated),
    /// Answer with this.
    Denied(Denial),
}

/// Who the request is.
#[derive(Debug, Clone)]
pub struct Authenticated {
    /// The method that authenticated (its name in the policy); `None` when anonymous.
    pub method: Option<Arc<str>>,
    /// Its type ([`MethodKind::None`] when anonymous).
    pub kind: MethodKind,
    /// `auth.identity`.
    pub identity: Arc<serde_json::Value>,
    /// `Set-Cookie` values for the answer: an OIDC session that was refreshed.
    pub set_cookies: Vec<HeaderValue>,
}

impl Authenticated {
    fn anonymous() -> Self {
        Self {
            method: None,
            kind: MethodKind::None,
            identity: Arc::new(serde_json::Value::Null),
            set_cookies: Vec::new(),
        }
    }
}

/// A denial, ready to send.
#[derive(Debug, Clone)]
pub struct Denial {
    /// Status (the policy's `unauthenticated` or `unauthorized` code).
    pub status: StatusCode,
    /// `content-type`, and `www-authenticate` for unauthenticated answers.
    pub headers: HeaderMap,
    /// The policy's message, else the status reason, plus a newline.
    pub body: Bytes,
    /// [`Outcome::Unauthenticated`], [`Outcome::Forbidden`] or [`Outcome::Error`].
    pub outcome: Outcome,
}

impl Denial {
    /// As an HTTP response (map the body into the server's body type).
    pub fn into_response(self) -> Response<Bytes> {
        let mut r = Response::new(self.body);
        *r.status_mut() = self.status;
        *r.headers_mut() = self.headers;
        r
    }
}

/// A precomputed denial answer.
#[derive(Debug, Clone)]
struct DenyTemplate {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl DenyTemplate {
    fn new(d: &DenyResponse, challenges: &[HeaderValue]) -> Result<Self, AuthBuildError> {
        let status = StatusCode::from_u16(d.code).map_err(|_| AuthBuildError::DenyCode(d.code))?;
        let body = match &d.message {
            Some(m) => format!("{m}\n"),
            None => format!("{}\n", status.canonical_reason().unwrap_or("denied")),
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        for c in challenges {
            headers.append(WWW_AUTHENTICATE, c.clone());
        }
        Ok(Self {
            status,
            headers,
            body: body.into(),
        })
    }

    fn denial(&self, outcome: Outcome) -> Denial {
        Denial {
            status: self.status,
            headers: self.headers.clone(),
            body: self.body.clone(),
            outcome,
        }
    }
}

/// How a compiled method verifies.
#[derive(Debug, Clone)]
enum Verifier {
    ApiKey(ApiKeyVerifier),
    Basic(BasicVerifier),
    Jwt(JwtVerifier),
    Introspection(Introspector),
    X509,
    Oidc(OidcVerifier),
}

#[derive(Debug, Clone)]
struct CompiledMethod {
    name: Arc<str>,
    /// `namespace/name` of the AuthPolicy that defined it.
    policy: Arc<str>,
    counted: MethodCounters,
    kind: MethodKind,
    source: Source,
    when: Vec<Expr>,
    verifier: Verifier,
}

#[derive(Debug, Clone)]
struct CompiledRule {
    name: Arc<str>,
    /// `namespace/name` of the AuthPolicy that defined it.
    policy: Arc<str>,
    counted: RuleCounters,
    predicate: Expr,
    when: Vec<Expr>,
}

/// One policy's auth, compiled for one table. Immutable; share it behind an `Arc`.
#[derive(Debug, Clone)]
pub struct CompiledAuth {
    shared: Arc<AuthShared>,
    /// `ns/name,…` of the contributing policies, for logs.
    sources: Arc<str>,
    /// `ns/name` of each contributing policy.
    policies: Vec<Arc<str>>,
    /// Decisions of the policies as a whole.
    whole: WholeCounters,
    /// The policy applies only when all hold.
    when: Vec<Expr>,
    methods: Vec<CompiledMethod>,
    rules: Vec<CompiledRule>,
    success_headers: Vec<(HeaderName, Expr)>,
    unauthenticated: DenyTemplate,
    unauthorized: DenyTemplate,
}

fn compile_all(exprs: &[String], context: &str) -> Result<Vec<Expr>, AuthBuildError> {
    exprs.iter().map(|e| compile(e, context)).collect()
}

fn compile(expr: &str, context: &str) -> Result<Expr, AuthBuildError> {
    Expr::compile(expr).map_err(|source| AuthBuildError::Cel {
        context: context.to_owned(),
        source,
    })
}

impl CompiledAuth {
    /// Compiles `auth` against the shared `state`: CEL compiled, digests decoded, inline keys
    /// parsed, remote key sets attached (and, inside a Tokio runtime, fetched in the
    /// background so the first request finds them).
    pub fn build(auth: &Auth, state: &AuthState) -> Result<Self, AuthBuildError> {
        let shared = &state.shared;
        let sources = sources_label(auth);
        let when = compile_all(&auth.when, "when")?;
        let methods = auth
            .authentication
            .iter()
            .map(|m| compile_method(m, shared, &sources))
            .collect::<Result<Vec<_>, _>>()?;
        // External rules run in the enforcer (module `external`): they need the snapshot's
        // backends and the request body.
        let rules = auth
            .authorization
            .iter()
            .filter(|r| r.external.is_none())
            .map(|r| {
                let ctx = format!("authorization.{}", r.name);
                Ok(CompiledRule {
                    name: r.name.as_str().into(),
                    policy: policy_label(&r.policy, &sources),
                    counted: RuleCounters::default(),
                    predicate: compile(&r.predicate, &ctx)?,
                    when: compile_all(&r.when, &format!("{ctx}.when"))?,
                })
            })
            .collect::<Result<Vec<_>, AuthBuildError>>()?;
        let success_headers = auth
            .success_headers
            .iter()
            .map(|(name, expr)| {
                let header = HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
                    .map_err(|_| AuthBuildError::SuccessHeader(name.clone()))?;
                Ok((header, compile(expr, &format!("successHeaders.{name}"))?))
            })
            .collect::<Result<Vec<_>, AuthBuildError>>()?;
        let challenges = challenges(&methods, &shared.options.realm);
        let unauthenticated = DenyTemplate::new(&auth.unauthenticated, &challenges)?;
        let unauthorized = DenyTemplate::new(&auth.unauthorized, &[])?;
        // Only a policy that compiled fetches anything.
        for m in &methods {
            if let Verifier::Jwt(v) = &m.verifier {
                v.prefetch(shared);
            }
        }
        Ok(Self {
            shared: shared.clone(),
            policies: counted::policies(auth),
            whole: WholeCounters::default(),
            sources,
            when,
            methods,
            rules,
            success_headers,
            unauthenticated,
            unauthorized,
        })
    }

    /// Whether the policy's own `when` holds for the request (else it neither authenticates
    /// nor denies, and its external rules do not run either).
    pub fn applies(&self, act: &Activation<'_>) -> bool {
        self.when.iter().all(|w| w.eval_bool(act))
    }

    /// Removes every success header name from `headers`. [`Self::check`] does this itself;
    /// call it before building the request's [`Activation`] too if expressions must not see
    /// the client's values of those headers.
    pub fn strip_success_headers(&self, headers: &mut HeaderMap) {
        for (name, _) in &self.success_headers {
            headers.remove(name);
        }
    }

    /// Authenticates and authorizes one request. `peer_cert` is the DER of the client
    /// certificate the TLS layer verified (`None` without one); `scheme` (`http` or
    /// `https`) makes the OIDC redirect URI. On
    /// [`AuthOutcome::Allowed`], `act` carries `auth.identity` and `parts` the success
    /// headers; the client's values of those headers are removed in every case.
    pub async fn check(
        &self,
        parts: &mut Parts,
        peer_cert: Option<&[u8]>,
        scheme: &str,
        act: &mut Activation<'_>,
    ) -> AuthOutcome {
        self.strip_success_headers(&mut parts.headers);
        if let Some(answer) = self.oidc_endpoint(parts, scheme).await {
            return AuthOutcome::Denied(answer);
        }
        if !self.when.iter().all(|w| w.eval_bool(act)) {
            self.shared
                .metrics
                .outcome(MethodKind::None, Outcome::Skipped);
            for c in &self.whole.skipped {
                c.inc();
            }
            return AuthOutcome::Allowed(Authenticated::anonymous());
        }
        let who = match self.authenticate(parts, peer_cert, act).await {
            Ok(who) => who,
            Err((kind, outcome)) => {
                if let Some(login) = self.oidc_login(parts, scheme, outcome, act).await {
                    return AuthOutcome::Denied(login);
                }
                self.shared.metrics.outcome(kind, outcome);
                return AuthOutcome::Denied(self.unauthenticated.denial(outcome));
            }
        };
        act.set_identity(&who.identity);
        for rule in &self.rules {
            if !rule.when.iter().all(|w| w.eval_bool(act)) {
                continue;
            }
            if !rule.predicate.eval_bool(act) {
                tracing::debug!(policy = %rule.policy, rule = %rule.name, "auth: authorization denied");
                rule.counted.forbidden.inc();
                self.shared.metrics.outcome(who.kind, Outcome::Forbidden);
                return AuthOutcome::Denied(self.unauthorized.denial(Outcome::Forbidden));
            }
            rule.counted.allowed.inc();
        }
        for (name, expr) in &self.success_headers {
            match expr.eval_string(act).map(HeaderValue::try_from) {
                Some(Ok(v)) => {
                    parts.headers.insert(name.clone(), v);
                }
                _ => {
                    tracing::debug!(policy = %self.sources, header = %name, "auth: success header has no value")
                }
            }
        }
        self.shared.metrics.outcome(who.kind, Outcome::Allowed);
        AuthOutcome::Allowed(who)
    }

    /// Step 2: the first method that verifies, or the (method kind, outcome) to count.
    async fn authenticate(
        &self,
        parts: &Parts,
        peer_cert: Option<&[u8]>,
        act: &Activation<'_>,
    ) -> Result<Authenticated, (MethodKind, Outcome)> {
        if self.methods.is_empty() {
            return Ok(Authenticated::anonymous());
        }
        let query = parts.uri.query();
        // What a failure is counted as: an error wins, then the first method that was shown
        // a credential, then the first method tried.
        let mut error: Option<&CompiledMethod> = None;
        let mut presented: Option<&CompiledMethod> = None;
        let mut tried: Option<&CompiledMethod> = None;
        let mut set_cookies = Vec::new();
        for m in &self.methods {
            if !m.when.iter().all(|w| w.eval_bool(act)) {
                continue;
            }
            tried.get_or_insert(m);
            let result = match &m.verifier {
                Verifier::X509 => match peer_cert {
                    None => continue,
                    Some(der) => x509::identity(der)
                        .map(Arc::new)
                        .map_err(|_| Failure::Invalid("unreadable client certificate")),
                },
                Verifier::Oidc(v) => match v.session(&parts.headers, &self.shared).await {
                    None => continue,
                    Some(r) => r.map(|(identity, cookies)| {
                        set_cookies = cookies;
                        identity
                    }),
                },
                verifier => {
                    let Some(credential) = m.source.extract(&parts.headers, query) else {
                        continue;
                    };
                    match verifier {
                        Verifier::ApiKey(v) => v
                            .verify(&credential)
                            .ok_or(Failure::Invalid("unknown API key")),
                        Verifier::Basic(v) => v.verify(&credential).await,
                        Verifier::Jwt(v) => v.verify(&credential, &self.shared).await,
                        Verifier::Introspection(v) => v.verify(&credential, &self.shared).await,
                        Verifier::X509 | Verifier::Oidc(_) => continue,
                    }
                }
            };
            presented.get_or_insert(m);
            match result {
                Ok(identity) => {
                    m.counted.authenticated.inc();
                    return Ok(Authenticated {
                        method: Some(m.name.clone()),
                        kind: m.kind,
                        identity,
                        set_cookies,
                    });
                }
                Err(Failure::Invalid(reason)) => {
                    tracing::debug!(policy = %m.policy, method = %m.name, reason, "auth: credential refused");
                }
                Err(Failure::Unavailable(e)) => {
                    // Per request, so debug: `tollgate_auth_requests_total{outcome="error"}`
                    // and the fetch/introspection counters are the signal.
                    tracing::debug!(policy = %m.policy, method = %m.name, error = %e, "auth: verification unavailable; denying");
                    error.get_or_insert(m);
                }
            }
        }
        Err(self.count_failure(error, presented.or(tried)))
    }
}

fn compile_method(
    m: &AuthnMethod,
    shared: &Arc<AuthShared>,
    sources: &Arc<str>,
) -> Result<CompiledMethod, AuthBuildError> {
    let (kind, verifier) = match &m.method {
        Method::ApiKey(keys) => (
            MethodKind::ApiKey,
            Verifier::ApiKey(ApiKeyVerifier::compile(keys, &m.name)?),
        ),
        Method::Basic(users) => (
            MethodKind::Basic,
            Verifier::Basic(BasicVerifier::compile(users)?),
        ),
        Method::Jwt(j) => {
            if jsonwebtoken::crypto::CryptoProvider::try_get_default().is_none() {
                return Err(AuthBuildError::NoCryptoProvider);
            }
            (
                MethodKind::Jwt,
                Verifier::Jwt(JwtVerifier::compile(j, &m.name, shared)?),
            )
        }
        Method::Introspection(i) => (
            MethodKind::Introspection,
            Verifier::Introspection(Introspector::compile(i, &m.name)?),
        ),
        Method::X509 => (MethodKind::X509, Verifier::X509),
        Method::Oidc(o) => (
            MethodKind::Oidc,
            Verifier::Oidc(OidcVerifier::compile(o, &m.name)?),
        ),
    };
    Ok(CompiledMethod {
        name: m.name.as_str().into(),
        policy: policy_label(&m.policy, sources),
        counted: MethodCounters::default(),
        kind,
        source: Source::compile(&m.credentials, &m.name)?,
        when: compile_all(&m.when, &format!("authentication.{}.when", m.name))?,
        verifier,
    })
}

/// One `WWW-Authenticate` value per distinct scheme, in method order (see the module docs).
fn challenges(methods: &[CompiledMethod], realm: &str) -> Vec<HeaderValue> {
    let realm: String = realm.chars().filter(|c| *c != '"' && *c != '\\').collect();
    let mut schemes: Vec<&str> = Vec::new();
    for m in methods {
        let scheme = match m.kind {
            MethodKind::Jwt | MethodKind::Introspection => m.source.scheme().unwrap_or("Bearer"),
            MethodKind::ApiKey => m.source.scheme().unwrap_or("APIKEY"),
            MethodKind::Basic => m.source.scheme().unwrap_or("Basic"),
            // OIDC sends browsers to log in; other clients get no scheme to answer.
            MethodKind::X509 | MethodKind::Oidc | MethodKind::None => continue,
        };
        if !schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme)) {
            schemes.push(scheme);
        }
    }
    schemes
        .into_iter()
        .filter_map(|s| HeaderValue::try_from(format!("{s} realm=\"{realm}\"")).ok())
        .collect()
}
