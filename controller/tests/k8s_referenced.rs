//! Secrets and ConfigMaps on the real kube-apiserver are held whole only while a Gateway
//! references them: objects created before any Gateway names them are fetched when one does,
//! and their updates reach the compile.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;

use std::time::Duration;

use gateway_api::gateways::Gateway;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::json;

use k8s_support::{TestEnv, eventually};

const WAIT: Duration = Duration::from_secs(30);

/// (status, reason) of a listener condition, once the controller has written one.
async fn listener_cond(env: &TestEnv, t: &str) -> Option<(String, String)> {
    let g: Gateway = env.get("gw").await;
    let l = g
        .status?
        .listeners?
        .into_iter()
        .find(|l| l.name == "https")?;
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
