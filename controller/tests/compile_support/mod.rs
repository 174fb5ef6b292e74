//! Helpers shared by the compiler tests: fixture loading and status lookups.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use gateway_types::gateways::GatewayStatusListeners;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use tollgate::compile::{Inputs, Output, compile, inputs_from_yaml};
use tollgate_api::{ListenerConfig, ObjectKey, PortConfig, Route, RouteTable, VirtualHost};

/// The time every test compiles at.
pub fn now() -> Time {
    Time(Timestamp::from_second(1_700_000_000).unwrap())
}

/// Path of a fixture file.
pub fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/compile")
        .join(name)
}

/// Text of fixture `name` (`.yaml` appended).
pub fn fixture(name: &str) -> String {
    let p = fixture_path(&format!("{name}.yaml"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `base` plus the named fixtures plus `extra` YAML, loaded.
pub fn inputs(fixtures: &[&str], extra: &str) -> Inputs {
    let mut text = fixture("base");
    for f in fixtures {
        text.push_str("\n---\n");
        text.push_str(&fixture(f));
    }
    text.push_str("\n---\n");
    text.push_str(extra);
    let inputs = inputs_from_yaml(&text, now()).unwrap();
    assert!(inputs.warnings.is_empty(), "{:?}", inputs.warnings);
    inputs
}

/// Compiles `base` + fixtures + extra.
pub fn run(fixtures: &[&str], extra: &str) -> Output {
    compile(&inputs(fixtures, extra))
}

/// The condition of `type_`.
pub fn cond<'a>(conds: &'a [Condition], type_: &str) -> &'a Condition {
    conds
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {conds:#?}"))
}

/// Asserts `type_` has `status` and `reason`.
#[track_caller]
pub fn assert_cond(conds: &[Condition], type_: &str, status: &str, reason: &str) {
    let c = cond(conds, type_);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        (status, reason),
        "{type_}: {}",
        c.message
    );
}

/// Conditions of a Gateway.
pub fn gateway_conds<'a>(out: &'a Output, ns: &str, name: &str) -> &'a [Condition] {
    out.gateways
        .get(&ObjectKey::new(ns, name))
        .unwrap_or_else(|| panic!("no status for Gateway {ns}/{name}"))
        .conditions
        .as_deref()
        .unwrap()
}

/// Status of one listener.
pub fn listener<'a>(out: &'a Output, ns: &str, gw: &str, name: &str) -> &'a GatewayStatusListeners {
    out.gateways[&ObjectKey::new(ns, gw)]
        .listeners
        .as_ref()
        .unwrap()
        .iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no listener {name}"))
}

/// Conditions of the `i`th parents[] entry of an HTTPRoute.
pub fn parent_conds<'a>(out: &'a Output, ns: &str, name: &str, i: usize) -> &'a [Condition] {
    &out.http_routes
        .get(&ObjectKey::new(ns, name))
        .unwrap_or_else(|| panic!("no status for HTTPRoute {ns}/{name}"))
        .parents[i]
        .conditions
}

/// Conditions of the `i`th parents[] entry of a GRPCRoute.
pub fn grpc_parent_conds<'a>(out: &'a Output, ns: &str, name: &str, i: usize) -> &'a [Condition] {
    &out.grpc_routes
        .get(&ObjectKey::new(ns, name))
        .unwrap_or_else(|| panic!("no status for GRPCRoute {ns}/{name}"))
        .parents[i]
        .conditions
}

/// Asserts the route's single parent is Accepted=True and ResolvedRefs=True.
#[track_caller]
pub fn assert_route_ok(out: &Output, ns: &str, name: &str) {
    let c = parent_conds(out, ns, name, 0);
    assert_cond(c, "Accepted", "True", "Accepted");
    assert_cond(c, "ResolvedRefs", "True", "ResolvedRefs");
}

/// The table of a Gateway.
pub fn table<'a>(out: &'a Output, ns: &str, gw: &str) -> &'a RouteTable {
    out.tables
        .get(&ObjectKey::new(ns, gw))
        .unwrap_or_else(|| panic!("no table for {ns}/{gw}"))
}

/// A port of a table.
pub fn port(t: &RouteTable, port: u16) -> &PortConfig {
    t.ports
        .iter()
        .find(|p| p.port == port)
        .unwrap_or_else(|| panic!("no port {port}"))
}

/// A listener of a table.
pub fn table_listener<'a>(t: &'a RouteTable, name: &str) -> &'a ListenerConfig {
    t.ports
        .iter()
        .flat_map(|p| &p.listeners)
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no listener {name} in table"))
}

/// A virtual host of a listener.
pub fn vhost<'a>(l: &'a ListenerConfig, host: &str) -> &'a VirtualHost {
    l.virtual_hosts
        .iter()
        .find(|v| v.hostname == host)
        .unwrap_or_else(|| panic!("no vhost {host} in {:?}", hosts(l)))
}

/// Hostnames of a listener's virtual hosts, in order.
pub fn hosts(l: &ListenerConfig) -> Vec<&str> {
    l.virtual_hosts
        .iter()
        .map(|v| v.hostname.as_str())
        .collect()
}

/// `name#rule` of every route of a vhost, in order.
pub fn order(v: &VirtualHost) -> Vec<String> {
    v.routes.iter().map(label).collect()
}

/// `name#rule`.
pub fn label(r: &Route) -> String {
    format!("{}#{}", r.route.name, r.rule_index)
}

/// Conditions of the `i`th parents[] entry of a TLSRoute.
pub fn tls_parent_conds<'a>(out: &'a Output, ns: &str, name: &str, i: usize) -> &'a [Condition] {
    &out.tls_routes
        .get(&ObjectKey::new(ns, name))
        .unwrap_or_else(|| panic!("no status for TLSRoute {ns}/{name}"))
        .parents[i]
        .conditions
}

/// Conditions of the `i`th parents[] entry of a TCPRoute.
pub fn tcp_parent_conds<'a>(out: &'a Output, ns: &str, name: &str, i: usize) -> &'a [Condition] {
    &out.tcp_routes
        .get(&ObjectKey::new(ns, name))
        .unwrap_or_else(|| panic!("no status for TCPRoute {ns}/{name}"))
        .parents[i]
        .conditions
}

/// Conditions of the `i`th parents[] entry of a UDPRoute.
pub fn udp_parent_conds<'a>(out: &'a Output, ns: &str, name: &str, i: usize) -> &'a [Condition] {
    &out.udp_routes
        .get(&ObjectKey::new(ns, name))
        .unwrap_or_else(|| panic!("no status for UDPRoute {ns}/{name}"))
        .parents[i]
        .conditions
}
