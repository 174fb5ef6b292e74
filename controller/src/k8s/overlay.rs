//! Overlays of live state on the compiler's statuses: a Gateway is `Programmed` once a
//! proxy runs its current table; a policy is `Enforced` on a Gateway once that Gateway is
//! Programmed.
//!
//! In: a compiled status and the push server's sync state. Out: the same status, adjusted.

use std::collections::BTreeSet;

use gateway_api::gateways::GatewayStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tollgate_api::ObjectKey;

use crate::compile::conditions::PROGRAMMED;
use crate::compile::policies::{ENFORCED, RECONCILING, reason as policy_reason};
use crate::crds::PolicyStatus;
use crate::push::SyncState;

pub fn programmed_true(s: &GatewayStatus) -> bool {
    s.conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == PROGRAMMED && c.status == "True")
}

/// Overlays the push sync state on a Gateway's `Programmed` condition (left alone when the
/// compiler already says False).
pub fn programmed(status: &mut GatewayStatus, sync: &SyncState, live_true: bool) {
    let Some(c) = status
        .conditions
        .iter_mut()
        .flatten()
        .find(|c| c.type_ == PROGRAMMED && c.status == "True")
    else {
        return;
    };
    let nacked = !sync.nacks.is_empty();
    if sync.in_sync > 0 || (live_true && sync.connected > 0 && !nacked) {
        c.reason = "Programmed".to_owned();
        c.message = format!("programmed on {} connected proxies", sync.connected);
        return;
    }
    c.status = "False".to_owned();
    if let Some((proxy, msg)) = sync.nacks.first() {
        c.reason = "Invalid".to_owned();
        c.message = format!("proxy {proxy} rejected version {}: {msg}", sync.version);
    } else {
        c.reason = "Pending".to_owned();
        c.message = format!(
            "waiting for a proxy to run version {} ({} of {} in sync)",
            sync.version, sync.in_sync, sync.connected
        );
    }
}

/// Overlays proxy confirmation on a policy's `Enforced`: enforced on a Gateway only once its
/// proxies run the current table (the Gateway is Programmed); the policy is enforced when it
/// is on at least one Gateway.
pub fn enforced(status: &mut PolicyStatus, programmed: &BTreeSet<ObjectKey>) {
    let is_true = |c: &Condition| c.type_ == ENFORCED && c.status == "True";
    let mut any = false;
    let mut waiting = false;
    for a in &mut status.ancestors {
        let gw = ObjectKey::new(
            a.ancestor_ref.namespace.as_str(),
            a.ancestor_ref.name.as_str(),
        );
        for c in a.conditions.iter_mut().filter(|c| is_true(c)) {
            if programmed.contains(&gw) {
                any = true;
            } else {
                waiting = true;
                c.status = "False".to_owned();
                c.reason = policy_reason::UNKNOWN.to_owned();
                c.message =
                    format!("waiting for the proxies of Gateway {gw} to run the current table");
            }
        }
    }
    if !any {
        for c in status.conditions.iter_mut().filter(|c| is_true(c)) {
            c.status = "False".to_owned();
            c.reason = policy_reason::UNKNOWN.to_owned();
            c.message = "waiting for proxies to run a table with this policy".to_owned();
        }
    }
    // kstatus reads Reconciling=True as InProgress: some Gateway's proxies still catch up.
    if waiting {
        let template = status.conditions.first().cloned();
        if let Some(mut c) = template {
            c.type_ = RECONCILING.to_owned();
            c.status = "True".to_owned();
            c.reason = "WaitingForProxies".to_owned();
            c.message = "waiting for proxies to run a table with this policy".to_owned();
            status.conditions.push(c);
        }
    }
}
