//! A route Tollgate cannot serve, on the real kube-apiserver: valid for the API server (an
//! `ExtensionRef` filter to a kind Tollgate implements none of), which the controller reads
//! with the experimental channel's types and refuses alone: `Accepted=False` with `UnsupportedValue` naming the filter, while every other route
//! keeps its status and its place in the table; fixing it brings it back. (Objects that do
//! not deserialize at all, as a newer CRD's could, are skipped alone: `k8s::lenient`'s tests.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;

use std::time::Duration;

use gateway_types::experimental::httproutes::HttpRoute;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::json;

use k8s_support::{TestEnv, eventually};

const WAIT: Duration = Duration::from_secs(30);

/// Our `Accepted` status and reason of a route, read untyped.
async fn accepted_reason(env: &TestEnv, name: &str) -> Option<(String, String)> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        &env.ns,
        &ApiResource::erase::<HttpRoute>(&()),
    );
    let r = api.get(name).await.ok()?;
    let parents = r.data["status"]["parents"].as_array()?.clone();
    let ours = parents
        .iter()
        .find(|p| p["controllerName"] == env.controller_name.as_str())?;
    let c = ours["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Accepted")?;
    Some((
        c["status"].as_str()?.to_owned(),
        c["reason"].as_str()?.to_owned(),
    ))
}

/// Our `Accepted` status of a route.
async fn accepted(env: &TestEnv, name: &str) -> Option<String> {
    accepted_reason(env, name).await.map(|(s, _)| s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_with_an_unserved_filter_is_refused_alone_and_recovers_when_fixed() {
    let env = TestEnv::new("malformed").await;
    env.gateway("gw", &[("http", 80)]).await;
    env.service("echo", 8080, "10.7.0.1").await;
    env.route("good", json!([{"name": "gw"}]), "echo", 8080)
        .await;
    let weird = |filters: serde_json::Value| {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "weird"},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["weird.test"],
                     "rules": [{"filters": filters,
                                "backendRefs": [{"name": "echo", "port": 8080}]}]},
        })
    };
    // Applied untyped, as a client knowing no Gateway API types would.
    let routes: Api<DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        &env.ns,
        &ApiResource::erase::<HttpRoute>(&()),
    );
    // An ExtensionRef: a filter this implementation serves none of (ExternalAuth, which this
    // test used before, is served since issue 33).
    let mut obj = weird(json!([{
        "type": "ExtensionRef",
        "extensionRef": {"group": "example.com", "kind": "Thing", "name": "thing"},
    }]));
    obj["metadata"]["namespace"] = json!(env.ns);
    routes
        .patch(
            "weird",
            &PatchParams::apply("test").force(),
            &Patch::Apply(obj),
        )
        .await
        .unwrap();
    let ctl = env.controller("a", &[]);
    ctl.wait_ready().await;

    eventually(WAIT, || async {
        (accepted(&env, "good").await.as_deref() == Some("True")).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("good route not accepted:\n{}", ctl.log()));
    eventually(WAIT, || async {
        (accepted_reason(&env, "weird").await
            == Some(("False".to_owned(), "UnsupportedValue".to_owned())))
        .then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("the ExtensionRef route is not refused:\n{}", ctl.log()));
    // Both are attached (attachment is the listener's allowedRoutes and the parentRef alone,
    // as the spec defines attachedRoutes), though only one is accepted.
    let attached = eventually(WAIT, || async {
        let g: gateway_types::gateways::Gateway = env.get("gw").await;
        let l = g.status?.listeners?.into_iter().next()?;
        Some(l.attached_routes)
    })
    .await;
    assert_eq!(attached, Some(2));

    // Fixed, it is served.
    env.apply::<HttpRoute>(weird(json!([{
        "type": "RequestHeaderModifier",
        "requestHeaderModifier": {"set": [{"name": "x-fixed", "value": "1"}]},
    }])))
    .await;
    eventually(WAIT, || async {
        (accepted(&env, "weird").await.as_deref() == Some("True")).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("fixed route not accepted:\n{}", ctl.log()));
    assert_eq!(accepted(&env, "good").await.as_deref(), Some("True"));
}
