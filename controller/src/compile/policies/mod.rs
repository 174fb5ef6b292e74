//! RateLimitPolicy and AuthPolicy: attachment, hierarchy, effective policy per route rule.
//!
//! In: the policies, our validated Gateways, the routes attached to them ([`RouteTarget`]s)
//! and the Secrets. Out: [`Policies`]: the effective [`PolicySet`] of every (Gateway,
//! listener, route, rule) a table serves, each policy's status, and which policies affect
//! each route and Gateway.
//!
//! Attachment (GEP-713): a targetRef names a Gateway (optionally one listener by
//! `sectionName`) or an HTTPRoute/GRPCRoute (optionally one rule) in the policy's namespace.
//! A target that is not one of ours is not found. Two policies of a kind on the same target
//! conflict: the older wins (creation time, then namespace/name), the newer is `Conflicted`
//! there.
//!
//! Hierarchy, from least to most specific: Gateway, listener, route, rule. Defaults: the most
//! specific one applies; a less specific one with strategy `merge` adds the names the more
//! specific one lacks, an `atomic` one is replaced. Overrides then apply from most to least
//! specific, so the least specific wins: `atomic` replaces everything, `merge` wins by name.
//! A policy is `Enforced` where any of its entries survives, else `Overridden`.
//!
//! Fail closed ([`last_valid`]): an invalid policy enforces its last valid version; an
//! AuthPolicy with none closes the rules under its targets (a [`Closed`] entry, 500), unless
//! a valid atomic override from a less specific target replaces whatever it would have said.

pub mod auth;
pub mod backend;
pub mod basic;
pub mod cache;
pub mod client;
mod client_fields;
pub mod external;
pub mod last_valid;
pub mod oidc;
pub mod ratelimit;
pub mod services;
mod status;
pub mod traffic;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tollgate_api::ObjectKey;
use tollgate_api::policy::{Auth, Closed, DenyResponse, PolicySet};

pub use super::conditions::Problem;
use super::grants::GATEWAY_GROUP;
use super::index::key_of;
use crate::crds::common::{PolicyStatus, Strategy, TargetRef};
use auth::AuthEntries;
pub use last_valid::LastValid;
use last_valid::State;
use ratelimit::Limits;

/// Condition type `Enforced`.
pub const ENFORCED: &str = "Enforced";
/// Condition type `Stalled` (kstatus: Failed), set while a policy is not accepted.
pub const STALLED: &str = "Stalled";
/// Condition type `Reconciling` (kstatus: InProgress), set while proxies catch up.
pub const RECONCILING: &str = "Reconciling";

/// Policy condition reasons.
pub mod reason {
    /// Accepted=True.
    pub const ACCEPTED: &str = "Accepted";
    /// No targetRef names one of our Gateways or routes.
    pub const TARGET_NOT_FOUND: &str = "TargetNotFound";
    /// The spec cannot be enforced as written.
    pub const INVALID: &str = "Invalid";
    /// An older policy of the same kind holds every target.
    pub const CONFLICTED: &str = "Conflicted";
    /// Enforced=True.
    pub const ENFORCED: &str = "Enforced";
    /// Every entry lost to another policy.
    pub const OVERRIDDEN: &str = "Overridden";
    /// Nothing is served under the targets (yet), or proxies have not confirmed.
    pub const UNKNOWN: &str = "Unknown";
}

pub(crate) fn invalid(message: impl Into<String>) -> Problem {
    Problem::new(reason::INVALID, message)
}

/// What one policy contributes: defaults or overrides, with a strategy.
#[derive(Debug, Clone)]
pub struct Contribution<T> {
    /// Overrides (else defaults).
    pub overrides: bool,
    /// Atomic or merge.
    pub strategy: Strategy,
    /// The named entries.
    pub entries: T,
}

/// Named entries that merge by name.
pub trait Entries: Clone {
    /// Adds the entries of `other` whose names `self` lacks; true when any was added.
    fn add_missing(&mut self, other: &Self) -> bool;
}

impl Entries for Limits {
    fn add_missing(&mut self, other: &Self) -> bool {
        let mut added = false;
        for (k, v) in other {
            if !self.contains_key(k) {
                self.insert(k.clone(), v.clone());
                added = true;
            }
        }
        added
    }
}

impl Entries for AuthEntries {
    fn add_missing(&mut self, other: &Self) -> bool {
        fn add<V: Clone>(a: &mut BTreeMap<String, V>, b: &BTreeMap<String, V>) -> bool {
            let before = a.len();
            for (k, v) in b {
                a.entry(k.clone()).or_insert_with(|| v.clone());
            }
            a.len() > before
        }
        let mut added = add(&mut self.authentication, &other.authentication);
        added |= add(&mut self.authorization, &other.authorization);
        added |= add(&mut self.success_headers, &other.success_headers);
        if self.unauthenticated.is_none() && other.unauthenticated.is_some() {
            self.unauthenticated.clone_from(&other.unauthenticated);
            added = true;
        }
        if self.unauthorized.is_none() && other.unauthorized.is_some() {
            self.unauthorized.clone_from(&other.unauthorized);
            added = true;
        }
        added
    }
}

/// A route a policy may target, as served.
#[derive(Debug, Clone)]
pub struct RouteTarget {
    /// `HTTPRoute` or `GRPCRoute`.
    pub kind: &'static str,
    /// The route.
    pub key: ObjectKey,
    /// Rules: index and optional name.
    pub rules: Vec<(u32, Option<String>)>,
    /// Where it is served: (Gateway, listener name).
    pub attachments: Vec<(ObjectKey, String)>,
}

/// A Gateway a policy may target.
#[derive(Debug, Clone)]
pub struct GatewayTarget {
    /// The Gateway.
    pub key: ObjectKey,
    /// Listener names.
    pub listeners: Vec<String>,
    /// Listeners no request policy reaches (TLS, TCP, UDP: streams, not requests), shown as
    /// `name (PROTOCOL)`: a Gateway-wide policy's status names them.
    pub streams: Vec<String>,
}

/// A policy named by kind and key.
pub type PolicyRef = (&'static str, ObjectKey);

/// One policy before resolution: metadata, the targetRefs of the version in effect, state.
type Item<T> = (ObjectMeta, Vec<TargetRef>, State<T>);

/// Where an effective policy set applies: Gateway, listener, route kind, route, rule index.
pub type RuleKey = (ObjectKey, String, &'static str, ObjectKey, u32);

/// The compiled policies.
#[derive(Debug, Default)]
pub struct Policies {
    /// Effective policy set per served rule (absent = no policy).
    pub effective: BTreeMap<RuleKey, PolicySet>,
    /// Rules closed by invalid policies (never in `effective`): they answer 500.
    pub closed: BTreeMap<RuleKey, Closed>,
    /// The version of every policy valid now or kept from before: the next compile's
    /// [`crate::compile::Inputs::last_valid`].
    pub last_valid: LastValid,
    /// Status of every RateLimitPolicy.
    pub rate_limit_status: BTreeMap<ObjectKey, PolicyStatus>,
    /// Status of every AuthPolicy.
    pub auth_status: BTreeMap<ObjectKey, PolicyStatus>,
    /// Policies (kind, key) affecting each route on each Gateway: (route kind, route, Gateway).
    pub affecting_routes: BTreeMap<(&'static str, ObjectKey, ObjectKey), BTreeSet<PolicyRef>>,
    /// Policies (kind, key) affecting each Gateway.
    pub affecting_gateways: BTreeMap<ObjectKey, BTreeSet<PolicyRef>>,
    /// The authorization services of `external` rules, by backend key: the tables that
    /// use them get them ([`external::add_backends`]).
    pub external_backends: crate::compile::index::LookupMap<String, tollgate_api::Backend>,
}

/// Target levels, least specific first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Gateway,
    Listener,
    Route,
    Rule,
}

/// A resolved target: (level, kind, key, section).
type Target = (Level, &'static str, ObjectKey, Option<String>);

/// One kind's policies, resolved.
struct Resolved<T> {
    kind: &'static str,
    keys: Vec<ObjectKey>,
    metas: Vec<ObjectMeta>,
    /// Per policy: what it enforces (its contribution, its last valid one, closure) and why.
    contributions: Vec<State<T>>,
    /// Per policy: targets found, missing refs, targets lost to an older policy.
    found: Vec<Vec<Target>>,
    missing: Vec<Vec<String>>,
    /// Per policy: targets that exist but belong to another controller.
    foreign: Vec<usize>,
    lost: Vec<Vec<(String, ObjectKey)>>,
    /// Target to winning policy index.
    holder: BTreeMap<Target, usize>,
    /// Per policy: Gateways where an entry survived; Gateways reached.
    enforced_on: Vec<BTreeSet<ObjectKey>>,
    reached: Vec<BTreeSet<ObjectKey>>,
    /// Per Gateway: its stream listeners ([`GatewayTarget::streams`]), when it has any.
    streams: BTreeMap<ObjectKey, Vec<String>>,
}

impl<T: Entries> Resolved<T> {
    fn new(
        kind: &'static str,
        items: Vec<Item<T>>,
        gateways: &[GatewayTarget],
        routes: &[RouteTarget],
        existing: &BTreeSet<(&str, ObjectKey)>,
    ) -> Self {
        let mut items = items;
        // Older first: the holder of a contested target is the oldest policy.
        items.sort_by(|a, b| {
            (a.0.creation_timestamp.as_ref().map(|t| t.0), key_of(&a.0))
                .cmp(&(b.0.creation_timestamp.as_ref().map(|t| t.0), key_of(&b.0)))
        });
        let n = items.len();
        let mut r = Self {
            kind,
            keys: Vec::with_capacity(n),
            metas: Vec::with_capacity(n),
            contributions: Vec::with_capacity(n),
            found: vec![Vec::new(); n],
            missing: vec![Vec::new(); n],
            foreign: vec![0; n],
            lost: vec![Vec::new(); n],
            holder: BTreeMap::new(),
            enforced_on: vec![BTreeSet::new(); n],
            reached: vec![BTreeSet::new(); n],
            streams: gateways
                .iter()
                .filter(|g| !g.streams.is_empty())
                .map(|g| (g.key.clone(), g.streams.clone()))
                .collect(),
        };
        for (i, (meta, refs, contribution)) in items.into_iter().enumerate() {
            let key = key_of(&meta);
            if contribution.holds_targets() {
                for t in &refs {
                    match resolve(&key.namespace, t, gateways, routes) {
                        Some(target) => {
                            if let Some(&h) = r.holder.get(&target) {
                                r.lost[i].push((describe(t), r.keys[h].clone()));
                            } else {
                                r.holder.insert(target.clone(), i);
                                r.found[i].push(target);
                            }
                        }
                        None if is_foreign(&key.namespace, t, gateways, routes, existing) => {
                            r.foreign[i] += 1;
                        }
                        None => r.missing[i].push(describe(t)),
                    }
                }
            }
            r.keys.push(key);
            r.metas.push(meta);
            r.contributions.push(contribution);
        }
        r
    }

    /// The effective entries for one rule, with the indices of the contributing policies,
    /// and the indices of the invalid policies that close it (empty = open).
    fn effective(
        &mut self,
        gw: &ObjectKey,
        listener: &str,
        route: &RouteTarget,
        rule: &(u32, Option<String>),
    ) -> (Option<(T, BTreeSet<usize>)>, BTreeSet<usize>) {
        let kind = route.kind;
        let candidates: [Target; 4] = [
            (Level::Gateway, "Gateway", gw.clone(), None),
            (
                Level::Listener,
                "Gateway",
                gw.clone(),
                Some(listener.to_owned()),
            ),
            (Level::Route, kind, route.key.clone(), None),
            (Level::Rule, kind, route.key.clone(), rule.1.clone()),
        ];
        // Holders, most specific first.
        let mut held: Vec<usize> = Vec::new();
        let mut levels: Vec<Level> = Vec::new();
        for t in candidates.iter().rev() {
            if t.0 == Level::Rule && t.3.is_none() {
                continue;
            }
            if let Some(&i) = self.holder.get(t) {
                self.reached[i].insert(gw.clone());
                held.push(i);
                levels.push(t.0);
            }
        }
        // An invalid policy closes the rule, since what it would enforce is unknown, unless
        // a valid atomic override from a less specific target replaces it whatever it says.
        let replaced_below = held
            .iter()
            .zip(&levels)
            .filter(|(i, _)| {
                self.contributions[**i]
                    .contribution()
                    .is_some_and(|c| c.overrides && c.strategy == Strategy::Atomic)
            })
            .map(|(_, l)| *l)
            .min();
        let closed: BTreeSet<usize> = held
            .iter()
            .zip(&levels)
            .filter(|(i, l)| {
                matches!(self.contributions[**i], State::Closed(_))
                    && replaced_below.is_none_or(|r| **l <= r)
            })
            .map(|(i, _)| *i)
            .collect();
        let mut result: Option<T> = None;
        let mut sources: BTreeSet<usize> = BTreeSet::new();
        for &i in &held {
            let Some(c) = self.contributions[i].contribution() else {
                continue;
            };
            if c.overrides {
                continue;
            }
            match &mut result {
                None => {
                    result = Some(c.entries.clone());
                    sources.insert(i);
                }
                Some(r) => {
                    if c.strategy == Strategy::Merge && r.add_missing(&c.entries) {
                        sources.insert(i);
                    }
                }
            }
        }
        for &i in &held {
            let Some(c) = self.contributions[i].contribution() else {
                continue;
            };
            if !c.overrides {
                continue;
            }
            match (c.strategy, result.take()) {
                (Strategy::Merge, Some(below)) => {
                    let mut top = c.entries.clone();
                    let kept_any = top.add_missing(&below);
                    if !kept_any {
                        sources.clear();
                    }
                    sources.insert(i);
                    result = Some(top);
                }
                _ => {
                    sources.clear();
                    sources.insert(i);
                    result = Some(c.entries.clone());
                }
            }
        }
        for &i in &sources {
            self.enforced_on[i].insert(gw.clone());
        }
        (result.map(|r| (r, sources)), closed)
    }
}

fn describe(t: &TargetRef) -> String {
    let d = match &t.section_name {
        Some(s) => format!("{} {} (section {s})", t.kind, t.name),
        None => format!("{} {}", t.kind, t.name),
    };
    if matches!(t.kind.as_str(), "TLSRoute" | "TCPRoute" | "UDPRoute") {
        // Policies act on HTTP requests; these kinds carry opaque streams or datagrams.
        d + &format!(" (policies do not apply to {}s)", t.kind)
    } else {
        d
    }
}

/// True when `t` names an object that exists but is not one of ours.
fn is_foreign(
    ns: &str,
    t: &TargetRef,
    gateways: &[GatewayTarget],
    routes: &[RouteTarget],
    existing: &BTreeSet<(&str, ObjectKey)>,
) -> bool {
    let key = ObjectKey::new(ns, t.name.as_str());
    let ours = if t.kind == "Gateway" {
        gateways.iter().any(|g| g.key == key)
    } else {
        routes.iter().any(|r| r.kind == t.kind && r.key == key)
    };
    !ours && existing.contains(&(t.kind.as_str(), key))
}

/// Resolves one targetRef of a policy in namespace `ns`.
fn resolve(
    ns: &str,
    t: &TargetRef,
    gateways: &[GatewayTarget],
    routes: &[RouteTarget],
) -> Option<Target> {
    if t.group != GATEWAY_GROUP {
        return None;
    }
    let key = ObjectKey::new(ns, t.name.as_str());
    if t.kind == "Gateway" {
        let gw = gateways.iter().find(|g| g.key == key)?;
        return match &t.section_name {
            None => Some((Level::Gateway, "Gateway", key, None)),
            Some(s) => gw
                .listeners
                .contains(s)
                .then(|| (Level::Listener, "Gateway", key, Some(s.clone()))),
        };
    }
    let route = routes.iter().find(|r| r.kind == t.kind && r.key == key)?;
    match &t.section_name {
        None => Some((Level::Route, route.kind, key, None)),
        Some(s) => route
            .rules
            .iter()
            .any(|(_, n)| n.as_deref() == Some(s.as_str()))
            .then(|| (Level::Rule, route.kind, key, Some(s.clone()))),
    }
}

/// Compiles every policy of `inputs` (the policies, Secrets, [`LastValid`] and `now`).
/// `existing` holds every Gateway and route in the inputs, ours or not, as (kind, key): a
/// policy whose targets all exist but are another controller's gets no status from us.
pub fn compile_policies(
    inputs: &crate::compile::Inputs,
    idx: &crate::compile::index::Index<'_>,
    gateways: &[GatewayTarget],
    routes: &[RouteTarget],
    existing: &BTreeSet<(&str, ObjectKey)>,
) -> Policies {
    let now = &inputs.now;
    let secrets: Vec<&Secret> = inputs.secrets.iter().collect();
    let mut last_valid = LastValid::default();
    let mut items = Vec::with_capacity(inputs.rate_limit_policies.len());
    for p in &inputs.rate_limit_policies {
        let key = key_of(&p.metadata);
        let last = inputs.last_valid.rate_limit_policies.get(&key);
        // A rate limit keeps its last valid version but, never valid, closes nothing.
        let (state, refs, keep) =
            last_valid::resolve(p, last, false, |v| ratelimit::contribution(v, &key));
        if let Some(keep) = keep {
            last_valid.rate_limit_policies.insert(key, keep);
        }
        items.push((p.metadata.clone(), refs, state));
    }
    let mut rl = Resolved::new("RateLimitPolicy", items, gateways, routes, existing);
    let mut items = Vec::with_capacity(inputs.auth_policies.len());
    let externals = external::ExternalBackends::new(idx);
    for p in &inputs.auth_policies {
        let key = key_of(&p.metadata);
        let last = inputs.last_valid.auth_policies.get(&key);
        let (state, refs, keep) = last_valid::resolve(p, last, true, |v| {
            auth::contribution(v, &key, &secrets, &externals)
        });
        if let Some(keep) = keep {
            last_valid.auth_policies.insert(key, keep);
        }
        items.push((p.metadata.clone(), refs, state));
    }
    let mut ap = Resolved::new("AuthPolicy", items, gateways, routes, existing);
    let mut out = Policies {
        last_valid,
        external_backends: externals.into_backends(),
        ..Policies::default()
    };
    for route in routes {
        for (gw, listener) in &route.attachments {
            for rule in &route.rules {
                let mut set = PolicySet::default();
                let mut affecting = BTreeSet::new();
                let (limits, rl_closed) = rl.effective(gw, listener, route, rule);
                if let Some((limits, sources)) = limits {
                    set.rate_limits = limits.into_values().collect();
                    affecting.extend(sources.into_iter().map(|i| (rl.kind, rl.keys[i].clone())));
                }
                let (entries, ap_closed) = ap.effective(gw, listener, route, rule);
                // Rate limits never close (see `last_valid`): only AuthPolicies can.
                debug_assert!(rl_closed.is_empty());
                if let Some((entries, sources)) = entries {
                    set.auth = Some(to_auth(
                        entries,
                        sources.iter().map(|&i| ap.keys[i].clone()).collect(),
                    ));
                    affecting.extend(sources.into_iter().map(|i| (ap.kind, ap.keys[i].clone())));
                }
                // The closing policies affect the route too: its status names them.
                affecting.extend(ap_closed.iter().map(|&i| (ap.kind, ap.keys[i].clone())));
                if !affecting.is_empty() {
                    out.affecting_gateways
                        .entry(gw.clone())
                        .or_default()
                        .extend(affecting.iter().cloned());
                    out.affecting_routes
                        .entry((route.kind, route.key.clone(), gw.clone()))
                        .or_default()
                        .extend(affecting);
                }
                let key = (
                    gw.clone(),
                    listener.clone(),
                    route.kind,
                    route.key.clone(),
                    rule.0,
                );
                if !ap_closed.is_empty() {
                    let by = ap_closed.iter().map(|&i| ap.keys[i].clone()).collect();
                    out.closed.insert(key, Closed { by });
                } else if !set.is_empty() {
                    out.effective.insert(key, set);
                }
            }
        }
    }
    out.rate_limit_status = rl.statuses(now);
    out.auth_status = ap.statuses(now);
    out
}

fn to_auth(e: AuthEntries, sources: Vec<ObjectKey>) -> Auth {
    Auth {
        sources,
        when: e.when,
        authentication: e.authentication.into_values().collect(),
        authorization: e.authorization.into_values().collect(),
        success_headers: e.success_headers.into_iter().collect(),
        unauthenticated: e
            .unauthenticated
            .unwrap_or_else(DenyResponse::unauthenticated),
        unauthorized: e.unauthorized.unwrap_or_else(DenyResponse::unauthorized),
    }
}
