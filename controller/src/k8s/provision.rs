//! Provisioning the proxy of each Gateway: a ServiceAccount, a Deployment and a Service, and
//! the HorizontalPodAutoscaler and PodDisruptionBudget its GatewayParameters ask for, all
//! owner-referenced to the Gateway.
//!
//! In: a Gateway with a table (as read from the API server), its merged GatewayParameters and
//! the [`ProvisionConfig`]. Out: the objects, server-side applied in the Gateway's namespace,
//! and the addresses for the Gateway's `status.addresses`, read from the Service. Only the
//! leader calls this.
//!
//! What gets created (the pure builders are in [`desired`], names in [`names`]):
//!
//! - all three are named [`object_name`] (`<gateway>-tollgate`; adjusted and hashed when
//!   that is no valid Service name, e.g. longer than 63 characters), carry a controller
//!   owner reference to the Gateway (`blockOwnerDeletion`), the Gateway's
//!   `spec.infrastructure.labels` and `.annotations` (also on the pod template), and the
//!   labels `app.kubernetes.io/name: tollgate-proxy`, `app.kubernetes.io/managed-by:
//!   tollgate`, `gateway.networking.k8s.io/gateway-name` and `.../gateway-class-name`.
//!   Ours win over `infrastructure.labels` with the same key. Changing infrastructure labels
//!   or annotations changes the pod template, so the proxy pods roll (one at a time).
//! - Deployment: replicas from the Gateway annotation `tollgate.dev/replicas` (0 to 100; any
//!   other value is an [`ProvisionError::InvalidGateway`] and nothing is applied); without
//!   it the field is left to the API server's default of 1 (and to an autoscaler, if any).
//!   Non-root, read-only root filesystem, no capabilities, seccomp `RuntimeDefault`, no
//!   service-account token; the TLS Secret [`tls_secret_name`] at `/etc/tollgate/tls`; an
//!   emptyDir for the last good table; probes on the admin port 9902. Listeners below port
//!   1024 add `NET_BIND_SERVICE` and the pod sysctl `net.ipv4.ip_unprivileged_port_start`
//!   (the sysctl is what lets a non-root process bind; see [`desired`]).
//! - Service: type from the parameters or else the config, one port per distinct listener
//!   port and protocol; the parameters' `service.annotations` on it alone.
//! - GatewayParameters (merged by the compiler, [`crate::compile::parameters`]) set replicas
//!   (over the annotation) or an autoscaler, resources, workers, log level, access log, node
//!   selector, tolerations, priority class, topology spread and a disruption budget. An
//!   autoscaler or budget the parameters no longer ask for is deleted. When an autoscaler
//!   takes over, `spec.replicas` is first handed to a field manager of its own
//!   ([`HANDOVER_MANAGER`]) at its current value, so dropping it from our apply does not reset
//!   the Deployment to one pod before the autoscaler acts (the hand-over the server-side
//!   apply documentation describes).
//!
//! Server-side apply with the field manager [`FIELD_MANAGER`] and `force`: re-applying an
//! unchanged Gateway changes nothing (no new resourceVersion), and fields we stop setting
//! are removed. Fields other managers own (an autoscaler's replicas, a cloud provider's
//! annotations) are left alone.

use gateway_types::gateways::{Gateway, GatewayStatusAddresses};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub mod desired;
pub mod names;
pub mod scaling;

use crate::crds::GatewayParametersSpec;
use tollgate_proxy::AccessLogArgs;

pub use desired::{Desired, REPLICAS_ANNOTATION, addresses, requested_addresses};
pub use names::{object_name, tls_secret_name};

/// Field manager of every provisioned object.
pub const FIELD_MANAGER: &str = "tollgate.dev/gateway-controller";
/// Field manager that holds a Deployment's `spec.replicas` while an autoscaler takes it over.
pub const HANDOVER_MANAGER: &str = "tollgate.dev/replicas-handover";

/// Settings of provisioned proxies.
#[derive(Debug, Clone)]
pub struct ProvisionConfig {
    /// Proxy container image.
    pub proxy_image: String,
    /// Type of the provisioned Service: `LoadBalancer` (also when empty), `ClusterIP` or
    /// `NodePort`.
    pub service_type: String,
    /// URL proxies use to reach the controller's push server.
    pub controller_url: String,
    /// Namespace the controller runs in (where its CA Secret lives).
    pub controller_namespace: String,
    /// Extra arguments for every provisioned proxy (the rate-limit storage flags).
    pub proxy_args: Vec<String>,
    /// The proxies' access log, unless their GatewayParameters say otherwise.
    pub access_log: AccessLogArgs,
}

impl Default for ProvisionConfig {
    fn default() -> Self {
        Self {
            proxy_image: "ghcr.io/tollgate-dev/tollgate-proxy:latest".into(),
            service_type: "LoadBalancer".into(),
            controller_url: "https://tollgate-controller.tollgate-system.svc:9443".into(),
            controller_namespace: "tollgate-system".into(),
            proxy_args: Vec::new(),
            access_log: AccessLogArgs::default(),
        }
    }
}

/// Errors applying or reading provisioned objects.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// An API call failed.
    #[error("{action} {kind} {namespace}/{name}: {source}")]
    Api {
        /// What was attempted.
        action: &'static str,
        /// Kind.
        kind: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Why (boxed: `kube::Error` is large, and errors are the rare path).
        source: Box<kube::Error>,
    },
    /// The Gateway cannot be provisioned as it is (e.g. a bad `tollgate.dev/replicas`
    /// annotation); nothing was applied. Worth an Event on the Gateway.
    #[error("Gateway {namespace}/{name}: {reason}")]
    InvalidGateway {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The [`ProvisionConfig`] is unusable (e.g. an unknown Service type).
    #[error("provisioning config: {0}")]
    InvalidConfig(String),
}

/// Creates or updates the proxy objects of an accepted Gateway (server-side apply; only the
/// leader calls this) with its merged GatewayParameters, and returns the addresses for
/// `status.addresses` read from the Service (empty while the API server has assigned none,
/// e.g. with a headless Service). `served` are the ports its route table serves
/// (ListenerSets' included).
pub async fn provision(
    client: &Client,
    config: &ProvisionConfig,
    gateway: &Gateway,
    params: &GatewayParametersSpec,
    served: &[(u16, tollgate_api::Protocol)],
) -> Result<Vec<GatewayStatusAddresses>, ProvisionError> {
    let desired = desired::desired(config, gateway, params, served)?;
    let gw_name = gateway.metadata.name.as_deref().unwrap_or_default();
    let namespace = desired
        .deployment
        .metadata
        .namespace
        .clone()
        .unwrap_or_default();
    let name = object_name(gw_name);
    // An autoscaler no longer wanted goes first, so it cannot rescale the replicas set next.
    if desired.autoscaler.is_none() {
        delete::<HorizontalPodAutoscaler>(client, &namespace, &name, gw_name).await?;
    } else {
        hand_over_replicas(client, &namespace, &name).await?;
    }
    apply(client, &desired.service_account).await?;
    apply(client, &desired.deployment).await?;
    let service = apply(client, &desired.service).await?;
    if let Some(hpa) = &desired.autoscaler {
        apply(client, hpa).await?;
    }
    match &desired.disruption_budget {
        Some(pdb) => {
            apply(client, pdb).await?;
        }
        None => delete::<PodDisruptionBudget>(client, &namespace, &name, gw_name).await?,
    }
    Ok(addresses(&service))
}

/// When our field manager owns the Deployment's `spec.replicas`, gives it to
/// [`HANDOVER_MANAGER`] at its current value: our next apply leaves the field out for the
/// autoscaler, and a field no manager owns would be reset to the default of one pod.
async fn hand_over_replicas(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<(), ProvisionError> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let err = |action: &'static str, source| ProvisionError::Api {
        action,
        kind: "Deployment",
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        source: Box::new(source),
    };
    let Some(current) = api.get_opt(name).await.map_err(|e| err("get", e))? else {
        return Ok(());
    };
    let ours = current.metadata.managed_fields.iter().flatten().any(|m| {
        m.manager.as_deref() == Some(FIELD_MANAGER)
            && m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:spec/f:replicas").is_some())
    });
    let Some(replicas) = current.spec.as_ref().and_then(|s| s.replicas) else {
        return Ok(());
    };
    if !ours {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas},
    });
    api.patch(
        name,
        &PatchParams::apply(HANDOVER_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| err("hand over replicas of", e))?;
    Ok(())
}

/// Deletes the proxy objects of a Gateway that is gone or no longer ours (owner references
/// let the garbage collector do this too; this does not wait for it). Objects already gone
/// are fine; objects of that name that Tollgate did not create for this Gateway are left
/// alone.
pub async fn deprovision(
    client: &Client,
    namespace: &str,
    gateway_name: &str,
) -> Result<(), ProvisionError> {
    let name = object_name(gateway_name);
    delete::<HorizontalPodAutoscaler>(client, namespace, &name, gateway_name).await?;
    delete::<PodDisruptionBudget>(client, namespace, &name, gateway_name).await?;
    delete::<Service>(client, namespace, &name, gateway_name).await?;
    delete::<Deployment>(client, namespace, &name, gateway_name).await?;
    delete::<ServiceAccount>(client, namespace, &name, gateway_name).await
}

/// Server-side applies `object` (named and namespaced) and returns what the server stored.
async fn apply<K>(client: &Client, object: &K) -> Result<K, ProvisionError>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Serialize
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let meta = object.meta();
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let api: Api<K> = Api::namespaced(client.clone(), &namespace);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&name, &params, &Patch::Apply(object))
        .await
        .map_err(|source| ProvisionError::Api {
            action: "apply",
            kind: kind::<K>(),
            namespace,
            name,
            source: Box::new(source),
        })
}

/// Deletes `namespace/name` if it is labelled as Tollgate's object for `gateway_name`; the
/// uid precondition makes sure it is the object just checked.
async fn delete<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    gateway_name: &str,
) -> Result<(), ProvisionError>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let err = |action: &'static str, source| ProvisionError::Api {
        action,
        kind: kind::<K>(),
        namespace: namespace.to_string(),
        name: name.to_string(),
        source: Box::new(source),
    };
    let Some(object) = api.get_opt(name).await.map_err(|e| err("get", e))? else {
        return Ok(());
    };
    let meta = object.meta();
    let labels = meta.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    let ours = label("app.kubernetes.io/managed-by") == Some(desired::MANAGED_BY)
        && label(desired::GATEWAY_NAME_LABEL)
            == Some(names::gateway_label_value(gateway_name).as_str());
    if !ours || meta.deletion_timestamp.is_some() {
        return Ok(());
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: meta.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        // Gone meanwhile (404), or replaced by another object of that name (409: uid
        // precondition failed): either way not ours to delete any more.
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(e) => Err(err("delete", e)),
    }
}

fn kind<K: Resource<DynamicType = ()>>() -> &'static str {
    // Only the kinds above come through here; `kind` returns a borrowed static str
    // for k8s-openapi types, so this avoids an allocation per error.
    match K::kind(&()).as_ref() {
        "Service" => "Service",
        "Deployment" => "Deployment",
        "ServiceAccount" => "ServiceAccount",
        "HorizontalPodAutoscaler" => "HorizontalPodAutoscaler",
        "PodDisruptionBudget" => "PodDisruptionBudget",
        _ => "object",
    }
}
