//! Gateway, GatewayClass and listener statuses.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use tollgate_api::ObjectKey;

#[test]
fn gateway_class_accepted_with_sorted_features() {
    let out = run(&[], "");
    assert_eq!(
        out.gateway_classes.keys().collect::<Vec<_>>(),
        vec!["tollgate"]
    );
    let st = &out.gateway_classes["tollgate"];
    let conds = st.conditions.as_deref().unwrap();
    assert_cond(conds, "Accepted", "True", "Accepted");
    assert_eq!(conds[0].observed_generation, Some(1));
    assert_eq!(conds[0].last_transition_time, now());
    let names: Vec<&str> = st
        .supported_features
        .as_ref()
        .unwrap()
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted);
    // What the class advertises is what e2e/conformance.sh claims, which the conformance
    // suite proves: no feature is advertised untested, none tested goes unadvertised.
    assert_eq!(names, conformance_claims());
    assert!(names.contains(&"TCPRoute") && names.contains(&"UDPRoute"));
}

/// Every feature e2e/conformance.sh claims (its `*_features` arrays), sorted and distinct.
fn conformance_claims() -> Vec<&'static str> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/conformance.sh");
    let text = std::fs::read_to_string(&path).unwrap();
    let text: &'static str = Box::leak(text.into_boxed_str());
    let mut claims = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.ends_with("_features=(") {
            inside = true;
        } else if inside && line.trim() == ")" {
            inside = false;
        } else if inside {
            claims.extend(line.split_whitespace());
        }
    }
    claims.sort_unstable();
    claims.dedup();
    assert!(
        claims.len() > 40,
        "{} claims read from {}",
        claims.len(),
        path.display()
    );
    claims
}

#[test]
fn gateway_class_with_foreign_parameters_ref_is_invalid_parameters_yet_served() {
    let out = run(
        &["listeners"],
        r"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: with-params}
spec:
  controllerName: tollgate.dev/gateway-controller
  parametersRef: {group: example.com, kind: Config, name: x}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: params-gw, namespace: infra}
spec:
  gatewayClassName: with-params
  listeners: [{name: http, port: 80, protocol: HTTP}]
",
    );
    let c = out.gateway_classes["with-params"]
        .conditions
        .as_deref()
        .unwrap();
    assert_cond(c, "Accepted", "False", "InvalidParameters");
    assert_cond(
        gateway_conds(&out, "infra", "params-gw"),
        "Accepted",
        "False",
        "InvalidParameters",
    );
    // Parameters concern provisioning: the routes stay served, the proxy is left alone.
    let key = ObjectKey::new("infra", "params-gw");
    assert!(out.tables.contains_key(&key));
    let err = out.parameters[&key].as_ref().unwrap_err();
    assert!(err.contains("only tollgate.dev/GatewayParameters"), "{err}");
}

#[test]
fn gateways_of_other_classes_are_ignored() {
    let out = run(&["listeners"], "");
    assert!(
        !out.gateways
            .contains_key(&ObjectKey::new("infra", "not-ours"))
    );
    assert!(!out.gateway_classes.contains_key("someone-else"));
}

#[test]
fn hostname_conflict() {
    let out = run(&["listeners"], "");
    for name in ["a", "b"] {
        let l = listener(&out, "infra", "conflicts", name);
        assert_cond(&l.conditions, "Conflicted", "True", "HostnameConflict");
        assert_cond(&l.conditions, "Accepted", "False", "HostnameConflict");
        assert_cond(&l.conditions, "Programmed", "False", "HostnameConflict");
        assert_eq!(l.conditions[0].observed_generation, Some(3));
    }
    let c = listener(&out, "infra", "conflicts", "c");
    assert_cond(&c.conditions, "Conflicted", "False", "NoConflicts");
    assert_cond(&c.conditions, "Accepted", "True", "Accepted");
    assert_cond(&c.conditions, "Programmed", "True", "Programmed");
    // Only listener c is served on port 80.
    let t = table(&out, "infra", "conflicts");
    let p80 = port(t, 80);
    assert_eq!(
        p80.listeners
            .iter()
            .map(|l| l.name.as_str())
            .collect::<Vec<_>>(),
        vec!["c"]
    );
}

#[test]
fn protocol_conflict() {
    let out = run(&["listeners"], "");
    for name in ["plain", "secure"] {
        let l = listener(&out, "infra", "conflicts", name);
        assert_cond(&l.conditions, "Conflicted", "True", "ProtocolConflict");
        assert_cond(&l.conditions, "Accepted", "False", "ProtocolConflict");
    }
    let gw = gateway_conds(&out, "infra", "conflicts");
    assert_cond(gw, "Accepted", "True", "ListenersNotValid");
    assert_cond(gw, "Programmed", "True", "Programmed");
    assert!(
        table(&out, "infra", "conflicts")
            .ports
            .iter()
            .all(|p| p.port != 8080)
    );
}

#[test]
fn https_listener_with_valid_secret() {
    let out = run(&["listeners"], "");
    let l = listener(&out, "infra", "tls", "ok");
    assert_cond(&l.conditions, "Accepted", "True", "Accepted");
    assert_cond(&l.conditions, "ResolvedRefs", "True", "ResolvedRefs");
    assert_cond(&l.conditions, "Programmed", "True", "Programmed");
    let t = table(&out, "infra", "tls");
    let cfg = table_listener(t, "ok");
    assert_eq!(cfg.certificates.len(), 1);
    assert_eq!(cfg.certificates[0].source, "infra/tls-ok");
    assert!(
        cfg.certificates[0]
            .cert_pem
            .starts_with("-----BEGIN CERTIFICATE-----")
    );
    assert_eq!(port(t, 443).protocol, tollgate_api::Protocol::Https);
}

#[test]
fn invalid_certificate_ref_missing_secret() {
    let out = run(&["listeners"], "");
    let l = listener(&out, "infra", "tls", "missing");
    assert_cond(&l.conditions, "Accepted", "True", "Accepted");
    assert_cond(
        &l.conditions,
        "ResolvedRefs",
        "False",
        "InvalidCertificateRef",
    );
    assert_cond(&l.conditions, "Programmed", "False", "Invalid");
    // Routes still attach to (and are counted on) a listener with unresolved refs.
    assert_eq!(l.attached_routes, 1);
    assert_route_ok(&out, "infra", "to-missing");
    let t = table(&out, "infra", "tls");
    assert!(
        t.ports
            .iter()
            .flat_map(|p| &p.listeners)
            .all(|l| l.name != "missing")
    );
}

#[test]
fn invalid_certificate_ref_wrong_kind_and_bad_pem() {
    let out = run(&["listeners"], "");
    for name in ["wrong-kind", "bad-pem"] {
        let l = listener(&out, "infra", "tls", name);
        assert_cond(
            &l.conditions,
            "ResolvedRefs",
            "False",
            "InvalidCertificateRef",
        );
        assert_cond(&l.conditions, "Programmed", "False", "Invalid");
    }
}

#[test]
fn ref_not_permitted_certificate() {
    let out = run(&["listeners"], "");
    let l = listener(&out, "infra", "tls", "cross");
    assert_cond(&l.conditions, "ResolvedRefs", "False", "RefNotPermitted");
    assert_cond(&l.conditions, "Programmed", "False", "Invalid");
    // With a ReferenceGrant in the Secret's namespace the same shape resolves.
    let g = listener(&out, "infra", "tls", "granted");
    assert_cond(&g.conditions, "ResolvedRefs", "True", "ResolvedRefs");
    let cfg = table_listener(table(&out, "infra", "tls"), "granted");
    assert_eq!(cfg.certificates[0].source, "certs/shared-tls");
}

#[test]
fn unsupported_protocol() {
    let out = run(&["listeners"], "");
    for name in ["custom", "passthrough"] {
        let l = listener(&out, "infra", "tls", name);
        assert_cond(&l.conditions, "Accepted", "False", "UnsupportedProtocol");
        assert_cond(&l.conditions, "Programmed", "False", "Invalid");
    }
    assert!(
        listener(&out, "infra", "tls", "custom")
            .supported_kinds
            .as_ref()
            .unwrap()
            .is_empty()
    );
    let gw = gateway_conds(&out, "infra", "only-custom");
    assert_cond(gw, "Accepted", "False", "ListenersNotValid");
    assert_cond(gw, "Programmed", "False", "Invalid");
    assert!(
        !out.tables
            .contains_key(&ObjectKey::new("infra", "only-custom"))
    );
}

#[test]
fn invalid_route_kinds() {
    let out = run(&["listeners"], "");
    let none = listener(&out, "infra", "tls", "kinds-none");
    assert_cond(
        &none.conditions,
        "ResolvedRefs",
        "False",
        "InvalidRouteKinds",
    );
    assert_cond(&none.conditions, "Programmed", "False", "Invalid");
    assert!(none.supported_kinds.as_ref().unwrap().is_empty());
    let mixed = listener(&out, "infra", "tls", "kinds-mixed");
    assert_cond(
        &mixed.conditions,
        "ResolvedRefs",
        "False",
        "InvalidRouteKinds",
    );
    assert_cond(&mixed.conditions, "Programmed", "True", "Programmed");
    let kinds = mixed.supported_kinds.as_ref().unwrap();
    assert_eq!(kinds.len(), 1);
    assert_eq!(
        (kinds[0].group.as_deref(), kinds[0].kind.as_str()),
        (Some("gateway.networking.k8s.io"), "HTTPRoute")
    );
}

#[test]
fn unsupported_address() {
    let out = run(&["listeners"], "");
    for gw in ["hostname-address", "bad-ip"] {
        let c = gateway_conds(&out, "infra", gw);
        assert_cond(c, "Accepted", "False", "UnsupportedAddress");
        assert_cond(c, "Programmed", "False", "Invalid");
        assert!(!out.tables.contains_key(&ObjectKey::new("infra", gw)));
        // Its listeners are fine but not served.
        let l = listener(&out, "infra", gw, "http");
        assert_cond(&l.conditions, "Accepted", "True", "Accepted");
        assert_cond(&l.conditions, "Programmed", "False", "Invalid");
    }
}

#[test]
fn first_ip_address_is_the_bind_address() {
    let out = run(&["listeners"], "");
    assert_eq!(port(table(&out, "infra", "pinned"), 80).address, "10.9.8.7");
    assert_eq!(port(table(&out, "infra", "tls"), 443).address, "0.0.0.0");
    assert!(
        out.gateways[&ObjectKey::new("infra", "pinned")]
            .addresses
            .is_none()
    );
}

#[test]
fn rejections_name_the_objects() {
    let out = run(&["listeners"], "");
    let rej = out.rejections();
    assert!(rej.iter().any(|r| r.kind == "Gateway"
        && r.key == ObjectKey::new("infra", "tls")
        && r.part.as_deref() == Some("listener cross")
        && r.condition == "ResolvedRefs"
        && r.reason == "RefNotPermitted"));
    assert!(
        rej.iter()
            .any(|r| r.key == ObjectKey::new("infra", "only-custom")
                && r.part.is_none()
                && r.reason == "ListenersNotValid")
    );
    let shown = rej[0].to_string();
    assert!(shown.contains("=False"), "{shown}");
    // A clean world has none.
    assert!(run(&[], "").rejections().is_empty());
}
