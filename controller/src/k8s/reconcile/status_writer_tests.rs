//! `final_status` over the combinations it decides: provisioning on or off, pushing on or
//! off, a static address assigned or not, proxies in sync, rolling out, refusing a version or
//! gone, a compiler rejection; and policies Enforced only where their Gateway is Programmed.
#![allow(clippy::unwrap_used)]
use super::*;
use crate::compile::conditions::{Conds, PROGRAMMED};
use crate::k8s::reconcile::tests::policy_on;
use gateway_types::gateways::GatewayStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

fn now() -> Time {
    Time(Timestamp::UNIX_EPOCH)
}

fn gateway(programmed_ok: bool) -> GatewayStatus {
    let now = now();
    let c = Conds::new(Some(3), &now);
    GatewayStatus {
        conditions: Some(vec![c.make(
            PROGRAMMED,
            programmed_ok,
            if programmed_ok {
                "Programmed"
            } else {
                "Invalid"
            },
            "compiled",
        )]),
        ..GatewayStatus::default()
    }
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new("ns", name)
}

fn ip(a: &str) -> GatewayStatusAddresses {
    GatewayStatusAddresses {
        r#type: Some("IPAddress".into()),
        value: a.into(),
    }
}

fn sync(version: u64, connected: u32, in_sync: u32, nack: Option<&str>) -> SyncState {
    SyncState {
        version,
        connected,
        in_sync,
        nacks: nack
            .map(|m| vec![("p1".to_owned(), m.to_owned())])
            .unwrap_or_default(),
    }
}

/// One Gateway `gw` (compiled Programmed when `compiled_ok`) and a RateLimitPolicy on it.
fn compiled(compiled_ok: bool) -> Output {
    let mut out = Output::default();
    out.gateways.insert(key("gw"), gateway(compiled_ok));
    out.rate_limit_policies
        .insert(key("limit"), policy_on(&["gw"]));
    out
}

/// (status, reason) of the Gateway's Programmed, the Gateway's addresses, and the status of
/// the policy's Enforced.
fn verdict(out: &Output) -> (String, String, Vec<String>, String) {
    let gw = &out.gateways[&key("gw")];
    let p = gw
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == PROGRAMMED)
        .unwrap();
    let addresses = gw
        .addresses
        .iter()
        .flatten()
        .map(|a| a.value.clone())
        .collect();
    let policy = &out.rate_limit_policies[&key("limit")];
    (
        p.status.clone(),
        p.reason.clone(),
        addresses,
        policy.conditions[1].status.clone(),
    )
}

fn facts(
    provisioned: Option<(&[&str], &[&str])>,
    sync: Option<SyncState>,
    live_programmed: bool,
) -> BTreeMap<ObjectKey, GatewayFacts> {
    let provisioned = provisioned.map(|(requested, assigned)| {
        (
            requested.iter().map(|s| (*s).to_owned()).collect(),
            assigned.iter().map(|a| ip(a)).collect(),
        )
    });
    [(
        key("gw"),
        GatewayFacts {
            provisioned,
            sync,
            live_programmed,
        },
    )]
    .into()
}

fn v(
    status: &str,
    reason: &str,
    addresses: &[&str],
    enforced: &str,
) -> (String, String, Vec<String>, String) {
    (
        status.into(),
        reason.into(),
        addresses.iter().map(|s| (*s).to_owned()).collect(),
        enforced.into(),
    )
}

#[test]
fn without_push_or_provisioning_the_compiled_status_is_final() {
    let out = final_status(&compiled(true), &BTreeMap::new(), false);
    assert_eq!(verdict(&out), v("True", "Programmed", &[], "True"));
    assert_eq!(out, compiled(true));
}

#[test]
fn pushing_waits_for_a_proxy_that_runs_the_version() {
    // No proxy has connected yet (no facts at all counts as none).
    let out = final_status(&compiled(true), &BTreeMap::new(), true);
    assert_eq!(verdict(&out), v("False", "Pending", &[], "False"));
    let out = final_status(
        &compiled(true),
        &facts(None, Some(sync(4, 2, 0, None)), false),
        true,
    );
    assert_eq!(verdict(&out), v("False", "Pending", &[], "False"));
    // One of two in sync: Programmed, and the policy Enforced.
    let out = final_status(
        &compiled(true),
        &facts(None, Some(sync(4, 2, 1, None)), false),
        true,
    );
    assert_eq!(verdict(&out), v("True", "Programmed", &[], "True"));
}

#[test]
fn a_rollout_in_flight_keeps_programmed_but_a_refusal_or_no_proxy_does_not() {
    let rolling = final_status(
        &compiled(true),
        &facts(None, Some(sync(5, 2, 0, None)), true),
        true,
    );
    assert_eq!(verdict(&rolling), v("True", "Programmed", &[], "True"));
    let refused = final_status(
        &compiled(true),
        &facts(None, Some(sync(5, 2, 0, Some("bad regex"))), true),
        true,
    );
    assert_eq!(verdict(&refused), v("False", "Invalid", &[], "False"));
    let gone = final_status(
        &compiled(true),
        &facts(None, Some(sync(5, 0, 0, None)), true),
        true,
    );
    assert_eq!(verdict(&gone), v("False", "Pending", &[], "False"));
}

#[test]
fn a_compiler_rejection_stays_whatever_the_proxies_say() {
    let out = final_status(
        &compiled(false),
        &facts(Some((&[], &["127.0.1.3"])), Some(sync(5, 2, 2, None)), true),
        true,
    );
    assert_eq!(
        verdict(&out),
        v("False", "Invalid", &["127.0.1.3"], "False")
    );
}

#[test]
fn provisioning_lists_the_services_addresses_and_waits_for_a_static_one() {
    let in_sync = || Some(sync(6, 1, 1, None));
    // The Service's address, nothing requested.
    let out = final_status(
        &compiled(true),
        &facts(Some((&[], &["127.0.1.3"])), in_sync(), false),
        true,
    );
    assert_eq!(
        verdict(&out),
        v("True", "Programmed", &["127.0.1.3"], "True")
    );
    // A static address requested and not (yet) assigned: not Programmed, not Enforced, even
    // with every proxy in sync.
    let out = final_status(
        &compiled(true),
        &facts(Some((&["127.0.1.250"], &["10.96.0.7"])), in_sync(), true),
        true,
    );
    assert_eq!(
        verdict(&out),
        v("False", "AddressNotUsable", &["127.0.1.250"], "False")
    );
    // Assigned.
    let out = final_status(
        &compiled(true),
        &facts(Some((&["127.0.1.250"], &["127.0.1.250"])), in_sync(), false),
        true,
    );
    assert_eq!(
        verdict(&out),
        v("True", "Programmed", &["127.0.1.250"], "True")
    );
    // Provisioning without a push server: addresses only, Programmed as compiled.
    let out = final_status(
        &compiled(true),
        &facts(Some((&[], &["127.0.1.3"])), None, false),
        false,
    );
    assert_eq!(
        verdict(&out),
        v("True", "Programmed", &["127.0.1.3"], "True")
    );
}

#[test]
fn a_policy_is_enforced_only_on_the_gateways_that_are_programmed() {
    let mut c = compiled(true);
    c.gateways.insert(key("other"), gateway(true));
    c.rate_limit_policies
        .insert(key("limit"), policy_on(&["gw", "other"]));
    let mut f = facts(None, Some(sync(2, 1, 1, None)), false);
    f.insert(
        key("other"),
        GatewayFacts {
            provisioned: None,
            sync: Some(sync(2, 1, 0, None)),
            live_programmed: false,
        },
    );
    let out = final_status(&c, &f, true);
    let p = &out.rate_limit_policies[&key("limit")];
    assert_eq!(p.conditions[1].status, "True");
    assert_eq!(p.ancestors[0].conditions[0].status, "True");
    assert_eq!(
        (
            p.ancestors[1].conditions[0].status.as_str(),
            p.ancestors[1].conditions[0].reason.as_str()
        ),
        ("False", "Unknown")
    );
}
