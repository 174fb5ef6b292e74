//! OpenID Connect login (the `oidc` authentication method). In: a
//! [`tollgate_api::policy::Oidc`] (compiled once per table) and, per request, the request head
//! and its scheme. Out: the session's identity (the ID token's claims) with `Set-Cookie`
//! values when the session was refreshed, or an answer the proxy gives itself: the redirect
//! to the issuer, the callback's redirect back, the logout's redirect.
//!
//! ```text
//! GET /page (no valid session, Accept: text/html)
//!   → 302 <authorization_endpoint>?response_type=code&state&nonce&code_challenge (S256)
//!     + Set-Cookie <name>_login (sealed: state, nonce, PKCE verifier, /page), Path=<redirectPath>
//! GET <redirectPath>?code&state      (the issuer sends the browser back)
//!   → state checked against the login cookie, code exchanged at the token endpoint (with
//!     the verifier and the client secret), ID token verified (JWKS, iss, aud, exp, nonce)
//!   → 302 /page + Set-Cookie <name> (sealed session) and the login cookie cleared
//! GET /page (session cookie)         → opened, not expired: allowed, auth.identity = claims
//!                                      expired: refreshed with the refresh token, the new
//!                                      session set on the answer; else as without session
//! GET <logoutPath>                   → session cookies cleared, 302 to the issuer's
//!                                      end_session_endpoint (id_token_hint,
//!                                      post_logout_redirect_uri = <scheme>://<host>/), or /
//! ```
//!
//! A request that is not a browser navigation (not GET or HEAD, or no `text/html` in
//! `Accept`: XHR, fetch, API clients) is never redirected: without a valid session it gets
//! the policy's `unauthenticated` answer (401). Everything the flow depends on failing
//! (discovery, JWKS, token endpoint) denies: the callback answers 502, any other request the
//! `unauthenticated` answer; nothing passes without a session that opened and has not expired.
//!
//! The login cookie keeps the state in the browser, not in the proxy, so any replica can
//! finish a login another began. One login at a time per browser: a second tab starting
//! another replaces the first's cookie, and the first's callback is refused.

mod discovery;
mod flow;
mod seal;
mod session;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::header::{ACCEPT, HOST};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method};
use sha2::{Digest, Sha256};
use tollgate_api::policy::Oidc;

use self::discovery::Discovery;
use self::seal::{CookieKeys, request_cookies};
use self::session::{Session, unix_now};
use super::Verifier;
use super::{AuthBuildError, AuthShared, CompiledAuth, Denial, Failure, MethodKind, Outcome};
use crate::lifecycle::policy::cel::Activation;

/// The compiled `oidc` method. Cheap to clone.
#[derive(Clone)]
pub(crate) struct OidcVerifier {
    inner: Arc<Inner>,
}

struct Inner {
    method: String,
    client_id: String,
    client_secret: String,
    redirect_path: String,
    logout_path: Option<String>,
    /// Space-separated.
    scopes: String,
    cookie_name: String,
    keys: CookieKeys,
    /// Associated data of session and login cookies: kind, issuer, client id, cookie name.
    session_aad: Vec<u8>,
    login_aad: Vec<u8>,
    discovery: Discovery,
    /// Refreshes in flight or done lately, by SHA-256 of the expired session cookie.
    refreshes: Mutex<HashMap<[u8; 32], Flight>>,
    /// Sessions opened lately, by their sealed value (compared in full): a repeat request
    /// costs a hash and a comparison of the cookie instead of opening it and parsing the
    /// claims. Per compiled method, so a table with other keys starts empty.
    opened: quick_cache::sync::Cache<Box<str>, Opened>,
}

/// A session opened and found well-formed.
#[derive(Clone)]
struct Opened {
    claims: Arc<serde_json::Value>,
    exp: u64,
}

/// What a refresh gives: the identity and the new session's `Set-Cookie` values.
type Refreshed = Result<(Arc<serde_json::Value>, Vec<HeaderValue>), Failure>;

/// One refresh, shared by every request carrying the same expired cookie meanwhile.
struct Flight {
    started: Instant,
    result: Arc<tokio::sync::OnceCell<Refreshed>>,
}

/// Opened sessions kept per method.
const OPENED_CAPACITY: usize = 10_000;

/// How long a refresh's result answers requests with the cookie it replaced: the requests a
/// page makes at once (its scripts, images, API calls) all carry the expired cookie, and the
/// issuer may accept its refresh token only once (rotation), so they share the first
/// refresh instead of failing after it.
const REFRESH_SHARED_FOR: Duration = Duration::from_secs(30);

impl std::fmt::Debug for OidcVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcVerifier")
            .field("method", &self.inner.method)
            .field("client_id", &self.inner.client_id)
            .field("redirect_path", &self.inner.redirect_path)
            .field("cookie_name", &self.inner.cookie_name)
            .finish_non_exhaustive()
    }
}

/// A path the method answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Callback,
    Logout,
}

impl OidcVerifier {
    /// Compiles a method: keys derived, discovery URL checked (nothing is fetched yet).
    pub fn compile(o: &Oidc, method: &str) -> Result<Self, AuthBuildError> {
        let keys = CookieKeys::derive(&o.cookie_keys).map_err(|e| AuthBuildError::Jwks {
            method: method.to_owned(),
            message: e.to_string(),
        })?;
        let aad = |kind: &str| {
            [kind, &o.issuer, &o.client_id, &o.cookie_name]
                .join("\0")
                .into_bytes()
        };
        Ok(Self {
            inner: Arc::new(Inner {
                method: method.to_owned(),
                client_id: o.client_id.clone(),
                client_secret: o.client_secret.clone(),
                redirect_path: o.redirect_path.clone(),
                logout_path: o.logout_path.clone(),
                scopes: o.scopes.join(" "),
                cookie_name: o.cookie_name.clone(),
                session_aad: aad("tollgate oidc session"),
                login_aad: aad("tollgate oidc login"),
                keys,
                discovery: Discovery::new(&o.issuer, &o.client_id, method)?,
                refreshes: Mutex::new(HashMap::new()),
                opened: quick_cache::sync::Cache::new(OPENED_CAPACITY),
            }),
        })
    }

    fn endpoint(&self, path: &str) -> Option<Endpoint> {
        if path == self.inner.redirect_path {
            Some(Endpoint::Callback)
        } else if self.inner.logout_path.as_deref() == Some(path) {
            Some(Endpoint::Logout)
        } else {
            None
        }
    }

    /// The session of the request: `None` without a session cookie; the identity (and the
    /// `Set-Cookie` values of a refreshed session) when it opens and is current or could be
    /// refreshed; else why not.
    pub async fn session(
        &self,
        headers: &HeaderMap,
        shared: &Arc<AuthShared>,
    ) -> Option<Result<(Arc<serde_json::Value>, Vec<HeaderValue>), Failure>> {
        let cookies = request_cookies(headers, &self.inner.cookie_name);
        let sealed = cookies.session?;
        let now = unix_now();
        if let Some(hit) = self.inner.opened.get(sealed.as_str())
            && now < hit.exp
        {
            return Some(Ok((hit.claims, Vec::new())));
        }
        let Some(session) = self.open_session(&sealed) else {
            return Some(Err(Failure::Invalid("session cookie does not open")));
        };
        if now < session.exp {
            self.inner.opened.insert(
                sealed.into_boxed_str(),
                Opened {
                    claims: session.claims.clone(),
                    exp: session.exp,
                },
            );
            return Some(Ok((session.claims, Vec::new())));
        }
        if session.refresh_token.is_none() {
            return Some(Err(Failure::Invalid("session expired")));
        }
        let key: [u8; 32] = Sha256::digest(sealed.as_bytes()).into();
        let flight = {
            let mut m = self
                .inner
                .refreshes
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            m.retain(|_, f| f.started.elapsed() < REFRESH_SHARED_FOR);
            m.entry(key)
                .or_insert_with(|| Flight {
                    started: Instant::now(),
                    result: Arc::new(tokio::sync::OnceCell::new()),
                })
                .result
                .clone()
        };
        let chunks = cookies.chunks;
        Some(
            flight
                .get_or_init(|| self.refresh(session, chunks, shared))
                .await
                .clone(),
        )
    }

    fn open_session(&self, sealed: &str) -> Option<Session> {
        let plain = self.inner.keys.open(&self.inner.session_aad, sealed)?;
        serde_json::from_slice(&plain).ok()
    }
}

/// True for a request a browser makes to show a page: it can follow a login redirect.
fn is_navigation(parts: &Parts) -> bool {
    (parts.method == Method::GET || parts.method == Method::HEAD)
        && parts
            .headers
            .get_all(ACCEPT)
            .iter()
            .any(|v| v.to_str().is_ok_and(|s| s.contains("text/html")))
}

/// `<scheme>://<host>`, from the normalized `Host` the intake set; `None` without one.
fn origin(parts: &Parts, scheme: &str) -> Option<String> {
    let host = parts.headers.get(HOST)?.to_str().ok()?;
    (!host.is_empty()).then(|| format!("{scheme}://{host}"))
}

impl CompiledAuth {
    /// The answer to a request for a redirect or logout path of one of the policy's `oidc`
    /// methods (whatever the `when` predicates say: the paths belong to the login flow).
    pub(super) async fn oidc_endpoint(&self, parts: &Parts, scheme: &str) -> Option<Denial> {
        let path = parts.uri.path();
        let (v, endpoint) = self.methods.iter().find_map(|m| match &m.verifier {
            Verifier::Oidc(v) => v.endpoint(path).map(|e| (v, e)),
            _ => None,
        })?;
        let answer = match endpoint {
            Endpoint::Callback => v.callback(parts, scheme, self).await,
            Endpoint::Logout => v.logout(parts, scheme, &self.shared).await,
        };
        self.shared
            .metrics
            .outcome(MethodKind::Oidc, answer.outcome);
        Some(answer)
    }

    /// For a browser navigation that no method authenticated (and not because verification
    /// could not run), the redirect to the issuer of the first `oidc` method that applies.
    /// When discovery fails, the policy's `unauthenticated` answer counted as an error.
    pub(super) async fn oidc_login(
        &self,
        parts: &Parts,
        scheme: &str,
        outcome: Outcome,
        act: &Activation<'_>,
    ) -> Option<Denial> {
        if outcome == Outcome::Error || !is_navigation(parts) {
            return None;
        }
        let v = self.methods.iter().find_map(|m| match &m.verifier {
            Verifier::Oidc(v) if m.when.iter().all(|w| w.eval_bool(act)) => Some(v),
            _ => None,
        })?;
        let answer = match v.login_redirect(parts, scheme, &self.shared).await {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(policy = %self.sources, method = %v.inner.method, error = %e, "auth: OIDC login cannot start; denying");
                self.unauthenticated.denial(Outcome::Error)
            }
        };
        self.shared
            .metrics
            .outcome(MethodKind::Oidc, answer.outcome);
        Some(answer)
    }
}
