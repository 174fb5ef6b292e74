//! ClientPolicy: per-port client settings (client address, path options, limits) of each
//! Gateway.
//!
//! In: the ClientPolicies, their last valid versions, our accepted Gateways' listeners with
//! their ports, and `now`. Out: [`ClientPolicies`]: the [`ClientSettings`] of every (Gateway,
//! port) a policy reaches, each policy's status, and which policies affect each Gateway.
//!
//! Attachment: a Gateway, or one of its listeners by `sectionName`. Two policies on the same
//! target: the older holds it (creation time, then namespace/name), the newer is
//! `Conflicted` there. A listener's settings are its listener policy's fields over its
//! Gateway policy's. Settings act per port (one socket), so every listener of a port must
//! end up with the same ones: a listener policy that would split a port loses that target
//! (`Conflicted`, naming the port and its other listeners) and the port keeps the Gateway's.
//!
//! An HTTPRoute (or one named rule) may be targeted with `limits.maxRequestBodyBytes` and
//! `compression: {disabled: true}` alone: its rules get them in the table ([`RuleSettings`];
//! each field the rule's policy over the route's), replacing the port's.
//!
//! Fail closed: the client address feeds authorization (`source.address`), so a policy that
//! becomes invalid keeps its last valid version, and one never valid closes the ports of its
//! targets (every request answers 500) instead of serving them with the balancer's address.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use tollgate_api::ObjectKey;
use tollgate_api::client::ClientSettings;

use super::client_fields::{Fields, fields};
use super::last_valid::{self, State};
use super::status::gateway_ancestor;
use super::{Contribution, ENFORCED, PolicyRef, STALLED, reason};
use crate::compile::CONTROLLER_NAME;
use crate::compile::Objects;
use crate::compile::conditions::{ACCEPTED, Conds};
use crate::compile::grants::GATEWAY_GROUP;
use crate::compile::index::key_of;
use crate::crds::ClientPolicy;
use crate::crds::common::{PolicyStatus, TargetRef};

/// Kind name.
const KIND: &str = "ClientPolicy";
/// Target kinds.
const GATEWAY: &str = "Gateway";
const HTTPROUTE: &str = "HTTPRoute";

/// A target: kind, object, listener or rule name.
type Target = (&'static str, ObjectKey, Option<String>);

/// A Gateway a ClientPolicy may target: its served listeners as (name, port).
#[derive(Debug, Clone)]
pub struct ClientGateway {
    /// The Gateway.
    pub key: ObjectKey,
    /// Listeners with a port: (name, port).
    pub listeners: Vec<(String, u16)>,
}

/// An HTTPRoute a ClientPolicy may target (for `limits.maxRequestBodyBytes`), as served.
#[derive(Debug, Clone)]
pub struct ClientRoute {
    /// The HTTPRoute.
    pub key: ObjectKey,
    /// Its rules: index and optional name.
    pub rules: Vec<(u32, Option<String>)>,
    /// The Gateways it is served by.
    pub gateways: Vec<ObjectKey>,
}

/// What ClientPolicies on an HTTPRoute set for one of its rules.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleSettings {
    /// The rule's request body limit, replacing the port's.
    pub max_request_body_bytes: Option<u64>,
    /// The rule's responses are never compressed.
    pub compression_disabled: bool,
}

/// The compiled ClientPolicies.
#[derive(Debug, Default)]
pub struct ClientPolicies {
    /// Settings per (Gateway, port), for ports some policy reaches.
    pub ports: BTreeMap<(ObjectKey, u16), ClientSettings>,
    /// Settings per (HTTPRoute, rule index), from policies on HTTPRoutes.
    pub routes: BTreeMap<(ObjectKey, u32), RuleSettings>,
    /// Policies affecting each HTTPRoute on each Gateway.
    pub affecting_routes: BTreeMap<(ObjectKey, ObjectKey), BTreeSet<PolicyRef>>,
    /// Status of every ClientPolicy.
    pub status: BTreeMap<ObjectKey, PolicyStatus>,
    /// Policies affecting each Gateway.
    pub affecting_gateways: BTreeMap<ObjectKey, BTreeSet<PolicyRef>>,
    /// Versions valid now or kept: the next compile's last valid ClientPolicies.
    pub last_valid: BTreeMap<ObjectKey, ClientPolicy>,
}

/// One policy after resolution.
struct Item {
    key: ObjectKey,
    meta: ObjectMeta,
    state: State<Fields>,
    /// The targetRefs of the version in effect.
    refs: Vec<TargetRef>,
    /// Targets held: (kind, Gateway or HTTPRoute, listener or rule name).
    held: Vec<Target>,
    /// Targets not found, described.
    missing: Vec<String>,
    /// Targets that exist but are not ours.
    foreign: usize,
    /// Targets lost, described with why.
    lost: Vec<String>,
    /// Gateways where its fields reach a port; Gateways it targets.
    enforced_on: BTreeSet<ObjectKey>,
    reached: BTreeSet<ObjectKey>,
}

/// Compiles every ClientPolicy. `existing`: every Gateway in the inputs, ours or not.
pub fn compile_client_policies(
    policies: &Objects<ClientPolicy>,
    last: &BTreeMap<ObjectKey, ClientPolicy>,
    gateways: &[ClientGateway],
    routes: &[ClientRoute],
    existing: &BTreeSet<(&str, ObjectKey)>,
    now: &Time,
) -> ClientPolicies {
    let mut out = ClientPolicies::default();
    let mut items: Vec<Item> = policies
        .iter()
        .map(|p| {
            let key = key_of(&p.metadata);
            // What a policy never valid closes: the ports of its Gateway targets. One only on
            // HTTPRoutes sets a body limit, and enforces nothing (as a rate limit).
            let closes = p.spec.target_refs.iter().any(|t| t.kind == "Gateway");
            let (state, refs, keep) = last_valid::resolve(p, last.get(&key), closes, |v| {
                fields(&v.spec).map(|entries| Contribution {
                    overrides: false,
                    strategy: Default::default(),
                    entries,
                })
            });
            if let Some(keep) = keep {
                out.last_valid.insert(key.clone(), keep);
            }
            Item {
                key,
                meta: p.metadata.clone(),
                state,
                refs,
                held: Vec::new(),
                missing: Vec::new(),
                foreign: 0,
                lost: Vec::new(),
                enforced_on: BTreeSet::new(),
                reached: BTreeSet::new(),
            }
        })
        .collect();
    // Oldest first: the holder of a contested target is the oldest policy.
    items.sort_by(|a, b| {
        (a.meta.creation_timestamp.as_ref().map(|t| t.0), &a.key)
            .cmp(&(b.meta.creation_timestamp.as_ref().map(|t| t.0), &b.key))
    });
    let mut holder: BTreeMap<Target, usize> = BTreeMap::new();
    for (i, item) in items.iter_mut().enumerate() {
        // A policy that enforces nothing holds no target (a valid one may have it).
        if !item.state.holds_targets() {
            continue;
        }
        for t in &item.refs {
            let key = ObjectKey::new(item.key.namespace.as_str(), t.name.as_str());
            let d = describe(t);
            let (kind, found, served_by) = match (t.group == GATEWAY_GROUP, t.kind.as_str()) {
                (true, "Gateway") => {
                    let gw = gateways.iter().find(|g| g.key == key);
                    let found = gw.is_some_and(|g| {
                        t.section_name
                            .as_ref()
                            .is_none_or(|s| g.listeners.iter().any(|(n, _)| n == s))
                    });
                    (GATEWAY, found, vec![key.clone()])
                }
                (true, "HTTPRoute") => {
                    let r = routes.iter().find(|r| r.key == key);
                    let found = r.is_some_and(|r| {
                        t.section_name.as_ref().is_none_or(|s| {
                            r.rules
                                .iter()
                                .any(|(_, n)| n.as_deref() == Some(s.as_str()))
                        })
                    });
                    (
                        HTTPROUTE,
                        found,
                        r.map(|r| r.gateways.clone()).unwrap_or_default(),
                    )
                }
                _ => {
                    item.missing.push(d);
                    continue;
                }
            };
            if !found {
                let ours = if kind == GATEWAY {
                    gateways.iter().any(|g| g.key == key)
                } else {
                    routes.iter().any(|r| r.key == key)
                };
                if !ours && existing.contains(&(kind, key.clone())) {
                    item.foreign += 1;
                } else {
                    item.missing.push(d);
                }
                continue;
            }
            let target = (kind, key, t.section_name.clone());
            match holder.get(&target) {
                Some(&h) if h != i => item.lost.push(format!("{d} already has {KIND} (older)")),
                Some(_) => {}
                None => {
                    holder.insert(target.clone(), i);
                    item.reached.extend(served_by);
                    item.held.push(target);
                }
            }
        }
    }
    for r in routes {
        let route_holder = holder.get(&(HTTPROUTE, r.key.clone(), None)).copied();
        for (index, name) in &r.rules {
            let rule_holder = name
                .as_ref()
                .and_then(|n| holder.get(&(HTTPROUTE, r.key.clone(), Some(n.clone()))))
                .copied();
            // Each field from the rule's policy when it sets it, else from the route's.
            let pick = |get: &dyn Fn(&Fields) -> Option<u64>| {
                [rule_holder, route_holder].into_iter().find_map(|h| {
                    let i = h?;
                    let v = get(&items[i].state.contribution()?.entries)?;
                    Some((i, v))
                })
            };
            let body = pick(&|f| f.limits.max_request_body_bytes);
            let off = pick(&|f| matches!(f.compression, Some(None)).then_some(1));
            if body.is_none() && off.is_none() {
                continue;
            }
            out.routes.insert(
                (r.key.clone(), *index),
                RuleSettings {
                    max_request_body_bytes: body.map(|(_, v)| v),
                    compression_disabled: off.is_some(),
                },
            );
            for (i, _) in body.into_iter().chain(off) {
                for gw in &r.gateways {
                    items[i].enforced_on.insert(gw.clone());
                    out.affecting_routes
                        .entry((r.key.clone(), gw.clone()))
                        .or_default()
                        .insert((KIND, items[i].key.clone()));
                }
            }
        }
    }
    for gw in gateways {
        let gw_holder = holder.get(&(GATEWAY, gw.key.clone(), None)).copied();
        let gw_fields = gw_holder
            .and_then(|i| items[i].state.contribution())
            .map(|c| c.entries.clone())
            .unwrap_or_default();
        let mut by_port: BTreeMap<u16, Vec<(&str, Option<usize>)>> = BTreeMap::new();
        for (name, port) in &gw.listeners {
            let h = holder
                .get(&(GATEWAY, gw.key.clone(), Some(name.clone())))
                .copied();
            by_port.entry(*port).or_default().push((name.as_str(), h));
        }
        for (port, listeners) in by_port {
            let effective = |h: Option<usize>| -> Fields {
                match h.and_then(|i| items[i].state.contribution()) {
                    Some(c) => c.entries.over(&gw_fields),
                    None => gw_fields.clone(),
                }
            };
            let first = effective(listeners[0].1);
            let split = listeners.iter().any(|(_, h)| effective(*h) != first);
            let mut sources: BTreeSet<usize> = gw_holder.into_iter().collect();
            let mut chosen = first;
            if split {
                // The port keeps the Gateway's settings; each listener policy here loses.
                chosen = gw_fields.clone();
                let names: Vec<&str> = listeners.iter().map(|(n, _)| *n).collect();
                for (name, h) in &listeners {
                    if let Some(i) = h {
                        items[*i].held.retain(|t| {
                            !(t.0 == GATEWAY && t.1 == gw.key && t.2.as_deref() == Some(*name))
                        });
                        items[*i].lost.push(format!(
                            "Gateway {} (section {name}): port {port} is shared by \
                             listeners {} whose settings would differ; a port has one \
                             socket, so target the Gateway or give every listener on the \
                             port the same settings",
                            gw.key.name,
                            names.join(", ")
                        ));
                    }
                }
            } else {
                sources.extend(listeners.iter().filter_map(|(_, h)| *h));
            }
            // Every never-valid policy holding the Gateway or a listener of this port closes
            // it, split or not: what it would set is unknown.
            let closers: BTreeSet<usize> = gw_holder
                .into_iter()
                .chain(listeners.iter().filter_map(|(_, h)| *h))
                .filter(|&i| matches!(items[i].state, State::Closed(_)))
                .collect();
            let closed_by: Vec<ObjectKey> = closers.iter().map(|&i| items[i].key.clone()).collect();
            sources.extend(closers);
            if sources.is_empty() {
                continue;
            }
            let mut settings = chosen.settings();
            settings.closed_by = closed_by;
            for &i in &sources {
                if items[i].state.contribution().is_some() {
                    items[i].enforced_on.insert(gw.key.clone());
                }
                out.affecting_gateways
                    .entry(gw.key.clone())
                    .or_default()
                    .insert((KIND, items[i].key.clone()));
            }
            out.ports.insert((gw.key.clone(), port), settings);
        }
    }
    for item in &items {
        if let Some(s) = status(item, now) {
            out.status.insert(item.key.clone(), s);
        }
    }
    out
}

fn describe(t: &TargetRef) -> String {
    match &t.section_name {
        Some(s) => format!("{} {} (section {s})", t.kind, t.name),
        None => format!("{} {}", t.kind, t.name),
    }
}

/// A policy's status; `None` when every target is another controller's Gateway.
fn status(item: &Item, now: &Time) -> Option<PolicyStatus> {
    if item.held.is_empty() && item.lost.is_empty() && item.missing.is_empty() && item.foreign > 0 {
        return None;
    }
    let conds = Conds::new(item.meta.generation, now);
    let accepted = match &item.state {
        State::Kept(_, p) | State::Closed(p) | State::Rejected(p) => {
            conds.no(ACCEPTED, p.reason, p.message.clone())
        }
        State::Valid(_) if item.held.is_empty() && !item.lost.is_empty() => {
            conds.no(ACCEPTED, reason::CONFLICTED, item.lost.join("; "))
        }
        State::Valid(_) if item.held.is_empty() => conds.no(
            ACCEPTED,
            reason::TARGET_NOT_FOUND,
            format!(
                "no target is a Gateway, listener or HTTPRoute served by {CONTROLLER_NAME}: {}",
                item.missing.join(", ")
            ),
        ),
        State::Valid(_) => {
            let mut msg = format!("{KIND} is accepted");
            if !item.missing.is_empty() {
                msg.push_str(&format!("; targets not found: {}", item.missing.join(", ")));
            }
            if !item.lost.is_empty() {
                msg.push_str(&format!("; targets not held: {}", item.lost.join("; ")));
            }
            conds.yes(ACCEPTED, reason::ACCEPTED, msg)
        }
    };
    let is_accepted = accepted.status == "True";
    let mut conditions = vec![accepted.clone()];
    if !is_accepted {
        conditions.push(conds.yes(STALLED, &accepted.reason, accepted.message.clone()));
    }
    let mut ancestors = Vec::new();
    if is_accepted || matches!(item.state, State::Kept(..)) {
        let enforced = |gw: Option<&ObjectKey>| {
            let on = match gw {
                Some(g) => item.enforced_on.contains(g),
                None => !item.enforced_on.is_empty(),
            };
            if on {
                conds.yes(ENFORCED, reason::ENFORCED, format!("{KIND} is enforced"))
            } else {
                conds.no(
                    ENFORCED,
                    reason::UNKNOWN,
                    "no listener under the targets is served with these settings",
                )
            }
        };
        conditions.push(enforced(None));
        for gw in &item.reached {
            ancestors.push(gateway_ancestor(
                gw,
                vec![accepted.clone(), enforced(Some(gw))],
            ));
        }
    }
    Some(PolicyStatus {
        observed_generation: item.meta.generation,
        conditions,
        ancestors,
    })
}
