//! The objects a Gateway's proxy needs, as plain values: no API calls, no clock.
//!
//! In: a [`ProvisionConfig`], a Gateway as read from the API server (it must carry its
//! namespace and uid, for the owner reference) and its merged, checked GatewayParameters.
//! Out: [`Desired`], the ServiceAccount, Deployment, Service and, when the parameters ask for
//! them, HorizontalPodAutoscaler and PodDisruptionBudget ([`super::scaling`]) to server-side
//! apply, or a [`ProvisionError`] saying why the
//! Gateway cannot be provisioned (nothing is applied then, so a bad edit never takes down a
//! running proxy). [`addresses`] turns the applied Service into `status.addresses`.
//!
//! Everything here is deterministic (maps are `BTreeMap`s, ports sorted), so applying the
//! same Gateway twice sends the same bytes and the API server records no change.

use std::collections::BTreeMap;

use gateway_types::gateways::{Gateway, GatewayStatusAddresses};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecretVolumeSource, SecurityContext, Service,
    ServiceAccount, ServicePort, ServiceSpec, Sysctl, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;

use super::names::{gateway_label_value, object_name, tls_secret_name};
use super::scaling;
use super::{ProvisionConfig, ProvisionError};
use crate::compile::parameters::{access_log_args, cache_size, tracing_args};
use crate::crds::GatewayParametersSpec;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use tollgate_api::Protocol;

pub use crate::compile::parameters::{MAX_REPLICAS, REPLICAS_ANNOTATION};
/// Port of the proxy's admin server (`/healthz`, `/readyz`, `/metrics`) inside the pod.
pub const ADMIN_PORT: i32 = 9902;
/// Where the proxy TLS Secret is mounted.
pub const TLS_DIR: &str = "/etc/tollgate/tls";
/// Where the proxy keeps its last good table (an emptyDir: survives container restarts).
pub const STATE_DIR: &str = "/var/lib/tollgate";

/// `app.kubernetes.io/name` of every provisioned object.
pub const APP_NAME: &str = "tollgate-proxy";
/// `app.kubernetes.io/managed-by` of every provisioned object.
pub const MANAGED_BY: &str = "tollgate";
/// The label GEP-1762 requires on generated resources (the conformance test selects by it).
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
/// The label GEP-1762 recommends on generated resources.
pub const GATEWAY_CLASS_LABEL: &str = "gateway.networking.k8s.io/gateway-class-name";

const NAME_LABEL: &str = "app.kubernetes.io/name";
const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// UID and GID of distroless' `nonroot` user, the proxy image's user.
const NONROOT_ID: i64 = 65532;
/// Ports below this need privilege to bind (`net.ipv4.ip_unprivileged_port_start`).
const FIRST_UNPRIVILEGED_PORT: i32 = 1024;

/// The objects of one Gateway, ready for server-side apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// The proxy's ServiceAccount (no token mounted: the proxy does not call the API).
    pub service_account: ServiceAccount,
    /// The proxy Deployment.
    pub deployment: Deployment,
    /// The Service exposing every listener port.
    pub service: Service,
    /// The autoscaler the parameters ask for; `None`: none (one left over is deleted).
    pub autoscaler: Option<HorizontalPodAutoscaler>,
    /// The disruption budget the parameters ask for; `None`: none.
    pub disruption_budget: Option<PodDisruptionBudget>,
}

/// One Service/container port: a distinct (port, L4 protocol) of the Gateway's listeners.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ListenerPort {
    name: String,
    port: i32,
    protocol: &'static str,
}

/// Builds the desired objects of `gateway` with its `params` (checked by the compiler);
/// `extra` are the ports its accepted ListenerSets add (port, protocol), exposed beside its
/// own listeners'.
pub fn desired(
    config: &ProvisionConfig,
    gateway: &Gateway,
    params: &GatewayParametersSpec,
    extra: &[(u16, Protocol)],
) -> Result<Desired, ProvisionError> {
    let gw_name = gateway.metadata.name.clone().unwrap_or_default();
    let namespace = gateway.metadata.namespace.clone().unwrap_or_default();
    let invalid = |reason: String| ProvisionError::InvalidGateway {
        namespace: namespace.clone(),
        name: gw_name.clone(),
        reason,
    };
    if gw_name.is_empty() || namespace.is_empty() {
        return Err(invalid("the Gateway has no name or namespace".into()));
    }
    let owner = owner_reference(gateway)
        .ok_or_else(|| invalid("the Gateway has no uid (not read from the API server)".into()))?;
    let service_type = match params.service.as_ref().and_then(|s| s.type_) {
        Some(t) => t.as_str(),
        None => service_type(config)?,
    };
    // Parameters that scale win; without them the annotation (the compiler drops a class's
    // scaling when a Gateway carries the annotation).
    let replicas = match (&params.autoscaling, params.replicas) {
        (Some(_), _) => None,
        (None, Some(n)) => Some(n),
        (None, None) => replicas(gateway).map_err(invalid)?,
    };
    let ports = listener_ports(gateway, extra);
    if ports.is_empty() {
        return Err(invalid("the Gateway has no listeners".into()));
    }
    if ports.iter().any(|p| p.port == ADMIN_PORT) {
        return Err(invalid(format!(
            "listener port {ADMIN_PORT} is the proxy's admin port"
        )));
    }

    let name = object_name(&gw_name);
    let infra = gateway.spec.infrastructure.as_ref();
    let infra_labels = infra.and_then(|i| i.labels.clone()).unwrap_or_default();
    let annotations = infra
        .and_then(|i| i.annotations.clone())
        .unwrap_or_default();
    let selector = selector_labels(&gw_name);
    // Ours win over `infrastructure.labels`: the selector must keep matching.
    let mut labels = infra_labels;
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    labels.insert(
        GATEWAY_CLASS_LABEL.into(),
        gateway_label_value(&gateway.spec.gateway_class_name),
    );
    labels.extend(selector.clone());

    let meta = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(namespace.clone()),
        labels: Some(labels.clone()),
        annotations: non_empty(annotations.clone()),
        owner_references: Some(vec![owner]),
        ..ObjectMeta::default()
    };

    let service_account = ServiceAccount {
        metadata: meta.clone(),
        automount_service_account_token: Some(false),
        ..ServiceAccount::default()
    };

    let pod = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels),
            annotations: non_empty(annotations.clone()),
            ..ObjectMeta::default()
        }),
        spec: Some(scaling::with_parameters(
            pod_spec(config, params, &namespace, &gw_name, &name, &ports),
            params,
            &selector,
        )),
    };
    let deployment = Deployment {
        metadata: meta.clone(),
        spec: Some(DeploymentSpec {
            // None leaves the field unowned: the API server defaults it to 1 and an
            // autoscaler may own it (see `super::provision` for the hand-over to one).
            replicas,
            selector: LabelSelector {
                match_labels: Some(selector.clone()),
                ..LabelSelector::default()
            },
            template: pod,
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    };

    let autoscaler = params
        .autoscaling
        .as_ref()
        .map(|a| scaling::autoscaler(&meta, a));
    let disruption_budget = params
        .pod_disruption_budget
        .as_ref()
        .map(|b| scaling::disruption_budget(&meta, b, &selector));
    let mut service_meta = meta;
    if let Some(extra) = params.service.as_ref().and_then(|s| s.annotations.as_ref()) {
        let mut all = annotations;
        all.extend(extra.clone());
        service_meta.annotations = non_empty(all);
    }
    let service = Service {
        metadata: service_meta,
        spec: Some(ServiceSpec {
            type_: Some(service_type.into()),
            // A static address (GatewayStaticAddresses): asked of the load balancer, which
            // assigns it or not; the Gateway is Programmed only once it is assigned.
            load_balancer_ip: (service_type == "LoadBalancer")
                .then(|| requested_addresses(gateway).into_iter().next())
                .flatten(),
            selector: Some(selector),
            ports: Some(
                ports
                    .iter()
                    .map(|p| ServicePort {
                        name: Some(p.name.clone()),
                        port: p.port,
                        protocol: Some(p.protocol.into()),
                        target_port: Some(IntOrString::Int(p.port)),
                        ..ServicePort::default()
                    })
                    .collect(),
            ),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };

    Ok(Desired {
        service_account,
        deployment,
        service,
        autoscaler,
        disruption_budget,
    })
}

/// The IP addresses a Gateway asks for in `spec.addresses` (type `IPAddress`, the default),
/// in order. Its Service requests the first one; the compiler has rejected other types.
pub fn requested_addresses(gateway: &Gateway) -> Vec<String> {
    gateway
        .spec
        .addresses
        .iter()
        .flatten()
        .filter(|a| a.r#type.as_deref().unwrap_or("IPAddress") == "IPAddress")
        .filter_map(|a| a.value.clone().filter(|v| !v.is_empty()))
        .collect()
}

/// `status.addresses` from a Service read back from the API server: the load balancer's
/// ingress points for a `LoadBalancer` that has them (IP → `IPAddress`, hostname →
/// `Hostname`), otherwise the cluster IPs (`IPAddress`). Empty when none is assigned.
pub fn addresses(service: &Service) -> Vec<GatewayStatusAddresses> {
    let spec = service.spec.as_ref();
    let is_lb = spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer");
    let mut out = Vec::new();
    if is_lb {
        let ingress = service
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref());
        for point in ingress.into_iter().flatten() {
            if let Some(ip) = point.ip.as_deref().filter(|ip| !ip.is_empty()) {
                out.push(address("IPAddress", ip));
            } else if let Some(host) = point.hostname.as_deref().filter(|h| !h.is_empty()) {
                out.push(address("Hostname", host));
            }
        }
        if !out.is_empty() {
            return out;
        }
    }
    let cluster_ips = spec
        .and_then(|s| s.cluster_ips.clone())
        .filter(|ips| !ips.is_empty())
        .or_else(|| spec.and_then(|s| s.cluster_ip.clone()).map(|ip| vec![ip]))
        .unwrap_or_default();
    cluster_ips
        .iter()
        .filter(|ip| !ip.is_empty() && ip.as_str() != "None")
        .map(|ip| address("IPAddress", ip))
        .collect()
}

fn address(type_: &str, value: &str) -> GatewayStatusAddresses {
    GatewayStatusAddresses {
        r#type: Some(type_.into()),
        value: value.into(),
    }
}

/// The labels the Deployment and the Service select pods by. Never change these: a
/// Deployment's selector is immutable.
fn selector_labels(gateway: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME_LABEL.into(), APP_NAME.into()),
        (GATEWAY_NAME_LABEL.into(), gateway_label_value(gateway)),
    ])
}

/// A controller reference that also blocks the Gateway's foreground deletion until the
/// object is gone (kube's `controller_owner_ref` leaves `blockOwnerDeletion` unset).
fn owner_reference(gateway: &Gateway) -> Option<OwnerReference> {
    Some(OwnerReference {
        block_owner_deletion: Some(true),
        ..gateway.controller_owner_ref(&())?
    })
}

fn service_type(config: &ProvisionConfig) -> Result<&'static str, ProvisionError> {
    match config.service_type.as_str() {
        "" | "LoadBalancer" => Ok("LoadBalancer"),
        "ClusterIP" => Ok("ClusterIP"),
        "NodePort" => Ok("NodePort"),
        other => Err(ProvisionError::InvalidConfig(format!(
            "service type {other:?}: expected LoadBalancer, ClusterIP or NodePort"
        ))),
    }
}

/// The replica count from [`REPLICAS_ANNOTATION`], `None` when the annotation is absent.
fn replicas(gateway: &Gateway) -> Result<Option<i32>, String> {
    let Some(raw) = gateway
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REPLICAS_ANNOTATION))
    else {
        return Ok(None);
    };
    match raw.trim().parse::<i32>() {
        Ok(n) if (0..=MAX_REPLICAS).contains(&n) => Ok(Some(n)),
        _ => Err(format!(
            "annotation {REPLICAS_ANNOTATION}={raw:?}: expected an integer from 0 to {MAX_REPLICAS}"
        )),
    }
}

/// Distinct (port, L4 protocol) pairs of the listeners, sorted; each named after the first
/// listener using it, `<protocol>-<port>` (at most 11 characters, a valid port name).
fn listener_ports(gateway: &Gateway, extra: &[(u16, Protocol)]) -> Vec<ListenerPort> {
    let mut ports: BTreeMap<(i32, &'static str), String> = BTreeMap::new();
    let own = gateway
        .spec
        .listeners
        .iter()
        .map(|l| (l.port, l.protocol.as_str()));
    let sets = extra.iter().map(|(port, p)| {
        let name = match p {
            Protocol::Http => "HTTP",
            Protocol::Https => "HTTPS",
            Protocol::Tls => "TLS",
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        };
        (i32::from(*port), name)
    });
    for (port, protocol) in own.chain(sets) {
        let l4 = if protocol == "UDP" { "UDP" } else { "TCP" };
        let prefix = match protocol {
            "HTTP" | "HTTPS" | "TLS" | "TCP" | "UDP" => protocol.to_ascii_lowercase(),
            // Implementation-specific protocols (`example.com/x`) are no valid port names.
            _ => l4.to_ascii_lowercase(),
        };
        ports
            .entry((port, l4))
            .or_insert_with(|| format!("{prefix}-{port}"));
    }
    ports
        .into_iter()
        .map(|((port, protocol), name)| ListenerPort {
            name,
            port,
            protocol,
        })
        .collect()
}

fn pod_spec(
    config: &ProvisionConfig,
    params: &GatewayParametersSpec,
    namespace: &str,
    gateway: &str,
    name: &str,
    ports: &[ListenerPort],
) -> PodSpec {
    let lowest = ports
        .iter()
        .map(|p| p.port)
        .min()
        .unwrap_or(FIRST_UNPRIVILEGED_PORT);
    let low_ports = lowest < FIRST_UNPRIVILEGED_PORT;
    let mut container_ports: Vec<ContainerPort> = ports
        .iter()
        .map(|p| ContainerPort {
            name: Some(p.name.clone()),
            container_port: p.port,
            protocol: Some(p.protocol.into()),
            ..ContainerPort::default()
        })
        .collect();
    container_ports.push(ContainerPort {
        name: Some("admin".into()),
        container_port: ADMIN_PORT,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    });
    let probe = |path: &str, period: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("admin".into()),
            scheme: Some("HTTP".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(2),
        failure_threshold: Some(3),
        ..Probe::default()
    };
    let container = Container {
        name: "proxy".into(),
        image: Some(config.proxy_image.clone()),
        args: Some(
            [
                "--controller",
                &config.controller_url,
                "--gateway",
                &format!("{namespace}/{gateway}"),
                "--tls-dir",
                TLS_DIR,
                "--state-dir",
                STATE_DIR,
                // The default admin address is loopback; the kubelet probes the pod IP.
                "--admin",
                &format!("0.0.0.0:{ADMIN_PORT}"),
            ]
            .map(String::from)
            .into_iter()
            .chain(config.proxy_args.iter().cloned())
            .chain(
                params
                    .access_log
                    .as_ref()
                    .map_or_else(
                        || config.access_log.clone(),
                        |l| access_log_args(l, &config.access_log),
                    )
                    .to_proxy_flags(),
            )
            .chain(params.workers.map(|w| format!("--workers={w}")))
            .chain(
                params
                    .cache
                    .as_ref()
                    .and_then(|c| c.size.as_ref())
                    .and_then(|s| cache_size(&s.0).ok())
                    .map(|b| format!("--cache-size={b}")),
            )
            .chain(
                params
                    .telemetry
                    .as_ref()
                    .and_then(|t| t.tracing.as_ref())
                    .map(|t| tracing_args(t).to_flags())
                    .unwrap_or_default(),
            )
            .collect(),
        ),
        env: Some(
            [
                field_env("POD_NAME", "metadata.name"),
                field_env("POD_NAMESPACE", "metadata.namespace"),
            ]
            .into_iter()
            .chain(params.log_level.map(|l| EnvVar {
                name: "RUST_LOG".into(),
                value: Some(l.as_str().into()),
                ..EnvVar::default()
            }))
            .collect(),
        ),
        ports: Some(container_ports),
        readiness_probe: Some(probe("/readyz", 5)),
        liveness_probe: Some(probe("/healthz", 10)),
        resources: Some(
            params
                .resources
                .clone()
                .unwrap_or_else(|| ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("cpu".into(), Quantity("100m".into())),
                        ("memory".into(), Quantity("64Mi".into())),
                    ])),
                    ..ResourceRequirements::default()
                }),
        ),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                // Asked for by listeners below 1024. On its own it does not let a non-root
                // process bind (Kubernetes grants no ambient capabilities, and
                // no_new_privs ignores file capabilities); the sysctl below does.
                add: low_ports.then(|| vec!["NET_BIND_SERVICE".into()]),
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "tls".into(),
                mount_path: TLS_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "state".into(),
                mount_path: STATE_DIR.into(),
                ..VolumeMount::default()
            },
        ]),
        ..Container::default()
    };
    PodSpec {
        service_account_name: Some(name.into()),
        automount_service_account_token: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(NONROOT_ID),
            run_as_group: Some(NONROOT_ID),
            fs_group: Some(NONROOT_ID),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            // A namespaced "safe" sysctl (allowed by default since Kubernetes 1.22, and by
            // the restricted Pod Security Standard): ports from the lowest listener port up
            // become bindable without privilege, in this pod's network namespace only.
            sysctls: low_ports.then(|| {
                vec![Sysctl {
                    name: "net.ipv4.ip_unprivileged_port_start".into(),
                    value: lowest.to_string(),
                }]
            }),
            ..PodSecurityContext::default()
        }),
        containers: vec![container],
        volumes: Some(vec![
            Volume {
                name: "tls".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(tls_secret_name(gateway)),
                    default_mode: Some(0o440),
                    ..SecretVolumeSource::default()
                }),
                ..Volume::default()
            },
            Volume {
                name: "state".into(),
                empty_dir: Some(EmptyDirVolumeSource {
                    size_limit: Some(Quantity("64Mi".into())),
                    ..EmptyDirVolumeSource::default()
                }),
                ..Volume::default()
            },
        ]),
        ..PodSpec::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn non_empty(map: BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (!map.is_empty()).then_some(map)
}

#[cfg(test)]
#[path = "desired_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "addresses_tests.rs"]
mod addresses_tests;

#[cfg(test)]
#[path = "parameters_tests.rs"]
mod parameters_tests;
