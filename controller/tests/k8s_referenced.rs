//! Secrets and ConfigMaps on the real kube-apiserver are held whole only while a Gateway
//! references them: objects created before any Gateway names them are fetched when one does,
//! and their updates reach the compile; one the controller cannot read holds its listener's
//! status (and table) back instead of rejecting the listener.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;

use std::time::Duration;

use gateway_types::gateways::Gateway;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::json;

use k8s_support::{ControllerProc, TestEnv, eventually};

const WAIT: Duration = Duration::from_secs(30);

/// (status, reason) of a listener condition, once the controller has written one.
async fn listener_cond(env: &TestEnv, t: &str) -> Option<(String, String)> {
    listener_cond_of(env, "https", t).await
}

/// [`listener_cond`] of the listener named `listener`.
async fn listener_cond_of(env: &TestEnv, listener: &str, t: &str) -> Option<(String, String)> {
    let g: Gateway = env.get("gw").await;
    let l = g
        .status?
        .listeners?
        .into_iter()
        .find(|l| l.name == listener)?;
    let c = l.conditions.into_iter().find(|c| c.type_ == t)?;
    Some((c.status, c.reason))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn referenced_payloads_are_fetched_and_follow_updates() {
    let env = TestEnv::new("referenced").await;
    let cert = rcgen::generate_simple_self_signed(vec!["shop.example.com".to_owned()]).unwrap();
    let (crt, key) = (cert.cert.pem(), cert.signing_key.serialize_pem());
    env.apply::<Secret>(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "early"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": crt, "tls.key": key},
    }))
    .await;
    env.apply::<ConfigMap>(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "client-ca"},
        "data": {"ca.crt": crt},
    }))
    .await;
    let ctl = env.controller("a", &[]);
    ctl.wait_ready().await;

    // The Gateway arrives after the controller stored both objects without payload.
    env.apply::<Gateway>(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "gw"},
        "spec": {
            "gatewayClassName": env.class,
            "tls": {"frontend": {"default": {"validation": {
                "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "client-ca"}]}}}},
            "listeners": [{"name": "https", "port": 443, "protocol": "HTTPS",
                           "tls": {"certificateRefs": [{"name": "early"}]}}],
        },
    }))
    .await;
    let ok = eventually(WAIT, || async {
        let r = listener_cond(&env, "ResolvedRefs").await?;
        (r.0 == "True").then_some(r)
    })
    .await
    .unwrap_or_else(|| panic!("references never resolved:\n{}", ctl.log()));
    assert_eq!(ok.1, "ResolvedRefs");
    assert_eq!(
        listener_cond(&env, "Accepted").await,
        Some(("True".into(), "Accepted".into()))
    );
    assert_eq!(
        listener_cond(&env, "Programmed").await,
        Some(("True".into(), "Programmed".into()))
    );

    // An update of a referenced object reaches the compile.
    env.apply::<Secret>(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "early"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "tls.key": key},
    }))
    .await;
    eventually(WAIT, || async {
        let r = listener_cond(&env, "ResolvedRefs").await?;
        (r == ("False".to_owned(), "InvalidCertificateRef".to_owned())).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("the broken certificate was not noticed:\n{}", ctl.log()));
    env.apply::<ConfigMap>(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "client-ca"},
        "data": {"ca.crt": "not a certificate"},
    }))
    .await;
    eventually(WAIT, || async {
        let r = listener_cond(&env, "Accepted").await?;
        (r == ("False".to_owned(), "NoValidCACertificate".to_owned())).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("the broken CA was not noticed:\n{}", ctl.log()));
}

/// A certificate the controller cannot read (its GETs refused, as when the API server fails
/// to answer around a control-plane restart) publishes nothing and writes no status calling
/// the listener's certificate invalid; once it can be read, the listener is resolved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_certificate_rejects_no_listener() {
    let env = TestEnv::new("unreadable").await;
    let (ctl, user) = controller_without_secret_reads(&env).await;
    // A few retries later, still nothing calls the certificate invalid.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        listener_cond(&env, "ResolvedRefs").await,
        None,
        "{}",
        ctl.log()
    );
    allow_secret_reads(&env, &user).await;
    wait_resolved(&env, &ctl).await;
}

/// Past the grace period the controller compiles without the unreadable certificate (the
/// listener is rejected rather than every change held back for good), and keeps trying: once
/// readable, the listener is resolved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_certificate_is_rejected_after_the_grace_period() {
    let env = TestEnv::new("unreadgrace").await;
    let (ctl, user) = controller_without_secret_reads(&env).await;
    let rejected = eventually(Duration::from_secs(90), || async {
        let r = listener_cond(&env, "ResolvedRefs").await?;
        (r.0 == "False").then_some(r)
    })
    .await;
    assert_eq!(
        rejected,
        Some(("False".into(), "InvalidCertificateRef".into())),
        "{}",
        ctl.log()
    );
    assert!(ctl.log().contains("still unreadable"), "{}", ctl.log());
    // The certificates it may read are read all the same, whichever comes first.
    for open in READABLE {
        assert_eq!(
            listener_cond_of(&env, open, "ResolvedRefs").await,
            Some(("True".into(), "ResolvedRefs".into())),
            "{open}: {}",
            ctl.log()
        );
    }
    allow_secret_reads(&env, &user).await;
    wait_resolved(&env, &ctl).await;
}

/// Waits for the listener's `ResolvedRefs=True`.
async fn wait_resolved(env: &TestEnv, ctl: &ControllerProc) {
    let resolved = eventually(WAIT, || async {
        let r = listener_cond(env, "ResolvedRefs").await?;
        (r.0 == "True").then_some(r)
    })
    .await;
    assert!(
        resolved.is_some(),
        "not resolved once readable: {:?}\n{}",
        listener_cond(env, "ResolvedRefs").await,
        ctl.log()
    );
}

/// Secrets the user of [`controller_without_secret_reads`] may get, each the certificate of a
/// listener of its own name (named to come after the unreadable `shop-cert`).
const READABLE: [&str; 3] = ["x-open-1", "x-open-2", "x-open-3"];

/// A Gateway with an HTTPS listener whose certificate Secret exists, and a controller acting
/// as a user that may list and watch Secrets but get none except [`READABLE`]; returns once
/// a read was refused, with that user's name.
async fn controller_without_secret_reads(env: &TestEnv) -> (ControllerProc, String) {
    let user = format!("tollgate-test-{}", env.ns);
    let groups = [
        "gateway.networking.k8s.io",
        "tollgate.dev",
        "discovery.k8s.io",
        "coordination.k8s.io",
        "events.k8s.io",
        "apps",
    ];
    env.grant(
        &user,
        &user,
        json!([
            {"apiGroups": groups, "resources": ["*"], "verbs": ["*"]},
            {"apiGroups": [""], "resources": ["services", "namespaces", "configmaps", "events"],
             "verbs": ["*"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list", "watch"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
             "resourceNames": READABLE},
        ]),
    )
    .await;
    let kubeconfig = k8s_support::kubeconfig_as(env, &user);

    let cert = rcgen::generate_simple_self_signed(vec!["shop.example.com".to_owned()]).unwrap();
    let (crt, key) = (cert.cert.pem(), cert.signing_key.serialize_pem());
    let mut listeners = vec![json!({"name": "https", "port": 443, "protocol": "HTTPS",
                                    "tls": {"certificateRefs": [{"name": "shop-cert"}]}})];
    for (i, name) in std::iter::once("shop-cert").chain(READABLE).enumerate() {
        env.apply::<Secret>(json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
            "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": crt, "tls.key": key},
        }))
        .await;
        if i > 0 {
            listeners.push(json!({"name": name, "port": 8440 + i, "protocol": "HTTPS",
                                  "tls": {"certificateRefs": [{"name": name}]}}));
        }
    }
    env.apply::<Gateway>(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "gw"},
        "spec": {"gatewayClassName": env.class, "listeners": listeners},
    }))
    .await;
    let ctl = env.controller("a", &["--kubeconfig", kubeconfig.to_str().unwrap()]);
    ctl.wait_ready().await;
    let refused = eventually(WAIT, || async {
        ctl.log().contains("forbidden").then_some(())
    })
    .await;
    assert!(
        refused.is_some(),
        "the read was not refused:\n{}",
        ctl.log()
    );
    (ctl, user)
}

/// Lets the user of [`controller_without_secret_reads`] get Secrets.
async fn allow_secret_reads(env: &TestEnv, user: &str) {
    env.grant(
        &format!("{user}-get-secrets"),
        user,
        json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
    )
    .await;
}
