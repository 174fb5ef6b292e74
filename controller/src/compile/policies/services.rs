//! Policies that target Services (BackendPolicy, XBackendTrafficPolicy): which policy holds
//! which Service port, and the table backends that take it. In: each policy's targets, in
//! the order that settles conflicts (oldest first), and the Services. Out: per policy, the
//! targets it holds, lost to an older one (`Conflicted`) or did not find
//! (`TargetNotFound`), and a walk over the table backends of the held ports.
//!
//! A policy naming a port (`sectionName`: the Service port's name) wins there over one
//! naming the whole Service.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use tollgate_api::{Backend, ObjectKey, RouteTable};

use super::reason;
use super::status::gateway_ancestor;
use crate::compile::conditions::{ACCEPTED, Conds};
use crate::compile::index::{Index, key_of};
use crate::crds::common::PolicyStatus;

/// One target reference.
pub struct Target<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
    pub section: Option<&'a str>,
}

/// A policy's claim on its targets; an invalid policy claims nothing.
pub struct Claim<'a> {
    pub key: ObjectKey,
    pub valid: bool,
    pub targets: Vec<Target<'a>>,
}

/// (namespace, Service, port name or none for the whole Service).
type Slot = (String, String, Option<String>);

/// Who holds what.
pub struct Resolution {
    kind: &'static str,
    holders: BTreeMap<Slot, usize>,
    conflicts: Vec<Vec<String>>,
    missing: Vec<Vec<String>>,
}

/// `items` oldest first, then by key: the order that settles conflicts.
pub fn oldest_first<'a, T: 'a>(
    items: impl IntoIterator<Item = &'a T>,
    meta: impl Fn(&T) -> &ObjectMeta,
) -> Vec<&'a T> {
    let mut order: Vec<&T> = items.into_iter().collect();
    order.sort_by(|a, b| {
        let created = |m: &ObjectMeta| m.creation_timestamp.as_ref().map(|t| t.0);
        created(meta(a))
            .cmp(&created(meta(b)))
            .then_with(|| key_of(meta(a)).cmp(&key_of(meta(b))))
    });
    order
}

/// Settles which claim holds each Service port.
pub fn resolve(kind: &'static str, claims: &[Claim<'_>], idx: &Index<'_>) -> Resolution {
    let mut r = Resolution {
        kind,
        holders: BTreeMap::new(),
        conflicts: vec![Vec::new(); claims.len()],
        missing: vec![Vec::new(); claims.len()],
    };
    for (i, c) in claims.iter().enumerate().filter(|(_, c)| c.valid) {
        let ns = c.key.namespace.as_str();
        for t in &c.targets {
            let what = match t.section {
                Some(s) => format!("Service {ns}/{} port {s}", t.name),
                None => format!("Service {ns}/{}", t.name),
            };
            let svc = (t.group.is_empty() && t.kind == "Service")
                .then(|| idx.services.get(&(ns, t.name)))
                .flatten();
            let found = match (svc, t.section) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(s), Some(port)) => s
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.ports.as_ref())
                    .is_some_and(|ps| ps.iter().any(|sp| sp.name.as_deref() == Some(port))),
            };
            if !found {
                r.missing[i].push(what);
                continue;
            }
            let slot = (
                ns.to_owned(),
                t.name.to_owned(),
                t.section.map(str::to_owned),
            );
            match r.holders.get(&slot) {
                Some(&j) if j != i => {
                    r.conflicts[i].push(format!("{what} already has {kind} {}", claims[j].key))
                }
                _ => {
                    r.holders.insert(slot, i);
                }
            }
        }
    }
    r
}

impl Resolution {
    /// Calls `f(claim, backend)` for each table backend of a held Service port; the
    /// Gateways each claim reached (where `f` returned true).
    pub fn apply(
        &self,
        idx: &Index<'_>,
        tables: &mut BTreeMap<ObjectKey, RouteTable>,
        mut f: impl FnMut(usize, &mut Backend) -> bool,
    ) -> Vec<BTreeSet<ObjectKey>> {
        let mut reached = vec![BTreeSet::new(); self.conflicts.len()];
        if self.holders.is_empty() {
            return reached;
        }
        for (gw, table) in tables.iter_mut() {
            for (key, backend) in table.backends.iter_mut() {
                let Some((ns, svc, port)) = service_port(key) else {
                    continue;
                };
                let port_name = idx
                    .services
                    .get(&(ns, svc))
                    .and_then(|s| s.spec.as_ref())
                    .and_then(|s| s.ports.as_ref())
                    .and_then(|ps| ps.iter().find(|sp| sp.port == i32::from(port)))
                    .and_then(|sp| sp.name.clone());
                let held = port_name
                    .and_then(|n| self.holders.get(&(ns.to_owned(), svc.to_owned(), Some(n))))
                    .or_else(|| self.holders.get(&(ns.to_owned(), svc.to_owned(), None)));
                if let Some(&i) = held
                    && f(i, backend)
                {
                    reached[i].insert(gw.clone());
                }
            }
        }
        reached
    }

    fn holds_nothing(&self, i: usize) -> bool {
        !self.holders.values().any(|&j| j == i)
    }

    /// The `Accepted` condition of claim `i` (`invalid`: why its spec is refused).
    pub fn accepted(&self, i: usize, invalid: Option<&String>, conds: &Conds<'_>) -> Condition {
        let (conflicts, missing) = (&self.conflicts[i], &self.missing[i]);
        if let Some(e) = invalid {
            return conds.no(ACCEPTED, reason::INVALID, e.clone());
        }
        if self.holds_nothing(i) && !conflicts.is_empty() {
            return conds.no(ACCEPTED, reason::CONFLICTED, conflicts.join("; "));
        }
        if self.holds_nothing(i) {
            return conds.no(
                ACCEPTED,
                reason::TARGET_NOT_FOUND,
                format!("no target Service found: {}", missing.join(", ")),
            );
        }
        let mut msg = format!("{} is accepted", self.kind);
        if !missing.is_empty() {
            msg.push_str(&format!("; targets not found: {}", missing.join(", ")));
        }
        if !conflicts.is_empty() {
            msg.push_str("; ");
            msg.push_str(&conflicts.join("; "));
        }
        conds.yes(ACCEPTED, reason::ACCEPTED, msg)
    }
}

/// The status of each policy of `order`: `Accepted` (with the notes `notes(i)` gives when it
/// is true) at the top and on each Gateway the policy reached.
pub fn statuses<T>(
    order: &[&T],
    meta: impl Fn(&T) -> &ObjectMeta,
    res: &Resolution,
    invalid: impl Fn(usize) -> Option<String>,
    reached: &[BTreeSet<ObjectKey>],
    now: &Time,
    notes: impl Fn(usize) -> Vec<&'static str>,
) -> BTreeMap<ObjectKey, PolicyStatus> {
    order
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let m = meta(p);
            let conds = Conds::new(m.generation, now);
            let mut accepted = res.accepted(i, invalid(i).as_ref(), &conds);
            if accepted.status == "True" {
                for note in notes(i) {
                    accepted.message.push_str("; ");
                    accepted.message.push_str(note);
                }
            }
            let ancestors = reached[i]
                .iter()
                .map(|gw| gateway_ancestor(gw, vec![accepted.clone()]))
                .collect();
            let status = PolicyStatus {
                observed_generation: m.generation,
                conditions: vec![accepted],
                ancestors,
            };
            (key_of(m), status)
        })
        .collect()
}

/// `namespace/service:port` (with any `#suffix`) of a table backend key.
fn service_port(key: &str) -> Option<(&str, &str, u16)> {
    let key = key.split('#').next()?;
    let (ns, rest) = key.split_once('/')?;
    let (svc, port) = rest.rsplit_once(':')?;
    Some((ns, svc, port.parse().ok()?))
}
