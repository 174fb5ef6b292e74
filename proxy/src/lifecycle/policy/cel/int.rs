//! The fast path of cost expressions: the integer shapes a `cost` writes most, compiled once
//! from the parsed CEL and evaluated on the request's or the response's data directly,
//! without building a CEL context.
//!
//! In: a parsed expression (at table build); per request, an [`Activation`] (request costs),
//! or per response its status, headers and parsed body (response costs). Out: the integer,
//! or an error where CEL fails, with exactly the interpreter's results (`int_tests.rs` runs
//! both over a table of inputs).
//!
//! The shapes: an integer literal (`5`; `5u` on a response), and `int(<value>)` where the value is one the
//! fast path reads: a request value of `fast.rs` ([`Path`]: `request.headers['h']`,
//! `auth.identity.n`, ...) for a request cost; `response.headers['h']`, `response.status` or
//! `response.body` followed by keys for a response cost, where the bare value is also fast
//! (the response side converts it as [`super::ResponseExpr`] converts a result). `int()` is
//! CEL's: an int as it is, a uint that fits, a double truncated toward zero when it is in
//! range, a string as Rust's `i64::from_str` reads it (the `cel` crate's own conversion: an
//! optional sign, ASCII digits, leading zeros allowed, no spaces, overflow an error); anything
//! else (a missing header or key, a bool, null, a list or map) is an error.

use cel::common::ast::{CallExpr, Expr as Ast, LiteralValue};
use http::{HeaderMap, HeaderName};

use super::fast::{self, Path, Val};

/// A request cost's fast form.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum RequestInt {
    /// An int literal.
    Lit(Result<i64, ()>),
    /// `int(<path>)`.
    Int(Path),
}

/// Where a response value is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ResponsePath {
    /// `response.status`.
    Status,
    /// `response.headers['name']`; `None` for a name no header has (not lower-case).
    Header(Option<HeaderName>),
    /// `response.body` followed by these keys.
    Body(Box<[Box<str>]>),
}

/// A response cost's fast form.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum ResponseInt {
    /// A literal: its value, or the error converting it.
    Lit(Result<i64, ()>),
    /// `int(<path>)`.
    Int(ResponsePath),
    /// `<path>` alone: converted as a result is (an int, a uint that fits, a string of an
    /// integer with spaces around it).
    Bare(ResponsePath),
}

/// An integer literal's value as a cost.
fn literal(e: &Ast) -> Option<Result<i64, ()>> {
    match e {
        Ast::Literal(LiteralValue::Int(i)) => Some(Ok(*i.inner())),
        Ast::Literal(LiteralValue::UInt(u)) => Some(i64::try_from(*u.inner()).map_err(|_| ())),
        _ => None,
    }
}

/// The argument of `int(x)`.
fn int_arg(e: &Ast) -> Option<&Ast> {
    match e {
        Ast::Call(CallExpr {
            func_name,
            target: None,
            args,
        }) if func_name == "int" => match args.as_slice() {
            [arg] => Some(&arg.expr),
            _ => None,
        },
        _ => None,
    }
}

/// Compiles a request cost's fast form; `None` leaves it to the interpreter.
pub(super) fn compile_request(e: &Ast) -> Option<RequestInt> {
    // An int literal only: a uint one is also printed as a string (`eval_string`).
    if let Ast::Literal(LiteralValue::Int(i)) = e {
        return Some(RequestInt::Lit(Ok(*i.inner())));
    }
    fast::path(int_arg(e)?).map(RequestInt::Int)
}

/// Compiles a response cost's fast form; `None` leaves it to the interpreter.
pub(super) fn compile_response(e: &Ast) -> Option<ResponseInt> {
    if let Some(lit) = literal(e) {
        return Some(ResponseInt::Lit(lit));
    }
    match int_arg(e) {
        Some(arg) => response_path(arg).map(ResponseInt::Int),
        None => response_path(e).map(ResponseInt::Bare),
    }
}

fn response_path(e: &Ast) -> Option<ResponsePath> {
    let mut segs = Vec::new();
    if !fast::segments(e, &mut segs) {
        return None;
    }
    Some(match segs.as_slice() {
        ["response", "status"] => ResponsePath::Status,
        ["response", "headers", name] => ResponsePath::Header(fast::header(name)),
        ["response", "body", keys @ ..] => {
            ResponsePath::Body(keys.iter().map(|k| (*k).into()).collect())
        }
        _ => return None,
    })
}

/// CEL's `int()` of a value.
pub(super) fn cel_int(v: Val<'_>) -> Result<i64, ()> {
    match v {
        Val::Int(i) => Ok(i),
        Val::UInt(u) => i64::try_from(u).map_err(|_| ()),
        // The `cel` crate's bounds: (i64::MIN, i64::MAX) exclusive, NaN refused.
        Val::Float(x) if x > (i64::MIN as f64) && x < (i64::MAX as f64) => Ok(x as i64),
        Val::Str(s) => s.parse::<i64>().map_err(|_| ()),
        Val::Float(_) | Val::Bool(_) | Val::Null | Val::Json(_) | Val::Missing => Err(()),
    }
}

/// A response expression's result as a cost, as [`super::ResponseExpr::eval_int`] converts
/// the interpreter's value.
pub(super) fn result_int(v: Val<'_>) -> Result<i64, ()> {
    match v {
        Val::Int(i) => Ok(i),
        Val::UInt(u) => i64::try_from(u).map_err(|_| ()),
        Val::Str(s) => s.trim().parse::<i64>().map_err(|_| ()),
        Val::Float(_) | Val::Bool(_) | Val::Null | Val::Json(_) | Val::Missing => Err(()),
    }
}

/// What a response exposes to a fast response cost.
pub(super) struct ResponseData<'a> {
    pub status: u16,
    pub headers: &'a HeaderMap,
    /// The parsed body; `None` where the expression does not read it.
    pub body: Option<&'a serde_json::Value>,
}

/// Evaluates a response cost's fast form.
pub(super) fn eval_response(f: &ResponseInt, r: &ResponseData<'_>) -> Result<i64, ()> {
    match f {
        ResponseInt::Lit(v) => *v,
        ResponseInt::Int(p) => read_response(p, r, cel_int),
        ResponseInt::Bare(p) => read_response(p, r, result_int),
    }
}

fn read_response<R>(p: &ResponsePath, r: &ResponseData<'_>, f: impl FnOnce(Val<'_>) -> R) -> R {
    match p {
        ResponsePath::Status => f(Val::Int(i64::from(r.status))),
        ResponsePath::Header(None) => f(Val::Missing),
        // As the interpreter's map has it: the values that are text, joined with `,`; a name
        // whose values are none of them text is there, empty.
        ResponsePath::Header(Some(name)) => {
            let mut all = r.headers.get_all(name).iter().peekable();
            if all.peek().is_none() {
                return f(Val::Missing);
            }
            super::activation::with_header(r.headers, name, |v| f(Val::Str(v.unwrap_or(""))))
        }
        ResponsePath::Body(keys) => f(Val::identity(r.body, keys)),
    }
}
