//! TLSRoute, TCPRoute and UDPRoute rules to route-table entries.
//!
//! In: one TLSRoute and a backend [`Resolver`]. Out: a [`CompiledRoute`], like
//! [`super::rules::compile_route`] gives for an HTTPRoute, so attachment, hostname
//! intersection, status and table assembly are shared with the other kinds. A TLSRoute rule
//! has no matches (the SNI hostname is the only thing routed on, through `spec.hostnames`),
//! so each rule compiles to one catch-all match whose weighted backends are where passthrough
//! connections go; the proxy reads only the backends on a passthrough port.
//!
//! BackendRefs have the HTTPRoute backendRef schema minus filters, so the JSON form converts
//! without loss and [`compile_actions`] resolves them (Service kind, ReferenceGrant, missing
//! Service, with the standard ResolvedRefs reasons) under the TLS backend key
//! ([`tollgate_api::BackendKey::tcp`]): bytes are copied, whatever the port's `appProtocol`.

use gateway_types::experimental::httproutes::HttpRouteRules;
use gateway_types::tcproutes::TcpRoute;
use gateway_types::tlsroutes::{TlsRoute, TlsRouteRules};
use gateway_types::udproutes::UdpRoute;
use tollgate_api::{PathMatch, RouteMatch};

use super::backends::Resolver;
use super::conditions::Problem;
use super::index::ns_of;
use super::kinds::RouteKind;
use super::precedence::Specificity;
use super::rules::{
    CompiledRoute, CompiledRule, RuleInput, collect_rules, compile_actions, unsupported,
};

/// Compiles the rules of `route`.
pub fn compile_tls_route(route: &TlsRoute, resolver: &mut Resolver<'_, '_>) -> CompiledRoute {
    let ns = ns_of(&route.metadata);
    collect_rules(
        &route.spec.hostnames,
        &route.spec.rules,
        |i, rule, unresolved| compile_rule(i, rule, ns, resolver, unresolved),
    )
}

/// Compiles the rules of a TCPRoute as a TLSRoute's: no hostnames (the route takes every
/// connection of its listener), rules of the same shape.
pub fn compile_tcp_route(route: &TcpRoute, resolver: &mut Resolver<'_, '_>) -> CompiledRoute {
    let ns = ns_of(&route.metadata);
    collect_rules(&[], &route.spec.rules, |i, rule, unresolved| {
        let value = serde_json::json!({
            "name": rule.name,
            "backendRefs": rule.backend_refs,
        });
        compile_stream_rule(i, value, RouteKind::Tcp, ns, resolver, unresolved)
    })
}

/// Compiles the rules of a UDPRoute as a TCPRoute's.
pub fn compile_udp_route(route: &UdpRoute, resolver: &mut Resolver<'_, '_>) -> CompiledRoute {
    let ns = ns_of(&route.metadata);
    collect_rules(&[], &route.spec.rules, |i, rule, unresolved| {
        let value = serde_json::json!({
            "name": rule.name,
            "backendRefs": rule.backend_refs,
        });
        compile_stream_rule(i, value, RouteKind::Udp, ns, resolver, unresolved)
    })
}

fn compile_rule(
    i: usize,
    rule: &TlsRouteRules,
    ns: &str,
    resolver: &mut Resolver<'_, '_>,
    unresolved: &mut Vec<Problem>,
) -> Result<CompiledRule, Problem> {
    let value = serde_json::json!({
        "name": rule.name,
        "backendRefs": rule.backend_refs,
    });
    compile_stream_rule(i, value, RouteKind::Tls, ns, resolver, unresolved)
}

/// One rule of a stream route, as its `{name, backendRefs}` JSON: a catch-all match whose
/// weighted backends are where connections go.
fn compile_stream_rule(
    i: usize,
    value: serde_json::Value,
    kind: RouteKind,
    ns: &str,
    resolver: &mut Resolver<'_, '_>,
    unresolved: &mut Vec<Problem>,
) -> Result<CompiledRule, Problem> {
    let field = format!("spec.rules[{i}]");
    let actions: HttpRouteRules =
        serde_json::from_value(value).map_err(|e| unsupported(&field, e))?;
    let any = RouteMatch {
        path: PathMatch::PathPrefix("/".to_owned()),
        method: None,
        headers: Vec::new(),
        query_params: Vec::new(),
    };
    let specificity = Specificity::http(&any);
    let input = RuleInput {
        index: i,
        rule: &actions,
        matches: vec![any],
        specificity: vec![specificity],
        kind,
        ns,
    };
    compile_actions(input, resolver, unresolved)
}
