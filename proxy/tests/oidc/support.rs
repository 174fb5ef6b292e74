//! Fixtures of the OIDC tests: the real provider (e2e/oidc-provider.sh builds it), a proxy
//! whose route logs browsers in through it, and a scripted browser: a cookie jar (names,
//! values, paths, `Max-Age=0` removal) that follows redirects and fills in the provider's
//! login form as a user would.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use tollgate_api::policy::{Auth, AuthnMethod, Credentials, DenyResponse, Method as Verify, Oidc};
use tollgate_api::{ObjectKey, PolicySet, RouteTable};
use tollgate_proxy::{Proxy, ProxyOptions};

use crate::common::*;

pub const CLIENT_ID: &str = "shop";
pub const CLIENT_SECRET: &str = "shop-secret";
pub const USER: &str = "test-user@127.0.0.1";
pub const PASSWORD: &str = "verysecure";
/// The example provider's id of [`USER`] (the ID token's `sub`).
pub const USER_SUB: &str = "id1";
pub const OLD_KEY: &str = "the old cookie key: 32 bytes or more, really";
pub const NEW_KEY: &str = "the new cookie key: 32 bytes or more, really";
pub const COOKIE: &str = "tollgate_session";

// ---- the provider ----

/// The provider binary: `$TOLLGATE_OIDC_PROVIDER`, else the newest
/// `oidc-provider-*` under `$TOLLGATE_BIN_DIR` (default `$HOME/.cache/tollgate/bin`).
fn provider_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TOLLGATE_OIDC_PROVIDER") {
        return Some(PathBuf::from(p));
    }
    let dir = std::env::var_os("TOLLGATE_BIN_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tollgate/bin"))
        })?;
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("oidc-provider-") && !n.contains(".tmp.")
        })
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
}

/// A running provider, killed on drop.
pub struct Provider {
    pub issuer: String,
    _process: Killed,
}

/// Starts the provider (ID tokens living `id_token_lifetime`, Go syntax like `1h`), or `None`
/// after a loud message when it was never built.
pub fn provider(id_token_lifetime: &str) -> Option<Provider> {
    let Some(bin) = provider_binary() else {
        eprintln!(
            "\n*** SKIPPED: no OIDC provider binary; build it with `e2e/oidc-provider.sh build` \
             (e2e/test-all.sh does) ***\n"
        );
        return None;
    };
    let mut child = Command::new(&bin)
        .args([
            "-listen",
            "127.0.0.1:0",
            "-client",
            CLIENT_ID,
            "-secret",
            CLIENT_SECRET,
            "-id-token-lifetime",
            id_token_lifetime,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let issuer = line
        .strip_prefix("issuer ")
        .unwrap_or_else(|| panic!("provider said {line:?}"))
        .trim()
        .to_owned();
    Some(Provider {
        issuer,
        _process: Killed(child),
    })
}

// ---- the proxy ----

/// The `oidc` method for `issuer` with `keys` (first seals).
pub fn oidc_method(issuer: &str, keys: &[&str]) -> AuthnMethod {
    AuthnMethod {
        name: "browser".into(),
        policy: Default::default(),
        credentials: Credentials::Cookie {
            name: COOKIE.into(),
        },
        method: Verify::Oidc(Oidc {
            issuer: issuer.into(),
            client_id: CLIENT_ID.into(),
            client_secret: CLIENT_SECRET.into(),
            redirect_path: "/oauth2/callback".into(),
            logout_path: Some("/logout".into()),
            scopes: vec!["openid".into(), "offline_access".into()],
            cookie_name: COOKIE.into(),
            cookie_keys: keys.iter().map(|k| k.to_string()).collect(),
        }),
        when: vec![],
    }
}

/// A table routing everything to `app` behind the OIDC policy, which sets `x-user-sub` and
/// `x-user-iss` from the ID token's claims.
pub fn oidc_table(version: u64, app: &EchoBackend, issuer: &str, keys: &[&str]) -> RouteTable {
    let mut r = route("app", "/", vec![wb("app", 1)]);
    r.policy = Some("p".into());
    let mut t = table(
        version,
        vec![http_port(0, vec![r])],
        vec![("app", backend_of(&[app]))],
    );
    let auth = Auth {
        sources: vec![ObjectKey::new("shop", "login")],
        when: vec![],
        authentication: vec![oidc_method(issuer, keys)],
        authorization: vec![],
        success_headers: vec![
            ("x-user-sub".into(), "auth.identity.sub".into()),
            ("x-user-iss".into(), "auth.identity.iss".into()),
        ],
        unauthenticated: DenyResponse::unauthenticated(),
        unauthorized: DenyResponse::unauthorized(),
    };
    t.policies.insert(
        "p".into(),
        PolicySet {
            auth: Some(auth),
            rate_limits: vec![],
        },
    );
    t
}

/// A proxy serving [`oidc_table`]; its base URL.
pub async fn oidc_proxy(app: &EchoBackend, issuer: &str, keys: &[&str]) -> (Proxy, String) {
    let proxy = Proxy::new(ProxyOptions::default());
    proxy.apply(oidc_table(1, app, issuer, keys)).await.unwrap();
    let addr = proxy.local_addr(0).unwrap();
    (proxy, format!("http://{addr}"))
}

// ---- the browser ----

/// One cookie of the jar.
#[derive(Debug, Clone)]
pub struct Cookie {
    pub value: String,
    pub path: String,
}

/// A browser: one cookie jar for 127.0.0.1 (cookies ignore ports, as browsers do).
pub struct Browser {
    pub client: TestClient,
    pub jar: BTreeMap<String, Cookie>,
    /// Every URL requested, in order.
    pub visited: Vec<String>,
}

impl Browser {
    pub fn new() -> Self {
        Self {
            client: h1_client(),
            jar: BTreeMap::new(),
            visited: Vec::new(),
        }
    }

    /// One request as a page load (`Accept: text/html`), without following redirects.
    pub async fn request(&mut self, method: Method, url: &str, form: Option<String>) -> Answer {
        self.visited.push(url.to_owned());
        let path = url
            .splitn(4, '/')
            .nth(3)
            .map(|p| format!("/{}", p.split('?').next().unwrap_or("")))
            .unwrap_or_else(|| "/".into());
        let cookie = self
            .jar
            .iter()
            .filter(|(_, c)| path.starts_with(&c.path))
            .map(|(n, c)| format!("{n}={}", c.value))
            .collect::<Vec<_>>()
            .join("; ");
        let mut b = Request::builder()
            .method(method)
            .uri(url)
            .header("accept", "text/html,application/xhtml+xml");
        if !cookie.is_empty() {
            b = b.header("cookie", cookie);
        }
        let body = match form {
            Some(f) => {
                b = b.header("content-type", "application/x-www-form-urlencoded");
                Bytes::from(f)
            }
            None => Bytes::new(),
        };
        let a = send(&self.client, b.body(Full::new(body)).unwrap()).await;
        self.store(&a);
        a
    }

    /// Stores the answer's cookies (a `Max-Age=0` one removes).
    pub fn store(&mut self, a: &Answer) {
        for sc in a.headers.get_all("set-cookie") {
            let sc = sc.to_str().unwrap();
            let mut attrs = sc.split(';').map(str::trim);
            let (name, value) = attrs.next().unwrap().split_once('=').unwrap();
            let mut path = "/".to_owned();
            let mut gone = false;
            for a in attrs {
                if let Some(p) = a.strip_prefix("Path=") {
                    path = p.to_owned();
                }
                if a == "Max-Age=0" {
                    gone = true;
                }
            }
            if gone {
                self.jar.remove(name);
            } else {
                self.jar.insert(
                    name.to_owned(),
                    Cookie {
                        value: value.to_owned(),
                        path,
                    },
                );
            }
        }
    }

    /// GET `url` and follow redirects (up to 10); the last answer and its URL.
    pub async fn follow(&mut self, url: &str) -> (Answer, String) {
        let mut url = url.to_owned();
        for _ in 0..10 {
            let a = self.request(Method::GET, &url, None).await;
            if !a.status.is_redirection() {
                return (a, url);
            }
            url = resolve(&url, a.headers["location"].to_str().unwrap());
        }
        panic!("too many redirects; visited {:?}", self.visited);
    }

    /// From a page that redirects to the provider, through its login form as `user`, to the
    /// callback's answer (not followed): the answer and the callback URL.
    pub async fn log_in(&mut self, start: &str, user: &str, password: &str) -> (Answer, String) {
        let (form_page, form_url) = self.follow(start).await;
        assert_eq!(form_page.status, StatusCode::OK, "the login form");
        let html = String::from_utf8_lossy(&form_page.body).into_owned();
        let id = html
            .split("name=\"id\" value=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or_else(|| panic!("no id field in the login form: {html}"))
            .to_owned();
        let action = resolve(&form_url, "/login/username");
        let form = form_urlencoded::Serializer::new(String::new())
            .append_pair("username", user)
            .append_pair("password", password)
            .append_pair("id", &id)
            .finish();
        let mut a = self.request(Method::POST, &action, Some(form)).await;
        let mut url = action;
        // The provider's own redirects, up to the one to our callback.
        for _ in 0..5 {
            assert!(a.status.is_redirection(), "{}: {:?}", a.status, a.body);
            url = resolve(&url, a.headers["location"].to_str().unwrap());
            a = self.request(Method::GET, &url, None).await;
            if url.contains("/oauth2/callback") {
                return (a, url);
            }
        }
        panic!("never got back to the callback; visited {:?}", self.visited);
    }
}

/// `location` resolved against `base` (absolute, or a path on the same origin).
pub fn resolve(base: &str, location: &str) -> String {
    if location.starts_with("http://") || location.starts_with("https://") {
        return location.to_owned();
    }
    let origin: String = base.splitn(4, '/').take(3).collect::<Vec<_>>().join("/");
    format!("{origin}{location}")
}

/// A request as an API client (no `text/html`), with the jar's session cookies.
pub async fn api_get(b: &Browser, url: &str) -> Answer {
    let cookie = b
        .jar
        .iter()
        .filter(|(_, c)| c.path == "/")
        .map(|(n, c)| format!("{n}={}", c.value))
        .collect::<Vec<_>>()
        .join("; ");
    let mut r = Request::get(url).header("accept", "application/json");
    if !cookie.is_empty() {
        r = r.header("cookie", cookie);
    }
    send(&b.client, r.body(Full::default()).unwrap()).await
}
