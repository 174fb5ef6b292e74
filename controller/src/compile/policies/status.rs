//! Policy statuses: `Accepted`, `Stalled`, `Enforced`, per-Gateway ancestors.
//!
//! In: one kind's [`Resolved`] policies after every rule's effective set was computed (which
//! records where each one was reached and enforced). Out: the status of each policy. An
//! invalid policy is `Accepted=False` whatever it enforces; the message says what applies
//! (its last valid version, or its targets closed), and one kept at its last valid version
//! still reports where that version is `Enforced`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use tollgate_api::ObjectKey;

use super::last_valid::State;
use super::{ENFORCED, Resolved, STALLED, reason};
use crate::compile::CONTROLLER_NAME;
use crate::compile::conditions::{ACCEPTED, Conds};
use crate::compile::grants::GATEWAY_GROUP;
use crate::crds::common::{AncestorRef, PolicyAncestorStatus, PolicyStatus};

/// A policy's status entry for the Gateway `gw`, with its `conditions`.
pub(super) fn gateway_ancestor(gw: &ObjectKey, conditions: Vec<Condition>) -> PolicyAncestorStatus {
    PolicyAncestorStatus {
        ancestor_ref: AncestorRef {
            group: GATEWAY_GROUP.to_owned(),
            kind: "Gateway".to_owned(),
            namespace: gw.namespace.clone(),
            name: gw.name.clone(),
        },
        controller_name: CONTROLLER_NAME.to_owned(),
        conditions,
    }
}

impl<T> Resolved<T> {
    /// Status of every policy.
    pub(super) fn statuses(&self, now: &Time) -> BTreeMap<ObjectKey, PolicyStatus> {
        let mut out = BTreeMap::new();
        for i in 0..self.keys.len() {
            if self.contributions[i].holds_targets()
                && self.found[i].is_empty()
                && self.lost[i].is_empty()
                && self.missing[i].is_empty()
                && self.foreign[i] > 0
            {
                // Every target is another controller's Gateway or route: not ours to judge.
                continue;
            }
            let conds = Conds::new(self.metas[i].generation, now);
            let mut conditions = Vec::new();
            let accepted = match &self.contributions[i] {
                State::Kept(_, p) | State::Closed(p) | State::Rejected(p) => {
                    conds.no(ACCEPTED, p.reason, p.message.clone())
                }
                State::Valid(_) if self.found[i].is_empty() && !self.lost[i].is_empty() => conds
                    .no(
                        ACCEPTED,
                        reason::CONFLICTED,
                        self.lost[i]
                            .iter()
                            .map(|(t, by)| format!("{t} already has {} {by}", self.kind))
                            .collect::<Vec<_>>()
                            .join("; "),
                    ),
                State::Valid(_) if self.found[i].is_empty() => conds.no(
                    ACCEPTED,
                    reason::TARGET_NOT_FOUND,
                    format!(
                        "no target is a Gateway or route served by {CONTROLLER_NAME}: {}",
                        self.missing[i].join(", ")
                    ),
                ),
                State::Valid(_) => {
                    let mut msg = format!("{} is accepted", self.kind);
                    if !self.missing[i].is_empty() {
                        msg.push_str(&format!(
                            "; targets not found: {}",
                            self.missing[i].join(", ")
                        ));
                    }
                    for (_, kind, gw, section) in &self.found[i] {
                        let streams = self.streams.get(gw).filter(|_| *kind == "Gateway");
                        if let (Some(streams), None) = (streams, section) {
                            msg.push_str(&format!(
                                "; not enforced on the stream listeners of Gateway {gw} ({}): \
                                 policies act on HTTP requests",
                                streams.join(", ")
                            ));
                        }
                    }
                    if !self.lost[i].is_empty() {
                        msg.push_str(&format!(
                            "; targets held by older policies: {}",
                            self.lost[i]
                                .iter()
                                .map(|(t, by)| format!("{t} ({by})"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                    }
                    conds.yes(ACCEPTED, reason::ACCEPTED, msg)
                }
            };
            let is_accepted = accepted.status == "True";
            conditions.push(accepted.clone());
            if !is_accepted {
                // kstatus (Flux, Argo CD's kstatus-based checks) reads Stalled=True as Failed.
                conditions.push(conds.yes(STALLED, &accepted.reason, accepted.message.clone()));
            }
            let mut ancestors = Vec::new();
            // A policy kept at its last valid version is enforced as that version.
            if is_accepted || matches!(self.contributions[i], State::Kept(..)) {
                conditions.push(self.enforced(i, None, &conds));
                let mut reached: BTreeSet<ObjectKey> = self.reached[i].clone();
                for t in &self.found[i] {
                    if t.1 == "Gateway" {
                        reached.insert(t.2.clone());
                    }
                }
                for gw in reached {
                    let enforced = self.enforced(i, Some(&gw), &conds);
                    ancestors.push(gateway_ancestor(&gw, vec![accepted.clone(), enforced]));
                }
            }
            out.insert(
                self.keys[i].clone(),
                PolicyStatus {
                    observed_generation: self.metas[i].generation,
                    conditions,
                    ancestors,
                },
            );
        }
        out
    }

    fn enforced(&self, i: usize, gw: Option<&ObjectKey>, conds: &Conds<'_>) -> Condition {
        let (enforced, reached) = match gw {
            Some(g) => (self.enforced_on[i].contains(g), self.reached[i].contains(g)),
            None => (!self.enforced_on[i].is_empty(), !self.reached[i].is_empty()),
        };
        if enforced {
            conds.yes(
                ENFORCED,
                reason::ENFORCED,
                format!("{} is enforced", self.kind),
            )
        } else if reached {
            conds.no(
                ENFORCED,
                reason::OVERRIDDEN,
                format!("{} is overridden by other policies", self.kind),
            )
        } else {
            conds.no(
                ENFORCED,
                reason::UNKNOWN,
                "no route is served under the targets",
            )
        }
    }
}
