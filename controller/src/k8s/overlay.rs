//! Overlays of live state on the compiler's statuses: a Gateway is `Programmed` once a
//! proxy runs its current table; a policy is `Enforced` on a Gateway once that Gateway is
//! Programmed.
//!
//! In: a compiled status and the push server's sync state. Out: the same status, adjusted.

use std::collections::BTreeSet;

use gateway_types::gateways::{GatewayStatus, GatewayStatusAddresses};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tollgate_api::ObjectKey;

use crate::compile::conditions::PROGRAMMED;

/// Gateway `Programmed=False` reason: a requested static address is not assigned.
pub const ADDRESS_NOT_USABLE: &str = "AddressNotUsable";
use crate::compile::policies::{ENFORCED, RECONCILING, reason as policy_reason};
use crate::crds::PolicyStatus;
use crate::push::SyncState;

pub fn programmed_true(s: &GatewayStatus) -> bool {
    s.conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == PROGRAMMED && c.status == "True")
}

/// The Gateway's `Programmed` condition when it is True (the overlays only ever lower it).
fn programmed_true_mut(status: &mut GatewayStatus) -> Option<&mut Condition> {
    status
        .conditions
        .iter_mut()
        .flatten()
        .find(|c| c.type_ == PROGRAMMED && c.status == "True")
}

/// Overlays the push sync state on a Gateway's `Programmed` condition (left alone when the
/// compiler already says False).
pub fn programmed(status: &mut GatewayStatus, sync: &SyncState, live_true: bool) {
    let Some(c) = programmed_true_mut(status) else {
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
    } else if sync.connected == 0 {
        // No version in the message: a restarted controller numbers its tables afresh, and a
        // message naming one would rewrite the status of every Gateway without proxies.
        c.reason = "Pending".to_owned();
        c.message = "waiting for a proxy to connect".to_owned();
    } else {
        c.reason = "Pending".to_owned();
        c.message = format!(
            "waiting for a proxy to run version {} ({} of {} in sync)",
            sync.version, sync.in_sync, sync.connected
        );
    }
}

/// GatewayStaticAddresses: a Gateway that asks for addresses (`requested`, from
/// `spec.addresses`) lists them in `status.addresses`, and is `Programmed` only once the load
/// balancer has assigned every one of them to its Service (`assigned`); until then
/// `Programmed=False` with reason `AddressNotUsable`. A False from the compiler is left
/// alone. Without requested addresses, `status.addresses` is what the Service was assigned.
pub fn static_addresses(
    status: &mut GatewayStatus,
    requested: &[String],
    assigned: Vec<GatewayStatusAddresses>,
) {
    if requested.is_empty() {
        status.addresses = (!assigned.is_empty()).then_some(assigned);
        return;
    }
    let missing: Vec<&str> = requested
        .iter()
        .map(String::as_str)
        .filter(|r| !assigned.iter().any(|a| a.value == *r))
        .collect();
    status.addresses = Some(
        requested
            .iter()
            .map(|r| GatewayStatusAddresses {
                r#type: Some("IPAddress".to_owned()),
                value: r.clone(),
            })
            .collect(),
    );
    if missing.is_empty() {
        return;
    }
    let Some(c) = programmed_true_mut(status) else {
        return;
    };
    c.status = "False".to_owned();
    c.reason = ADDRESS_NOT_USABLE.to_owned();
    c.message = if requested.len() > 1 {
        format!(
            "spec.addresses: {} not assigned; the proxy's LoadBalancer Service asks for one address (the first), so only one can be used",
            missing.join(", ")
        )
    } else {
        format!(
            "spec.addresses: the load balancer has not assigned {} to the proxy's Service (it cannot, or not yet)",
            missing.join(", ")
        )
    };
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
