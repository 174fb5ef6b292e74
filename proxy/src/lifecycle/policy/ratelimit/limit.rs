//! A rate limit of the route table, compiled once per table.
//!
//! In: a [`tollgate_api::policy::RateLimit`] (at table build) and a request's
//! [`Activation`] (per request). Out: whether the limit applies to the request and the key of
//! the counter it falls in.
//!
//! The key is the limit `id` followed by the value of every counter expression, escaped so
//! that no two different tuples give the same key: `\` and `|` are escaped with `\`, each
//! value is introduced by `|=`, and a counter expression that fails to evaluate (a missing
//! header, a type error) contributes `|!` instead. Failing closed this way puts every request
//! that lacks the value in one shared counter for "missing": a client cannot escape its limit
//! by leaving out the header the counter is keyed on. A value longer than
//! [`MAX_RAW_COUNTER_VALUE`] bytes is introduced by `|#` and replaced by its SHA-256 (in hex):
//! counters keyed on a client's header then cost at most a few hundred bytes each, however
//! long the values a client sends (a key is held in memory or Redis for its whole window).

use std::sync::Arc;

use http::HeaderMap;
use tollgate_api::policy::{Cost as CostSpec, DEFAULT_COST_MAX_BODY_BYTES, LimitMode, RateLimit};

use super::KeyHasher;
use super::algo::{Cost, MAX_EXACT, Spec};
use super::metrics::DecisionCache;
use crate::lifecycle::policy::cel::{Activation, CelError, Expr, ResponseExpr};
use crate::lifecycle::policy::decisions::Decided as Counter;
use crate::lifecycle::policy::decisions::{Outcome, PolicyDecisions, rule_label};

/// Why a limit could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// A `when`, `counters` or `cost` expression does not compile.
    #[error("rate limit `{id}`: {source}")]
    Cel {
        /// The limit id.
        id: String,
        /// The CEL error.
        source: CelError,
    },
    /// The limit has no rates (it would admit everything).
    #[error("rate limit `{id}` has no rates")]
    NoRates {
        /// The limit id.
        id: String,
    },
    /// A rate has a zero window or is too large to count exactly.
    #[error(
        "rate limit `{id}`: rate {limit} per {window_ms} ms is out of range (window > 0, limit × window_ms < {MAX_EXACT})"
    )]
    BadRate {
        /// The limit id.
        id: String,
        /// Its limit.
        limit: u64,
        /// Its window.
        window_ms: u64,
    },
}

/// A [`RateLimit`] with its CEL compiled and its rates checked.
#[derive(Debug, Clone)]
pub struct CompiledLimit {
    id: Arc<str>,
    /// The id as it starts every key (escaped).
    key_prefix: Arc<str>,
    /// Hashes this limit's keys, the prefix read once here.
    key_hasher: KeyHasher,
    /// `namespace/policy`: the metrics label.
    policy: Arc<str>,
    specs: Arc<[Spec]>,
    counters: Vec<Expr>,
    when: Vec<Expr>,
    /// What a request counts.
    cost: CostExpr,
    /// The most units one request counts: the largest limit of its rates.
    max_cost: i64,
    /// `mode: Shadow`: counted, reported, never refused.
    shadow: bool,
    /// This limit's decision counters.
    metrics: DecisionCache,
    /// Its `tollgate_policy_decisions_total` counters: allowed, and limited (shadow_limited
    /// for a shadow limit); counting nowhere until [`Self::count_with`].
    decided: [Counter; 2],
}

/// A limit's compiled `cost`.
#[derive(Debug, Clone)]
enum CostExpr {
    /// One per request.
    One,
    /// From the request.
    Request(Expr),
    /// From the response, counted after it; `body_cap` is the most bytes of the body kept
    /// when the expression reads `response.body`.
    Response { expr: ResponseExpr, body_cap: usize },
}

/// What a request's `cost.request` came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestCost {
    /// What the counter is asked for.
    pub cost: Cost,
    /// The expression failed or gave a negative number: the cost is 1 (see
    /// [`CompiledLimit::request_cost`]).
    pub failed: bool,
}

impl CompiledLimit {
    /// Compiles the expressions and checks the rates of `limit`.
    pub fn new(limit: &RateLimit) -> Result<Self, LimitError> {
        let id = limit.id.as_str();
        let compile = |src: &String| {
            Expr::compile(src).map_err(|source| LimitError::Cel {
                id: id.to_owned(),
                source,
            })
        };
        if limit.rates.is_empty() {
            return Err(LimitError::NoRates { id: id.to_owned() });
        }
        let specs = limit
            .rates
            .iter()
            .map(|rate| {
                Spec::new(limit.algorithm, rate).ok_or_else(|| LimitError::BadRate {
                    id: id.to_owned(),
                    limit: rate.limit,
                    window_ms: rate.window_ms,
                })
            })
            .collect::<Result<Arc<[Spec]>, _>>()?;
        let mut key_prefix = String::with_capacity(id.len());
        escape_into(&mut key_prefix, id);
        let cost = match &limit.cost {
            None => CostExpr::One,
            Some(CostSpec::Request(src)) => CostExpr::Request(compile(src)?),
            Some(CostSpec::Response(src)) => CostExpr::Response {
                expr: ResponseExpr::compile(src).map_err(|source| LimitError::Cel {
                    id: id.to_owned(),
                    source,
                })?,
                body_cap: usize::try_from(
                    limit
                        .cost_max_body_bytes
                        .unwrap_or(DEFAULT_COST_MAX_BODY_BYTES),
                )
                .unwrap_or(usize::MAX),
            },
        };
        let max_cost = specs.iter().map(|s| s.limit).max().unwrap_or(1);
        Ok(Self {
            id: id.into(),
            key_hasher: KeyHasher::after_prefix(&key_prefix),
            key_prefix: key_prefix.into(),
            policy: policy_of(id).into(),
            specs,
            counters: limit
                .counters
                .iter()
                .map(compile)
                .collect::<Result<_, _>>()?,
            when: limit.when.iter().map(compile).collect::<Result<_, _>>()?,
            cost,
            max_cost,
            shadow: limit.mode == LimitMode::Shadow,
            metrics: DecisionCache::default(),
            decided: Default::default(),
        })
    }

    /// `mode: Shadow`: the limit counts and reports, and never refuses.
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// True when the limit's cost is read from the response
    /// ([`Self::response_cost`]), to be counted after it.
    pub fn costs_after_response(&self) -> bool {
        matches!(self.cost, CostExpr::Response { .. })
    }

    /// When the limit's `cost.response` reads `response.body`: the most bytes of the body
    /// to keep for it (the cost is counted once the body has ended).
    pub fn response_body_cap(&self) -> Option<usize> {
        match &self.cost {
            CostExpr::Response { expr, body_cap } if expr.reads_body() => Some(*body_cap),
            _ => None,
        }
    }

    /// What the request of `act` asks of the counter. A plain limit: room for 1, counts 1.
    /// `cost.request`: room for its cost (at least 1: a free request still needs a counter
    /// that is not over its limit), counts its cost; an expression that fails, or gives a
    /// negative number or no integer, costs 1, never 0 (a client that makes it fail must
    /// not go unlimited). `cost.response`: room for 1, counts nothing now. A request cost
    /// above the limit's largest rate never fits: it asks for one more than that rate holds
    /// (refused whatever the counter says, counting nothing), rather than being cut to the
    /// limit and admitted on an empty counter.
    pub(crate) fn request_cost(&self, act: &Activation<'_>) -> RequestCost {
        match &self.cost {
            CostExpr::One => RequestCost {
                cost: Cost::ONE,
                failed: false,
            },
            CostExpr::Response { .. } => RequestCost {
                cost: Cost { need: 1, take: 0 },
                failed: false,
            },
            CostExpr::Request(e) => {
                let n = e.eval_int(act);
                match n.filter(|n| *n >= 0) {
                    Some(n) if n > self.max_cost => RequestCost {
                        cost: Cost {
                            need: self.max_cost.saturating_add(1),
                            take: 0,
                        },
                        failed: false,
                    },
                    Some(n) => RequestCost {
                        cost: Cost {
                            need: n.max(1),
                            take: n,
                        },
                        failed: false,
                    },
                    None => RequestCost {
                        cost: Cost::ONE,
                        failed: true,
                    },
                }
            }
        }
    }

    /// What the response of a request counted by this limit costs (`cost.response`), and
    /// whether the expression failed: as for [`Self::request_cost`], a failure or a
    /// negative number costs 1. At most the limit's largest rate. `None` for a limit whose
    /// cost is not read from the response. `body`: the response body as JSON, when read.
    pub(crate) fn response_cost(
        &self,
        status: u16,
        headers: &HeaderMap,
        body: Option<&serde_json::Value>,
    ) -> Option<(i64, bool)> {
        let CostExpr::Response { expr: e, .. } = &self.cost else {
            return None;
        };
        Some(match e.eval_int(status, headers, body) {
            Ok(n) if n >= 0 => (n.min(self.max_cost), false),
            Ok(_) | Err(_) => (1, true),
        })
    }

    /// The limit id (`namespace/policy/limit-name`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The id, shared.
    pub fn id_shared(&self) -> &Arc<str> {
        &self.id
    }

    /// The `namespace/policy` part of the id, the metrics label.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    pub(crate) fn policy_label(&self) -> &Arc<str> {
        &self.policy
    }

    pub(crate) fn specs(&self) -> &[Spec] {
        &self.specs
    }

    pub(crate) fn metrics_cache(&self) -> &DecisionCache {
        &self.metrics
    }

    /// The limit's name in its policy: the id after `namespace/policy/`.
    pub fn name(&self) -> &str {
        self.id.get(self.policy.len() + 1..).unwrap_or_default()
    }

    /// Resolves the limit's decision counters in `decisions` (`rule="limits.<name>"`): call
    /// once when the table is applied.
    pub fn count_with(&mut self, decisions: &PolicyDecisions) {
        let refused = if self.shadow {
            Outcome::ShadowLimited
        } else {
            Outcome::Limited
        };
        self.decided = decisions.counters(
            &self.policy,
            &rule_label("limits", self.name()),
            [Outcome::Allowed, refused],
        );
    }

    /// Counts one decision in the limit's decision counters.
    pub(crate) fn count_decision(&self, allowed: bool) {
        let [yes, no] = &self.decided;
        if allowed { yes } else { no }.inc();
    }

    /// True when every `when` predicate holds (an expression that fails is false: the limit
    /// then does not apply, as for any unmet condition).
    pub fn applies(&self, act: &Activation<'_>) -> bool {
        self.when.iter().all(|e| e.eval_bool(act))
    }

    /// The counter key of the request (see the module documentation). Always a key: a
    /// counter expression that fails to evaluate selects the "missing" counter, it never
    /// exempts the request.
    pub fn key(&self, act: &Activation<'_>) -> String {
        let mut key = String::with_capacity(self.key_prefix.len() + 24 * self.counters.len());
        self.key_into(act, &mut key);
        key
    }

    /// [`Self::key`] appended to `key` (to reuse one buffer).
    pub fn key_into(&self, act: &Activation<'_>, key: &mut String) {
        key.push_str(&self.key_prefix);
        for e in &self.counters {
            e.eval_str_with(act, |v| push_value(key, v));
        }
    }

    /// The hash of `key`, one of this limit's keys ([`Self::key`]), as the counter stores
    /// hash keys (the prefix was read at build).
    pub(crate) fn key_hash(&self, key: &str) -> u64 {
        debug_assert!(
            key.starts_with(&*self.key_prefix),
            "not a key of this limit"
        );
        self.key_hasher.hash(key)
    }

    /// Its request CEL expressions (`when`, `counters`, then `cost.request`).
    pub fn expressions(&self) -> impl Iterator<Item = &Expr> {
        let cost = match &self.cost {
            CostExpr::Request(e) => Some(e),
            CostExpr::One | CostExpr::Response { .. } => None,
        };
        self.when.iter().chain(&self.counters).chain(cost)
    }
}

/// `namespace/policy` of `namespace/policy/limit`; the whole id when it has fewer parts.
fn policy_of(id: &str) -> &str {
    match id.match_indices('/').nth(1) {
        Some((i, _)) => &id[..i],
        None => id,
    }
}

/// The key of `id` and the counter values (`None` = did not evaluate), as
/// [`CompiledLimit::key`] builds it.
#[cfg(test)]
pub(crate) fn encode_key(id: &str, values: &[Option<String>]) -> String {
    let len = id.len() + values.iter().flatten().map(|v| v.len() + 2).sum::<usize>();
    let mut key = String::with_capacity(len + 2 * values.len());
    escape_into(&mut key, id);
    for v in values {
        push_value(&mut key, v.as_deref());
    }
    key
}

/// Longest counter value kept as it is in a key; a longer one is hashed.
pub const MAX_RAW_COUNTER_VALUE: usize = 256;

/// One counter value of a key: `|=` and the value escaped, `|#` and the SHA-256 of a value
/// over [`MAX_RAW_COUNTER_VALUE`] bytes, or `|!` when it did not evaluate.
fn push_value(key: &mut String, v: Option<&str>) {
    match v {
        Some(v) if v.len() > MAX_RAW_COUNTER_VALUE => {
            use sha2::{Digest, Sha256};
            use std::fmt::Write as _;
            key.push_str("|#");
            for b in Sha256::digest(v.as_bytes()) {
                let _ = write!(key, "{b:02x}");
            }
        }
        Some(v) => {
            key.push_str("|=");
            escape_into(key, v);
        }
        None => key.push_str("|!"),
    }
}

fn escape_into(out: &mut String, s: &str) {
    if !s.bytes().any(|b| b == b'\\' || b == b'|') {
        out.push_str(s);
        return;
    }
    for ch in s.chars() {
        if ch == '\\' || ch == '|' {
            out.push('\\');
        }
        out.push(ch);
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;
    use tollgate_api::policy::{Algorithm, Rate};

    use super::*;
    use crate::lifecycle::policy::cel::Attrs;

    fn limit(counters: &[&str], when: &[&str]) -> RateLimit {
        RateLimit {
            id: "shop/per-user/api".into(),
            rates: vec![Rate {
                limit: 10,
                window_ms: 1_000,
            }],
            algorithm: Algorithm::default(),
            counters: counters.iter().map(|s| s.to_string()).collect(),
            when: when.iter().map(|s| s.to_string()).collect(),
            cost: None,
            cost_max_body_bytes: None,
            mode: Default::default(),
        }
    }

    fn with_act<R>(headers: &[(&'static str, &str)], f: impl FnOnce(&Activation<'_>) -> R) -> R {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.insert(*k, v.parse().unwrap());
        }
        let attrs = Attrs {
            method: "GET",
            host: "shop.example.com",
            path: "/api/items",
            scheme: "https",
            headers: &h,
            source: "10.0.0.7:4000".parse().unwrap(),
        };
        f(&Activation::new(&attrs))
    }

    #[test]
    fn key_is_the_id_and_the_counter_values() {
        let l = CompiledLimit::new(&limit(
            &["request.headers['x-user']", "source.address"],
            &[],
        ))
        .unwrap();
        assert_eq!(l.policy(), "shop/per-user");
        let key = with_act(&[("x-user", "alice")], |a| l.key(a));
        assert_eq!(key, "shop/per-user/api|=alice|=10.0.0.7");
    }

    #[test]
    fn key_is_encode_key_of_the_evaluated_values() {
        let l = CompiledLimit::new(&limit(
            &[
                "request.headers['x-user']",
                "source.port",
                "request.headers['missing']",
                "size(request.headers)",
                "request.method == 'GET'",
            ],
            &[],
        ))
        .unwrap();
        with_act(&[("x-user", "a|=b\\c")], |a| {
            let values: Vec<Option<String>> = l.expressions().map(|e| e.eval_string(a)).collect();
            assert_eq!(l.key(a), encode_key(l.id(), &values));
            assert_eq!(l.key(a), "shop/per-user/api|=a\\|=b\\\\c|=4000|!|=1|=true");
        });
    }

    #[test]
    fn a_counter_that_does_not_evaluate_selects_the_missing_counter() {
        let l = CompiledLimit::new(&limit(&["request.headers['x-user']"], &[])).unwrap();
        let missing = with_act(&[], |a| l.key(a));
        assert_eq!(missing, "shop/per-user/api|!");
        let empty = with_act(&[("x-user", "")], |a| l.key(a));
        assert_ne!(
            missing, empty,
            "an empty value is a value, not a missing one"
        );
    }

    #[test]
    fn keys_are_unambiguous() {
        let tuples: [&[Option<&str>]; 7] = [
            &[Some("a|=b")],
            &[Some("a"), Some("b")],
            &[Some("a\\"), Some("b")],
            &[Some("a\\|=b")],
            &[None],
            &[Some("!")],
            &[Some("")],
        ];
        let keys: Vec<String> = tuples
            .iter()
            .map(|t| {
                let owned: Vec<Option<String>> = t.iter().map(|v| v.map(str::to_owned)).collect();
                encode_key("ns/p/l", &owned)
            })
            .collect();
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_ne!(
            encode_key("a|", &[None]),
            encode_key("a", &[Some(String::new())])
        );
    }

    #[test]
    fn applies_when_every_predicate_holds() {
        let l = CompiledLimit::new(&limit(
            &[],
            &[
                "request.method == 'GET'",
                "request.url_path.startsWith('/api')",
            ],
        ))
        .unwrap();
        assert!(with_act(&[], |a| l.applies(a)));
        let l = CompiledLimit::new(&limit(
            &[],
            &["request.method == 'GET'", "request.headers['x'] == 'y'"],
        ))
        .unwrap();
        assert!(!with_act(&[], |a| l.applies(a)));
        let l = CompiledLimit::new(&limit(&[], &[])).unwrap();
        assert!(with_act(&[], |a| l.applies(a)), "no predicate: always");
        assert_eq!(with_act(&[], |a| l.key(a)), "shop/per-user/api");
    }

    #[test]
    fn bad_limits_are_refused() {
        assert!(matches!(
            CompiledLimit::new(&limit(&["request.headers["], &[])),
            Err(LimitError::Cel { .. })
        ));
        assert!(matches!(
            CompiledLimit::new(&limit(&[], &["nope == 1"])),
            Err(LimitError::Cel { .. })
        ));
        let mut l = limit(&[], &[]);
        l.rates.clear();
        assert!(matches!(
            CompiledLimit::new(&l),
            Err(LimitError::NoRates { .. })
        ));
        l.rates.push(Rate {
            limit: 1,
            window_ms: 0,
        });
        assert!(matches!(
            CompiledLimit::new(&l),
            Err(LimitError::BadRate { .. })
        ));
    }

    #[test]
    fn policy_label_is_namespace_and_policy() {
        assert_eq!(policy_of("ns/pol/limit"), "ns/pol");
        assert_eq!(policy_of("ns/pol"), "ns/pol");
        assert_eq!(policy_of("x"), "x");
        let l = CompiledLimit::new(&limit(&[], &[])).unwrap();
        assert_eq!((l.policy(), l.name()), ("shop/per-user", "api"));
    }

    #[test]
    fn long_counter_values_are_hashed_into_short_keys() {
        let l = CompiledLimit::new(&limit(&["request.headers['x-user']"], &[])).unwrap();
        let key_of = |v: &str| with_act(&[("x-user", v)], |a| l.key(a));
        let at_limit = "a".repeat(MAX_RAW_COUNTER_VALUE);
        assert_eq!(key_of(&at_limit), format!("shop/per-user/api|={at_limit}"));
        let long = "b".repeat(60_000);
        let key = key_of(&long);
        assert_eq!(key.len(), "shop/per-user/api|#".len() + 64, "{key}");
        assert!(key.starts_with("shop/per-user/api|#"));
        assert_eq!(key_of(&long), key);
        let other = format!("{}c", "b".repeat(59_999));
        assert_ne!(key_of(&other), key);
        // No raw value can look like a hashed one: its `|` would be escaped.
        let forged = format!("x|#{}", &key["shop/per-user/api|#".len()..]);
        assert_ne!(key_of(&forged), key);
    }
}
