//! The Secrets of the push PKI. In: a kube [`Client`]. Out: the CA Secret (controller
//! namespace) and one proxy Secret per Gateway (Gateway namespace), created when absent and
//! rewritten only when stale.
//!
//! CA Secret (`Opaque`, name chosen by the caller): `ca.crt`, `ca.key`, and during a rotation
//! `ca-previous.crt`. Two replicas starting together both try to create it; the loser gets
//! `AlreadyExists`, re-reads, and uses the winner's CA. Rotation is a replace guarded by the
//! read `resourceVersion`, so concurrent rotations converge on one new CA too.
//!
//! Proxy Secret (`kubernetes.io/tls`, [`proxy_secret_name`]): `tls.crt`, `tls.key` (client
//! certificate with CN `NAMESPACE/NAME` of the Gateway) and `ca.crt` (the trust bundle);
//! owner-referenced to the Gateway when it exists, so the garbage collector removes it with
//! the Gateway.

use std::collections::BTreeMap;

use gateway_types::gateways::Gateway;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, Error as KubeError, Resource as _};

use super::{CA_ROTATE_BEFORE, CLIENT_RENEW_BEFORE, Ca, PkiError, proxy_identity};

/// CA Secret key: current CA certificate.
pub const CA_CERT_KEY: &str = "ca.crt";
/// CA Secret key: current CA private key.
pub const CA_KEY_KEY: &str = "ca.key";
/// CA Secret key: the CA certificate replaced by the last rotation (kept in the bundle).
pub const CA_PREVIOUS_KEY: &str = "ca-previous.crt";

/// How often a create/replace race is retried before giving up.
const ATTEMPTS: usize = 5;

/// Name of the proxy Secret of Gateway `gateway_name`: `<gateway>-tollgate-proxy-tls`.
pub fn proxy_secret_name(gateway_name: &str) -> String {
    format!("{gateway_name}-tollgate-proxy-tls")
}

fn is_status(e: &KubeError, code: u16) -> bool {
    matches!(e, KubeError::Api(s) if s.code == code)
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([(
        "app.kubernetes.io/managed-by".to_owned(),
        "tollgate".to_owned(),
    )])
}

fn ca_secret(
    namespace: &str,
    name: &str,
    ca: &Ca,
    resource_version: Option<String>,
    owners: Option<Vec<OwnerReference>>,
) -> Secret {
    let mut data = BTreeMap::from([
        (
            CA_CERT_KEY.to_owned(),
            ByteString(ca.cert_pem().as_bytes().to_vec()),
        ),
        (
            CA_KEY_KEY.to_owned(),
            ByteString(ca.key_pem().as_bytes().to_vec()),
        ),
    ]);
    if let Some(prev) = ca.previous_pem() {
        data.insert(
            CA_PREVIOUS_KEY.to_owned(),
            ByteString(prev.as_bytes().to_vec()),
        );
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels()),
            resource_version,
            owner_references: owners,
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

/// Loads the push CA from Secret `namespace/secret_name`, creating it on first start and
/// rotating it when it expires within 30 days (the old certificate moves to
/// `ca-previous.crt`). A Secret whose CA does not parse is an error, never overwritten.
pub async fn ensure_ca(
    client: &Client,
    namespace: &str,
    secret_name: &str,
) -> Result<Ca, PkiError> {
    ensure_ca_owned(client, namespace, secret_name, None).await
}

/// [`ensure_ca`], with `owner` among the Secret's owners (set when it is created or rotated,
/// added when it is missing): the controller's Deployment, so uninstalling removes the CA.
pub async fn ensure_ca_owned(
    client: &Client,
    namespace: &str,
    secret_name: &str,
    owner: Option<&OwnerReference>,
) -> Result<Ca, PkiError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let api_err = |action: &'static str| {
        move |source| PkiError::Api {
            source: Box::new(source),
            action,
            namespace: namespace.to_owned(),
            name: secret_name.to_owned(),
        }
    };
    for _ in 0..ATTEMPTS {
        let existing = api.get_opt(secret_name).await.map_err(api_err("reading"))?;
        let Some(secret) = existing else {
            let ca = Ca::generate()?;
            match api
                .create(
                    &PostParams::default(),
                    &ca_secret(
                        namespace,
                        secret_name,
                        &ca,
                        None,
                        owner.map(|o| vec![o.clone()]),
                    ),
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(namespace, secret_name, "push CA created");
                    return Ok(ca);
                }
                // Another replica created it first: use theirs.
                Err(e) if is_status(&e, 409) => continue,
                Err(e) => return Err(api_err("creating")(e)),
            }
        };
        let (Some(cert), Some(key)) = (text(&secret, CA_CERT_KEY), text(&secret, CA_KEY_KEY))
        else {
            return Err(PkiError::Parse {
                what: format!("Secret {namespace}/{secret_name}"),
                message: format!("missing {CA_CERT_KEY} or {CA_KEY_KEY}"),
            });
        };
        let previous = text(&secret, CA_PREVIOUS_KEY);
        let ca = Ca::from_pem(&cert, &key, previous.as_deref())?;
        let current = secret.metadata.owner_references.as_deref();
        let added = owner.and_then(|o| crate::k8s::owner::with_owner(current, o));
        if !ca.expires_within(CA_ROTATE_BEFORE) {
            if let Some(owners) = added {
                // Created before we knew our Deployment (or by another one): own it too.
                let patch = serde_json::json!({"metadata": {
                    "ownerReferences": owners,
                    "resourceVersion": secret.metadata.resource_version,
                }});
                match api
                    .patch(secret_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {}
                    Err(e) if is_status(&e, 409) => continue,
                    Err(e) => return Err(api_err("adding the owner of")(e)),
                }
            }
            return Ok(ca);
        }
        let next = ca.rotate()?;
        let replacement = ca_secret(
            namespace,
            secret_name,
            &next,
            secret.metadata.resource_version.clone(),
            added.or_else(|| current.map(<[OwnerReference]>::to_vec)),
        );
        match api
            .replace(secret_name, &PostParams::default(), &replacement)
            .await
        {
            Ok(_) => {
                tracing::info!(namespace, secret_name, "push CA rotated");
                return Ok(next);
            }
            // Someone else rotated (or changed) it since we read it: read again.
            Err(e) if is_status(&e, 409) => continue,
            Err(e) => return Err(api_err("rotating")(e)),
        }
    }
    Err(PkiError::Conflict {
        namespace: namespace.to_owned(),
        name: secret_name.to_owned(),
    })
}

/// Ensures the proxy Secret of Gateway `gateway_ns/gateway_name` (see
/// [`proxy_secret_name`]) holds a client certificate of `ca` for that Gateway that does not
/// expire within 7 days, and `ca`'s trust bundle; (re)issues it otherwise. Returns its name.
pub async fn ensure_proxy_secret(
    client: &Client,
    gateway_ns: &str,
    gateway_name: &str,
    ca: &Ca,
) -> Result<String, PkiError> {
    let name = proxy_secret_name(gateway_name);
    let identity = proxy_identity(gateway_ns, gateway_name);
    let bundle = ca.trust_bundle();
    let api: Api<Secret> = Api::namespaced(client.clone(), gateway_ns);
    let owner = Api::<Gateway>::namespaced(client.clone(), gateway_ns)
        .get_opt(gateway_name)
        .await
        .map_err(|source| PkiError::Api {
            source: Box::new(source),
            action: "reading Gateway for",
            namespace: gateway_ns.to_owned(),
            name: name.clone(),
        })?
        .and_then(|g| g.owner_ref(&()));
    let api_err = |action: &'static str| {
        let name = name.clone();
        move |source| PkiError::Api {
            source: Box::new(source),
            action,
            namespace: gateway_ns.to_owned(),
            name,
        }
    };
    for _ in 0..ATTEMPTS {
        let existing = api.get_opt(&name).await.map_err(api_err("reading"))?;
        if let Some(secret) = &existing {
            let current = text(secret, "tls.crt")
                .is_some_and(|c| ca.is_current_client(&c, &identity, CLIENT_RENEW_BEFORE))
                && text(secret, "tls.key").is_some()
                && text(secret, "ca.crt").as_deref() == Some(bundle.as_str())
                && owner.as_ref().is_none_or(|o| {
                    secret
                        .metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|r| r.uid == o.uid)
                });
            if current {
                return Ok(name);
            }
        }
        let issued = ca.issue_client(&identity)?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(gateway_ns.to_owned()),
                labels: Some(labels()),
                owner_references: owner.clone().map(|o| vec![o]),
                resource_version: existing
                    .as_ref()
                    .and_then(|s| s.metadata.resource_version.clone()),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".to_owned()),
            data: Some(BTreeMap::from([
                (
                    "tls.crt".to_owned(),
                    ByteString(issued.cert_pem.into_bytes()),
                ),
                (
                    "tls.key".to_owned(),
                    ByteString(issued.key_pem.into_bytes()),
                ),
                ("ca.crt".to_owned(), ByteString(issued.ca_pem.into_bytes())),
            ])),
            ..Secret::default()
        };
        let pp = PostParams::default();
        let outcome = if existing.is_some() {
            api.replace(&name, &pp, &secret).await
        } else {
            api.create(&pp, &secret).await
        };
        match outcome {
            Ok(_) => {
                tracing::info!(namespace = gateway_ns, secret = %name, "proxy certificate issued");
                return Ok(name);
            }
            Err(e) if is_status(&e, 409) => continue,
            Err(e) => return Err(api_err("writing")(e)),
        }
    }
    Err(PkiError::Conflict {
        namespace: gateway_ns.to_owned(),
        name,
    })
}
