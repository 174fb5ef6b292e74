//! CEL expressions of policies: compiled once per table, evaluated per request.
//!
//! In: expression source (at table build) and a request's [`Attrs`] (per request). Out: a
//! boolean (predicates) or a string (counter keys, header values). The variables are the ones
//! the policy API documents: `request` (`method`, `host`, `path` with query, `url_path`,
//! `scheme`, `headers` with lower-case names, several values of one name joined with `,`),
//! `source` (`address`, `port`) and `auth` (`identity`). Besides the standard functions, the
//! Kubernetes IP and CIDR libraries (`ip`, `cidr` and their methods; `cel/net.rs`) let a
//! predicate match networks: `cidr('10.0.0.0/8').containsIP(source.address)`. [`check`] is
//! what the compiler calls so that a policy with an expression the proxy could not run is
//! rejected before it reaches a proxy.
//!
//! The policy phase runs on every request, so evaluation is built not to cost a CEL context:
//!
//! - [`Expr::compile`] also compiles the common shapes (attribute paths, comparisons with
//!   literals, `startsWith`/`endsWith`/`contains`, `has`, `in`, `cidr('literal').containsIP`,
//!   `&&`, `||`, `!`; see `cel/fast.rs`) into a tree evaluated on the request data directly.
//!   Cost expressions have their own fast forms (`cel/int.rs`): integer literals and
//!   `int(<value>)` of such a value (`int(request.headers['x-cost'])`), and on a response
//!   `int(response.headers['h'])`, `response.status` and `response.body` fields.
//!   Everything else, and the few cases of those shapes whose CEL semantics the fast path
//!   does not model, runs through the CEL interpreter, with the same results (`cel/tests.rs`
//!   and `cel/int_tests.rs` check both ways).
//! - An [`Activation`] is a snapshot of the request, taken before authentication may change
//!   the request's headers: the method, host, path and scheme, and the headers. Built with
//!   [`Activation::with_needs`] it copies only what the expressions of a policy set read
//!   ([`Needs`]): no header at all, or the few they name, or the whole map when an
//!   interpreted expression reads `request`. The CEL context is built from it only when an
//!   interpreted expression runs, at most once per request, with only the variables the
//!   expressions use. `auth.identity` is shared with the authenticator, not copied.

mod activation;
mod fast;
mod int;
#[cfg(test)]
mod int_tests;
mod log_filter;
mod net;
mod response;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap};
use std::fmt::{self, Write as _};
use std::sync::{Arc, LazyLock};

use cel::common::ast::{EntryExpr, Expr as Ast, MapExpr, StructExpr, operators as ops};
use cel::{Context, Env, IdedExpr, Program, Value};
use http::HeaderName;

pub use self::activation::{Activation, Attrs, IdentityValue, Needs};
use self::fast::{Fast, Tri, Val};
pub use self::log_filter::{LOG_VARIABLES, LogFilter, LogVars};
pub use self::response::{RESPONSE_VARIABLES, ResponseExpr, check_response};

/// Top-level variables an expression may use.
pub const VARIABLES: [&str; 3] = ["request", "source", "auth"];

/// The variables as bits of [`Needs`].
const REQUEST: u8 = 1;
const SOURCE: u8 = 2;
const AUTH: u8 = 4;
const ALL_VARS: u8 = REQUEST | SOURCE | AUTH;

/// The environment: the standard library and the Kubernetes IP and CIDR libraries
/// (`cel/net.rs`). Built once (building it per request would cost more than the evaluation).
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    if let Err(e) = env.add_extension(net::register) {
        // Only a bug can get here (an overload declared twice; a test registers them): `check`
        // then refuses the functions left undeclared.
        tracing::error!(error = %e, "the CEL IP and CIDR functions could not be declared");
    }
    Arc::new(env)
});

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
    /// A response expression names a variable other than `response`.
    #[error(
        "CEL expression `{expr}` uses unknown variable `{variable}` (a response expression knows only: response)"
    )]
    UnknownResponseVariable {
        /// The expression.
        expr: String,
        /// The variable.
        variable: String,
    },
    /// It calls a function the environment does not declare: it could never run.
    #[error("CEL expression `{expr}` calls unknown function `{function}`")]
    UnknownFunction {
        /// The expression.
        expr: String,
        /// The function, as the call names it (`f` of `x.f()`).
        function: String,
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

/// Checks that `source` compiles and names only known variables and functions.
pub fn check(source: &str) -> Result<(), CelError> {
    Expr::compile(source).map(|_| ())
}

/// A compiled expression. Cheap to clone.
#[derive(Clone)]
pub struct Expr {
    inner: Arc<Compiled>,
}

struct Compiled {
    program: Program,
    source: Box<str>,
    /// The fast form, when the expression has one of the shapes `fast.rs` knows.
    fast: Option<Fast>,
    /// The fast integer form (a cost), when it has one of the shapes `int.rs` knows.
    int: Option<int::RequestInt>,
    /// Variables it uses ([`REQUEST`] | [`SOURCE`] | [`AUTH`]).
    vars: u8,
    /// Headers its fast form reads.
    headers: Box<[HeaderName]>,
}

impl std::fmt::Debug for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Expr").field(&self.inner.source).finish()
    }
}

impl Expr {
    /// Compiles `source`.
    pub fn compile(source: &str) -> Result<Self, CelError> {
        let program = ENV.compile(source).map_err(|e| CelError::Parse {
            expr: source.to_owned(),
            message: e.to_string(),
        })?;
        let mut vars = 0;
        let mut names = Names::new();
        names.walk(program.expression());
        let mut unknown: Option<&str> = None;
        for v in &names.variables {
            match VARIABLES.iter().position(|known| known == v) {
                Some(i) => vars |= 1 << i,
                // The least one is reported, so an expression always gets the same message
                // (statuses are part of the compiler's deterministic output; found by
                // fuzzing).
                None => unknown = Some(unknown.map_or(v, |u| u.min(v))),
            }
        }
        if let Some(v) = unknown {
            return Err(CelError::UnknownVariable {
                expr: source.to_owned(),
                variable: v.to_owned(),
            });
        }
        if let Some(f) = names.unknown_functions.first() {
            return Err(CelError::UnknownFunction {
                expr: source.to_owned(),
                function: (*f).to_owned(),
            });
        }
        let fast = fast::compile(program.expression());
        let int = match fast {
            Some(_) => None,
            None => int::compile_request(&program.expression().expr),
        };
        let mut headers = Vec::new();
        if let Some(f) = &fast {
            fast::headers(f, &mut headers);
        }
        if let Some(int::RequestInt::Int(p)) = &int {
            fast::headers(&Fast::Value(p.clone()), &mut headers);
        }
        Ok(Self {
            inner: Arc::new(Compiled {
                program,
                source: source.into(),
                fast,
                int,
                vars,
                headers: headers.into(),
            }),
        })
    }

    /// The source text.
    pub fn source(&self) -> &str {
        &self.inner.source
    }

    /// Whether the expression runs without the CEL interpreter (but for values whose type
    /// the fast path does not model).
    pub fn is_fast(&self) -> bool {
        self.inner.fast.is_some() || self.inner.int.is_some()
    }

    /// Evaluates to a value, with the CEL interpreter.
    pub fn eval(&self, act: &Activation<'_>) -> Result<Value, CelError> {
        debug_assert!(
            self.inner.vars & !act.vars == 0,
            "`{}` uses a variable the activation did not capture",
            self.inner.source
        );
        self.inner
            .program
            .execute(act.context())
            .map_err(|e| CelError::Eval {
                expr: self.inner.source.to_string(),
                message: e.to_string(),
            })
    }

    /// Evaluates a predicate; anything but `true` (including an error) is false.
    pub fn eval_bool(&self, act: &Activation<'_>) -> bool {
        match &self.inner.fast {
            Some(Fast::Pred(p)) => match fast::eval(p, act) {
                Tri::True => true,
                Tri::False | Tri::Error => false,
                Tri::Unknown => self.interpret_bool(act),
            },
            Some(Fast::Value(path)) => act.read(path, |v| matches!(v, Val::Bool(true))),
            // An integer is never `true`.
            None if self.inner.int.is_some() => false,
            None => self.interpret_bool(act),
        }
    }

    /// Evaluates to an integer (what a `cost.request` gives): an int, or anything that
    /// [`Self::eval_string`] gives as the text of one (spaces around it allowed); `None`
    /// otherwise.
    pub fn eval_int(&self, act: &Activation<'_>) -> Option<i64> {
        match &self.inner.int {
            Some(i) => self.fast_int(i, act).ok(),
            None => self.eval_str_with(act, |v| v.and_then(|s| s.trim().parse::<i64>().ok())),
        }
    }

    fn fast_int(&self, i: &int::RequestInt, act: &Activation<'_>) -> Result<i64, ()> {
        match i {
            int::RequestInt::Lit(v) => *v,
            int::RequestInt::Int(path) => act.read(path, int::cel_int),
        }
    }

    /// Evaluates to a string: strings as they are, numbers and booleans printed, anything
    /// else (lists, maps, null, errors) as `None`.
    pub fn eval_string(&self, act: &Activation<'_>) -> Option<String> {
        self.eval_str_with(act, |s| s.map(str::to_owned))
    }

    /// [`Self::eval_string`] handed to `f` as a borrowed string, without allocating on the
    /// fast path.
    pub fn eval_str_with<R>(&self, act: &Activation<'_>, f: impl FnOnce(Option<&str>) -> R) -> R {
        match &self.inner.fast {
            Some(Fast::Value(path)) => act.read(path, |v| match v {
                Val::Str(s) => f(Some(s)),
                Val::Int(i) => with_display(i, f),
                Val::UInt(u) => with_display(u, f),
                Val::Float(x) => with_display(x, f),
                Val::Bool(b) => f(Some(if b { "true" } else { "false" })),
                Val::Null | Val::Json(_) | Val::Missing => f(None),
            }),
            Some(Fast::Pred(p)) => match fast::eval(p, act) {
                Tri::True => f(Some("true")),
                Tri::False => f(Some("false")),
                Tri::Error => f(None),
                Tri::Unknown => f(self.interpret_string(act).as_deref()),
            },
            None => match &self.inner.int {
                Some(i) => match self.fast_int(i, act) {
                    Ok(n) => with_display(n, f),
                    Err(()) => f(None),
                },
                None => f(self.interpret_string(act).as_deref()),
            },
        }
    }

    fn interpret_bool(&self, act: &Activation<'_>) -> bool {
        matches!(self.eval(act), Ok(Value::Bool(true)))
    }

    fn interpret_string(&self, act: &Activation<'_>) -> Option<String> {
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

/// Compiles `source` in [`ENV`] for a kind of expression whose variables are `known`: the least
/// other variable it reads is refused with the error `unknown` makes of it, and so is a call
/// to an undeclared function.
fn compile_checked(
    source: &str,
    known: &[&str],
    unknown: impl FnOnce(&str) -> CelError,
) -> Result<Program, CelError> {
    let program = ENV.compile(source).map_err(|e| CelError::Parse {
        expr: source.to_owned(),
        message: e.to_string(),
    })?;
    let mut names = Names::new();
    names.walk(program.expression());
    if let Some(v) = names.variables.iter().find(|v| !known.contains(v)) {
        return Err(unknown(v));
    }
    if let Some(f) = names.unknown_functions.first() {
        return Err(CelError::UnknownFunction {
            expr: source.to_owned(),
            function: (*f).to_owned(),
        });
    }
    Ok(program)
}

/// The names an expression uses, found in its syntax tree. The crate's `references` would
/// count `ip` in `ip.isCanonical(s)` as a variable: the parser does not know the environment,
/// which says that `ip` is a function's namespace there. Nor does the parser refuse a call
/// to a function no one declared (`sise(x)`), which fails on every evaluation: a predicate
/// with a typo would be false for every request, and a `when` with one would never apply.
struct Names<'e> {
    /// Identifiers read as variables (comprehension variables included, as `references`
    /// counts them), not the namespaces of the qualified functions called.
    variables: BTreeSet<&'e str>,
    /// Functions called that [`ENV`] does not declare.
    unknown_functions: BTreeSet<&'e str>,
    /// A context of [`ENV`], only asked which functions it declares.
    probe: Context<'static, 'static>,
}

impl<'e> Names<'e> {
    fn new() -> Self {
        Self {
            variables: BTreeSet::new(),
            unknown_functions: BTreeSet::new(),
            probe: Context::with_env(ENV.clone()),
        }
    }

    /// Whether [`ENV`] declares a function (global or member) called `name`. The crate
    /// answers that only this way: a context refuses a function of a declared overload's
    /// name (and takes one of any other name, in this throwaway context).
    fn declared(&mut self, name: &str) -> bool {
        self.probe.add_function(name, |x: i64| x).is_err()
    }

    fn walk(&mut self, e: &'e IdedExpr) {
        match &e.expr {
            Ast::Ident(name) => {
                // `@`-names are the macros' own (`@result`).
                if !name.starts_with('@') {
                    self.variables.insert(name);
                }
            }
            Ast::Call(call) => {
                let mut namespaced = false;
                if let Some(target) = &call.target {
                    // `a.b.f(x)` calls the function `a.b.f` when one is declared, as the
                    // interpreter resolves it; `a.b` is then no value.
                    let qualified =
                        qualified_name(&target.expr).map(|ns| format!("{ns}.{}", call.func_name));
                    namespaced = qualified.is_some_and(|q| self.declared(&q));
                    if !namespaced {
                        self.walk(target);
                    }
                }
                // Operators are the interpreter's own, not declared functions.
                if !namespaced
                    && !OPERATORS.contains(&call.func_name.as_str())
                    && !self.declared(&call.func_name)
                {
                    self.unknown_functions.insert(&call.func_name);
                }
                for arg in &call.args {
                    self.walk(arg);
                }
            }
            Ast::Select(select) => self.walk(&select.operand),
            Ast::Comprehension(c) => {
                for part in [
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ] {
                    self.walk(part);
                }
            }
            Ast::List(list) => {
                for element in &list.elements {
                    self.walk(element);
                }
            }
            Ast::Map(MapExpr { entries }) | Ast::Struct(StructExpr { entries, .. }) => {
                for entry in entries {
                    match &entry.expr {
                        EntryExpr::StructField(field) => self.walk(&field.value),
                        EntryExpr::MapEntry(entry) => {
                            self.walk(&entry.key);
                            self.walk(&entry.value);
                        }
                    }
                }
            }
            Ast::Literal(_) | Ast::Unspecified => {}
        }
    }
}

/// The calls the parser writes for operators (`a == b` calls `_==_`), which the
/// interpreter evaluates itself.
const OPERATORS: [&str; 21] = [
    ops::ADD,
    ops::CONDITIONAL,
    ops::DIVIDE,
    ops::EQUALS,
    ops::GREATER,
    ops::GREATER_EQUALS,
    ops::IN,
    ops::INDEX,
    ops::LESS,
    ops::LESS_EQUALS,
    ops::LOGICAL_AND,
    ops::LOGICAL_NOT,
    ops::LOGICAL_OR,
    ops::MODULO,
    ops::MULTIPLY,
    ops::NEGATE,
    ops::NOT_EQUALS,
    ops::NOT_STRICTLY_FALSE,
    ops::OPT_INDEX,
    ops::OPT_SELECT,
    ops::SUBSTRACT,
];

/// The qualified name `e` spells (`a.b.c`), if it is an identifier or fields selected on one.
fn qualified_name(e: &Ast) -> Option<String> {
    match e {
        Ast::Ident(name) => Some(name.clone()),
        Ast::Select(select) if !select.test => {
            let mut name = qualified_name(&select.operand.expr)?;
            name.push('.');
            name.push_str(&select.field);
            Some(name)
        }
        _ => None,
    }
}

/// `v` printed into a stack buffer (or a string when it does not fit), handed to `f`.
fn with_display<R>(v: impl fmt::Display, f: impl FnOnce(Option<&str>) -> R) -> R {
    let mut buf = StackStr::<40>::new();
    if write!(buf, "{v}").is_ok() {
        f(Some(buf.as_str()))
    } else {
        f(Some(&v.to_string()))
    }
}

/// A string in a fixed buffer; a write that does not fit fails and leaves it as it was.
struct StackStr<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> StackStr<N> {
    fn new() -> Self {
        Self {
            buf: [0; N],
            len: 0,
        }
    }

    fn as_str(&self) -> &str {
        // Only whole `&str`s and ASCII bytes are ever copied in: always UTF-8.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }

    /// Appends an ASCII byte (dropped when full).
    fn push_byte(&mut self, b: u8) {
        debug_assert!(b.is_ascii());
        if let Some(slot) = self.buf.get_mut(self.len) {
            *slot = b;
            self.len += 1;
        }
    }
}

impl<const N: usize> fmt::Write for StackStr<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let dst = self.buf.get_mut(self.len..end).ok_or(fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
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
