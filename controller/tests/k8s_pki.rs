//! The push PKI Secrets on the real kube-apiserver of `e2e/cluster.sh`: the CA Secret is
//! created once, reused, converged on under concurrent starts, and rotated near expiry; the
//! proxy Secret of a Gateway is issued, left alone while current, and reissued after a
//! rotation; an owner (the controller's Deployment) is set on a new CA Secret and added, once,
//! to one created without it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod k8s_support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use tollgate::push::pki::{
    CA_CERT_KEY, CA_KEY_KEY, CA_PREVIOUS_KEY, Ca, ensure_ca, ensure_ca_owned, ensure_proxy_secret,
    proxy_secret_name,
};

fn data(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()?
        .get(key)
        .map(|b| String::from_utf8(b.0.clone()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_secret_is_created_once_then_reused() {
    let env = k8s_support::TestEnv::new("pki-create").await;
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns);
    assert!(secrets.get_opt("push-ca").await.unwrap().is_none());

    let first = ensure_ca(&env.client, &env.ns, "push-ca").await.unwrap();
    let stored = secrets.get("push-ca").await.unwrap();
    assert_eq!(
        data(&stored, CA_CERT_KEY).as_deref(),
        Some(first.cert_pem())
    );
    assert_eq!(data(&stored, CA_KEY_KEY).as_deref(), Some(first.key_pem()));
    assert!(data(&stored, CA_PREVIOUS_KEY).is_none());

    let second = ensure_ca(&env.client, &env.ns, "push-ca").await.unwrap();
    assert_eq!(second.cert_pem(), first.cert_pem());
    assert_eq!(second.key_pem(), first.key_pem());
    let again = secrets.get("push-ca").await.unwrap();
    assert_eq!(
        again.metadata.resource_version, stored.metadata.resource_version,
        "a current CA is not rewritten"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_starts_converge_on_one_ca() {
    let env = k8s_support::TestEnv::new("pki-race").await;
    let c = &env.client;
    let ns = env.ns.as_str();
    let (a, b, c3, d) = tokio::join!(
        ensure_ca(c, ns, "push-ca"),
        ensure_ca(c, ns, "push-ca"),
        ensure_ca(c, ns, "push-ca"),
        ensure_ca(c, ns, "push-ca"),
    );
    let all = [a.unwrap(), b.unwrap(), c3.unwrap(), d.unwrap()];
    let stored = Api::<Secret>::namespaced(env.client.clone(), ns)
        .get("push-ca")
        .await
        .unwrap();
    for ca in &all {
        assert_eq!(data(&stored, CA_CERT_KEY).as_deref(), Some(ca.cert_pem()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiring_ca_rotates_and_keeps_the_previous_in_the_bundle() {
    let env = k8s_support::TestEnv::new("pki-rotate").await;
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns);
    // A CA that expires in 10 days, as a controller would have stored it a year ago.
    let old = Ca::generate_valid_for(Duration::from_secs(10 * 86_400)).unwrap();
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "push-ca", "namespace": env.ns},
        "type": "Opaque",
        "stringData": {CA_CERT_KEY: old.cert_pem(), CA_KEY_KEY: old.key_pem()},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    // A proxy Secret issued by the old CA.
    let name = ensure_proxy_secret(&env.client, &env.ns, "gw", &old)
        .await
        .unwrap();
    assert_eq!(name, proxy_secret_name("gw"));
    assert_eq!(name, "gw-tollgate-proxy-tls");
    let issued = secrets.get(&name).await.unwrap();
    assert_eq!(issued.type_.as_deref(), Some("kubernetes.io/tls"));
    let old_cert = data(&issued, "tls.crt").unwrap();
    assert!(old.is_current_client(&old_cert, &format!("{}/gw", env.ns), Duration::ZERO));
    assert!(data(&issued, "tls.key").is_some());
    assert_eq!(data(&issued, "ca.crt").unwrap(), old.trust_bundle());
    ensure_proxy_secret(&env.client, &env.ns, "gw", &old)
        .await
        .unwrap();
    assert_eq!(
        secrets.get(&name).await.unwrap().metadata.resource_version,
        issued.metadata.resource_version,
        "a current proxy Secret is not rewritten"
    );

    let new = ensure_ca(&env.client, &env.ns, "push-ca").await.unwrap();
    assert_ne!(new.cert_pem(), old.cert_pem());
    assert_eq!(new.previous_pem(), Some(old.cert_pem()));
    assert!(new.not_after() > std::time::SystemTime::now() + Duration::from_secs(300 * 86_400));
    let stored = secrets.get("push-ca").await.unwrap();
    assert_eq!(data(&stored, CA_CERT_KEY).as_deref(), Some(new.cert_pem()));
    assert_eq!(
        data(&stored, CA_PREVIOUS_KEY).as_deref(),
        Some(old.cert_pem())
    );
    let again = ensure_ca(&env.client, &env.ns, "push-ca").await.unwrap();
    assert_eq!(
        again.cert_pem(),
        new.cert_pem(),
        "rotated once, then reused"
    );

    // The proxy Secret moves to the new CA, with both CAs in its bundle, and (the Gateway
    // now existing) is owned by the Gateway.
    env.gateway("gw", &[("http", 80)]).await;
    ensure_proxy_secret(&env.client, &env.ns, "gw", &new)
        .await
        .unwrap();
    let reissued = secrets.get(&name).await.unwrap();
    let cert = data(&reissued, "tls.crt").unwrap();
    assert_ne!(cert, old_cert);
    assert!(new.is_current_client(&cert, &format!("{}/gw", env.ns), Duration::ZERO));
    let bundle = data(&reissued, "ca.crt").unwrap();
    assert_eq!(bundle, new.trust_bundle());
    assert!(bundle.contains(old.cert_pem().trim()) && bundle.contains(new.cert_pem().trim()));
    let owners = reissued.metadata.owner_references.unwrap_or_default();
    assert_eq!(owners.len(), 1);
    assert_eq!(
        (owners[0].kind.as_str(), owners[0].name.as_str()),
        ("Gateway", "gw")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_secret_gets_its_owner_on_creation_or_later_once() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    let env = k8s_support::TestEnv::new("pki-owner").await;
    // Any object will do as the owner here (no garbage collector runs on this cluster).
    let owner_of = |cm: &ConfigMap| OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: cm.metadata.name.clone().unwrap(),
        uid: cm.metadata.uid.clone().unwrap(),
        controller: None,
        block_owner_deletion: None,
    };
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let mut owners = Vec::new();
    for name in ["owner-a", "owner-b"] {
        let cm = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        owners.push(owner_of(
            &cms.create(&PostParams::default(), &cm).await.unwrap(),
        ));
    }
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns);
    let uids = |s: &Secret| -> Vec<String> {
        s.metadata
            .owner_references
            .iter()
            .flatten()
            .map(|o| o.uid.clone())
            .collect()
    };

    // Created with its owner.
    let ca = ensure_ca_owned(&env.client, &env.ns, "owned-ca", Some(&owners[0]))
        .await
        .unwrap();
    assert_eq!(
        uids(&secrets.get("owned-ca").await.unwrap()),
        [owners[0].uid.clone()]
    );
    // Created without: the owner is added on the next start, once, and the CA stays.
    ensure_ca(&env.client, &env.ns, "plain-ca").await.unwrap();
    assert!(uids(&secrets.get("plain-ca").await.unwrap()).is_empty());
    for _ in 0..2 {
        let again = ensure_ca_owned(&env.client, &env.ns, "plain-ca", Some(&owners[1]))
            .await
            .unwrap();
        let stored = secrets.get("plain-ca").await.unwrap();
        assert_eq!(uids(&stored), [owners[1].uid.clone()]);
        assert_eq!(
            data(&stored, CA_CERT_KEY).as_deref(),
            Some(again.cert_pem())
        );
    }
    // Another owner joins the first instead of replacing it.
    let same = ensure_ca_owned(&env.client, &env.ns, "owned-ca", Some(&owners[1]))
        .await
        .unwrap();
    assert_eq!(same.cert_pem(), ca.cert_pem());
    assert_eq!(
        uids(&secrets.get("owned-ca").await.unwrap()),
        [owners[0].uid.clone(), owners[1].uid.clone()]
    );
}
