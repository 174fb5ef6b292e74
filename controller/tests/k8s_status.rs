//! `tollgate controller` against the real kube-apiserver of `e2e/cluster.sh`: exact statuses
//! and reasons (HTTPRoute, GRPCRoute and TLSRoute), no status writes after a restart, a rejected route
//! alone, other controllers' route status entries kept, Events for rejections.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;

use std::time::Duration;

use gateway_types::experimental::httproutes::{HttpRoute, HttpRouteStatusParents};
use gateway_types::gatewayclasses::GatewayClass;
use gateway_types::gateways::Gateway;
use gateway_types::grpcroutes::{GrpcRoute, GrpcRouteStatusParents};
use gateway_types::tlsroutes::TlsRoute;
use k8s_openapi::api::core::v1::Event as CoreEvent;
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tollgate::compile::kinds::RouteParent;
use tollgate::k8s::status::RouteStatusKind;

use k8s_support::{TestEnv, conds, eventually, summary};

const WAIT: Duration = Duration::from_secs(30);

/// Our parent entries of an HTTPRoute, once it has any.
async fn parents(env: &TestEnv, route: &str) -> Vec<HttpRouteStatusParents> {
    parents_in::<HttpRoute>(env, env, route).await
}

/// Our parent entries of a GRPCRoute, once it has any.
async fn grpc_parents(env: &TestEnv, route: &str) -> Vec<GrpcRouteStatusParents> {
    parents_in::<GrpcRoute>(env, env, route).await
}

/// Our (`env`'s controller) parent entries of a route of kind `K` in `in_env`'s namespace.
async fn parents_in<K: RouteStatusKind>(
    env: &TestEnv,
    in_env: &TestEnv,
    route: &str,
) -> Vec<K::Parent> {
    let cn = env.controller_name.clone();
    eventually(WAIT, || async {
        let r: K = in_env.get(route).await;
        let ours: Vec<_> = r
            .live_parents()
            .iter()
            .filter(|p| p.controller_name() == cn)
            .cloned()
            .collect();
        (!ours.is_empty()).then_some(ours)
    })
    .await
    .unwrap_or_else(|| panic!("no status on {} {route}", K::KIND))
}

async fn gateway_written(env: &TestEnv, name: &str) -> Gateway {
    eventually(WAIT, || async {
        let g: Gateway = env.get(name).await;
        let written = g
            .status
            .as_ref()?
            .conditions
            .iter()
            .flatten()
            .any(|c| c.reason != "Pending");
        written.then_some(g)
    })
    .await
    .unwrap_or_else(|| panic!("no status on gateway {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_carry_exact_conditions_and_reasons() {
    let env = TestEnv::new("status").await;
    let other_ns = TestEnv::new("status-other").await;
    env.gateway("gw", &[("http", 80), ("admin", 8080)]).await;
    env.service("echo", 8080, "10.1.0.1").await;
    env.route(
        "ok",
        json!([{"name": "gw", "sectionName": "http"}]),
        "echo",
        8080,
    )
    .await;
    env.route("missing", json!([{"name": "gw"}]), "nope", 80)
        .await;
    let cross = json!([{"name": "gw", "namespace": env.ns}]);
    other_ns.route("cross", cross, "echo", 8080).await;
    let ctl = env.controller("a", &[]);
    ctl.wait_ready().await;

    let ok = parents(&env, "ok").await;
    assert_eq!(ok.len(), 1);
    assert_eq!(ok[0].parent_ref.name, "gw");
    assert_eq!(ok[0].parent_ref.section_name.as_deref(), Some("http"));
    assert_eq!(
        summary(&ok[0].conditions),
        conds(&[
            ("Accepted", "True", "Accepted"),
            ("ResolvedRefs", "True", "ResolvedRefs")
        ])
    );
    assert!(
        ok[0]
            .conditions
            .iter()
            .all(|c| c.observed_generation == Some(1))
    );

    let missing = parents(&env, "missing").await;
    assert_eq!(
        summary(&missing[0].conditions),
        conds(&[
            ("Accepted", "True", "Accepted"),
            ("ResolvedRefs", "False", "BackendNotFound")
        ])
    );

    let cross = parents_in::<HttpRoute>(&env, &other_ns, "cross").await;
    assert_eq!(
        summary(&cross[0].conditions)
            .into_iter()
            .find(|c| c.0 == "Accepted")
            .unwrap(),
        (
            "Accepted".into(),
            "False".into(),
            "NotAllowedByListeners".into()
        )
    );

    let gw = gateway_written(&env, "gw").await;
    let st = gw.status.unwrap();
    assert_eq!(
        summary(st.conditions.as_deref().unwrap()),
        conds(&[
            ("Accepted", "True", "Accepted"),
            ("Programmed", "True", "Programmed")
        ])
    );
    let attached: Vec<(String, i32)> = st
        .listeners
        .unwrap()
        .iter()
        .map(|l| (l.name.clone(), l.attached_routes))
        .collect();
    // "ok" attaches to http only; "missing" (no sectionName) to both; "cross" to none.
    assert_eq!(attached, vec![("http".into(), 2), ("admin".into(), 1)]);

    let class: GatewayClass = Api::all(env.client.clone()).get(&env.class).await.unwrap();
    let cs = class.status.unwrap();
    assert_eq!(
        summary(cs.conditions.as_deref().unwrap()),
        conds(&[("Accepted", "True", "Accepted")])
    );
    let features = cs.supported_features.unwrap_or_default();
    assert!(
        features.iter().any(|f| f.name == "HTTPRoute"),
        "{features:?}"
    );

    // The rejection is an Event on the route, once.
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    let found = eventually(WAIT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        let evs: Vec<_> = list
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("missing"))
            .collect();
        (!evs.is_empty()).then_some(evs)
    })
    .await
    .expect("no Event for the rejected route");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].reason.as_deref(), Some("BackendNotFound"));
    assert_eq!(found[0].type_.as_deref(), Some("Warning"));
    let _ = Api::<CoreEvent>::namespaced(env.client.clone(), &env.ns);
    drop(ctl);
}

async fn versions(env: &TestEnv) -> [Option<String>; 4] {
    let g: Gateway = env.get("gw").await;
    let r1: HttpRoute = env.get("r1").await;
    let r2: HttpRoute = env.get("r2").await;
    let c: GatewayClass = Api::all(env.client.clone()).get(&env.class).await.unwrap();
    [
        g.resource_version(),
        r1.resource_version(),
        r2.resource_version(),
        c.resource_version(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_writes_no_status_for_unchanged_objects() {
    let env = TestEnv::new("restart").await;
    env.gateway("gw", &[("http", 80)]).await;
    env.service("echo", 80, "10.1.0.2").await;
    env.route("r1", json!([{"name": "gw"}]), "echo", 80).await;
    env.route("r2", json!([{"name": "gw"}]), "missing", 80)
        .await;
    let mut first = env.controller("a", &[]);
    first.wait_ready().await;
    parents(&env, "r1").await;
    parents(&env, "r2").await;
    gateway_written(&env, "gw").await;
    // Let the echo of our own writes come back, then stop.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(first.metric("tollgate_controller_status_writes_total", "result=\"ok\"") >= 4.0);
    first.terminate();

    let before = versions(&env).await;
    let second = env.controller("b", &[]);
    second.wait_ready().await;
    // The first reconcile runs before /readyz turns ready; give any stray write time to land.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(versions(&env).await, before, "{}", second.log());
    assert_eq!(
        second.metric("tollgate_controller_status_writes_total", ""),
        0.0,
        "{}",
        second.log()
    );
    assert!(second.metric("tollgate_controller_reconciles_total", "") >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_route_is_rejected_alone() {
    let env = TestEnv::new("reject").await;
    env.gateway("gw", &[("http", 80)]).await;
    env.service("echo", 80, "10.1.0.3").await;
    env.route("good", json!([{"name": "gw"}]), "echo", 80).await;
    env.apply::<HttpRoute>(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "bad-regex"},
        "spec": {"parentRefs": [{"name": "gw"}],
                 "rules": [{"matches": [{"path": {"type": "RegularExpression", "value": "/(unclosed"}}],
                            "backendRefs": [{"name": "echo", "port": 80}]}]},
    }))
    .await;
    let ctl = env.controller("a", &[]);
    ctl.wait_ready().await;
    let bad = parents(&env, "bad-regex").await;
    let accepted = bad[0]
        .conditions
        .iter()
        .find(|c| c.type_ == "Accepted")
        .unwrap();
    assert_eq!(accepted.status, "False", "{accepted:?}");
    assert_eq!(accepted.reason, "UnsupportedValue", "{accepted:?}");
    let good = parents(&env, "good").await;
    assert_eq!(
        summary(&good[0].conditions),
        conds(&[
            ("Accepted", "True", "Accepted"),
            ("ResolvedRefs", "True", "ResolvedRefs")
        ])
    );
    // Attachment depends only on parentRefs and allowedRoutes (Gateway API), so both count.
    let gw = gateway_written(&env, "gw").await;
    let l = &gw.status.unwrap().listeners.unwrap()[0];
    assert_eq!(l.attached_routes, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_controllers_entries_are_kept_and_ours_removed_when_unreferenced() {
    let env = TestEnv::new("share").await;
    env.gateway("gw", &[("http", 80)]).await;
    env.service("echo", 80, "10.1.0.4").await;
    env.route("r", json!([{"name": "gw"}, {"name": "theirs"}]), "echo", 80)
        .await;
    // Another controller's entry, written before ours.
    let theirs = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "r", "namespace": env.ns},
        "status": {"parents": [{
            "controllerName": "example.com/other",
            "parentRef": {"name": "theirs"},
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
                            "observedGeneration": 1}],
        }]},
    });
    let routes: Api<HttpRoute> = Api::namespaced(env.client.clone(), &env.ns);
    routes
        .patch_status("r", &PatchParams::apply("other"), &Patch::Apply(theirs))
        .await
        .unwrap();
    let ctl = env.controller("a", &[]);
    ctl.wait_ready().await;
    parents(&env, "r").await;
    let all = |r: HttpRoute| -> Vec<String> {
        r.status
            .map(|s| s.parents)
            .unwrap_or_default()
            .into_iter()
            .map(|p| format!("{}:{}", p.controller_name, p.parent_ref.name))
            .collect()
    };
    let r: HttpRoute = env.get("r").await;
    assert_eq!(
        all(r),
        vec![
            "example.com/other:theirs".to_owned(),
            format!("{}:gw", env.controller_name)
        ]
    );

    // The route stops referencing our Gateway: our entry goes, theirs stays.
    env.apply::<HttpRoute>(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "r"},
        "spec": {"parentRefs": [{"name": "theirs"}],
                 "rules": [{"backendRefs": [{"name": "echo", "port": 80}]}]},
    }))
    .await;
    let left = eventually(WAIT, || async {
        let r: HttpRoute = env.get("r").await;
        let v = all(r);
        (v.len() == 1).then_some(v)
    })
    .await
    .unwrap_or_else(|| panic!("our entry stayed:\n{}", ctl.log()));
    assert_eq!(left, vec!["example.com/other:theirs".to_owned()]);
    // And the Gateway no longer counts it.
    let n = eventually(WAIT, || async {
        let g: Gateway = env.get("gw").await;
        let n = g.status?.listeners?[0].attached_routes;
        (n == 0).then_some(n)
    })
    .await;
    assert_eq!(n, Some(0));
}

async fn grpc_route(env: &TestEnv, name: &str, section: &str, host: &str, backend: &str) {
    env.apply::<GrpcRoute>(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
        "metadata": {"name": name},
        "spec": {"parentRefs": [{"name": "gw", "sectionName": section}],
                 "hostnames": [host],
                 "rules": [{"matches": [{"method": {"service": "pkg.Svc", "method": "Get"}}],
                            "backendRefs": [{"name": backend, "port": 8080}]}]},
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcroute_statuses_carry_exact_conditions_and_reasons() {
    let env = TestEnv::new("grpc").await;
    env.apply::<Gateway>(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "gw"},
        "spec": {"gatewayClassName": env.class, "listeners": [
            {"name": "http", "port": 80, "protocol": "HTTP"},
            {"name": "http-only", "port": 8080, "protocol": "HTTP",
             "allowedRoutes": {"kinds": [{"kind": "HTTPRoute"}]}},
        ]},
    }))
    .await;
    env.service("echo", 8080, "10.1.0.5").await;
    grpc_route(&env, "ok", "http", "ok.test", "echo").await;
    grpc_route(&env, "missing", "http", "missing.test", "nope").await;
    grpc_route(&env, "kinds", "http-only", "kinds.test", "echo").await;
    // Cross serving: the HTTPRoute is created first (and sorts first should both carry the
    // same creation second), so the GRPCRoute on its hostname is the one rejected.
    env.apply::<HttpRoute>(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "a-http"},
        "spec": {"parentRefs": [{"name": "gw", "sectionName": "http"}],
                 "hostnames": ["both.test"],
                 "rules": [{"backendRefs": [{"name": "echo", "port": 8080}]}]},
    }))
    .await;
    grpc_route(&env, "b-grpc", "http", "both.test", "echo").await;
    let ctl = env.controller("a", &[]);
    ctl.wait_ready().await;

    let ok = grpc_parents(&env, "ok").await;
    assert_eq!(ok.len(), 1);
    assert_eq!(ok[0].parent_ref.name, "gw");
    assert_eq!(ok[0].parent_ref.section_name.as_deref(), Some("http"));
    assert_eq!(
        summary(&ok[0].conditions),
        conds(&[
            ("Accepted", "True", "Accepted"),
            ("ResolvedRefs", "True", "ResolvedRefs")
        ])
    );
    assert!(
        ok[0]
            .conditions
            .iter()
            .all(|c| c.observed_generation == Some(1))
    );
    assert_eq!(
        summary(&grpc_parents(&env, "missing").await[0].conditions),
        conds(&[
            ("Accepted", "True", "Accepted"),
            ("ResolvedRefs", "False", "BackendNotFound")
        ])
    );
    assert_eq!(
        summary(&grpc_parents(&env, "kinds").await[0].conditions),
        conds(&[
            ("Accepted", "False", "NotAllowedByListeners"),
            ("ResolvedRefs", "True", "ResolvedRefs")
        ])
    );
    assert_eq!(
        summary(&grpc_parents(&env, "b-grpc").await[0].conditions),
        conds(&[
            ("Accepted", "False", "HostnameConflict"),
            ("ResolvedRefs", "True", "ResolvedRefs")
        ])
    );
    assert_eq!(
        summary(&parents(&env, "a-http").await[0].conditions),
        conds(&[
            ("Accepted", "True", "Accepted"),
            ("ResolvedRefs", "True", "ResolvedRefs")
        ])
    );

    let gw = gateway_written(&env, "gw").await;
    let listeners = gw.status.unwrap().listeners.unwrap();
    let attached: Vec<(String, i32)> = listeners
        .iter()
        .map(|l| (l.name.clone(), l.attached_routes))
        .collect();
    // Every route but "kinds" attaches to http (the conflict does not change the count).
    assert_eq!(attached, vec![("http".into(), 4), ("http-only".into(), 0)]);
    let kinds: Vec<&str> = listeners[0]
        .supported_kinds
        .iter()
        .flatten()
        .map(|k| k.kind.as_str())
        .collect();
    assert_eq!(kinds, vec!["HTTPRoute", "GRPCRoute"]);
    let class: GatewayClass = Api::all(env.client.clone()).get(&env.class).await.unwrap();
    let features = class.status.unwrap().supported_features.unwrap_or_default();
    assert!(
        features.iter().any(|f| f.name == "GRPCRoute"),
        "{features:?}"
    );

    // No churn: with nothing changing, the written GRPCRoute is not written again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before: GrpcRoute = env.get("ok").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after: GrpcRoute = env.get("ok").await;
    assert_eq!(
        before.resource_version(),
        after.resource_version(),
        "{}",
        ctl.log()
    );
    assert!(
        ctl.metric(
            "tollgate_controller_status_writes_total",
            "kind=\"GRPCRoute\",result=\"ok\""
        ) >= 4.0,
        "{}",
        ctl.log()
    );
}

async fn tls_route(env: &TestEnv, name: &str, section: &str, host: &str, backend: &str) {
    env.apply::<TlsRoute>(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "TLSRoute",
        "metadata": {"name": name},
        "spec": {"parentRefs": [{"name": "gw", "sectionName": section}],
                 "hostnames": [host],
                 "rules": [{"backendRefs": [{"name": backend, "port": 8080}]}]},
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tlsroute_statuses_carry_exact_conditions_and_reasons() {
    let env = TestEnv::new("tlsroute").await;
    env.apply::<Gateway>(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "gw"},
        "spec": {"gatewayClassName": env.class, "listeners": [
            {"name": "passthrough", "port": 443, "protocol": "TLS", "hostname": "*.example.com",
             "tls": {"mode": "Passthrough"}},
            // Terminate with a certificate that does not exist: accepted, not programmed.
            {"name": "terminate", "port": 8443, "protocol": "TLS", "hostname": "t.example.com",
             "tls": {"mode": "Terminate", "certificateRefs": [{"name": "absent"}]}},
            {"name": "http", "port": 80, "protocol": "HTTP"},
        ]},
    }))
    .await;
    env.service("echo", 8080, "10.1.0.5").await;
    tls_route(&env, "ok", "passthrough", "abc.example.com", "echo").await;
    tls_route(
        &env,
        "missing",
        "passthrough",
        "missing.example.com",
        "nope",
    )
    .await;
    tls_route(&env, "outside", "passthrough", "abc.other.test", "echo").await;
    tls_route(&env, "on-http", "http", "abc.example.com", "echo").await;
    let ctl = env.controller("a", &[]);
    ctl.wait_ready().await;

    let ok = parents_in::<TlsRoute>(&env, &env, "ok").await;
    assert_eq!(ok.len(), 1);
    assert_eq!(
        ok[0].parent_ref.section_name.as_deref(),
        Some("passthrough")
    );
    assert_eq!(
        summary(&ok[0].conditions),
        conds(&[
            ("Accepted", "True", "Accepted"),
            ("ResolvedRefs", "True", "ResolvedRefs")
        ])
    );
    assert!(
        ok[0]
            .conditions
            .iter()
            .all(|c| c.observed_generation == Some(1))
    );
    for (name, accepted, resolved) in [
        (
            "missing",
            ("Accepted", "True", "Accepted"),
            ("ResolvedRefs", "False", "BackendNotFound"),
        ),
        (
            "outside",
            ("Accepted", "False", "NoMatchingListenerHostname"),
            ("ResolvedRefs", "True", "ResolvedRefs"),
        ),
        (
            "on-http",
            ("Accepted", "False", "NotAllowedByListeners"),
            ("ResolvedRefs", "True", "ResolvedRefs"),
        ),
    ] {
        let p = parents_in::<TlsRoute>(&env, &env, name).await;
        assert_eq!(
            summary(&p[0].conditions),
            conds(&[accepted, resolved]),
            "{name}"
        );
    }

    let gw = gateway_written(&env, "gw").await;
    let listeners = gw.status.unwrap().listeners.unwrap();
    let by_name = |n: &str| listeners.iter().find(|l| l.name == n).unwrap();
    let passthrough = by_name("passthrough");
    assert_eq!(passthrough.attached_routes, 2);
    let kinds: Vec<&str> = passthrough
        .supported_kinds
        .iter()
        .flatten()
        .map(|k| k.kind.as_str())
        .collect();
    assert_eq!(kinds, vec!["TLSRoute"]);
    assert_eq!(
        summary(&by_name("terminate").conditions),
        conds(&[
            ("Accepted", "True", "Accepted"),
            ("Conflicted", "False", "NoConflicts"),
            ("Programmed", "False", "Invalid"),
            ("ResolvedRefs", "False", "InvalidCertificateRef"),
        ])
    );
    let class: GatewayClass = Api::all(env.client.clone()).get(&env.class).await.unwrap();
    let features = class.status.unwrap().supported_features.unwrap_or_default();
    for f in ["TLSRoute", "TLSRouteModeTerminate", "TLSRouteModeMixed"] {
        assert!(features.iter().any(|x| x.name == f), "{f}: {features:?}");
    }
    assert!(
        ctl.metric(
            "tollgate_controller_status_writes_total",
            "kind=\"TLSRoute\",result=\"ok\""
        ) >= 4.0,
        "{}",
        ctl.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_leaves_our_class_loses_our_status() {
    let env = TestEnv::new("release").await;
    env.gateway("gw", &[("http", 80)]).await;
    let ctl = env.controller("a", &[]);
    ctl.wait_ready().await;
    let g = gateway_written(&env, "gw").await;
    assert!(g.status.unwrap().listeners.is_some_and(|l| !l.is_empty()));

    // Move the Gateway to a class no controller here owns.
    env.apply::<Gateway>(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "gw"},
        "spec": {"gatewayClassName": "nobody-owns-this", "listeners": [
            {"name": "http", "port": 80, "protocol": "HTTP"}]},
    }))
    .await;
    let released = eventually(WAIT, || async {
        let g: Gateway = env.get("gw").await;
        let s = g.status.unwrap_or_default();
        let ours_left = s.listeners.as_ref().is_some_and(|l| !l.is_empty())
            || s.conditions.iter().flatten().any(|c| c.status != "Unknown");
        (!ours_left).then_some(s)
    })
    .await
    .unwrap_or_else(|| panic!("status not released:\n{}", ctl.log()));
    // What remains is the CRD's default (Unknown/Pending), if anything.
    for c in released.conditions.iter().flatten() {
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("Unknown", "Pending")
        );
    }
    let managers: Vec<String> = env
        .get::<Gateway>("gw")
        .await
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.subresource.as_deref() == Some("status"))
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:status")?.as_object().map(|o| !o.is_empty()))
                .unwrap_or(false)
        })
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        !managers.contains(&env.controller_name),
        "still owns status fields: {managers:?}"
    );
    // Nothing more to write: no churn once released.
    let writes = ctl.metric("tollgate_controller_status_writes_total", "Gateway");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        ctl.metric("tollgate_controller_status_writes_total", "Gateway"),
        writes,
        "{}",
        ctl.log()
    );
}

/// A status write the API server never answers is given up after the reconciler's API call
/// timeout and retried: the reconcile returns (the loop goes on, and the first reconcile
/// that readiness waits for ends) asking for a retry, and the retry once requests are
/// answered again writes the status.
#[tokio::test]
async fn a_status_write_that_hangs_is_bounded_and_retried() {
    use std::sync::Arc;
    use tollgate::k8s::metrics::Metrics;
    use tollgate::k8s::reconcile::{Reconciler, Settings};
    use tollgate::k8s::stores::{Relevance, Stores};
    let env = TestEnv::new("writehang").await;
    env.gateway("gw", &[("http", 80)]).await;
    let metrics = Arc::new(Metrics::new());
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let (stores, tasks) = Stores::spawn(&env.client, &tx, &metrics);
    stores.wait_until_ready().await.unwrap();
    // Writes go through a relay that stops answering; the watches do not.
    let relay = k8s_support::Relay::start().await;
    let settings = Settings {
        controller_name: env.controller_name.clone(),
        push: None,
        provision: None,
        pki: None,
        api_timeout: Duration::from_secs(1),
        tracing: None,
    };
    let client = relay.client().await;
    // One answered request first: the write then goes out on that open connection and meets
    // no answer (a fresh connection would instead fail at the client's connect timeout).
    let through: Api<Gateway> = Api::namespaced(client.clone(), &env.ns);
    through.get("gw").await.unwrap();
    let mut reconciler = Reconciler::new(client, stores, settings, metrics, "test");
    relay.freeze();
    let outcome = tokio::time::timeout(
        Duration::from_secs(60),
        reconciler.reconcile(Relevance::Full, true),
    )
    .await
    .expect("the reconcile waited on a status write that is never answered");
    assert!(
        outcome.retry,
        "a write that timed out asks for no retry: {outcome:?}"
    );
    let gateways: Api<Gateway> = Api::namespaced(env.client.clone(), &env.ns);
    let accepted = |g: &Gateway| {
        g.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == "Accepted" && c.status == "True")
            })
    };
    assert!(!accepted(&gateways.get("gw").await.unwrap()));

    // Requests answered again: the retries (a second apart in the controller) write it.
    relay.thaw();
    let mut outcome = reconciler.reconcile(Relevance::Status, true).await;
    for _ in 0..10 {
        if !outcome.retry {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        outcome = reconciler.reconcile(Relevance::Status, true).await;
    }
    assert!(!outcome.retry, "the retries failed too: {outcome:?}");
    let written = eventually(WAIT, || async {
        accepted(&gateways.get("gw").await.unwrap()).then_some(())
    })
    .await;
    assert!(written.is_some(), "the retried write did not land");
    for t in tasks {
        t.abort();
    }
}
