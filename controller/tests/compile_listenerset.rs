//! ListenerSet: admission by the Gateway's `allowedListeners`, conflicts by precedence (the
//! Gateway's listeners, then older ListenerSets), certificates from the ListenerSet's namespace
//! (ReferenceGrants to ListenerSets, not Gateways), statuses on the ListenerSet and the
//! Gateway, routes attaching by parentRef kind, and the listeners in the route table. The
//! cases follow the ListenerSet conformance tests of Gateway API v1.6.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use gateway_types::listenersets::{ListenerSetStatus, ListenerSetStatusListeners};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tollgate::compile::Output;
use tollgate_api::{ObjectKey, Protocol};

fn out() -> Output {
    run(&["listenerset"], "")
}

fn set<'a>(out: &'a Output, ns: &str, name: &str) -> &'a ListenerSetStatus {
    out.listener_sets
        .get(&ObjectKey::new(ns, name))
        .unwrap_or_else(|| panic!("no status for ListenerSet {ns}/{name}"))
}

fn set_conds<'a>(out: &'a Output, ns: &str, name: &str) -> &'a [Condition] {
    set(out, ns, name).conditions.as_deref().unwrap_or_default()
}

fn set_listener<'a>(
    out: &'a Output,
    ns: &str,
    name: &str,
    listener: &str,
) -> &'a ListenerSetStatusListeners {
    set(out, ns, name)
        .listeners
        .iter()
        .flatten()
        .find(|l| l.name == listener)
        .unwrap_or_else(|| panic!("no listener {listener} in ListenerSet {ns}/{name}"))
}

fn attached_sets(out: &Output, gw: &str) -> Option<i32> {
    out.gateways[&ObjectKey::new("infra", gw)].attached_listener_sets
}

#[test]
fn an_admitted_listener_set_is_accepted_with_its_valid_listeners() {
    let out = out();
    let c = set_conds(&out, "apps", "team-a");
    assert_cond(c, "Accepted", "True", "Accepted");
    assert!(
        cond(c, "Accepted").message.contains("2 of 5 listeners"),
        "{c:?}"
    );
    assert_cond(c, "Programmed", "True", "Programmed");
    // Conditions carry the ListenerSet's generation, not the Gateway's.
    assert!(c.iter().all(|c| c.observed_generation == Some(3)), "{c:?}");
    for name in ["a", "a-tls", "shared-tls"] {
        let l = set_listener(&out, "apps", "team-a", name);
        assert_cond(&l.conditions, "Accepted", "True", "Accepted");
        assert_cond(&l.conditions, "Programmed", "True", "Programmed");
        assert_cond(&l.conditions, "ResolvedRefs", "True", "ResolvedRefs");
        assert_cond(&l.conditions, "Conflicted", "False", "NoConflicts");
        let kinds: Vec<&str> = l
            .supported_kinds
            .iter()
            .flatten()
            .map(|k| k.kind.as_str())
            .collect();
        assert_eq!(kinds, ["HTTPRoute", "GRPCRoute"], "{name}");
    }
    // The Gateway's own listeners come first: the same port and hostname, then the same
    // port with another protocol, are taken.
    let web = set_listener(&out, "apps", "team-a", "web");
    for t in ["Accepted", "Programmed"] {
        assert_cond(&web.conditions, t, "False", "HostnameConflict");
    }
    assert_cond(&web.conditions, "Conflicted", "True", "HostnameConflict");
    assert!(
        cond(&web.conditions, "Accepted")
            .message
            .contains("listener web already uses port 80 with hostname web.example.com"),
        "{:?}",
        web.conditions
    );
    let raw = set_listener(&out, "apps", "team-a", "raw");
    for t in ["Accepted", "Programmed"] {
        assert_cond(&raw.conditions, t, "False", "ProtocolConflict");
    }
    assert_cond(&raw.conditions, "Conflicted", "True", "ProtocolConflict");
    // The Gateway keeps its own listeners in its status and counts the accepted set.
    let gw = &out.gateways[&ObjectKey::new("infra", "open")];
    let names: Vec<&str> = gw
        .listeners
        .iter()
        .flatten()
        .map(|l| l.name.as_str())
        .collect();
    assert_eq!(names, ["web", "secure"]);
    assert_eq!(attached_sets(&out, "open"), Some(1));
    assert_cond(
        gateway_conds(&out, "infra", "open"),
        "Accepted",
        "True",
        "Accepted",
    );
}

#[test]
fn a_younger_listener_set_on_a_taken_hostname_has_no_valid_listener() {
    let out = out();
    let c = set_conds(&out, "other", "team-b");
    assert_cond(c, "Accepted", "False", "ListenersNotValid");
    assert_cond(c, "Programmed", "False", "ListenersNotValid");
    let b = set_listener(&out, "other", "team-b", "b");
    assert_cond(&b.conditions, "Accepted", "False", "HostnameConflict");
    assert_cond(&b.conditions, "Conflicted", "True", "HostnameConflict");
    assert!(
        cond(&b.conditions, "Accepted")
            .message
            .contains("apps/team-a/a"),
        "{:?}",
        b.conditions
    );
}

#[test]
fn allowed_listeners_admits_by_namespace_and_none_by_default() {
    let out = out();
    for (ns, name) in [("apps", "team-c"), ("other", "team-d")] {
        let c = set_conds(&out, ns, name);
        assert_cond(c, "Accepted", "False", "NotAllowed");
        assert_cond(c, "Programmed", "False", "NotAllowed");
        assert!(set(&out, ns, name).listeners.is_none(), "{ns}/{name}");
    }
    assert_eq!(attached_sets(&out, "closed"), Some(0));
    // `Same`: the Gateway's namespace is admitted.
    assert_cond(
        set_conds(&out, "infra", "team-e"),
        "Accepted",
        "True",
        "Accepted",
    );
    assert_eq!(attached_sets(&out, "same-only"), Some(1));
    // A ListenerSet of a Gateway that is not ours gets no status from us.
    assert!(
        !out.listener_sets
            .contains_key(&ObjectKey::new("infra", "not-ours"))
    );
    assert!(
        !out.gateways
            .contains_key(&ObjectKey::new("infra", "theirs"))
    );
}

#[test]
fn certificates_need_a_reference_grant_to_listener_sets() {
    let out = out();
    // infra's Gateways may read certs/shared-tls; a ListenerSet in infra may not.
    let l = set_listener(&out, "infra", "team-e", "e-tls");
    assert_cond(&l.conditions, "ResolvedRefs", "False", "RefNotPermitted");
    assert_cond(&l.conditions, "Programmed", "False", "Invalid");
    let t = table(&out, "infra", "same-only");
    assert!(t.ports.iter().all(|p| p.port != 8443), "{:?}", t.ports);
    // apps' ListenerSets may (listenersets-in-apps), and their own namespace's Secrets.
    let t = table(&out, "infra", "open");
    for (p, host) in [(8443, "a.example.com"), (8444, "shared.example.com")] {
        let port = port(t, p);
        assert_eq!(port.protocol, Protocol::Https);
        assert_eq!(port.listeners[0].hostname.as_deref(), Some(host));
        assert_eq!(port.listeners[0].certificates.len(), 1);
    }
}

#[test]
fn routes_attach_to_the_listeners_of_the_parent_they_name() {
    let out = out();
    for name in ["to-set", "to-set-section", "to-gateway"] {
        assert_route_ok(&out, "apps", name);
    }
    let p = &out.http_routes[&ObjectKey::new("apps", "to-set")].parents[0].parent_ref;
    assert_eq!(
        (p.group.as_deref(), p.kind.as_deref(), p.name.as_str()),
        (
            Some("gateway.networking.k8s.io"),
            Some("ListenerSet"),
            "team-a"
        )
    );
    let attached = |l: &str| set_listener(&out, "apps", "team-a", l).attached_routes;
    assert_eq!(
        (attached("a"), attached("a-tls"), attached("shared-tls")),
        (2, 1, 1)
    );
    assert_eq!(attached("web"), 0);
    assert_eq!(listener(&out, "infra", "open", "web").attached_routes, 1);
    // `secure` takes routes from its own namespace only.
    assert_eq!(listener(&out, "infra", "open", "secure").attached_routes, 0);
    // A Gateway parentRef does not reach a ListenerSet's listener by its name.
    let c = parent_conds(&out, "apps", "gateway-section-of-set", 0);
    assert_cond(c, "Accepted", "False", "NoMatchingParent");
    assert!(
        cond(c, "Accepted").message.contains("no listener named a"),
        "{c:?}"
    );
    // `Same` on a ListenerSet listener means the ListenerSet's namespace.
    let c = parent_conds(&out, "other", "wrong-namespace", 0);
    assert_cond(c, "Accepted", "False", "NotAllowedByListeners");
    assert!(
        cond(c, "Accepted")
            .message
            .starts_with("ListenerSet apps/team-a:"),
        "{c:?}"
    );
    let c = parent_conds(&out, "other", "to-invalid-set", 0);
    assert_cond(c, "Accepted", "False", "NoMatchingParent");
    assert!(
        cond(c, "Accepted").message.contains("is not accepted"),
        "{c:?}"
    );
}

#[test]
fn the_table_serves_listener_set_listeners_beside_the_gateways() {
    let out = out();
    let t = table(&out, "infra", "open");
    let p80 = port(t, 80);
    assert_eq!(p80.protocol, Protocol::Http);
    let names: Vec<&str> = p80.listeners.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["web", "apps/team-a/a"]);
    let a = table_listener(t, "apps/team-a/a");
    assert_eq!(
        order(vhost(a, "a.example.com")),
        ["to-set-section#0", "to-set#0"]
    );
    let web = table_listener(t, "web");
    assert_eq!(order(vhost(web, "web.example.com")), ["to-gateway#0"]);
    let ports: Vec<u16> = t.ports.iter().map(|p| p.port).collect();
    assert_eq!(ports, [80, 443, 8443, 8444]);
}

#[test]
fn a_listener_on_the_proxys_admin_port_is_unavailable_not_fatal() {
    let extra = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: admin-grab, namespace: infra}
spec:
  parentRef: {name: same-only}
  listeners:
  - {name: grab, port: 9902, protocol: HTTP}
"#;
    let mut inputs = inputs(&["listenerset"], extra);
    inputs.reserved_ports = vec![9902];
    let out = tollgate::compile::compile(&inputs);
    let l = set_listener(&out, "infra", "admin-grab", "grab");
    assert_cond(&l.conditions, "Accepted", "False", "PortUnavailable");
    assert!(
        cond(&l.conditions, "Accepted")
            .message
            .contains("admin port"),
        "{:?}",
        l.conditions
    );
    assert_cond(
        set_conds(&out, "infra", "admin-grab"),
        "Accepted",
        "False",
        "ListenersNotValid",
    );
    // The Gateway and its other ListenerSet are served as before.
    let t = table(&out, "infra", "same-only");
    let ports: Vec<u16> = t.ports.iter().map(|p| p.port).collect();
    assert_eq!(ports, [80, 8080]);
}

#[test]
fn a_gateway_wide_policy_covers_listener_set_listeners_and_section_names_do_not() {
    let policy = |section: &str| {
        format!(
            r#"
apiVersion: tollgate.dev/v1alpha1
kind: AuthPolicy
metadata: {{name: gate, namespace: infra, generation: 1}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: Gateway, name: open{section}}}]
  rules:
    authorization:
      internal-net: {{predicate: "source.address.startsWith('10.')"}}
"#
        )
    };
    let policed = |out: &Output, listener: &str, host: &str| {
        let t = table(out, "infra", "open");
        vhost(table_listener(t, listener), host)
            .routes
            .iter()
            .all(|r| r.policy.is_some())
    };
    // Gateway-wide: a team's listener is behind it as the Gateway's own are.
    let out = run(&["listenerset"], &policy(""));
    assert!(policed(&out, "web", "web.example.com"));
    assert!(policed(&out, "apps/team-a/a", "a.example.com"));
    // A sectionName names the Gateway's own listeners only, even when a ListenerSet has a
    // listener of that name.
    let out = run(&["listenerset"], &policy(", sectionName: web"));
    assert!(policed(&out, "web", "web.example.com"));
    assert!(!policed(&out, "apps/team-a/a", "a.example.com"));
}

#[test]
fn a_listener_set_whose_only_listener_has_no_usable_certificate_is_not_valid() {
    // ListenerSetReferenceGrant: the certificate's namespace grants nothing to this
    // ListenerSet's namespace.
    let extra = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: no-grant, namespace: infra}
spec:
  parentRef: {name: same-only}
  listeners:
  - name: tls
    port: 9443
    protocol: HTTPS
    tls: {certificateRefs: [{name: shared-tls, namespace: certs}]}
"#;
    let out = run(&["listenerset"], extra);
    let c = set_conds(&out, "infra", "no-grant");
    assert_cond(c, "Accepted", "False", "ListenersNotValid");
    assert_cond(c, "Programmed", "False", "ListenersNotValid");
    let l = set_listener(&out, "infra", "no-grant", "tls");
    assert_cond(&l.conditions, "ResolvedRefs", "False", "RefNotPermitted");
    assert_eq!(attached_sets(&out, "same-only"), Some(1));
}

#[test]
fn the_same_listener_set_in_two_files_counts_once() {
    // A second copy of team-a, newer than team-b: sorted by age the two copies are not
    // neighbours, and the copy must not conflict with its own original.
    let extra = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: team-a, namespace: apps, generation: 3, creationTimestamp: "2026-01-03T00:00:00Z"}
spec:
  parentRef: {name: open, namespace: infra}
  listeners:
  - {name: a, port: 80, protocol: HTTP, hostname: a.example.com}
"#;
    let out = run(&["listenerset"], extra);
    let c = set_conds(&out, "apps", "team-a");
    assert_cond(c, "Accepted", "True", "Accepted");
    let a = set_listener(&out, "apps", "team-a", "a");
    assert_cond(&a.conditions, "Conflicted", "False", "NoConflicts");
    let t = table(&out, "infra", "open");
    let names: Vec<&str> = port(t, 80)
        .listeners
        .iter()
        .map(|l| l.name.as_str())
        .collect();
    assert_eq!(names, ["web", "apps/team-a/a"]);
}
