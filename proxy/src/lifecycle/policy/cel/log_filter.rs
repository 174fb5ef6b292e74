//! CEL choosing which requests the access log writes (`--access-log-filter`).
//!
//! In: the expression source (at startup) and, per answered request, what its log line holds.
//! Out: whether to write the line. The variables: `request` (`method`, `host`, `path`),
//! `response` (`code`), `route` (`namespace/name`, empty when none matched), `duration_ms`
//! (a double) and `sample`, a number drawn per request uniformly from [0, 1): `sample < 0.01`
//! keeps one request in a hundred. An expression that fails or is not a boolean keeps the
//! line (a filter should never hide the requests it did not understand).

use std::collections::HashMap;
use std::sync::Arc;

use cel::{Context, Program, Value};

use super::{CelError, ENV, compile_checked};

/// The variables of a log filter.
pub const LOG_VARIABLES: [&str; 5] = ["request", "response", "route", "duration_ms", "sample"];

/// What a filter sees of one request.
#[derive(Debug, Clone, Copy)]
pub struct LogVars<'a> {
    /// Method.
    pub method: &'a str,
    /// Host, normalized.
    pub host: &'a str,
    /// Path without the query.
    pub path: &'a str,
    /// Status of the answer.
    pub status: u16,
    /// `namespace/name` of the route; empty when none matched.
    pub route: &'a str,
    /// From arrival to the last byte of the answer.
    pub duration_ms: f64,
}

/// A compiled filter. Cheap to clone.
#[derive(Clone)]
pub struct LogFilter {
    program: Arc<Program>,
    source: Arc<str>,
}

impl std::fmt::Debug for LogFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LogFilter").field(&self.source).finish()
    }
}

impl LogFilter {
    /// Compiles `source`, refusing unknown variables and functions.
    pub fn compile(source: &str) -> Result<Self, CelError> {
        let program = compile_checked(source, &LOG_VARIABLES, |v| CelError::Parse {
            expr: source.to_owned(),
            message: format!(
                "unknown variable `{v}` (a log filter knows: {})",
                LOG_VARIABLES.join(", ")
            ),
        })?;
        Ok(Self {
            program: Arc::new(program),
            source: source.into(),
        })
    }

    /// Whether the line of `vars` is written, `sample` being this request's draw.
    pub fn keep(&self, vars: &LogVars<'_>, sample: f64) -> Result<bool, CelError> {
        let mut request: HashMap<String, Value> = HashMap::with_capacity(3);
        request.insert("method".into(), vars.method.into());
        request.insert("host".into(), vars.host.into());
        request.insert("path".into(), vars.path.into());
        let mut response: HashMap<String, Value> = HashMap::with_capacity(1);
        response.insert("code".into(), Value::Int(i64::from(vars.status)));
        let mut context = Context::with_env(ENV.clone());
        context.add_variable_from_value("request", request);
        context.add_variable_from_value("response", response);
        context.add_variable_from_value("route", vars.route);
        context.add_variable_from_value("duration_ms", vars.duration_ms);
        context.add_variable_from_value("sample", sample);
        match self.program.execute(&context) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(CelError::Eval {
                expr: self.source.to_string(),
                message: format!("{other:?} is not a boolean"),
            }),
            Err(e) => Err(CelError::Eval {
                expr: self.source.to_string(),
                message: e.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(status: u16) -> LogVars<'static> {
        LogVars {
            method: "GET",
            host: "shop.example",
            path: "/cart",
            status,
            route: "default/shop",
            duration_ms: 12.5,
        }
    }

    #[test]
    fn keeps_what_the_expression_says() {
        let f = LogFilter::compile("response.code >= 500 || sample < 0.01").unwrap();
        assert!(f.keep(&vars(503), 0.5).unwrap());
        assert!(!f.keep(&vars(200), 0.5).unwrap());
        assert!(f.keep(&vars(200), 0.005).unwrap());
        let f = LogFilter::compile(
            "request.method == 'GET' && request.path.startsWith('/cart') && route == 'default/shop' && duration_ms > 10.0 && request.host.endsWith('.example')",
        )
        .unwrap();
        assert!(f.keep(&vars(200), 0.0).unwrap());
    }

    #[test]
    fn unknown_names_are_refused_and_failures_reported() {
        let e = LogFilter::compile("request.headers['x'] == 'y' || auth.identity == null")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown variable `auth`"), "{e}");
        assert!(matches!(
            LogFilter::compile("sise(route) > 1"),
            Err(CelError::UnknownFunction { .. })
        ));
        let f = LogFilter::compile("request.headers['x'] == 'y'").unwrap();
        assert!(
            f.keep(&vars(200), 0.0).is_err(),
            "no headers in a log filter"
        );
        let f = LogFilter::compile("response.code").unwrap();
        assert!(f.keep(&vars(200), 0.0).is_err(), "not a boolean");
    }
}
