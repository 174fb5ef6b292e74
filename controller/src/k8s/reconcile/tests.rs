//! Unit tests of the reconcile overlays one by one (Programmed from push sync, addresses,
//! Enforced), class ownership and the last-valid memory; their combination is tested with
//! `final_status` in status_writer_tests.rs.
#![allow(clippy::unwrap_used)]
use super::*;
use crate::compile::conditions::{Conds, PROGRAMMED};
use crate::compile::{CONTROLLER_NAME, Inputs};
use crate::crds::PolicyStatus;
use crate::crds::common::{AncestorRef, PolicyAncestorStatus};
use crate::push::SyncState;
use gateway_types::gateways::{GatewayStatus, GatewayStatusAddresses};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use tollgate_api::ObjectKey;

fn gateway(programmed_ok: bool) -> GatewayStatus {
    let now = Time(Timestamp::UNIX_EPOCH);
    let c = Conds::new(Some(3), &now);
    GatewayStatus {
        conditions: Some(vec![c.make(PROGRAMMED, programmed_ok, "Programmed", "ok")]),
        ..GatewayStatus::default()
    }
}

fn sync(version: u64, connected: u32, in_sync: u32) -> SyncState {
    SyncState {
        version,
        connected,
        in_sync,
        nacks: Vec::new(),
    }
}

fn programmed_of(s: &GatewayStatus) -> (String, String, String) {
    let c = &s.conditions.as_ref().unwrap()[0];
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

#[test]
fn programmed_waits_for_a_proxy_in_sync() {
    let mut s = gateway(true);
    programmed(&mut s, &sync(7, 2, 0), false);
    let p = programmed_of(&s);
    assert_eq!((p.0.as_str(), p.1.as_str()), ("False", "Pending"));
    assert_eq!(p.2, "waiting for a proxy to run version 7 (0 of 2 in sync)");
    let mut s = gateway(true);
    programmed(&mut s, &sync(7, 2, 1), false);
    assert_eq!(programmed_of(&s).0, "True");
    assert_eq!(programmed_of(&s).2, "programmed on 2 connected proxies");
}

#[test]
fn programmed_without_proxies_names_no_version() {
    // The same message whatever the version: a restart, which numbers tables afresh, must
    // not rewrite the status of a Gateway no proxy has connected to.
    let (mut a, mut b) = (gateway(true), gateway(true));
    programmed(&mut a, &sync(7, 0, 0), false);
    programmed(&mut b, &sync(1_796_649_043_607, 0, 0), false);
    assert_eq!(programmed_of(&a), programmed_of(&b));
    assert_eq!(
        programmed_of(&a),
        (
            "False".into(),
            "Pending".into(),
            "waiting for a proxy to connect".into()
        )
    );
}

#[test]
fn programmed_stays_true_while_a_new_version_rolls_out_but_not_on_a_nack() {
    let mut s = gateway(true);
    programmed(&mut s, &sync(8, 2, 0), true);
    assert_eq!(programmed_of(&s).0, "True");
    let mut s = gateway(true);
    let mut st = sync(8, 1, 0);
    st.nacks.push(("p1".into(), "bad regex".into()));
    programmed(&mut s, &st, true);
    let p = programmed_of(&s);
    assert_eq!((p.0.as_str(), p.1.as_str()), ("False", "Invalid"));
    assert_eq!(p.2, "proxy p1 rejected version 8: bad regex");
    // Disconnected: no longer programmed.
    let mut s = gateway(true);
    programmed(&mut s, &sync(8, 0, 0), true);
    assert_eq!(programmed_of(&s).1, "Pending");
}

#[test]
fn a_compiler_rejection_is_left_alone() {
    let mut s = gateway(false);
    programmed(&mut s, &sync(1, 1, 1), true);
    assert_eq!(programmed_of(&s).0, "False");
}

#[test]
fn only_classes_with_our_name_are_compiled_as_ours() {
    let mut inputs = Inputs::default();
    for (name, cn) in [
        ("a", "x.dev/mine"),
        ("b", CONTROLLER_NAME),
        ("c", "y.dev/other"),
    ] {
        let mut c = gateway_types::gatewayclasses::GatewayClass::default();
        c.metadata.name = Some(name.into());
        c.spec.controller_name = cn.into();
        inputs.gateway_classes.push(c);
    }
    own_classes(&mut inputs, "x.dev/mine");
    let ours: Vec<_> = inputs
        .gateway_classes
        .iter()
        .filter(|c| c.spec.controller_name == CONTROLLER_NAME)
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(ours, vec!["a".to_owned()]);
}

/// A policy status Accepted and Enforced on Gateways `ns/NAME` (shared with
/// status_writer_tests.rs).
pub(super) fn policy_on(gateways: &[&str]) -> PolicyStatus {
    let now = Time(Timestamp::UNIX_EPOCH);
    let c = Conds::new(Some(1), &now);
    let enforced = c.yes("Enforced", "Enforced", "enforced");
    PolicyStatus {
        observed_generation: Some(1),
        conditions: vec![c.yes("Accepted", "Accepted", "ok"), enforced.clone()],
        ancestors: gateways
            .iter()
            .map(|g| PolicyAncestorStatus {
                ancestor_ref: AncestorRef {
                    group: "gateway.networking.k8s.io".into(),
                    kind: "Gateway".into(),
                    namespace: "ns".into(),
                    name: (*g).into(),
                },
                controller_name: "x".into(),
                conditions: vec![enforced.clone()],
            })
            .collect(),
    }
}

#[test]
fn policy_is_enforced_only_where_the_gateway_is_programmed() {
    let programmed: std::collections::BTreeSet<ObjectKey> = [ObjectKey::new("ns", "a")].into();
    let mut s = policy_on(&["a", "b"]);
    enforced(&mut s, &programmed);
    assert_eq!(s.conditions[1].status, "True");
    assert_eq!(s.ancestors[0].conditions[0].status, "True");
    let b = &s.ancestors[1].conditions[0];
    assert_eq!((b.status.as_str(), b.reason.as_str()), ("False", "Unknown"));
    assert!(b.message.contains("ns/b"), "{}", b.message);

    let mut s = policy_on(&["b"]);
    enforced(&mut s, &programmed);
    let top = &s.conditions[1];
    assert_eq!(
        (top.status.as_str(), top.reason.as_str()),
        ("False", "Unknown")
    );
}

fn ip(a: &str) -> GatewayStatusAddresses {
    GatewayStatusAddresses {
        r#type: Some("IPAddress".into()),
        value: a.into(),
    }
}

fn status_addresses(s: &GatewayStatus) -> Vec<&str> {
    s.addresses
        .iter()
        .flatten()
        .map(|a| a.value.as_str())
        .collect()
}

#[test]
fn a_static_address_must_be_assigned_before_programmed() {
    let want = vec!["127.0.1.250".to_owned()];
    // Not assigned (the load balancer gave another address, or none): listed, not Programmed.
    let mut s = gateway(true);
    static_addresses(&mut s, &want, vec![ip("10.96.0.7")]);
    let p = programmed_of(&s);
    assert_eq!((p.0.as_str(), p.1.as_str()), ("False", "AddressNotUsable"));
    assert!(p.2.contains("127.0.1.250"), "{}", p.2);
    assert_eq!(status_addresses(&s), ["127.0.1.250"]);
    // Assigned.
    let mut s = gateway(true);
    static_addresses(&mut s, &want, vec![ip("127.0.1.250")]);
    assert_eq!(programmed_of(&s).0, "True");
    assert_eq!(status_addresses(&s), ["127.0.1.250"]);
    // Two asked for: only the first can be requested of the Service.
    let mut s = gateway(true);
    let two = ["127.0.1.250".to_owned(), "127.0.1.251".to_owned()];
    static_addresses(&mut s, &two, vec![ip("127.0.1.250")]);
    let p = programmed_of(&s);
    assert_eq!((p.0.as_str(), p.1.as_str()), ("False", "AddressNotUsable"));
    assert!(p.2.contains("only one"), "{}", p.2);
    // Nothing asked for: the Service's addresses, Programmed untouched.
    let mut s = gateway(true);
    static_addresses(&mut s, &[], vec![ip("127.0.1.3")]);
    assert_eq!(programmed_of(&s).0, "True");
    assert_eq!(status_addresses(&s), ["127.0.1.3"]);
    let mut s = gateway(true);
    static_addresses(&mut s, &[], Vec::new());
    assert!(s.addresses.is_none());
    // A compiler False is left alone.
    let mut s = gateway(false);
    static_addresses(&mut s, &want, Vec::new());
    assert_eq!(programmed_of(&s).1, "Programmed");
}

/// The reconcile loop hands each compile the previous one's valid policies: an AuthPolicy
/// edited into an invalid state keeps its last valid rules in the published table, where a
/// compile without that memory would close its route. (The real-cluster version of this
/// needs `e2e/cluster.sh up`; this is the reconcile step itself, without the API server.)
#[test]
fn compile_next_keeps_an_invalid_policys_last_valid_version() {
    let yaml = |predicate: &str, generation: u32| {
        format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: tollgate}}
spec: {{controllerName: {CONTROLLER_NAME}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw, namespace: default}}
spec:
  gatewayClassName: tollgate
  listeners: [{{name: http, protocol: HTTP, port: 80}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: api, namespace: default}}
spec:
  parentRefs: [{{name: gw}}]
  rules: [{{}}]
---
apiVersion: tollgate.dev/v1alpha1
kind: AuthPolicy
metadata: {{name: api-auth, namespace: default, generation: {generation}}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: api}}]
  rules:
    authorization:
      internal: {{predicate: "{predicate}"}}
"#
        )
    };
    let load = |text: String| {
        crate::compile::inputs_from_yaml(&text, Time(Timestamp::UNIX_EPOCH)).unwrap()
    };
    let gw = ObjectKey::new("default", "gw");
    let first = compile_next(
        &Output::default(),
        &mut load(yaml("source.address.startsWith('10.')", 1)),
        CONTROLLER_NAME,
    );
    let valid = first.tables[&gw].policies.clone();
    assert_eq!(valid.len(), 1, "{:?}", first.tables[&gw]);

    let mut edited = load(yaml("source.address.startsWith(", 2));
    let second = compile_next(&first, &mut edited, CONTROLLER_NAME);
    assert_eq!(second.tables[&gw].policies, valid);
    assert!(second.tables[&gw].closed.is_empty());
    let accepted = &second.auth_policies[&ObjectKey::new("default", "api-auth")].conditions[0];
    assert!(
        accepted
            .message
            .contains("the last valid version (generation 1) stays enforced"),
        "{}",
        accepted.message
    );
    // The memory passes on while the policy stays invalid.
    let third = compile_next(&second, &mut edited, CONTROLLER_NAME);
    assert_eq!(third.tables[&gw].policies, valid);
    // Without it (a fresh controller), the route is closed.
    let fresh = compile_next(&Output::default(), &mut edited, CONTROLLER_NAME);
    assert!(fresh.tables[&gw].policies.is_empty());
    assert_eq!(fresh.tables[&gw].closed.len(), 1);
}
