//! GRPCRoute rules to route-table entries.
//!
//! In: one GRPCRoute and a backend [`Resolver`]. Out: a [`CompiledRoute`], like
//! [`super::rules::compile_route`] gives for an HTTPRoute. A gRPC call is an HTTP/2 POST to
//! `/{service}/{method}`, so a GRPCRoute match compiles into the table's path and header
//! matches, and the proxy needs nothing gRPC-specific to route it:
//!
//! | `method` match                  | path match                                  |
//! |---------------------------------|---------------------------------------------|
//! | none                            | PathPrefix `/` (every call)                 |
//! | Exact, service and method       | Exact `/{service}/{method}`                 |
//! | Exact, service only             | PathPrefix `/{service}` (segment-wise)      |
//! | Exact, method only              | RegularExpression `/[^/]+/{method}`         |
//! | RegularExpression               | RegularExpression `/(?:{service})/(?:{method})`, an absent part `[^/]+` |
//!
//! No method predicate is added: the spec matches on service, method and headers only. Each
//! match carries its GRPCRoute [`Specificity`] (service named, method named, header count,
//! regular expression) for precedence. Filters and backendRefs have the HTTPRoute schema (a subset of its
//! filter types) and are compiled by [`compile_actions`], with backends spoken to over h2c.
//!
//! Every rule serves gRPC-Web too (`Route::grpc_web`: the proxy translates it), and takes
//! CORS from the route's `tollgate.dev/cors` annotation (module `grpc_cors`).
//!
//! Rejected (`UnsupportedValue`), mirroring the CRD's validation for files `tollgate run`
//! reads: a method match with neither service nor method, an Exact service or method with
//! characters gRPC names cannot have, a RegularExpression the `regex` crate refuses; plus
//! whatever [`compile_actions`] rejects. A regular expression is matched against the whole
//! service (or method) name: a leading `^` and a trailing `$` are implied and removed if
//! written.

use gateway_types::experimental::httproutes::HttpRouteRules;
use gateway_types::grpcroutes::{
    GrpcRoute, GrpcRouteRules, GrpcRouteRulesMatches, GrpcRouteRulesMatchesHeadersType,
    GrpcRouteRulesMatchesMethod, GrpcRouteRulesMatchesMethodType,
};
use tollgate_api::{PathMatch, RouteMatch};

use super::backends::Resolver;
use super::conditions::Problem;
use super::index::ns_of;
use super::kinds::RouteKind;
use super::precedence::Specificity;
use super::rules::{
    CompiledRoute, CompiledRule, RuleInput, check_regex, collect_rules, compile_actions,
    header_matches, read_request_trailers, unsupported,
};

/// What an absent service or method matches in a regular expression: one path segment.
const ANY_SEGMENT: &str = "[^/]+";

/// Compiles the rules of `route`.
pub fn compile_grpc_route(route: &GrpcRoute, resolver: &mut Resolver<'_, '_>) -> CompiledRoute {
    let ns = ns_of(&route.metadata);
    // As for HTTPRoutes: no rules means one rule matching every call, without backends.
    let default_rules = [GrpcRouteRules::default()];
    let rules_spec = route.spec.rules.as_deref().unwrap_or(&default_rules);
    let mut compiled = collect_rules(
        route.spec.hostnames.as_deref().unwrap_or_default(),
        rules_spec,
        |i, rule, unresolved| compile_rule(i, rule, ns, resolver, unresolved),
    );
    read_request_trailers(&route.metadata, &mut compiled);
    super::grpc_cors::read_cors(&route.metadata, &mut compiled);
    compiled
}

fn compile_rule(
    i: usize,
    rule: &GrpcRouteRules,
    ns: &str,
    resolver: &mut Resolver<'_, '_>,
    unresolved: &mut Vec<Problem>,
) -> Result<CompiledRule, Problem> {
    let field = format!("spec.rules[{i}]");
    let compiled: Vec<(RouteMatch, Specificity)> = match rule.matches.as_deref() {
        None | Some([]) => vec![(
            any_call(PathMatch::PathPrefix("/".to_owned()), Vec::new()),
            Specificity::grpc(false, false, 0, false),
        )],
        Some(ms) => ms
            .iter()
            .enumerate()
            .map(|(j, m)| convert_match(m, &format!("{field}.matches[{j}]")))
            .collect::<Result<_, _>>()?,
    };
    let (matches, specificity) = compiled.into_iter().unzip();
    let actions = as_http_rule(rule, &field)?;
    let input = RuleInput {
        index: i,
        rule: &actions,
        matches,
        specificity,
        kind: RouteKind::Grpc,
        ns,
    };
    compile_actions(input, resolver, unresolved)
}

/// The rule's name, filters and backendRefs in HTTPRoute form: the schemas are the same (the
/// GRPCRoute filter types are a subset), so the JSON form converts without loss.
fn as_http_rule(rule: &GrpcRouteRules, field: &str) -> Result<HttpRouteRules, Problem> {
    let value = serde_json::json!({
        "name": rule.name,
        "filters": rule.filters,
        "backendRefs": rule.backend_refs,
    });
    serde_json::from_value(value).map_err(|e| unsupported(field, e))
}

fn any_call(path: PathMatch, headers: Vec<tollgate_api::HeaderMatch>) -> RouteMatch {
    RouteMatch {
        path,
        method: None,
        headers,
        query_params: Vec::new(),
    }
}

fn convert_match(
    m: &GrpcRouteRulesMatches,
    field: &str,
) -> Result<(RouteMatch, Specificity), Problem> {
    let (path, named) = match &m.method {
        None => (PathMatch::PathPrefix("/".to_owned()), Named::default()),
        Some(mm) => method_path(mm, &format!("{field}.method"))?,
    };
    let headers = header_matches(
        m.headers.iter().flatten().map(|h| {
            let regex = h.r#type == Some(GrpcRouteRulesMatchesHeadersType::RegularExpression);
            (h.name.as_str(), regex, h.value.as_str())
        }),
        field,
    )?;
    let specificity = Specificity::grpc(named.service, named.method, headers.len(), named.regex);
    Ok((any_call(path, headers), specificity))
}

/// What a method match names.
#[derive(Debug, Default, Clone, Copy)]
struct Named {
    service: bool,
    method: bool,
    regex: bool,
}

/// The path match of a method match, and what it names.
fn method_path(
    mm: &GrpcRouteRulesMatchesMethod,
    field: &str,
) -> Result<(PathMatch, Named), Problem> {
    let service = mm.service.as_deref().filter(|s| !s.is_empty());
    let method = mm.method.as_deref().filter(|m| !m.is_empty());
    let regex = mm.r#type == Some(GrpcRouteRulesMatchesMethodType::RegularExpression);
    let (service, method) = if regex {
        (service.map(unanchor), method.map(unanchor))
    } else {
        (service, method)
    };
    let named = Named {
        service: service.is_some(),
        method: method.is_some(),
        regex,
    };
    if regex {
        if let Some(s) = service {
            check_regex(s, &format!("{field}.service"))?;
        }
        if let Some(m) = method {
            check_regex(m, &format!("{field}.method"))?;
        }
    } else {
        if let Some(s) = service.filter(|s| !is_service_name(s)) {
            return Err(unsupported(
                &format!("{field}.service"),
                format!(
                    "{s:?} is not a gRPC service name (^(?i)\\.?[a-z_][a-z_0-9]*(\\.[a-z_][a-z_0-9]*)*$)"
                ),
            ));
        }
        if let Some(m) = method.filter(|m| !is_method_name(m)) {
            return Err(unsupported(
                &format!("{field}.method"),
                format!("{m:?} is not a gRPC method name (^[A-Za-z_][A-Za-z_0-9]*$)"),
            ));
        }
    }
    let path = match (regex, service, method) {
        (_, None, None) => {
            return Err(unsupported(
                field,
                "one or both of service and method must be specified",
            ));
        }
        (true, s, m) => PathMatch::RegularExpression(format!(
            "/(?:{})/(?:{})",
            s.unwrap_or(ANY_SEGMENT),
            m.unwrap_or(ANY_SEGMENT)
        )),
        (false, Some(s), Some(m)) => PathMatch::Exact(format!("/{s}/{m}")),
        (false, Some(s), None) => PathMatch::PathPrefix(format!("/{s}")),
        // Method names are identifiers: nothing to escape.
        (false, None, Some(m)) => PathMatch::RegularExpression(format!("/{ANY_SEGMENT}/{m}")),
    };
    Ok((path, named))
}

/// A pattern without one leading `^` and one trailing (unescaped) `$`: the compiled path
/// regex anchors each part already, and an anchor inside it would never match.
fn unanchor(p: &str) -> &str {
    let p = p.strip_prefix('^').unwrap_or(p);
    match p.strip_suffix('$') {
        Some(rest) if !rest.ends_with('\\') => rest,
        _ => p,
    }
}

/// An identifier: `[A-Za-z_][A-Za-z_0-9]*`.
fn is_ident(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// `^(?i)\.?[a-z_][a-z_0-9]*(\.[a-z_][a-z_0-9]*)*$`: dot-separated identifiers, optionally
/// with a leading dot.
fn is_service_name(s: &str) -> bool {
    s.strip_prefix('.').unwrap_or(s).split('.').all(is_ident)
}

/// `^[A-Za-z_][A-Za-z_0-9]*$`.
fn is_method_name(m: &str) -> bool {
    is_ident(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_and_method_names() {
        assert!(is_service_name("grpc.health.v1.Health"));
        assert!(is_service_name(".pkg.Svc"));
        assert!(is_service_name("_x"));
        assert!(!is_service_name("pkg..Svc"));
        assert!(!is_service_name("pkg.Svc/Method"));
        assert!(!is_service_name("1pkg"));
        assert!(!is_service_name(""));
        assert!(is_method_name("Check"));
        assert!(!is_method_name("Check.Me"));
        assert!(!is_method_name("9"));
    }

    #[test]
    fn anchors_are_implied() {
        assert_eq!(unanchor("^foo.*$"), "foo.*");
        assert_eq!(unanchor("foo\\$"), "foo\\$");
        assert_eq!(unanchor("foo"), "foo");
    }
}
