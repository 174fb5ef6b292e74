//! CEL expressions of policies: compiled once per table, evaluated per request.
//!
//! In: expression source (at table build) and a request's [`Attrs`] (per request). Out: a
//! boolean (predicates) or a string (counter keys, header values). The variables are the ones
//! the policy API documents: `request` (`method`, `host`, `path` with query, `url_path`,
//! `scheme`, `headers` with lower-case names), `source` (`address`, `port`) and `auth`
//! (`identity`). [`check`] is what the compiler calls so that a policy with an expression the
//! proxy could not run is rejected before it reaches a proxy.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};

use cel::{Context, Env, Program, Value};
use http::HeaderMap;

/// Top-level variables an expression may use.
pub const VARIABLES: [&str; 3] = ["request", "source", "auth"];

/// The standard environment, built once (building it per request would cost more than the
/// evaluation).
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| Arc::new(Env::stdlib()));

/// Why an expression was refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    /// It does not parse.
    #[error("invalid CEL expression `{expr}`: {message}")]
    Parse {
        /// The expression.
        expr: String,
        /// Parser message.
        message: String,
    },
    /// It names a variable that does not exist.
    #[error(
        "CEL expression `{expr}` uses unknown variable `{variable}` (known: request, source, auth)"
    )]
    UnknownVariable {
        /// The expression.
        expr: String,
        /// The variable.
        variable: String,
    },
    /// It failed at run time (missing key, type mismatch).
    #[error("CEL expression `{expr}` failed: {message}")]
    Eval {
        /// The expression.
        expr: String,
        /// What went wrong.
        message: String,
    },
}

/// Checks that `source` compiles and names only known variables.
pub fn check(source: &str) -> Result<(), CelError> {
    Expr::compile(source).map(|_| ())
}

/// A compiled expression.
#[derive(Clone)]
pub struct Expr {
    program: Arc<Program>,
    source: Arc<str>,
}

impl std::fmt::Debug for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Expr").field(&self.source).finish()
    }
}

impl Expr {
    /// Compiles `source`.
    pub fn compile(source: &str) -> Result<Self, CelError> {
        let program = ENV.compile(source).map_err(|e| CelError::Parse {
            expr: source.to_owned(),
            message: e.to_string(),
        })?;
        let refs = program.references();
        if let Some(v) = refs
            .variables()
            .into_iter()
            .find(|v| !VARIABLES.contains(v))
        {
            return Err(CelError::UnknownVariable {
                expr: source.to_owned(),
                variable: v.to_owned(),
            });
        }
        Ok(Self {
            program: Arc::new(program),
            source: source.into(),
        })
    }

    /// The source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Evaluates to a value.
    pub fn eval(&self, act: &Activation<'_>) -> Result<Value, CelError> {
        self.program
            .execute(&act.context)
            .map_err(|e| CelError::Eval {
                expr: self.source.to_string(),
                message: e.to_string(),
            })
    }

    /// Evaluates a predicate; anything but `true` (including an error) is false.
    pub fn eval_bool(&self, act: &Activation<'_>) -> bool {
        matches!(self.eval(act), Ok(Value::Bool(true)))
    }

    /// Evaluates to a string: strings as they are, numbers and booleans printed, anything
    /// else (lists, maps, null, errors) as `None`.
    pub fn eval_string(&self, act: &Activation<'_>) -> Option<String> {
        match self.eval(act).ok()? {
            Value::String(s) => Some(s.to_string()),
            Value::Int(i) => Some(i.to_string()),
            Value::UInt(u) => Some(u.to_string()),
            Value::Float(f) => Some(f.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }
}

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

/// The variables of one request, built once and shared by every expression evaluated for it.
pub struct Activation<'a> {
    context: Context<'a, 'a>,
}

impl<'a> Activation<'a> {
    /// Builds the `request` and `source` variables (and an empty `auth`).
    pub fn new(attrs: &Attrs<'_>) -> Self {
        let mut context = Context::with_env(ENV.clone());
        let url_path = attrs.path.split('?').next().unwrap_or(attrs.path);
        let mut headers: HashMap<String, String> = HashMap::with_capacity(attrs.headers.len());
        for (name, value) in attrs.headers {
            if let Ok(v) = value.to_str() {
                headers
                    .entry(name.as_str().to_owned())
                    .and_modify(|e| {
                        e.push(',');
                        e.push_str(v);
                    })
                    .or_insert_with(|| v.to_owned());
            }
        }
        let mut request: HashMap<String, Value> = HashMap::with_capacity(6);
        request.insert("method".into(), attrs.method.into());
        request.insert("host".into(), attrs.host.into());
        request.insert("path".into(), attrs.path.into());
        request.insert("url_path".into(), url_path.into());
        request.insert("scheme".into(), attrs.scheme.into());
        request.insert("headers".into(), headers.into());
        context.add_variable_from_value("request", request);
        let mut source: HashMap<String, Value> = HashMap::with_capacity(2);
        source.insert("address".into(), attrs.source.ip().to_string().into());
        source.insert("port".into(), Value::Int(i64::from(attrs.source.port())));
        context.add_variable_from_value("source", source);
        let mut act = Self { context };
        act.set_identity(&serde_json::Value::Null);
        act
    }

    /// Sets `auth.identity` (after authentication succeeds).
    pub fn set_identity(&mut self, identity: &serde_json::Value) {
        let mut auth: HashMap<String, Value> = HashMap::with_capacity(1);
        auth.insert("identity".into(), json_to_value(identity));
        self.context.add_variable_from_value("auth", auth);
    }
}

/// Converts JSON into a CEL value (numbers as Int when integral, else Float).
pub fn json_to_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => match n.as_u64() {
                Some(u) => Value::UInt(u),
                None => Value::Float(n.as_f64().unwrap_or(0.0)),
            },
        },
        serde_json::Value::String(s) => s.as_str().into(),
        serde_json::Value::Array(a) => a.iter().map(json_to_value).collect::<Vec<_>>().into(),
        serde_json::Value::Object(o) => o
            .iter()
            .map(|(k, v)| (k.clone(), json_to_value(v)))
            .collect::<HashMap<String, Value>>()
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(headers: &HeaderMap) -> Attrs<'_> {
        Attrs {
            method: "POST",
            host: "shop.example.com",
            path: "/admin/users?x=1",
            scheme: "https",
            headers,
            source: "10.1.2.3:5555".parse().unwrap(),
        }
    }

    #[test]
    fn request_attributes_are_visible() {
        let mut h = HeaderMap::new();
        h.insert("x-team", "blue".parse().unwrap());
        let act = Activation::new(&attrs(&h));
        for (src, want) in [
            ("request.method == 'POST'", true),
            ("request.host == 'shop.example.com'", true),
            ("request.path == '/admin/users?x=1'", true),
            ("request.url_path.startsWith('/admin')", true),
            ("request.scheme == 'https'", true),
            ("request.headers['x-team'] == 'blue'", true),
            ("source.address == '10.1.2.3' && source.port == 5555", true),
            ("request.method == 'GET'", false),
        ] {
            assert_eq!(Expr::compile(src).unwrap().eval_bool(&act), want, "{src}");
        }
    }

    #[test]
    fn identity_is_visible_after_authentication() {
        let h = HeaderMap::new();
        let mut act = Activation::new(&attrs(&h));
        let role = Expr::compile("auth.identity.role == 'admin'").unwrap();
        assert!(!role.eval_bool(&act), "no identity yet");
        act.set_identity(&serde_json::json!({"sub": "alice", "role": "admin", "n": 3}));
        assert!(role.eval_bool(&act));
        let sub = Expr::compile("auth.identity.sub").unwrap();
        assert_eq!(sub.eval_string(&act).as_deref(), Some("alice"));
        let n = Expr::compile("auth.identity.n").unwrap();
        assert_eq!(n.eval_string(&act).as_deref(), Some("3"));
    }

    #[test]
    fn bad_expressions_are_refused_at_compile_time() {
        assert!(matches!(
            Expr::compile("request.method ==").unwrap_err(),
            CelError::Parse { .. }
        ));
        assert!(matches!(
            Expr::compile("requests.method == 'GET'").unwrap_err(),
            CelError::UnknownVariable { .. }
        ));
    }

    #[test]
    fn runtime_errors_are_false_not_panics() {
        let h = HeaderMap::new();
        let act = Activation::new(&attrs(&h));
        let e = Expr::compile("request.headers['missing'] == 'x'").unwrap();
        assert!(!e.eval_bool(&act));
        assert_eq!(
            Expr::compile("request.headers['missing']")
                .unwrap()
                .eval_string(&act),
            None
        );
    }
}
