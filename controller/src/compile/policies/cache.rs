//! CachePolicy: which HTTPRoute rules the proxy's shared cache serves, and how.
//!
//! In: the CachePolicies, the accepted Gateways and served HTTPRoutes (the views
//! ClientPolicy uses), and `now`. Out: [`CachePolicies`]: the [`CacheRule`] of each
//! (HTTPRoute, rule index) and of each Gateway, each policy's status, and the policies
//! affecting each route and Gateway; [`apply`] writes the rules into the tables.
//!
//! Attachment: an HTTPRoute (one rule by `sectionName`) or a Gateway (every HTTPRoute rule
//! it serves). Two policies on the same target: the older holds it (creation time, then
//! namespace/name), the newer is `Conflicted` there. A rule takes its own policy's rule,
//! else its route's, else its Gateway's. GRPCRoutes are never cached (their calls are POSTs).
//!
//! An invalid policy caches nothing: a cache grants no access, so leaving answers uncached
//! is the safe side (the rule's AuthPolicy and rate limits run either way).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tollgate_api::cache::{CacheRule, QueryKey};
use tollgate_api::{ObjectKey, RouteTable};
use tollgate_proxy::policy::cel;

use super::client::{ClientGateway, ClientRoute};
use super::status::gateway_ancestor;
use super::{ENFORCED, PolicyRef, STALLED, reason};
use crate::compile::CONTROLLER_NAME;
use crate::compile::Objects;
use crate::compile::conditions::{ACCEPTED, Conds};
use crate::compile::grants::GATEWAY_GROUP;
use crate::compile::index::key_of;
use crate::compile::rules::parse_duration_ms;
use crate::crds::CachePolicy;
use crate::crds::cache::CachePolicySpec;
use crate::crds::common::PolicyStatus;

const KIND: &str = "CachePolicy";
/// Default `maxEntryBytes`: 1 MiB.
const DEFAULT_MAX_ENTRY_BYTES: u64 = 1 << 20;
/// The largest `maxEntryBytes` (64 MiB, as the CRD's schema): a larger answer is a
/// download to stream, not one to hold in every proxy's memory.
pub const MAX_ENTRY_BYTES: u64 = 64 << 20;

/// The compiled CachePolicies.
#[derive(Debug, Default)]
pub struct CachePolicies {
    /// Per (HTTPRoute, rule index): from a policy on the rule or its route.
    pub rules: BTreeMap<(ObjectKey, u32), CacheRule>,
    /// Per HTTPRoute: from a policy on the whole route.
    pub routes: BTreeMap<ObjectKey, CacheRule>,
    /// Per Gateway: from a policy on the Gateway.
    pub gateways: BTreeMap<ObjectKey, CacheRule>,
    /// Status of every CachePolicy.
    pub status: BTreeMap<ObjectKey, PolicyStatus>,
    /// Policies affecting each (HTTPRoute, Gateway).
    pub affecting_routes: BTreeMap<(ObjectKey, ObjectKey), BTreeSet<PolicyRef>>,
    /// Policies affecting each Gateway.
    pub affecting_gateways: BTreeMap<ObjectKey, BTreeSet<PolicyRef>>,
}

/// The table rule of a spec, or why it cannot be one.
pub fn cache_rule(key: &ObjectKey, spec: &CachePolicySpec) -> Result<CacheRule, String> {
    let dur = |v: &Option<String>, field: &str| -> Result<Option<u64>, String> {
        v.as_deref()
            .map(|s| parse_duration_ms(s).map_err(|e| format!("spec.{field} {s:?}: {e}")))
            .transpose()
            .map(Option::flatten)
    };
    let default_ttl_ms = dur(&spec.default_ttl, "defaultTTL")?;
    let max_ttl_ms = dur(&spec.max_ttl, "maxTTL")?;
    let stale_while_revalidate_ms = dur(&spec.stale_while_revalidate, "staleWhileRevalidate")?;
    let stale_if_error_ms = dur(&spec.stale_if_error, "staleIfError")?;
    let key_spec = spec.key.clone().unwrap_or_default();
    let query = match key_spec.query {
        None => QueryKey::All,
        Some(q) => match (q.include, q.exclude) {
            (Some(i), None) => QueryKey::Include(i),
            (None, Some(e)) => QueryKey::Exclude(e),
            _ => return Err("spec.key.query needs exactly one of include and exclude".into()),
        },
    };
    let expressions = key_spec.expressions.unwrap_or_default();
    for (i, e) in expressions.iter().enumerate() {
        cel::check(e).map_err(|err| format!("spec.key.expressions[{i}]: {err}"))?;
    }
    let mut methods = spec
        .methods
        .clone()
        .unwrap_or_else(|| vec!["GET".into(), "HEAD".into()]);
    if let Some(m) = methods
        .iter()
        .find(|m| !matches!(m.as_str(), "GET" | "HEAD"))
    {
        return Err(format!("spec.methods: {m:?} is not cacheable (GET, HEAD)"));
    }
    methods.sort();
    methods.dedup();
    let max_entry_bytes = spec.max_entry_bytes.unwrap_or(DEFAULT_MAX_ENTRY_BYTES);
    if !(1..=MAX_ENTRY_BYTES).contains(&max_entry_bytes) {
        return Err(format!(
            "spec.maxEntryBytes {max_entry_bytes} is out of range (1 to {MAX_ENTRY_BYTES}, 64 MiB): larger answers are streamed, not stored"
        ));
    }
    Ok(CacheRule {
        policy: key.clone(),
        default_ttl_ms,
        max_ttl_ms,
        stale_while_revalidate_ms: stale_while_revalidate_ms.unwrap_or(0),
        stale_if_error_ms: stale_if_error_ms.unwrap_or(0),
        max_entry_bytes,
        query,
        expressions,
        methods,
        store_set_cookie: spec.store_set_cookie.unwrap_or(false),
    })
}

/// Compiles every CachePolicy. `existing`: every Gateway and HTTPRoute in the inputs.
pub fn compile_cache_policies(
    policies: &Objects<CachePolicy>,
    gateways: &[ClientGateway],
    routes: &[ClientRoute],
    existing: &BTreeSet<(&str, ObjectKey)>,
    now: &Time,
) -> CachePolicies {
    let mut out = CachePolicies::default();
    let mut sorted: Vec<&CachePolicy> = policies.iter().collect();
    sorted.sort_by(|a, b| {
        (
            a.metadata.creation_timestamp.as_ref().map(|t| t.0),
            key_of(&a.metadata),
        )
            .cmp(&(
                b.metadata.creation_timestamp.as_ref().map(|t| t.0),
                key_of(&b.metadata),
            ))
    });
    // (kind, object, section) → holder.
    let mut held: BTreeSet<(&'static str, ObjectKey, Option<String>)> = BTreeSet::new();
    for p in sorted {
        let key = key_of(&p.metadata);
        let conds = Conds::new(p.metadata.generation, now);
        let rule = match cache_rule(&key, &p.spec) {
            Ok(r) => r,
            Err(msg) => {
                let no = conds.no(ACCEPTED, reason::INVALID, msg);
                let stalled = conds.yes(STALLED, reason::INVALID, no.message.clone());
                out.status
                    .insert(key, status(p, vec![no, stalled], Vec::new()));
                continue;
            }
        };
        let (mut missing, mut lost, mut reached) = (Vec::new(), Vec::new(), BTreeSet::new());
        let mut holds = 0;
        for t in &p.spec.target_refs {
            let target = ObjectKey::new(key.namespace.as_str(), t.name.as_str());
            let d = match &t.section_name {
                Some(s) => format!("{} {} (section {s})", t.kind, t.name),
                None => format!("{} {}", t.kind, t.name),
            };
            let (kind, found, served_by): (&'static str, bool, Vec<ObjectKey>) =
                match (t.group == GATEWAY_GROUP, t.kind.as_str(), &t.section_name) {
                    (true, "Gateway", None) => (
                        "Gateway",
                        gateways.iter().any(|g| g.key == target),
                        vec![target.clone()],
                    ),
                    (true, "HTTPRoute", section) => {
                        let r = routes.iter().find(|r| r.key == target);
                        let found = r.is_some_and(|r| {
                            section.as_ref().is_none_or(|s| {
                                r.rules
                                    .iter()
                                    .any(|(_, n)| n.as_deref() == Some(s.as_str()))
                            })
                        });
                        (
                            "HTTPRoute",
                            found,
                            r.map(|r| r.gateways.clone()).unwrap_or_default(),
                        )
                    }
                    _ => {
                        missing.push(d);
                        continue;
                    }
                };
            if !found {
                if !existing.contains(&(kind, target.clone())) || kind == "HTTPRoute" {
                    missing.push(d);
                }
                continue;
            }
            let slot = (kind, target.clone(), t.section_name.clone());
            if !held.insert(slot) {
                lost.push(format!("{d} already has {KIND} (older)"));
                continue;
            }
            holds += 1;
            match (kind, &t.section_name) {
                ("Gateway", _) => {
                    out.gateways.insert(target.clone(), rule.clone());
                }
                (_, None) => {
                    out.routes.insert(target.clone(), rule.clone());
                }
                (_, Some(s)) => {
                    if let Some(r) = routes.iter().find(|r| r.key == target) {
                        for (i, n) in &r.rules {
                            if n.as_deref() == Some(s.as_str()) {
                                out.rules.insert((target.clone(), *i), rule.clone());
                            }
                        }
                    }
                }
            }
            for gw in &served_by {
                if kind == "Gateway" {
                    out.affecting_gateways
                        .entry(gw.clone())
                        .or_default()
                        .insert((KIND, key.clone()));
                } else {
                    out.affecting_routes
                        .entry((target.clone(), gw.clone()))
                        .or_default()
                        .insert((KIND, key.clone()));
                }
            }
            reached.extend(served_by);
        }
        let accepted = if holds == 0 && !lost.is_empty() {
            conds.no(ACCEPTED, reason::CONFLICTED, lost.join("; "))
        } else if holds == 0 {
            conds.no(
                ACCEPTED,
                reason::TARGET_NOT_FOUND,
                format!(
                    "no target is a Gateway or HTTPRoute served by {CONTROLLER_NAME}: {}",
                    missing.join(", ")
                ),
            )
        } else {
            let mut msg = format!("{KIND} is accepted");
            if !missing.is_empty() {
                msg.push_str(&format!("; targets not found: {}", missing.join(", ")));
            }
            if !lost.is_empty() {
                msg.push_str(&format!("; targets not held: {}", lost.join("; ")));
            }
            conds.yes(ACCEPTED, reason::ACCEPTED, msg)
        };
        let mut conditions = vec![accepted.clone()];
        let mut ancestors = Vec::new();
        if accepted.status == "True" {
            let enforced = conds.yes(ENFORCED, reason::ENFORCED, format!("{KIND} is enforced"));
            conditions.push(enforced.clone());
            for gw in &reached {
                ancestors.push(gateway_ancestor(
                    gw,
                    vec![accepted.clone(), enforced.clone()],
                ));
            }
        } else {
            conditions.push(conds.yes(STALLED, &accepted.reason, accepted.message.clone()));
        }
        out.status.insert(key, status(p, conditions, ancestors));
    }
    out
}

fn status(
    p: &CachePolicy,
    conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    ancestors: Vec<crate::crds::common::PolicyAncestorStatus>,
) -> PolicyStatus {
    PolicyStatus {
        observed_generation: p.metadata.generation,
        conditions,
        ancestors,
    }
}

/// Writes each HTTPRoute rule's cache setting into `tables` (every route, so a reused route
/// of an earlier compile loses a setting that no longer applies).
pub fn apply(tables: &mut BTreeMap<ObjectKey, RouteTable>, cache: &CachePolicies) {
    for (gw, table) in tables.iter_mut() {
        let gateway_rule = cache.gateways.get(gw);
        for port in &mut table.ports {
            for listener in &mut port.listeners {
                for vh in &mut listener.virtual_hosts {
                    let want: Vec<Option<&CacheRule>> = vh
                        .routes
                        .iter()
                        .map(|r| {
                            if r.grpc_web {
                                return None;
                            }
                            cache
                                .rules
                                .get(&(r.route.clone(), r.rule_index))
                                .or_else(|| cache.routes.get(&r.route))
                                .or(gateway_rule)
                        })
                        .collect();
                    let same = vh
                        .routes
                        .iter()
                        .zip(&want)
                        .all(|(r, w)| r.cache.as_deref() == *w);
                    if same {
                        continue;
                    }
                    let routes = Arc::make_mut(&mut vh.routes);
                    for (r, w) in routes.iter_mut().zip(want) {
                        r.cache = w.cloned().map(Box::new);
                    }
                }
            }
        }
    }
}
