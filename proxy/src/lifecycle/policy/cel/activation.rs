//! What expressions read of a request: the [`Activation`], a snapshot of the request taken
//! once per request, and [`Needs`], what the expressions of a policy set read of it.
//!
//! The snapshot borrows nothing from the request (authentication changes the request's
//! headers while it is alive, and expressions must keep seeing them as they were), so it
//! copies what it holds: the method (without allocating for the standard ones), host, path
//! and scheme (one string, only when an expression reads `request`), and the headers: none,
//! the few the expressions name (values shared, not copied), or the whole map when an
//! interpreted expression reads `request`. The CEL context is built from it on first use.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};

use cel::{Context, Value};
use http::{HeaderMap, HeaderName, HeaderValue, Method};

use super::fast::{Path, Val};
use super::{ALL_VARS, AUTH, ENV, Expr, REQUEST, SOURCE, StackStr, json_to_value};

/// What a request exposes to expressions.
#[derive(Debug, Clone, Copy)]
pub struct Attrs<'a> {
    /// Method.
    pub method: &'a str,
    /// Host without port, lower-case.
    pub host: &'a str,
    /// Path with query.
    pub path: &'a str,
    /// `http` or `https`.
    pub scheme: &'a str,
    /// Request headers.
    pub headers: &'a HeaderMap,
    /// The client (TCP peer).
    pub source: SocketAddr,
}

/// What a set of expressions reads from a request: the variables, and the headers (by name,
/// or all of them when an interpreted expression reads `request`). Computed once per policy
/// set; an [`Activation`] built [with](Activation::with_needs) it copies only that.
#[derive(Debug, Clone, Default)]
pub struct Needs {
    pub(super) vars: u8,
    pub(super) headers: Vec<HeaderName>,
    pub(super) all_headers: bool,
}

impl Needs {
    /// What `e` reads, added.
    pub fn add(&mut self, e: &Expr) {
        let c = &e.inner;
        self.vars |= c.vars;
        if c.fast.is_none() && c.int.is_none() && c.vars & REQUEST != 0 {
            self.all_headers = true;
        }
        for h in &c.headers {
            if !self.headers.contains(h) {
                self.headers.push(h.clone());
            }
        }
    }

    /// Everything (what [`Activation::new`] captures).
    pub fn everything() -> Self {
        Self {
            vars: ALL_VARS,
            headers: Vec::new(),
            all_headers: true,
        }
    }
}

impl<'e> FromIterator<&'e Expr> for Needs {
    fn from_iter<I: IntoIterator<Item = &'e Expr>>(iter: I) -> Self {
        let mut needs = Needs::default();
        for e in iter {
            needs.add(e);
        }
        needs
    }
}

/// What [`Activation::set_identity`] accepts: a JSON value (copied once) or a shared one.
pub trait IdentityValue {
    /// The value, shared.
    fn shared(&self) -> Arc<serde_json::Value>;
}

impl IdentityValue for serde_json::Value {
    fn shared(&self) -> Arc<serde_json::Value> {
        Arc::new(self.clone())
    }
}

impl IdentityValue for Arc<serde_json::Value> {
    fn shared(&self) -> Arc<serde_json::Value> {
        Arc::clone(self)
    }
}

/// The variables of one request, captured once and shared by every expression evaluated for
/// it. It borrows nothing from the request: authentication may change the request's headers
/// while it is alive, and expressions keep seeing them as they were.
pub struct Activation<'a> {
    method: Method,
    /// Host, then path, then scheme; empty when no expression reads `request`.
    pub(super) text: String,
    host_end: usize,
    path_end: usize,
    source: SocketAddr,
    /// `source.address` as text, when the caller had it already (see
    /// [`Activation::set_source_address`]).
    source_address: Option<&'a str>,
    headers: Headers<'a>,
    /// `auth.identity`; `None` is null.
    identity: Option<Arc<serde_json::Value>>,
    /// Variables captured ([`REQUEST`] | [`SOURCE`] | [`AUTH`]).
    pub(super) vars: u8,
    /// Built by the first interpreted expression.
    context: OnceLock<Context<'static, 'static>>,
}

/// The request headers as expressions see them.
enum Headers<'a> {
    /// All of them.
    All(HeaderMap),
    /// The values (as CEL sees them: `None` when absent) of the named headers only.
    Named {
        names: &'a [HeaderName],
        values: Vec<Option<HeaderText>>,
    },
}

/// One header's value for CEL: its text values joined with `,`.
enum HeaderText {
    One(HeaderValue),
    Joined(String),
}

impl HeaderText {
    fn as_str(&self) -> Option<&str> {
        match self {
            HeaderText::One(v) => v.to_str().ok(),
            HeaderText::Joined(s) => Some(s),
        }
    }
}

/// The value of `name` as CEL sees it: its values that are text, joined with `,`; absent when
/// there is none. Given to `f` (a join needs a string of its own).
pub(super) fn with_header<R>(
    map: &HeaderMap,
    name: &HeaderName,
    f: impl FnOnce(Option<&str>) -> R,
) -> R {
    let mut values = map.get_all(name).iter().filter_map(|v| v.to_str().ok());
    match (values.next(), values.next()) {
        (None, _) => f(None),
        (Some(one), None) => f(Some(one)),
        (Some(first), Some(second)) => {
            let mut joined = format!("{first},{second}");
            for v in values {
                joined.push(',');
                joined.push_str(v);
            }
            f(Some(&joined))
        }
    }
}

fn capture_header(map: &HeaderMap, name: &HeaderName) -> Option<HeaderText> {
    let mut values = map.get_all(name).iter().filter(|v| v.to_str().is_ok());
    match (values.next(), values.next()) {
        (None, _) => None,
        (Some(one), None) => Some(HeaderText::One(one.clone())),
        (Some(_), Some(_)) => with_header(map, name, |s| s.map(|s| HeaderText::Joined(s.into()))),
    }
}

impl<'a> Activation<'a> {
    /// Captures everything: the `request` and `source` variables (every header) and a null
    /// `auth.identity`.
    pub fn new(attrs: &Attrs<'_>) -> Self {
        Self::capture(attrs, ALL_VARS, Headers::All(attrs.headers.clone()))
    }

    /// Captures what the expressions that `needs` describes read, and nothing else.
    /// Evaluating any other expression with it is a bug (in debug builds, a panic).
    pub fn with_needs(attrs: &Attrs<'_>, needs: &'a Needs) -> Self {
        let headers = if needs.all_headers {
            Headers::All(attrs.headers.clone())
        } else {
            Headers::Named {
                names: &needs.headers,
                values: needs
                    .headers
                    .iter()
                    .map(|n| capture_header(attrs.headers, n))
                    .collect(),
            }
        };
        Self::capture(attrs, needs.vars, headers)
    }

    fn capture(attrs: &Attrs<'_>, vars: u8, headers: Headers<'a>) -> Self {
        let mut text = String::new();
        if vars & REQUEST != 0 {
            text.reserve_exact(attrs.host.len() + attrs.path.len() + attrs.scheme.len());
            text.push_str(attrs.host);
            text.push_str(attrs.path);
            text.push_str(attrs.scheme);
        }
        // Standard methods are copied without allocating; only `request.method` reads it.
        let method = if vars & REQUEST != 0 {
            Method::from_bytes(attrs.method.as_bytes()).unwrap_or_default()
        } else {
            Method::default()
        };
        Self {
            method,
            text,
            host_end: attrs.host.len(),
            path_end: attrs.host.len() + attrs.path.len(),
            source: attrs.source,
            source_address: None,
            headers,
            identity: None,
            vars,
            context: OnceLock::new(),
        }
    }

    /// Gives `source.address` as text: the source IP as `Display` prints it, formatted once
    /// per connection by the caller, so that expressions reading it do not format it again
    /// per request. It must be that address (checked in debug builds): expressions see it as
    /// it is.
    pub fn set_source_address(&mut self, text: &'a str) {
        debug_assert_eq!(text, self.source.ip().to_string(), "not the source address");
        if self.vars & SOURCE != 0 {
            self.source_address = Some(text);
        }
    }

    /// Sets `auth.identity` (after authentication succeeds).
    pub fn set_identity<I: IdentityValue + ?Sized>(&mut self, identity: &I) {
        let identity = identity.shared();
        if self.vars & AUTH != 0
            && let Some(context) = self.context.get_mut()
        {
            context.add_variable_from_value("auth", auth_value(Some(&identity)));
        }
        self.identity = Some(identity);
    }

    fn host(&self) -> &str {
        self.text.get(..self.host_end).unwrap_or_default()
    }

    fn path(&self) -> &str {
        self.text
            .get(self.host_end..self.path_end)
            .unwrap_or_default()
    }

    fn url_path(&self) -> &str {
        let path = self.path();
        path.split('?').next().unwrap_or(path)
    }

    fn scheme(&self) -> &str {
        self.text.get(self.path_end..).unwrap_or_default()
    }

    /// Hands the value of `path` to `f`.
    pub(super) fn read<R>(&self, path: &Path, f: impl FnOnce(Val<'_>) -> R) -> R {
        debug_assert!(
            match path {
                Path::Address | Path::Port => self.vars & SOURCE != 0,
                Path::Identity(_) => true,
                _ => self.vars & REQUEST != 0,
            },
            "{path:?} was not captured"
        );
        match path {
            Path::Method => f(Val::Str(self.method.as_str())),
            Path::Host => f(Val::Str(self.host())),
            Path::Path => f(Val::Str(self.path())),
            Path::UrlPath => f(Val::Str(self.url_path())),
            Path::Scheme => f(Val::Str(self.scheme())),
            Path::Header(None) => f(Val::Missing),
            Path::Header(Some(name)) => {
                self.read_header(name, |v| f(v.map_or(Val::Missing, Val::Str)))
            }
            Path::Address => match self.source_address {
                Some(a) => f(Val::Str(a)),
                None => with_address(self.source.ip(), |a| f(Val::Str(a))),
            },
            Path::Port => f(Val::Int(i64::from(self.source.port()))),
            Path::Identity(keys) => f(Val::identity(self.identity.as_deref(), keys)),
        }
    }

    /// The source IP: `source.address` before it is printed.
    pub(super) fn source_ip(&self) -> IpAddr {
        debug_assert!(self.vars & SOURCE != 0, "source was not captured");
        self.source.ip()
    }

    /// Hands the value of header `name` (as CEL sees it) to `f`.
    pub(super) fn read_header<R>(&self, name: &HeaderName, f: impl FnOnce(Option<&str>) -> R) -> R {
        match &self.headers {
            Headers::All(map) => with_header(map, name, f),
            Headers::Named { names, values } => match names.iter().position(|n| n == name) {
                Some(i) => f(values.get(i).and_then(|v| v.as_ref()?.as_str())),
                None => {
                    debug_assert!(false, "header {name} was not captured");
                    f(None)
                }
            },
        }
    }

    /// The CEL context, built on first use.
    pub(super) fn context(&self) -> &Context<'static, 'static> {
        self.context.get_or_init(|| self.build_context())
    }

    fn build_context(&self) -> Context<'static, 'static> {
        let mut context = Context::with_env(ENV.clone());
        if self.vars & REQUEST != 0 {
            let mut headers: HashMap<String, String> = HashMap::new();
            match &self.headers {
                Headers::All(map) => {
                    for name in map.keys() {
                        with_header(map, name, |v| {
                            if let Some(v) = v {
                                headers.insert(name.as_str().to_owned(), v.to_owned());
                            }
                        });
                    }
                }
                Headers::Named { names, values } => {
                    for (name, value) in names.iter().zip(values) {
                        if let Some(v) = value.as_ref().and_then(HeaderText::as_str) {
                            headers.insert(name.as_str().to_owned(), v.to_owned());
                        }
                    }
                }
            }
            let mut request: HashMap<String, Value> = HashMap::with_capacity(6);
            request.insert("method".into(), self.method.as_str().into());
            request.insert("host".into(), self.host().into());
            request.insert("path".into(), self.path().into());
            request.insert("url_path".into(), self.url_path().into());
            request.insert("scheme".into(), self.scheme().into());
            request.insert("headers".into(), headers.into());
            context.add_variable_from_value("request", request);
        }
        if self.vars & SOURCE != 0 {
            let mut source: HashMap<String, Value> = HashMap::with_capacity(2);
            let address = match self.source_address {
                Some(a) => a.to_owned(),
                None => self.source.ip().to_string(),
            };
            source.insert("address".into(), address.into());
            source.insert("port".into(), Value::Int(i64::from(self.source.port())));
            context.add_variable_from_value("source", source);
        }
        if self.vars & AUTH != 0 {
            context.add_variable_from_value("auth", auth_value(self.identity.as_deref()));
        }
        context
    }
}

/// `ip` as `Display` prints it (`source.address`), handed to `f`; IPv4 without the
/// formatting machinery, which costs more than the rest of a rate limit's key.
fn with_address<R>(ip: IpAddr, f: impl FnOnce(&str) -> R) -> R {
    let mut buf = StackStr::<48>::new();
    let written = match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf.push_byte(b'.');
                }
                if octet >= 100 {
                    buf.push_byte(b'0' + octet / 100);
                }
                if octet >= 10 {
                    buf.push_byte(b'0' + octet / 10 % 10);
                }
                buf.push_byte(b'0' + octet % 10);
            }
            true
        }
        IpAddr::V6(_) => write!(buf, "{ip}").is_ok(),
    };
    if written {
        f(buf.as_str())
    } else {
        f(&ip.to_string())
    }
}

/// The `auth` variable.
fn auth_value(identity: Option<&serde_json::Value>) -> HashMap<String, Value> {
    let mut auth: HashMap<String, Value> = HashMap::with_capacity(1);
    auth.insert(
        "identity".into(),
        identity.map_or(Value::Null, json_to_value),
    );
    auth
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_print_as_display_does() {
        for ip in [
            "0.0.0.0",
            "10.1.2.3",
            "192.168.100.255",
            "1.10.100.9",
            "255.255.255.255",
            "::1",
            "::ffff:192.0.2.1",
            "2001:db8::8a2e:370:7334",
            "fe80::1:2:3:4",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(with_address(ip, str::to_owned), ip.to_string());
        }
    }
}
