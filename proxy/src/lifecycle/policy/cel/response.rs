//! CEL on a response: the `cost.response` expressions of rate limits.
//!
//! In: the expression source (at table build) and, per response of a request such a limit
//! counted, the response's status and headers, and its body parsed as JSON when the
//! expression reads it ([`ResponseExpr::reads_body`]). Out: the integer the expression
//! evaluates to, or why it did not give one. The one variable is `response`: `status` (an
//! int), `headers` (lower-case names; several values of one name joined with `,`, as for
//! `request.headers`) and `body` (the JSON value; absent when the body could not be read, so
//! that `has(response.body)` is false and reading it fails). Request variables are not
//! offered: the request's snapshot is gone by the time the response arrives, and a cost read
//! from the request belongs in `cost.request`.
//!
//! These run once per response of a cost-limited route. The common shapes
//! (`int(response.headers['x-tokens-used'])`, `int(response.body.usage.total_tokens)`, a
//! literal; module `int`) are evaluated on the response directly; the rest through the
//! interpreter, with a context built per response from every header.

use std::collections::HashMap;
use std::sync::Arc;

use cel::common::ast::{Expr as Ast, LiteralValue, operators};
use cel::{Context, Program, Value};
use http::HeaderMap;

use super::int::{self, ResponseData, ResponseInt};
use super::{CelError, ENV, compile_checked};

/// The variable of response expressions.
pub const RESPONSE_VARIABLES: [&str; 1] = ["response"];

/// A compiled response expression. Cheap to clone.
#[derive(Clone)]
pub struct ResponseExpr {
    program: Arc<Program>,
    source: Arc<str>,
    /// The fast form, when the expression has one of the shapes module `int` knows.
    fast: Option<Arc<ResponseInt>>,
    /// It reads `response.body` (or `response` whole): the body must be kept and parsed.
    reads_body: bool,
}

impl std::fmt::Debug for ResponseExpr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ResponseExpr").field(&self.source).finish()
    }
}

/// Checks that `source` compiles as a response expression (what the compiler calls).
pub fn check_response(source: &str) -> Result<(), CelError> {
    ResponseExpr::compile(source).map(|_| ())
}

impl ResponseExpr {
    /// Compiles `source`, refusing variables other than `response` and unknown functions.
    pub fn compile(source: &str) -> Result<Self, CelError> {
        let program = compile_checked(source, &RESPONSE_VARIABLES, |v| {
            CelError::UnknownResponseVariable {
                expr: source.to_owned(),
                variable: v.to_owned(),
            }
        })?;
        let fast = int::compile_response(&program.expression().expr).map(Arc::new);
        let reads_body = reads_body(&program.expression().expr);
        Ok(Self {
            program: Arc::new(program),
            source: source.into(),
            fast,
            reads_body,
        })
    }

    /// Whether it reads `response.body`: the body is then kept (up to a cap) and parsed, and
    /// the cost counted once it has ended.
    pub fn reads_body(&self) -> bool {
        self.reads_body
    }

    /// Whether it runs without the CEL interpreter.
    pub fn is_fast(&self) -> bool {
        self.fast.is_some()
    }

    /// The source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Evaluates on a response to an integer: an int, a uint that fits, or a string of
    /// decimal digits (a header's value as it is). Anything else is an error. `body` is the
    /// body parsed as JSON, `None` when it was not read or could not be.
    pub fn eval_int(
        &self,
        status: u16,
        headers: &HeaderMap,
        body: Option<&serde_json::Value>,
    ) -> Result<i64, CelError> {
        match &self.fast {
            Some(f) => {
                let data = ResponseData {
                    status,
                    headers,
                    body,
                };
                int::eval_response(f, &data).map_err(|()| CelError::Eval {
                    expr: self.source.to_string(),
                    message: "the value is missing or not an integer".into(),
                })
            }
            None => self.interpret_int(status, headers, body),
        }
    }

    /// [`Self::eval_int`] through the interpreter.
    pub(super) fn interpret_int(
        &self,
        status: u16,
        headers: &HeaderMap,
        body: Option<&serde_json::Value>,
    ) -> Result<i64, CelError> {
        let mut map: HashMap<String, String> = HashMap::with_capacity(headers.keys_len());
        for name in headers.keys() {
            let mut joined = String::new();
            for v in headers.get_all(name).iter().filter_map(|v| v.to_str().ok()) {
                if !joined.is_empty() {
                    joined.push(',');
                }
                joined.push_str(v);
            }
            map.insert(name.as_str().to_owned(), joined);
        }
        let mut response: HashMap<String, Value> = HashMap::with_capacity(3);
        response.insert("status".into(), Value::Int(i64::from(status)));
        response.insert("headers".into(), map.into());
        if let Some(body) = body {
            response.insert("body".into(), super::json_to_value(body));
        }
        let mut context = Context::with_env(ENV.clone());
        context.add_variable_from_value("response", response);
        let fail = |message: String| CelError::Eval {
            expr: self.source.to_string(),
            message,
        };
        match self.program.execute(&context) {
            Ok(Value::Int(i)) => Ok(i),
            Ok(Value::UInt(u)) => i64::try_from(u).map_err(|_| fail(format!("{u} is too large"))),
            Ok(Value::String(s)) => s
                .trim()
                .parse::<i64>()
                .map_err(|_| fail(format!("{s:?} is not an integer"))),
            Ok(other) => Err(fail(format!("{other:?} is not an integer"))),
            Err(e) => Err(fail(e.to_string())),
        }
    }
}

/// Whether `e` reads `response.body`: selects `body` (or a key other than `status` and
/// `headers`) of `response`, or uses `response` whole.
fn reads_body(e: &Ast) -> bool {
    let is_response = |e: &Ast| matches!(e, Ast::Ident(name) if name == "response");
    let other = |field: &str| field != "status" && field != "headers";
    match e {
        Ast::Ident(name) => name == "response",
        Ast::Select(s) if is_response(&s.operand.expr) => other(&s.field),
        Ast::Select(s) => reads_body(&s.operand.expr),
        Ast::Call(c) => {
            if c.func_name == operators::INDEX
                && let [target, key] = c.args.as_slice()
                && is_response(&target.expr)
            {
                return match &key.expr {
                    Ast::Literal(LiteralValue::String(k)) => other(k),
                    _ => true,
                };
            }
            c.target.as_deref().is_some_and(|t| reads_body(&t.expr))
                || c.args.iter().any(|a| reads_body(&a.expr))
        }
        Ast::List(l) => l.elements.iter().any(|x| reads_body(&x.expr)),
        Ast::Map(m) => m.entries.iter().any(|x| match &x.expr {
            cel::common::ast::EntryExpr::MapEntry(m) => {
                reads_body(&m.key.expr) || reads_body(&m.value.expr)
            }
            cel::common::ast::EntryExpr::StructField(f) => reads_body(&f.value.expr),
        }),
        Ast::Struct(st) => st.entries.iter().any(|x| match &x.expr {
            cel::common::ast::EntryExpr::MapEntry(m) => {
                reads_body(&m.key.expr) || reads_body(&m.value.expr)
            }
            cel::common::ast::EntryExpr::StructField(f) => reads_body(&f.value.expr),
        }),
        Ast::Comprehension(c) => [
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ]
        .iter()
        .any(|x| reads_body(&x.expr)),
        Ast::Literal(_) | Ast::Unspecified => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn reads_the_status_and_headers() {
        let e = ResponseExpr::compile("int(response.headers['x-tokens-used'])").unwrap();
        assert_eq!(
            e.eval_int(200, &headers(&[("x-tokens-used", "400")]), None),
            Ok(400)
        );
        let e = ResponseExpr::compile("response.status == 200 ? 10 : 1").unwrap();
        assert_eq!(e.eval_int(200, &headers(&[]), None), Ok(10));
        assert_eq!(e.eval_int(503, &headers(&[]), None), Ok(1));
        let e = ResponseExpr::compile("response.headers['x-cost']").unwrap();
        assert_eq!(e.eval_int(200, &headers(&[("x-cost", " 7 ")]), None), Ok(7));
    }

    #[test]
    fn anything_but_an_integer_is_an_error() {
        let e = ResponseExpr::compile("int(response.headers['x-tokens-used'])").unwrap();
        assert!(
            e.eval_int(200, &headers(&[]), None).is_err(),
            "missing header"
        );
        assert!(
            e.eval_int(200, &headers(&[("x-tokens-used", "lots")]), None)
                .is_err()
        );
        let e = ResponseExpr::compile("response.headers['x-cost']").unwrap();
        assert!(
            e.eval_int(200, &headers(&[("x-cost", "1.5")]), None)
                .is_err()
        );
        let e = ResponseExpr::compile("1.5").unwrap();
        assert!(e.eval_int(200, &headers(&[]), None).is_err());
    }

    #[test]
    fn only_the_response_variable_is_known() {
        assert!(matches!(
            ResponseExpr::compile("int(request.headers['x'])"),
            Err(CelError::UnknownResponseVariable { variable, .. }) if variable == "request"
        ));
        assert!(matches!(
            ResponseExpr::compile("sise(response.headers)"),
            Err(CelError::UnknownFunction { .. })
        ));
        assert!(matches!(
            ResponseExpr::compile("response.headers["),
            Err(CelError::Parse { .. })
        ));
    }
}
