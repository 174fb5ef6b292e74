//! The compile cache changes nothing but speed: over a sequence of changes, every
//! `compile_cached` gives exactly the output of a fresh `compile`, and reuses what the change
//! did not touch.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use std::sync::Arc;

use compile_support::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tollgate::compile::{
    CompileCache, Inputs, Objects, Output, compile, compile_cached, inputs_from_yaml,
};
use tollgate_api::{ObjectKey, RouteTable};

/// A world with HTTPRoutes over three listeners, a GRPCRoute, TLSRoutes, cross-namespace
/// backends and mirrors.
fn world() -> Inputs {
    inputs(&["golden", "grpc", "tlsroute"], "")
}

thread_local! {
    /// Whether [`step`] hands a copy of each output back to the cache
    /// ([`CompileCache::recycle`]), as `tollgate run` does.
    static RECYCLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Compiles `inputs` with `cache` and checks the result against a fresh compile.
#[track_caller]
fn step(inputs: &Inputs, cache: CompileCache, what: &str) -> (Output, CompileCache) {
    let (out, mut cache) = compile_cached(inputs, cache);
    if RECYCLE.get() {
        cache.recycle(out.clone());
    }
    let fresh = compile(inputs);
    assert!(
        out == fresh,
        "{what}: cached compile differs from a fresh one:\n cached: {}\n  fresh: {}",
        serde_json::to_string(&out).unwrap(),
        serde_json::to_string(&fresh).unwrap()
    );
    // Byte-identical too (what a golden file or a proxy would see).
    assert_eq!(
        serde_json::to_string(&out).unwrap(),
        serde_json::to_string(&fresh).unwrap(),
        "{what}"
    );
    (out, cache)
}

/// The object named `name` among `objects`.
fn named<'a, T: ResourceExt + Clone>(objects: &'a mut Objects<T>, name: &str) -> &'a mut T {
    objects
        .iter_mut()
        .find(|o| o.name_any() == name)
        .unwrap_or_else(|| panic!("no object named {name}"))
}

fn add(inputs: &mut Inputs, yaml: &str) {
    inputs.extend(inputs_from_yaml(yaml, now()).unwrap());
}

fn table<'a>(out: &'a Output, ns: &str, name: &str) -> &'a RouteTable {
    &out.tables[&ObjectKey::new(ns, name)]
}

/// A virtual host's place: (port, listener, hostname).
type Place = (u16, String, String);

/// Every virtual host of a table by place, with its shared route list.
fn vhosts(t: &RouteTable) -> Vec<(Place, Arc<Vec<tollgate_api::Route>>)> {
    t.ports
        .iter()
        .flat_map(|p| {
            p.listeners.iter().flat_map(move |l| {
                l.virtual_hosts.iter().map(move |v| {
                    (
                        (p.port, l.name.clone(), v.hostname.clone()),
                        v.routes.clone(),
                    )
                })
            })
        })
        .collect()
}

/// How many virtual hosts of `after` carry the very route list (same allocation) `before` had.
fn shared(before: &RouteTable, after: &RouteTable) -> (usize, usize) {
    let old = vhosts(before);
    let new = vhosts(after);
    let same = new
        .iter()
        .filter(|(k, r)| old.iter().any(|(ok, or)| ok == k && Arc::ptr_eq(or, r)))
        .count();
    (same, new.len())
}

const NEW_ROUTE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: blog, namespace: apps, creationTimestamp: "2024-05-01T00:00:00Z"}
spec:
  parentRefs: [{name: edge, namespace: infra, sectionName: https}]
  hostnames: [blog.example.com]
  rules:
  - matches: [{path: {type: PathPrefix, value: /posts}}]
    backendRefs: [{name: web, port: 80}]
"#;

#[test]
fn a_sequence_of_changes_compiles_as_fresh() {
    sequence_of_changes();
}

#[test]
fn a_sequence_of_changes_compiles_as_fresh_with_each_output_recycled() {
    RECYCLE.set(true);
    sequence_of_changes();
}

#[test]
fn a_recycled_output_holding_anything_changes_nothing() {
    // Status entries recycled whatever they hold (other strings, more or fewer conditions
    // and parents): a compile writes every field of the entries it reuses.
    let inputs = world();
    let (out, mut cache) = step(&inputs, CompileCache::default(), "first compile");
    let mut garbage = out.clone();
    for (i, status) in garbage.http_routes.values_mut().enumerate() {
        if i % 3 == 2 {
            status.parents.clear();
            continue;
        }
        let extra = status.parents.first().cloned();
        for p in &mut status.parents {
            let extra_condition = p.conditions.first().cloned();
            for c in &mut p.conditions {
                c.last_transition_time = Time(Timestamp::UNIX_EPOCH);
                c.message = "m".repeat(300);
                c.observed_generation = Some(-1);
                c.reason = "Garbage".into();
                c.status = "Unknown".into();
                c.type_ = "Bogus".into();
            }
            p.conditions.extend(extra_condition);
            p.controller_name = "someone.else/controller".into();
            let r = &mut p.parent_ref;
            r.group = Some("other.group".into());
            r.kind = Some("OtherKind".into());
            r.name = "other-name".into();
            r.namespace = if r.namespace.is_some() {
                None
            } else {
                Some("elsewhere".into())
            };
            r.port = Some(1);
            r.section_name = Some("other-section".into());
        }
        status.parents.extend(extra);
    }
    cache.recycle(garbage);
    let (_, cache) = step(&inputs, cache, "unchanged, garbage recycled");
    let stats = cache.stats();
    assert_eq!(stats.routes_compiled, 0, "{stats:?}");
    assert_eq!(stats.attachments_reused, stats.routes_reused, "{stats:?}");
    // Every HTTPRoute's entries came from the recycled output.
    assert_eq!(stats.statuses_recycled, out.http_routes.len(), "{stats:?}");
}

fn sequence_of_changes() {
    let mut inputs = world();
    let (first, cache) = step(&inputs, CompileCache::default(), "first compile");
    let stats = cache.stats();
    assert!(
        stats.routes_compiled > 0 && stats.routes_reused == 0,
        "{stats:?}"
    );

    // Nothing changed: everything reused, every virtual host the same allocation.
    let (out, cache) = step(&inputs, cache, "unchanged");
    let stats = cache.stats();
    assert_eq!(stats.routes_compiled, 0, "{stats:?}");
    assert_eq!(stats.attachments_reused, stats.routes_reused, "{stats:?}");
    assert_eq!(stats.vhosts_built, 0, "{stats:?}");
    let (same, all) = shared(table(&first, "infra", "edge"), table(&out, "infra", "edge"));
    assert_eq!(same, all);

    // A route added: it alone is compiled; only its virtual host is built.
    add(&mut inputs, NEW_ROUTE);
    let (out2, cache) = step(&inputs, cache, "route added");
    let stats = cache.stats();
    assert_eq!(stats.routes_compiled, 1, "{stats:?}");
    assert_eq!(stats.vhosts_built, 1, "{stats:?}");
    let (same, all) = shared(table(&out, "infra", "edge"), table(&out2, "infra", "edge"));
    assert_eq!(same + 1, all);

    // The route changed (a new path), then changed back.
    let blog = named(&mut inputs.http_routes, "blog");
    blog.spec.rules.as_mut().unwrap()[0]
        .matches
        .as_mut()
        .unwrap()[0]
        .path
        .as_mut()
        .unwrap()
        .value = Some("/articles".into());
    let (_, cache) = step(&inputs, cache, "route changed");
    assert_eq!(cache.stats().routes_compiled, 1);

    // A route's hostnames changed: it moves to another virtual host.
    let blog = named(&mut inputs.http_routes, "blog");
    blog.spec.hostnames = Some(vec!["news.example.com".into()]);
    let (_, cache) = step(&inputs, cache, "route hostnames changed");

    // Only its creationTimestamp changed: compiled again, since virtual hosts order by it.
    named(&mut inputs.http_routes, "blog")
        .metadata
        .creation_timestamp = Some(Time("2024-04-01T00:00:00Z".parse::<Timestamp>().unwrap()));
    let (_, cache) = step(&inputs, cache, "route creationTimestamp changed");
    assert_eq!(cache.stats().routes_compiled, 1);

    // The route removed.
    inputs.http_routes.retain(|o| o.name_any() != "blog");
    let (_, cache) = step(&inputs, cache, "route removed");

    // Endpoints changed: backends follow, rules and virtual hosts are reused.
    let slice = named(&mut inputs.endpoint_slices, "web-def");
    slice.endpoints[1].addresses = vec!["10.0.0.9".into()];
    let (out3, cache) = step(&inputs, cache, "endpoints changed");
    assert_eq!(cache.stats().routes_compiled, 0);
    assert_eq!(cache.stats().vhosts_built, 0);
    assert!(
        table(&out3, "infra", "edge")
            .backends
            .values()
            .any(|b| b.endpoints.iter().any(|e| e.ip == "10.0.0.9"))
    );
    // A slice removed altogether.
    inputs.endpoint_slices.retain(|o| o.name_any() != "web-abc");
    let (_, cache) = step(&inputs, cache, "endpoint slice removed");

    // A Service changed: the port the routes use disappears (ResolvedRefs turns False).
    let web = named(&mut inputs.services, "web");
    web.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 81;
    let (_, cache) = step(&inputs, cache, "service port changed");
    // And back.
    let web = named(&mut inputs.services, "web");
    web.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 80;
    let (_, cache) = step(&inputs, cache, "service port restored");
    // A Service removed.
    inputs.services.retain(|o| o.name_any() != "rolling");
    let (_, cache) = step(&inputs, cache, "service removed");

    // The ReferenceGrant that lets apps use other/shared removed, then put back.
    let grant = inputs
        .reference_grants
        .iter()
        .position(|g| g.metadata.name.as_deref() == Some("apps-to-shared"))
        .unwrap();
    let removed = inputs.reference_grants.remove(grant);
    let (_, cache) = step(&inputs, cache, "reference grant removed");
    inputs.reference_grants.push(removed);
    let (_, cache) = step(&inputs, cache, "reference grant restored");

    // Namespace labels that a listener selects by: apps loses its team label, so its routes
    // no longer attach to the https listener; then the label comes back.
    let apps = named(&mut inputs.namespaces, "apps");
    let team = apps
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove("team")
        .unwrap();
    let (_, cache) = step(&inputs, cache, "namespace label removed");
    assert_eq!(cache.stats().routes_compiled, 0);
    assert_eq!(cache.stats().attachments_reused, 0, "{:?}", cache.stats());
    let apps = named(&mut inputs.namespaces, "apps");
    apps.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("team".into(), team);
    let (_, cache) = step(&inputs, cache, "namespace label restored");
    // The labels as before: the next compile reuses attachments again.
    let (_, cache) = step(&inputs, cache, "labels unchanged");
    assert!(cache.stats().attachments_reused > 0, "{:?}", cache.stats());

    // A Gateway listener changed: its hostname narrows, routes attach elsewhere.
    let edge = named(&mut inputs.gateways, "edge");
    let https = edge
        .spec
        .listeners
        .iter_mut()
        .find(|l| l.name == "https")
        .unwrap();
    https.hostname = Some("shop.example.com".into());
    let (_, cache) = step(&inputs, cache, "listener hostname changed");
    assert_eq!(cache.stats().attachments_reused, 0, "{:?}", cache.stats());
    // A listener removed.
    let edge = named(&mut inputs.gateways, "edge");
    edge.spec.listeners.retain(|l| l.name != "https-apex");
    let (_, cache) = step(&inputs, cache, "listener removed");

    // Policies added (the cache steps aside while they are in force), then removed.
    let before_policies = inputs.clone();
    let policies = inputs_from_yaml(&fixture("policies"), now()).unwrap();
    inputs.extend(policies);
    let (_, cache) = step(&inputs, cache, "policies added");
    let pol = inputs.rate_limit_policies.pop().unwrap();
    let (_, cache) = step(&inputs, cache, "a policy removed");
    inputs.rate_limit_policies.push(pol);
    let (_, cache) = step(&inputs, cache, "a policy restored");
    inputs = before_policies;
    let (_, cache) = step(&inputs, cache, "policies removed");

    // A GRPCRoute changed.
    let grpc = &mut inputs.grpc_routes[0];
    grpc.spec.hostnames = Some(vec!["grpc-changed.example.com".into()]);
    let (_, cache) = step(&inputs, cache, "grpc route changed");

    // A TLSRoute removed.
    inputs.tls_routes.pop();
    let (_, cache) = step(&inputs, cache, "tls route removed");

    // Another clock: conditions carry the new time, also those of reused attachments.
    inputs.now = Time(Timestamp::from_second(1_800_000_000).unwrap());
    let (_, cache) = step(&inputs, cache, "later");
    assert!(cache.stats().attachments_reused > 0, "{:?}", cache.stats());

    // A cache from a different world altogether is still only a cache.
    let (_, _) = step(&world(), cache, "back to the first world");
}

#[test]
fn the_same_object_in_two_files_compiles_as_fresh() {
    // Duplicate keys: the index keeps one deterministically; the cache must follow it.
    let mut inputs = world();
    add(&mut inputs, NEW_ROUTE);
    let (_, cache) = step(&inputs, CompileCache::default(), "one copy");
    let mut twice = NEW_ROUTE.replace("/posts", "/other");
    twice.push('\n');
    add(&mut inputs, &twice);
    let (_, cache) = step(&inputs, cache, "two copies");
    inputs.http_routes.pop();
    let (_, _) = step(&inputs, cache, "one copy again");
}

#[test]
fn a_route_with_a_resource_version_is_compiled_again_only_when_it_changes() {
    // As from an API server (or `tollgate run`'s manifest reader): every route carries a
    // resourceVersion, and a new version is compiled again.
    let mut inputs = world();
    for (i, r) in inputs.http_routes.iter_mut().enumerate() {
        r.metadata.resource_version = Some(format!("{}", 100 + i));
    }
    let (_, cache) = step(&inputs, CompileCache::default(), "versioned");
    let (_, cache) = step(&inputs, cache, "versions unchanged");
    assert_eq!(cache.stats().routes_compiled, 0, "{:?}", cache.stats());

    named(&mut inputs.http_routes, "docs")
        .metadata
        .resource_version = Some("900".into());
    let (_, cache) = step(&inputs, cache, "a version changed");
    assert_eq!(cache.stats().routes_compiled, 1, "{:?}", cache.stats());

    // The version decides, not the fields: an API server never gives two contents one
    // version, so under the same version the route is not compared (here a label that only
    // this test changes without a new version).
    named(&mut inputs.http_routes, "docs")
        .metadata
        .labels
        .get_or_insert_default()
        .insert("edited".into(), "in place".into());
    let (_, cache) = compile_cached(&inputs, cache);
    assert_eq!(cache.stats().routes_compiled, 0, "{:?}", cache.stats());

    // Without a version (objects built in code), field by field: compiled again once, as its
    // metadata changed, then reused.
    named(&mut inputs.http_routes, "docs")
        .metadata
        .resource_version = None;
    let (_, cache) = step(&inputs, cache, "a version removed");
    assert_eq!(cache.stats().routes_compiled, 1, "{:?}", cache.stats());
    let (_, cache) = step(&inputs, cache, "still none");
    assert_eq!(cache.stats().routes_compiled, 0, "{:?}", cache.stats());
}
