//! RateLimitPolicy spec to table limits.
//!
//! In: one policy. Out: its defaults or overrides as named [`RateLimit`]s (ids
//! `namespace/policy/limit`, the policy's `when` folded into every limit), or the `Invalid`
//! problem: a window that does not parse, a CEL expression that does not compile (a
//! `cost.request` on the request's variables, a `cost.response` on `response` alone), a
//! `cost` with both or neither of `request` and `response`, a `cost.maxBodyBytes` without
//! `response` or out of range, no limits.

use std::collections::BTreeMap;

use tollgate_api::ObjectKey;
use tollgate_api::policy::{Algorithm, Cost, LimitMode, MAX_COST_MAX_BODY_BYTES, Rate, RateLimit};
use tollgate_proxy::policy::cel;

use super::{Contribution, Problem, invalid};
use crate::crds::common::{Predicate, Strategy};
use crate::crds::ratelimit::{AlgorithmSpec, CostSpec, Limit, ModeSpec, RateLimitPolicy};

/// Named limits of one policy.
pub type Limits = BTreeMap<String, RateLimit>;

/// Converts `policy` into its contribution.
pub fn contribution(
    policy: &RateLimitPolicy,
    key: &ObjectKey,
) -> Result<Contribution<Limits>, Problem> {
    let spec = &policy.spec;
    let (overrides, strategy, limits, when) = match (&spec.defaults, &spec.overrides) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "spec.defaults and spec.overrides are mutually exclusive",
            ));
        }
        (_, Some(o)) if spec.limits.is_some() => {
            let _ = o;
            return Err(invalid(
                "spec.limits cannot be combined with spec.overrides",
            ));
        }
        (Some(_), None) if spec.limits.is_some() => {
            return Err(invalid("spec.limits cannot be combined with spec.defaults"));
        }
        (Some(d), None) => (false, d.strategy, &d.limits, d.when.as_slice()),
        (None, Some(o)) => (true, o.strategy, &o.limits, o.when.as_slice()),
        (None, None) => match &spec.limits {
            Some(l) => (
                false,
                Strategy::Atomic,
                l,
                spec.when.as_deref().unwrap_or_default(),
            ),
            None => {
                return Err(invalid(
                    "no limits: set spec.limits, spec.defaults or spec.overrides",
                ));
            }
        },
    };
    if limits.is_empty() {
        return Err(invalid("no limits"));
    }
    let policy_when = predicates(when, "when")?;
    let mut out = Limits::new();
    for (name, limit) in limits {
        out.insert(name.clone(), convert(name, limit, key, &policy_when)?);
    }
    Ok(Contribution {
        overrides,
        strategy,
        entries: out,
    })
}

fn convert(
    name: &str,
    limit: &Limit,
    key: &ObjectKey,
    policy_when: &[String],
) -> Result<RateLimit, Problem> {
    if limit.rates.is_empty() {
        return Err(invalid(format!(
            "limits.{name}: at least one rate is required"
        )));
    }
    let rates = limit
        .rates
        .iter()
        .map(|r| {
            if r.limit == 0 {
                return Err(invalid(format!("limits.{name}: limit must be at least 1")));
            }
            let window_ms = parse_window(&r.window).ok_or_else(|| {
                invalid(format!(
                    "limits.{name}: window {:?} is not a duration like 500ms, 10s, 1m, 1h",
                    r.window
                ))
            })?;
            Ok(Rate {
                limit: r.limit,
                window_ms,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let counters = limit
        .counters
        .iter()
        .map(|c| check(&c.expression, &format!("limits.{name}.counters")))
        .collect::<Result<Vec<_>, _>>()?;
    let mut when = policy_when.to_vec();
    when.extend(predicates(&limit.when, &format!("limits.{name}.when"))?);
    let (cost, cost_max_body_bytes) = match &limit.cost {
        Some(c) => {
            let (cost, cap) = convert_cost(name, c)?;
            (Some(cost), cap)
        }
        None => (None, None),
    };
    Ok(RateLimit {
        id: format!("{}/{}/{name}", key.namespace, key.name),
        rates,
        algorithm: match limit.algorithm {
            None | Some(AlgorithmSpec::SlidingWindow) => Algorithm::SlidingWindow,
            Some(AlgorithmSpec::TokenBucket) => Algorithm::TokenBucket,
            Some(AlgorithmSpec::FixedWindow) => Algorithm::FixedWindow,
        },
        counters,
        when,
        cost,
        cost_max_body_bytes,
        mode: match limit.mode {
            None | Some(ModeSpec::Enforce) => LimitMode::Enforce,
            Some(ModeSpec::Shadow) => LimitMode::Shadow,
        },
    })
}

/// `limits.NAME.cost`: exactly one expression, each checked against the variables it is
/// evaluated with, and the body cap (`maxBodyBytes`, with `response` only).
fn convert_cost(name: &str, cost: &CostSpec) -> Result<(Cost, Option<u64>), Problem> {
    if let Some(cap) = cost.max_body_bytes {
        if cost.response.is_none() {
            return Err(invalid(format!(
                "limits.{name}.cost.maxBodyBytes: only with cost.response (the body read is the response's)"
            )));
        }
        if !(1..=MAX_COST_MAX_BODY_BYTES).contains(&cap) {
            return Err(invalid(format!(
                "limits.{name}.cost.maxBodyBytes: {cap} is out of range (1 to {MAX_COST_MAX_BODY_BYTES})"
            )));
        }
    }
    match (&cost.request, &cost.response) {
        (Some(_), Some(_)) => Err(invalid(format!(
            "limits.{name}.cost: set request or response, not both (a request is counted once)"
        ))),
        (None, None) => Err(invalid(format!(
            "limits.{name}.cost: set request (CEL on the request) or response (CEL on the response)"
        ))),
        (Some(src), None) => match cel::check(src) {
            Ok(()) => Ok((Cost::Request(src.clone()), None)),
            // The response is not there yet when a request cost is evaluated.
            Err(e @ cel::CelError::UnknownVariable { .. }) if unknown_is(&e, "response") => {
                Err(invalid(format!(
                    "limits.{name}.cost.request: {e}; the response (its status, headers and body) is read by cost.response, counted after the response"
                )))
            }
            Err(e) => Err(invalid(format!("limits.{name}.cost.request: {e}"))),
        },
        (None, Some(src)) => {
            cel::check_response(src)
                .map_err(|e| invalid(format!("limits.{name}.cost.response: {e}")))?;
            Ok((Cost::Response(src.clone()), cost.max_body_bytes))
        }
    }
}

/// Whether `e` is about the unknown variable `var`.
fn unknown_is(e: &cel::CelError, var: &str) -> bool {
    matches!(e, cel::CelError::UnknownVariable { variable, .. } if variable == var)
}

/// Checks every predicate compiles; returns their sources.
pub fn predicates(when: &[Predicate], field: &str) -> Result<Vec<String>, Problem> {
    when.iter().map(|p| check(&p.predicate, field)).collect()
}

/// Checks one CEL expression; returns its source.
pub fn check(expr: &str, field: &str) -> Result<String, Problem> {
    cel::check(expr).map_err(|e| invalid(format!("{field}: {e}")))?;
    Ok(expr.to_owned())
}

/// Parses `500ms`, `10s`, `1m`, `1h30m` into milliseconds (> 0).
pub fn parse_window(s: &str) -> Option<u64> {
    let mut total: u64 = 0;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit_ms, len) = if rest.starts_with("ms") {
            (1, 2)
        } else if rest.starts_with('s') {
            (1_000, 1)
        } else if rest.starts_with('m') {
            (60_000, 1)
        } else if rest.starts_with('h') {
            (3_600_000, 1)
        } else {
            return None;
        };
        rest = &rest[len..];
        total = total.checked_add(n.checked_mul(unit_ms)?)?;
    }
    (total > 0).then_some(total)
}

#[cfg(test)]
mod tests {
    use super::parse_window;

    #[test]
    fn windows_parse() {
        assert_eq!(parse_window("500ms"), Some(500));
        assert_eq!(parse_window("10s"), Some(10_000));
        assert_eq!(parse_window("1m"), Some(60_000));
        assert_eq!(parse_window("1h30m"), Some(5_400_000));
        for bad in ["", "10", "m", "1d", "0s", "-1s", "1.5s", "1 m"] {
            assert_eq!(parse_window(bad), None, "{bad}");
        }
    }
}
