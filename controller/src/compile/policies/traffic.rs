//! XBackendTrafficPolicy (gateway.networking.x-k8s.io/v1alpha1: GEP-3388 retry budgets and
//! GEP-1619 session persistence) into the route tables. In: the policies, the Services (by
//! index) and the tables. Out: each table backend of a targeted Service carries the retry
//! budget and the session persistence (a route rule's own `sessionPersistence` wins over the
//! Service's), and each policy's status: `Accepted` per Gateway reached (the kind's status has
//! ancestors only); `tollgate validate` also prints why one applies nowhere.
//!
//! Targets: Services in the policy's namespace (`group: ""`, `kind: Service`); between two
//! policies on one Service the older wins and the other is `Conflicted`. An invalid policy is
//! `Invalid` and applies nowhere.

use std::collections::BTreeMap;

use gateway_types::experimental::httproutes::HttpRouteRulesSessionPersistence;
use gateway_types::experimental::xbackendtrafficpolicies::{
    XBackendTrafficPolicy, XBackendTrafficPolicyRetryConstraint, XBackendTrafficPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tollgate_api::backend::{RetryBudget, Session};
use tollgate_api::{ObjectKey, RouteTable};

use super::services;
use crate::compile::Objects;
use crate::compile::index::{Index, key_of};
use crate::compile::rules::parse_duration_ms;
use crate::crds::common::PolicyStatus;

/// GEP-3388's defaults: 20% of the requests of the last 10s, and at least 10 retries a
/// second.
const DEFAULT_PERCENT: u32 = 20;
const DEFAULT_INTERVAL_MS: u64 = 10_000;
const DEFAULT_MIN_RETRIES: u32 = 10;
const DEFAULT_MIN_INTERVAL_MS: u64 = 1_000;

/// What a valid policy sets.
#[derive(Debug, Clone, PartialEq)]
pub struct Compiled {
    pub retry_budget: Option<RetryBudget>,
    pub session: Option<Session>,
}

/// Applies the policies to `tables`; the status of each policy.
pub fn apply(
    policies: &Objects<XBackendTrafficPolicy>,
    idx: &Index<'_>,
    tables: &mut BTreeMap<ObjectKey, RouteTable>,
    now: &Time,
) -> BTreeMap<ObjectKey, PolicyStatus> {
    let order = services::oldest_first(policies, |p| &p.metadata);
    let compiled: Vec<Result<Compiled, String>> =
        order.iter().map(|p| compile_spec(&p.spec)).collect();
    let claims: Vec<services::Claim<'_>> = order
        .iter()
        .zip(&compiled)
        .map(|(p, c)| services::Claim {
            key: key_of(&p.metadata),
            valid: c.is_ok(),
            targets: p
                .spec
                .target_refs
                .iter()
                .map(|t| services::Target {
                    group: &t.group,
                    kind: &t.kind,
                    name: &t.name,
                    section: None,
                })
                .collect(),
        })
        .collect();
    let res = services::resolve("XBackendTrafficPolicy", &claims, idx);
    let reached = res.apply(idx, tables, |i, backend| {
        let Ok(c) = &compiled[i] else {
            return false;
        };
        backend.settings.retry_budget = c.retry_budget.clone();
        backend.settings.session = c.session.clone();
        true
    });
    services::statuses(
        &order,
        |p| &p.metadata,
        &res,
        |i| compiled[i].as_ref().err().cloned(),
        &reached,
        now,
        |_| Vec::new(),
    )
}

/// Checks and compiles a policy's spec.
pub fn compile_spec(spec: &XBackendTrafficPolicySpec) -> Result<Compiled, String> {
    for (i, t) in spec.target_refs.iter().enumerate() {
        if !t.group.is_empty() || t.kind != "Service" {
            return Err(format!(
                "spec.targetRefs[{i}]: only Services (group \"\", kind Service) can be targeted, not {}/{}",
                t.group, t.kind
            ));
        }
    }
    let retry_budget = spec.retry_constraint.as_ref().map(budget).transpose()?;
    let session = match &spec.session_persistence {
        None => None,
        Some(sp) => {
            // The same schema as an HTTPRoute rule's; one reading of it.
            let as_rule: HttpRouteRulesSessionPersistence = serde_json::to_value(sp)
                .and_then(serde_json::from_value)
                .map_err(|e| format!("spec.sessionPersistence: {e}"))?;
            crate::compile::session::compile(Some(&as_rule), "spec.sessionPersistence")
                .map_err(|p| p.message)?
        }
    };
    Ok(Compiled {
        retry_budget,
        session,
    })
}

fn budget(rc: &XBackendTrafficPolicyRetryConstraint) -> Result<RetryBudget, String> {
    let f = "spec.retryConstraint";
    let ms = |v: Option<&String>, what: &str, default: u64| -> Result<u64, String> {
        match v {
            None => Ok(default),
            Some(s) => match parse_duration_ms(s) {
                Ok(Some(ms)) if ms >= 1_000 => Ok(ms),
                Ok(_) => Err(format!("{f}.{what}: {s:?}: at least 1s")),
                Err(e) => Err(format!("{f}.{what}: {s:?}: {e}")),
            },
        }
    };
    let b = rc.budget.as_ref();
    let percent = match b.and_then(|b| b.percent) {
        None => DEFAULT_PERCENT,
        Some(p @ 0..=100) => u32::try_from(p).unwrap_or(DEFAULT_PERCENT),
        Some(p) => return Err(format!("{f}.budget.percent: {p} is not 0 to 100")),
    };
    let m = rc.min_retry_rate.as_ref();
    let min_retries = match m.and_then(|m| m.count) {
        None => DEFAULT_MIN_RETRIES,
        Some(c @ 0..=1_000_000) => u32::try_from(c).unwrap_or(DEFAULT_MIN_RETRIES),
        Some(c) => return Err(format!("{f}.minRetryRate.count: {c} is not 0 to 1000000")),
    };
    Ok(RetryBudget {
        percent,
        interval_ms: ms(
            b.and_then(|b| b.interval.as_ref()),
            "budget.interval",
            DEFAULT_INTERVAL_MS,
        )?,
        min_retries,
        min_interval_ms: ms(
            m.and_then(|m| m.interval.as_ref()),
            "minRetryRate.interval",
            DEFAULT_MIN_INTERVAL_MS,
        )?,
    })
}
