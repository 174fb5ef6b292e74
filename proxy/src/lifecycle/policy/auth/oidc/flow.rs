//! The login flow's steps. In: the compiled method, the request head and its scheme, the
//! shared HTTP client and key sets. Out: the answers the proxy gives itself (the redirect to
//! the issuer, the callback's redirect back with the session cookie, the logout's redirect),
//! and refreshed sessions.
//!
//! Redirects back go only to a path on the same host (`/` and not `//` or `/\`): the
//! return URL comes from the request that started the login and is sealed in the login
//! cookie, and is checked again when it comes back (no open redirect).

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION, SET_COOKIE};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, StatusCode};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::seal::{clear_login, clear_session, request_cookies, set_login, set_session};
use super::session::{
    Client, Login, Session, TokenError, exp_of, session_exp, token_call, unix_now,
};
use super::{OidcVerifier, origin};
use crate::lifecycle::policy::auth::{AuthShared, CompiledAuth, Denial, Failure, Outcome};

/// How long a login may take, from the redirect to the issuer to the callback (seconds).
const LOGIN_MAX_AGE: u64 = 600;

/// An answer of the flow.
fn answer(status: StatusCode, headers: HeaderMap, body: &'static str, outcome: Outcome) -> Denial {
    let mut headers = headers;
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Denial {
        status,
        headers,
        body: Bytes::from_static(body.as_bytes()),
        outcome,
    }
}

/// A 302 to `location` with `cookies` set.
fn redirect(location: &str, cookies: Vec<HeaderValue>, outcome: Outcome) -> Option<Denial> {
    let mut headers = HeaderMap::new();
    headers.insert(LOCATION, HeaderValue::try_from(location).ok()?);
    for c in cookies {
        headers.append(SET_COOKIE, c);
    }
    Some(answer(StatusCode::FOUND, headers, "Found\n", outcome))
}

/// The 502 of a callback whose issuer did not answer.
fn bad_gateway() -> Denial {
    answer(
        StatusCode::BAD_GATEWAY,
        HeaderMap::new(),
        "Bad Gateway: the identity provider could not be reached\n",
        Outcome::Error,
    )
}

/// A path on this host: `/`-rooted, not protocol-relative, no backslash (browsers read `\`
/// as `/`), no control characters.
fn same_site_path(p: &str) -> bool {
    p.starts_with('/')
        && !p.starts_with("//")
        && !p.contains('\\')
        && !p.bytes().any(|b| b.is_ascii_control())
}

/// `n` random bytes, base64url.
fn random(n: usize) -> Option<String> {
    let mut b = vec![0u8; n];
    SystemRandom::new().fill(&mut b).ok()?;
    Some(URL_SAFE_NO_PAD.encode(b))
}

impl OidcVerifier {
    fn client(&self) -> Client<'_> {
        Client {
            id: &self.inner.client_id,
            secret: &self.inner.client_secret,
        }
    }

    /// The 302 to the issuer's authorization endpoint, with the login cookie.
    pub(super) async fn login_redirect(
        &self,
        parts: &Parts,
        scheme: &str,
        shared: &Arc<AuthShared>,
    ) -> Result<Denial, String> {
        let origin = origin(parts, scheme).ok_or("the request names no host")?;
        let provider = self.inner.discovery.provider(shared).await?;
        let return_to = parts
            .uri
            .path_and_query()
            .map(|pq| pq.as_str())
            .filter(|p| same_site_path(p))
            .unwrap_or("/");
        let no_random = || "no randomness from the OS".to_owned();
        let login = Login {
            state: random(24).ok_or_else(no_random)?,
            nonce: random(24).ok_or_else(no_random)?,
            verifier: random(32).ok_or_else(no_random)?,
            return_to: return_to.to_owned(),
            started: unix_now(),
        };
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(login.verifier.as_bytes()));
        let redirect_uri = format!("{origin}{}", self.inner.redirect_path);
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("response_type", "code")
            .append_pair("client_id", &self.inner.client_id)
            .append_pair("redirect_uri", &redirect_uri)
            .append_pair("scope", &self.inner.scopes)
            .append_pair("state", &login.state)
            .append_pair("nonce", &login.nonce)
            .append_pair("code_challenge", &challenge)
            .append_pair("code_challenge_method", "S256")
            .finish();
        let sep = if provider.authorization_endpoint.contains('?') {
            '&'
        } else {
            '?'
        };
        let location = format!("{}{sep}{query}", provider.authorization_endpoint);
        let payload = serde_json::to_vec(&login).map_err(|e| e.to_string())?;
        let sealed = self
            .inner
            .keys
            .seal(&self.inner.login_aad, &payload)
            .ok_or_else(no_random)?;
        let cookie = set_login(
            &self.inner.cookie_name,
            &sealed,
            &self.inner.redirect_path,
            LOGIN_MAX_AGE,
        )
        .ok_or("login cookie is not a header value")?;
        redirect(&location, vec![cookie], Outcome::Unauthenticated)
            .ok_or_else(|| "authorization URL is not a header value".into())
    }

    /// The redirect path: the issuer sends the browser back with a code.
    pub(super) async fn callback(
        &self,
        parts: &Parts,
        scheme: &str,
        auth: &CompiledAuth,
    ) -> Denial {
        let refused = |reason: &'static str| {
            tracing::debug!(policy = %auth.sources, method = %self.inner.method, reason, "auth: OIDC callback refused");
            auth.unauthenticated.denial(Outcome::Unauthenticated)
        };
        let mut code = None;
        let mut state = None;
        let mut error = false;
        for (k, v) in form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes()) {
            match &*k {
                "code" => code = Some(v.into_owned()),
                "state" => state = Some(v.into_owned()),
                "error" => error = true,
                _ => {}
            }
        }
        let cookies = request_cookies(&parts.headers, &self.inner.cookie_name);
        let Some(login) = cookies
            .login
            .as_deref()
            .and_then(|s| self.inner.keys.open(&self.inner.login_aad, s))
            .and_then(|p| serde_json::from_slice::<Login>(&p).ok())
        else {
            return refused("no login in progress (login cookie missing or does not open)");
        };
        let Some(state) = state else {
            return refused("no state");
        };
        if !bool::from(state.as_bytes().ct_eq(login.state.as_bytes())) {
            return refused("state does not match the login in progress");
        }
        if unix_now().saturating_sub(login.started) > LOGIN_MAX_AGE {
            return refused("login took too long");
        }
        if error {
            return refused("the issuer answered with an error");
        }
        let Some(code) = code else {
            return refused("no code");
        };
        let Some(origin) = origin(parts, scheme) else {
            return refused("the request names no host");
        };
        let shared = &auth.shared;
        let provider = match self.inner.discovery.provider(shared).await {
            Ok(p) => p,
            Err(_) => return bad_gateway(),
        };
        let redirect_uri = format!("{origin}{}", self.inner.redirect_path);
        let params = [
            ("grant_type", "authorization_code"),
            ("code", code.as_str()),
            ("redirect_uri", redirect_uri.as_str()),
            ("code_verifier", login.verifier.as_str()),
        ];
        let tokens = match token_call(&provider, &self.client(), &params, shared).await {
            Ok(t) => t,
            Err(TokenError::Refused(e)) => {
                tracing::debug!(policy = %auth.sources, method = %self.inner.method, error = %e, "auth: OIDC code refused");
                return refused("the token endpoint refused the code");
            }
            Err(e @ TokenError::Unavailable(_)) => {
                tracing::warn!(policy = %auth.sources, method = %self.inner.method, error = %e, "auth: OIDC token endpoint");
                return bad_gateway();
            }
        };
        let Some(id_token) = tokens.id_token else {
            return refused("no ID token in the token response");
        };
        let claims = match provider.verifier.verify(&id_token, shared).await {
            Ok(c) => c,
            Err(Failure::Unavailable(_)) => return bad_gateway(),
            Err(Failure::Invalid(reason)) => return refused(reason),
        };
        let nonce_ok = claims
            .get("nonce")
            .and_then(|n| n.as_str())
            .is_some_and(|n| bool::from(n.as_bytes().ct_eq(login.nonce.as_bytes())));
        if !nonce_ok {
            return refused("ID token nonce does not match");
        }
        let Some(exp) = session_exp(&claims, tokens.expires_in) else {
            return refused("ID token without exp");
        };
        let session = Session {
            claims,
            exp,
            refresh_token: tokens.refresh_token,
            id_token: Some(id_token),
        };
        let Some(mut cookies_out) = self.seal_session(&session, cookies.chunks) else {
            return refused("session too large for its cookies");
        };
        cookies_out.extend(clear_login(
            &self.inner.cookie_name,
            &self.inner.redirect_path,
        ));
        let back = if same_site_path(&login.return_to) {
            login.return_to.as_str()
        } else {
            "/"
        };
        redirect(back, cookies_out, Outcome::Allowed)
            .unwrap_or_else(|| refused("return URL is not a header value"))
    }

    /// The logout path: the session cookies cleared, then the issuer's end-session endpoint
    /// (when discovered) or `/`. Never fails: a local logout needs nothing of the issuer.
    pub(super) async fn logout(
        &self,
        parts: &Parts,
        scheme: &str,
        shared: &Arc<AuthShared>,
    ) -> Denial {
        let cookies = request_cookies(&parts.headers, &self.inner.cookie_name);
        let id_token = cookies
            .session
            .as_deref()
            .and_then(|s| self.open_session(s))
            .and_then(|s| s.id_token);
        let mut clear = clear_session(&self.inner.cookie_name, cookies.chunks);
        if cookies.login.is_some() {
            clear.extend(clear_login(
                &self.inner.cookie_name,
                &self.inner.redirect_path,
            ));
        }
        let mut location = "/".to_owned();
        if let (Ok(provider), Some(origin)) = (
            self.inner.discovery.provider(shared).await,
            origin(parts, scheme),
        ) && let Some(end) = &provider.end_session_endpoint
        {
            let mut q = form_urlencoded::Serializer::new(String::new());
            if let Some(t) = &id_token {
                q.append_pair("id_token_hint", t);
            }
            q.append_pair("client_id", &self.inner.client_id);
            q.append_pair("post_logout_redirect_uri", &format!("{origin}/"));
            let sep = if end.contains('?') { '&' } else { '?' };
            location = format!("{end}{sep}{}", q.finish());
        }
        redirect(&location, clear.clone(), Outcome::Allowed)
            .or_else(|| redirect("/", clear, Outcome::Allowed))
            .unwrap_or_else(bad_gateway)
    }

    /// A new session from the refresh token of an expired one, with its `Set-Cookie` values
    /// (`had` = chunks the client holds).
    pub(super) async fn refresh(
        &self,
        old: Session,
        had: usize,
        shared: &Arc<AuthShared>,
    ) -> Result<(Arc<serde_json::Value>, Vec<HeaderValue>), Failure> {
        let Some(refresh_token) = old.refresh_token.as_deref() else {
            return Err(Failure::Invalid("session expired"));
        };
        let provider = self
            .inner
            .discovery
            .provider(shared)
            .await
            .map_err(Failure::Unavailable)?;
        let params = [
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh_token),
            ("scope", self.inner.scopes.as_str()),
        ];
        let tokens = match token_call(&provider, &self.client(), &params, shared).await {
            Ok(t) => t,
            Err(TokenError::Refused(_)) => return Err(Failure::Invalid("refresh refused")),
            Err(e @ TokenError::Unavailable(_)) => return Err(Failure::Unavailable(e.to_string())),
        };
        let (claims, id_token) = match tokens.id_token {
            Some(t) => {
                let claims = provider.verifier.verify(&t, shared).await?;
                // OpenID Connect Core §12.2: the same user.
                if claims.get("sub") != old.claims.get("sub") {
                    return Err(Failure::Invalid("refreshed ID token names another subject"));
                }
                (claims, Some(t))
            }
            None => (old.claims.clone(), old.id_token.clone()),
        };
        let exp = match (tokens.expires_in, exp_of(&claims)) {
            (_, Some(e)) if e > unix_now() => session_exp(&claims, tokens.expires_in),
            (Some(secs), _) => Some(unix_now().saturating_add(secs)),
            _ => None,
        }
        .filter(|e| *e > unix_now())
        .ok_or(Failure::Invalid("refresh gave no current expiry"))?;
        let session = Session {
            claims,
            exp,
            refresh_token: tokens.refresh_token.or(old.refresh_token),
            id_token,
        };
        let cookies = self
            .seal_session(&session, had)
            .ok_or(Failure::Invalid("session too large for its cookies"))?;
        Ok((session.claims, cookies))
    }

    /// `Set-Cookie` values for `session`.
    fn seal_session(&self, session: &Session, had: usize) -> Option<Vec<HeaderValue>> {
        let payload = serde_json::to_vec(session).ok()?;
        let sealed = self.inner.keys.seal(&self.inner.session_aad, &payload)?;
        set_session(&self.inner.cookie_name, &sealed, had)
    }
}
