//! BackendTLSPolicy on the real kube-apiserver: the controller watches the policies and the
//! ConfigMaps they name, writes `status.ancestors` (one entry per Gateway whose routes use
//! the targeted Service) next to another implementation's entry, which it keeps; a CA
//! ConfigMap that goes away closes the Service (the policy `Accepted=False
//! NoValidCACertificate`, `ResolvedRefs=False InvalidCACertificateRef`; the route
//! `ResolvedRefs=False InvalidBackendTLSPolicy`) and one that comes back opens it again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;

use std::time::Duration;

use gateway_types::backendtlspolicies::{BackendTlsPolicy, BackendTlsPolicyStatusAncestors};
use gateway_types::experimental::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use k8s_support::{TestEnv, conds, eventually, free_port, summary};

const WAIT: Duration = Duration::from_secs(30);
const OTHER: &str = "example.com/other-controller";

/// A CA certificate in PEM (only its parsing matters here: no TLS connection is made).
fn ca_pem() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).unwrap().pem()
}

async fn apply_ca(env: &TestEnv) {
    env.apply::<ConfigMap>(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "backend-ca"},
        "data": {"ca.crt": ca_pem()},
    }))
    .await;
}

/// The ancestor entries of policy `p` once `ready` holds for them.
async fn ancestors_when(
    env: &TestEnv,
    log: impl Fn() -> String,
    ready: impl Fn(&[BackendTlsPolicyStatusAncestors]) -> bool,
) -> Vec<BackendTlsPolicyStatusAncestors> {
    eventually(WAIT, || async {
        let p: BackendTlsPolicy = env.get("p").await;
        let a = p.status?.ancestors;
        ready(&a).then_some(a)
    })
    .await
    .unwrap_or_else(|| panic!("policy never reached the expected status:\n{}", log()))
}

fn ours<'a>(
    env: &TestEnv,
    a: &'a [BackendTlsPolicyStatusAncestors],
) -> Vec<&'a BackendTlsPolicyStatusAncestors> {
    a.iter()
        .filter(|x| x.controller_name == env.controller_name)
        .collect()
}

#[tokio::test]
async fn policy_status_follows_its_ca_and_keeps_other_controllers_entries() {
    let env = TestEnv::new("btls").await;
    env.gateway("gw", &[("http", free_port())]).await;
    env.apply::<k8s_openapi::api::core::v1::Service>(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "app"},
        "spec": {"ports": [{"name": "https", "port": 443, "protocol": "TCP"}]},
    }))
    .await;
    env.route("r", json!([{"name": "gw"}]), "app", 443).await;
    apply_ca(&env).await;
    let policy: BackendTlsPolicy = env
        .apply(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "BackendTLSPolicy",
            "metadata": {"name": "p"},
            "spec": {
                "targetRefs": [{"group": "", "kind": "Service", "name": "app", "sectionName": "https"}],
                "validation": {
                    "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "backend-ca"}],
                    "hostname": "app.example.test",
                },
            },
        }))
        .await;
    // Another implementation's verdict, written before ours.
    let api: Api<BackendTlsPolicy> = Api::namespaced(env.client.clone(), &env.ns);
    let other = json!({
        "ancestorRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "theirs", "namespace": env.ns},
        "controllerName": OTHER,
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": policy.metadata.generation}],
    });
    api.patch_status(
        "p",
        &PatchParams::apply("other").force(),
        &Patch::Apply(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "BackendTLSPolicy",
            "metadata": {"name": "p"}, "status": {"ancestors": [other]},
        })),
    )
    .await
    .unwrap();

    let c = env.controller("c", &[]);
    let ok = conds(&[
        ("Accepted", "True", "Accepted"),
        ("ResolvedRefs", "True", "ResolvedRefs"),
    ]);
    let a = ancestors_when(
        &env,
        || c.log(),
        |a| {
            ours(&env, a)
                .first()
                .is_some_and(|x| summary(&x.conditions) == ok)
        },
    )
    .await;
    let mine = ours(&env, &a);
    assert_eq!(mine.len(), 1, "{a:#?}");
    assert_eq!(mine[0].ancestor_ref.name, "gw");
    assert_eq!(
        mine[0].ancestor_ref.namespace.as_deref(),
        Some(env.ns.as_str())
    );
    assert!(
        a.iter().any(|x| x.controller_name == OTHER),
        "the other controller's entry was dropped: {a:#?}"
    );

    // The CA goes away: the policy says why, and the route's ref no longer resolves.
    Api::<ConfigMap>::namespaced(env.client.clone(), &env.ns)
        .delete("backend-ca", &DeleteParams::default())
        .await
        .unwrap();
    let closed = conds(&[
        ("Accepted", "False", "NoValidCACertificate"),
        ("ResolvedRefs", "False", "InvalidCACertificateRef"),
    ]);
    let a = ancestors_when(
        &env,
        || c.log(),
        |a| {
            ours(&env, a)
                .first()
                .is_some_and(|x| summary(&x.conditions) == closed)
        },
    )
    .await;
    assert!(a.iter().any(|x| x.controller_name == OTHER), "{a:#?}");
    let route_closed = eventually(WAIT, || async {
        let r: HttpRoute = env.get("r").await;
        let p = r
            .status?
            .parents
            .into_iter()
            .find(|p| p.controller_name == env.controller_name)?;
        p.conditions
            .iter()
            .any(|c| {
                c.type_ == "ResolvedRefs"
                    && c.status == "False"
                    && c.reason == "InvalidBackendTLSPolicy"
            })
            .then_some(())
    })
    .await;
    assert!(route_closed.is_some(), "route never closed:\n{}", c.log());

    // And back.
    apply_ca(&env).await;
    ancestors_when(
        &env,
        || c.log(),
        |a| {
            ours(&env, a)
                .first()
                .is_some_and(|x| summary(&x.conditions) == ok)
        },
    )
    .await;
}
