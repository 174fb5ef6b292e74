//! The fast path of [`super::Expr`]: the shapes policies write most, compiled once from the
//! parsed CEL into a small tree that is evaluated on the request's data directly, without
//! building a CEL value or context.
//!
//! Values ([`Path`]): `request.method|host|path|url_path|scheme`, `request.headers['name']`
//! (or `.name`), `source.address|port`, `auth.identity` followed by keys (`.a`, `['a']`).
//! Predicates ([`Pred`]): `<value> == <literal>` and `!=` (string, int or bool literal, either
//! side), `<value>.startsWith|endsWith|contains('literal')`, `has(request.headers.name)`,
//! `has(auth.identity….key)`, `'literal' in request.headers`, `'literal' in auth.identity…`,
//! `cidr('literal').containsIP(<value>)` and `….containsIP(ip(<value>))` (the network parsed
//! here, once; a literal `cidr` refuses is left to the interpreter, so that the error is its
//! own), a value used as a boolean, and `&&`, `||`, `!` of predicates. Anything else is not
//! compiled here and runs through the CEL interpreter.
//!
//! Results are exactly the interpreter's. Evaluation is three-valued like CEL's (true, false,
//! error, with CEL's rules for `&&`, `||` and `!`: false wins in `&&`, true wins in `||`), and
//! a fourth answer, [`Tri::Unknown`], covers the cases whose CEL semantics this module does not
//! model (an identity value of another type than the literal it is compared with, say): the
//! caller then asks the interpreter. A missing header, identity key or an identity that is
//! not an object where a key is read are errors, as in CEL.

use cel::IdedExpr;
use cel::common::ast::operators::{
    EQUALS, IN, INDEX, LOGICAL_AND, LOGICAL_NOT, LOGICAL_OR, NOT_EQUALS,
};
use cel::common::ast::{CallExpr, Expr as Ast, LiteralValue};
use http::HeaderName;

use super::Activation;
use super::net::{self, Cidr};

/// A value of the request an expression reads.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)] // `request.path`, `request.url_path`
pub(super) enum Path {
    /// `request.method`.
    Method,
    /// `request.host`.
    Host,
    /// `request.path` (with query).
    Path,
    /// `request.url_path` (without query).
    UrlPath,
    /// `request.scheme`.
    Scheme,
    /// `request.headers['name']`; `None` for a name no header has (not lower-case, not a
    /// header name): always missing.
    Header(Option<HeaderName>),
    /// `source.address`.
    Address,
    /// `source.port`.
    Port,
    /// `auth.identity` then these keys.
    Identity(Box<[Box<str>]>),
}

/// A literal operand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Lit {
    Str(Box<str>),
    Int(i64),
    Bool(bool),
}

/// A string method with a literal argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StrOp {
    StartsWith,
    EndsWith,
    Contains,
}

/// A predicate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Pred {
    /// A value used as a boolean.
    Bool(Path),
    /// `==` (or `!=` when `negated`).
    Cmp {
        path: Path,
        lit: Lit,
        negated: bool,
    },
    /// `path.startsWith('arg')` and the like.
    Str {
        path: Path,
        op: StrOp,
        arg: Box<str>,
    },
    /// `has(request.headers.name)`, `'name' in request.headers`.
    HasHeader(Option<HeaderName>),
    /// `has(<identity path>.key)`.
    HasKey {
        path: Path,
        key: Box<str>,
    },
    /// `'lit' in <identity path>`.
    In {
        lit: Box<str>,
        path: Path,
    },
    /// `cidr('net').containsIP(path)`, `cidr('net').containsIP(ip(path))`.
    InNet {
        net: Cidr,
        path: Path,
    },
    And(Box<Pred>, Box<Pred>),
    Or(Box<Pred>, Box<Pred>),
    Not(Box<Pred>),
}

/// A compiled fast expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fast {
    Value(Path),
    Pred(Pred),
}

/// Three-valued CEL truth, and "ask the interpreter".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tri {
    True,
    False,
    Error,
    Unknown,
}

impl From<bool> for Tri {
    fn from(b: bool) -> Self {
        if b { Tri::True } else { Tri::False }
    }
}

/// A value read from the request, borrowed.
#[derive(Debug, Clone, Copy)]
pub(super) enum Val<'v> {
    Str(&'v str),
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
    Null,
    /// A JSON array or object (from the identity).
    Json(&'v serde_json::Value),
    /// Not there: reading it is a CEL error (missing header or key, key of a non-object).
    Missing,
}

impl<'v> Val<'v> {
    /// An identity value as CEL sees it after [`super::json_to_value`].
    pub(super) fn of_json(v: &'v serde_json::Value) -> Self {
        match v {
            serde_json::Value::Null => Val::Null,
            serde_json::Value::Bool(b) => Val::Bool(*b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => Val::Int(i),
                None => match n.as_u64() {
                    Some(u) => Val::UInt(u),
                    None => Val::Float(n.as_f64().unwrap_or(0.0)),
                },
            },
            serde_json::Value::String(s) => Val::Str(s),
            serde_json::Value::Array(_) | serde_json::Value::Object(_) => Val::Json(v),
        }
    }

    /// `root` followed by `keys` (`None` for the anonymous, null identity).
    pub(super) fn identity(root: Option<&'v serde_json::Value>, keys: &[Box<str>]) -> Self {
        let Some(mut v) = root else {
            return if keys.is_empty() {
                Val::Null
            } else {
                Val::Missing
            };
        };
        for k in keys {
            match v {
                serde_json::Value::Object(o) => match o.get(&**k) {
                    Some(next) => v = next,
                    None => return Val::Missing,
                },
                _ => return Val::Missing,
            }
        }
        Val::of_json(v)
    }
}

/// Compiles the shapes this module knows; `None` for anything else.
pub(super) fn compile(e: &IdedExpr) -> Option<Fast> {
    match path(&e.expr) {
        Some(p) => Some(Fast::Value(p)),
        None => pred(&e.expr).map(Fast::Pred),
    }
}

/// The header names a fast expression reads.
pub(super) fn headers(f: &Fast, out: &mut Vec<HeaderName>) {
    fn of_path(p: &Path, out: &mut Vec<HeaderName>) {
        if let Path::Header(Some(h)) = p
            && !out.contains(h)
        {
            out.push(h.clone());
        }
    }
    fn of_pred(p: &Pred, out: &mut Vec<HeaderName>) {
        match p {
            Pred::Bool(path)
            | Pred::Cmp { path, .. }
            | Pred::Str { path, .. }
            | Pred::HasKey { path, .. }
            | Pred::In { path, .. }
            | Pred::InNet { path, .. } => of_path(path, out),
            Pred::HasHeader(Some(h)) => of_path(&Path::Header(Some(h.clone())), out),
            Pred::HasHeader(None) => {}
            Pred::And(a, b) | Pred::Or(a, b) => {
                of_pred(a, out);
                of_pred(b, out);
            }
            Pred::Not(a) => of_pred(a, out),
        }
    }
    match f {
        Fast::Value(p) => of_path(p, out),
        Fast::Pred(p) => of_pred(p, out),
    }
}

/// Evaluates a predicate on the request data of `act`.
pub(super) fn eval(p: &Pred, act: &Activation<'_>) -> Tri {
    let with = |path: &Path, f: &mut dyn FnMut(Val<'_>) -> Tri| act.read(path, f);
    match p {
        Pred::Bool(path) => with(path, &mut |v| match v {
            Val::Bool(b) => b.into(),
            _ => Tri::Error,
        }),
        Pred::Cmp { path, lit, negated } => with(path, &mut |v| {
            let eq = match (v, lit) {
                (Val::Missing, _) => return Tri::Error,
                (Val::Str(s), Lit::Str(l)) => s == &**l,
                (Val::Int(i), Lit::Int(l)) => i == *l,
                (Val::Bool(b), Lit::Bool(l)) => b == *l,
                _ => return Tri::Unknown,
            };
            (eq != *negated).into()
        }),
        Pred::Str { path, op, arg } => with(path, &mut |v| match v {
            Val::Str(s) => match op {
                StrOp::StartsWith => s.starts_with(&**arg),
                StrOp::EndsWith => s.ends_with(&**arg),
                StrOp::Contains => s.contains(&**arg),
            }
            .into(),
            Val::Missing => Tri::Error,
            _ => Tri::Unknown,
        }),
        Pred::HasHeader(None) => Tri::False,
        Pred::HasHeader(Some(h)) => act.read_header(h, |v| v.is_some()).into(),
        Pred::HasKey { path, key } => with(path, &mut |v| match v {
            Val::Json(serde_json::Value::Object(o)) => o.contains_key(&**key).into(),
            Val::Missing => Tri::Error,
            _ => Tri::Unknown,
        }),
        Pred::In { lit, path } => with(path, &mut |v| match v {
            Val::Json(serde_json::Value::Object(o)) => o.contains_key(&**lit).into(),
            Val::Json(serde_json::Value::Array(a)) => {
                let mut found = false;
                for item in a {
                    match item {
                        serde_json::Value::String(s) => found |= s == &**lit,
                        _ => return Tri::Unknown,
                    }
                }
                found.into()
            }
            Val::Missing => Tri::Error,
            _ => Tri::Unknown,
        }),
        // The peer's address as it is, rather than printed then parsed again.
        Pred::InNet {
            net,
            path: Path::Address,
        } => match net::accept(act.source_ip()) {
            Some(ip) => net.contains(ip).into(),
            None => Tri::Error,
        },
        Pred::InNet { net, path } => with(path, &mut |v| match v {
            Val::Str(s) => match net::parse_ip(s) {
                Ok(ip) => net.contains(ip).into(),
                Err(_) => Tri::Error,
            },
            Val::Missing => Tri::Error,
            _ => Tri::Unknown,
        }),
        Pred::And(a, b) => match eval(a, act) {
            Tri::Unknown => Tri::Unknown,
            Tri::False => Tri::False,
            left => match (left, eval(b, act)) {
                (_, Tri::Unknown) => Tri::Unknown,
                (_, Tri::False) => Tri::False,
                (Tri::True, right) => right,
                _ => Tri::Error,
            },
        },
        Pred::Or(a, b) => match eval(a, act) {
            Tri::Unknown => Tri::Unknown,
            Tri::True => Tri::True,
            left => match (left, eval(b, act)) {
                (_, Tri::Unknown) => Tri::Unknown,
                (_, Tri::True) => Tri::True,
                (Tri::False, right) => right,
                _ => Tri::Error,
            },
        },
        Pred::Not(a) => match eval(a, act) {
            Tri::True => Tri::False,
            Tri::False => Tri::True,
            other => other,
        },
    }
}

/// `request.x`, `request.headers.y`, `auth.identity.z['w']`: the name segments, root first.
pub(super) fn segments<'e>(e: &'e Ast, out: &mut Vec<&'e str>) -> bool {
    match e {
        Ast::Ident(name) => {
            out.push(name);
            true
        }
        Ast::Select(s) if !s.test => {
            let ok = segments(&s.operand.expr, out);
            out.push(&s.field);
            ok
        }
        Ast::Call(CallExpr {
            func_name,
            target: None,
            args,
        }) if func_name == INDEX && args.len() == 2 => match &args[1].expr {
            Ast::Literal(LiteralValue::String(key)) => {
                let ok = segments(&args[0].expr, out);
                out.push(key);
                ok
            }
            _ => false,
        },
        _ => false,
    }
}

fn path_of(segs: &[&str]) -> Option<Path> {
    Some(match segs {
        ["request", "method"] => Path::Method,
        ["request", "host"] => Path::Host,
        ["request", "path"] => Path::Path,
        ["request", "url_path"] => Path::UrlPath,
        ["request", "scheme"] => Path::Scheme,
        ["request", "headers", name] => Path::Header(header(name)),
        ["source", "address"] => Path::Address,
        ["source", "port"] => Path::Port,
        ["auth", "identity", keys @ ..] => {
            Path::Identity(keys.iter().map(|k| (*k).into()).collect())
        }
        _ => return None,
    })
}

/// The header a CEL key names: only a lower-case header name can be a key of
/// `request.headers`.
pub(super) fn header(name: &str) -> Option<HeaderName> {
    HeaderName::from_bytes(name.as_bytes())
        .ok()
        .filter(|h| h.as_str() == name)
}

pub(super) fn path(e: &Ast) -> Option<Path> {
    let mut segs = Vec::new();
    if !segments(e, &mut segs) {
        return None;
    }
    path_of(&segs)
}

fn lit(e: &Ast) -> Option<Lit> {
    match e {
        Ast::Literal(LiteralValue::String(s)) => Some(Lit::Str((**s).into())),
        Ast::Literal(LiteralValue::Int(i)) => Some(Lit::Int(*i.inner())),
        Ast::Literal(LiteralValue::Boolean(b)) => Some(Lit::Bool(*b.inner())),
        _ => None,
    }
}

fn str_lit(e: &Ast) -> Option<Box<str>> {
    match lit(e)? {
        Lit::Str(s) => Some(s),
        _ => None,
    }
}

/// A predicate operand of `&&`, `||`, `!`: a predicate or a value used as a boolean.
fn operand(e: &Ast) -> Option<Box<Pred>> {
    pred(e).or_else(|| path(e).map(Pred::Bool)).map(Box::new)
}

fn pred(e: &Ast) -> Option<Pred> {
    match e {
        Ast::Call(c) => call(c),
        Ast::Select(s) if s.test => {
            let mut segs = Vec::new();
            if !segments(&s.operand.expr, &mut segs) {
                return None;
            }
            match segs.as_slice() {
                ["request", "headers"] => Some(Pred::HasHeader(header(&s.field))),
                ["auth", "identity", ..] => Some(Pred::HasKey {
                    path: path_of(&segs)?,
                    key: s.field.as_str().into(),
                }),
                _ => None,
            }
        }
        _ => None,
    }
}

fn call(c: &CallExpr) -> Option<Pred> {
    let args = c.args.as_slice();
    match (c.func_name.as_str(), c.target.as_deref(), args) {
        (EQUALS | NOT_EQUALS, None, [a, b]) => {
            let (path, lit) = match (path(&a.expr), lit(&b.expr)) {
                (Some(p), Some(l)) => (p, l),
                _ => (path(&b.expr)?, lit(&a.expr)?),
            };
            Some(Pred::Cmp {
                path,
                lit,
                negated: c.func_name == NOT_EQUALS,
            })
        }
        (name @ ("startsWith" | "endsWith" | "contains"), Some(target), [arg]) => Some(Pred::Str {
            path: path(&target.expr)?,
            op: match name {
                "startsWith" => StrOp::StartsWith,
                "endsWith" => StrOp::EndsWith,
                _ => StrOp::Contains,
            },
            arg: str_lit(&arg.expr)?,
        }),
        ("containsIP", Some(target), [arg]) => Some(Pred::InNet {
            net: cidr_lit(&target.expr)?,
            path: ip_arg(&arg.expr)?,
        }),
        (LOGICAL_AND, None, [a, b]) => Some(Pred::And(operand(&a.expr)?, operand(&b.expr)?)),
        (LOGICAL_OR, None, [a, b]) => Some(Pred::Or(operand(&a.expr)?, operand(&b.expr)?)),
        (LOGICAL_NOT, None, [a]) => Some(Pred::Not(operand(&a.expr)?)),
        (IN, None, [l, container]) => {
            let lit = str_lit(&l.expr)?;
            let mut segs = Vec::new();
            if !segments(&container.expr, &mut segs) {
                return None;
            }
            match segs.as_slice() {
                ["request", "headers"] => Some(Pred::HasHeader(header(&lit))),
                ["auth", "identity", ..] => Some(Pred::In {
                    lit,
                    path: path_of(&segs)?,
                }),
                _ => None,
            }
        }
        _ => None,
    }
}

/// `cidr('literal')` with a literal `cidr` accepts, parsed.
fn cidr_lit(e: &Ast) -> Option<Cidr> {
    match e {
        Ast::Call(CallExpr {
            func_name,
            target: None,
            args,
        }) if func_name == "cidr" => match args.as_slice() {
            [arg] => net::parse_cidr(&str_lit(&arg.expr)?).ok(),
            _ => None,
        },
        _ => None,
    }
}

/// The value `containsIP` is given: `<path>` or `ip(<path>)`, which mean the same to it (a
/// string that is no address is an error either way).
fn ip_arg(e: &Ast) -> Option<Path> {
    match e {
        Ast::Call(CallExpr {
            func_name,
            target: None,
            args,
        }) if func_name == "ip" => match args.as_slice() {
            [arg] => path(&arg.expr),
            _ => None,
        },
        _ => path(e),
    }
}
