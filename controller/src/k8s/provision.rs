//! Provisioning the proxy of each Gateway: a ServiceAccount, a Deployment and a Service,
//! owner-referenced to the Gateway.
//!
//! INTERFACE STUB: owned by the provisioning work.

use gateway_api::gateways::{Gateway, GatewayStatusAddresses};
use kube::Client;

/// Settings of provisioned proxies.
#[derive(Debug, Clone)]
pub struct ProvisionConfig {
    /// Proxy container image.
    pub proxy_image: String,
    /// Type of the provisioned Service (`LoadBalancer` by default).
    pub service_type: String,
    /// URL proxies use to reach the controller's push server.
    pub controller_url: String,
    /// Namespace the controller runs in (where its CA Secret lives).
    pub controller_namespace: String,
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
        /// Why.
        source: kube::Error,
    },
}

/// Creates or updates the proxy objects of an accepted Gateway (server-side apply; only the
/// leader calls this) and returns the addresses for `status.addresses` read from the Service.
pub async fn provision(
    client: &Client,
    config: &ProvisionConfig,
    gateway: &Gateway,
) -> Result<Vec<GatewayStatusAddresses>, ProvisionError> {
    let _ = (client, config, gateway);
    todo!("provision")
}

/// Deletes the proxy objects of a Gateway that is gone or no longer ours (owner references
/// let the garbage collector do this too; this does not wait for it).
pub async fn deprovision(
    client: &Client,
    namespace: &str,
    gateway_name: &str,
) -> Result<(), ProvisionError> {
    let _ = (client, namespace, gateway_name);
    todo!("provision")
}
