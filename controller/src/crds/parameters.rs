//! GatewayParameters: how the proxies Tollgate provisions for a Gateway run.
//!
//! Referenced by a GatewayClass `spec.parametersRef` (defaults for every Gateway of the
//! class; the reference names the namespace) and by a Gateway
//! `spec.infrastructure.parametersRef` (that Gateway, in its namespace). A Gateway's fields
//! replace the class's field by field; the compiler ([`crate::compile::parameters`]) resolves,
//! merges and checks them, and the provisioner applies what they say. The object has no status
//! of its own: the Gateways and GatewayClasses referencing it say whether it is valid.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Settings of the proxies provisioned for a Gateway (or every Gateway of a class).
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tollgate.dev",
    version = "v1alpha1",
    kind = "GatewayParameters",
    plural = "gatewayparameters",
    shortname = "gwp",
    namespaced,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Min","type":"integer","jsonPath":".spec.autoscaling.minReplicas"}"#,
    printcolumn = r#"{"name":"Max","type":"integer","jsonPath":".spec.autoscaling.maxReplicas"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("!has(self.spec.replicas) || !has(self.spec.autoscaling)").message("spec.replicas and spec.autoscaling are exclusive")
)]
#[serde(rename_all = "camelCase")]
pub struct GatewayParametersSpec {
    /// A fixed number of proxy pods (0 to 100). Exclusive with `autoscaling`.
    #[schemars(range(min = 0, max = 100))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// A HorizontalPodAutoscaler (autoscaling/v2) scaling the proxies on CPU. Exclusive with
    /// `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
    /// The proxy container's resources (default: requests cpu 100m, memory 64Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Runtime worker threads of each proxy (1 to 64; default: one per core it sees).
    #[schemars(range(min = 1, max = 64))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<u32>,
    /// A PodDisruptionBudget over the proxy pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_disruption_budget: Option<PodDisruptionBudgetSpec>,
    /// Topology spread constraints of the proxy pods; one without a `labelSelector` selects
    /// the Gateway's proxy pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    /// Node selector of the proxy pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Tolerations of the proxy pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Priority class of the proxy pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// The Service exposing the listeners.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceParameters>,
    /// The proxies' own log level: error, warn, info (default), debug or trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_level: Option<LogLevel>,
    /// The proxies' access log; unset fields keep the controller's `--access-log*` flags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log: Option<AccessLogParameters>,
    /// The proxies' telemetry beyond metrics and logs. A Gateway's section replaces its
    /// class's whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<TelemetryParameters>,
    /// The proxies' shared HTTP cache, which CachePolicies use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheParameters>,
}

/// The shared HTTP cache of each proxy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheParameters {
    /// Its memory bound, a quantity of bytes (`256Mi`, `1G`; default `64Mi`, `0` turns the
    /// cache off; at most 1Ti). It is part of the proxy's memory: raise `resources` with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Quantity>,
}

/// Telemetry of the proxies.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TelemetryParameters {
    /// OpenTelemetry tracing (the proxies' `--otlp-*` and `--trace-sampling` flags); off
    /// without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<TracingParameters>,
}

/// Where and how the proxies export spans.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TracingParameters {
    /// The OTLP collector's URL, e.g. `http://otel-collector.observability:4317`.
    pub endpoint: String,
    /// `grpc` (default) or `http` (OTLP/HTTP with protobuf bodies, posted to
    /// `<endpoint>/v1/traces`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<OtlpProtocol>,
    /// Share of new traces sampled, 0 to 1 (default 1); a request with a W3C `traceparent`
    /// follows its sampled flag.
    #[schemars(range(min = 0.0, max = 1.0))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_ratio: Option<f64>,
}

/// An OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OtlpProtocol {
    /// OTLP/gRPC.
    Grpc,
    /// OTLP/HTTP with protobuf bodies.
    Http,
}

/// A HorizontalPodAutoscaler over the proxy Deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Autoscaling {
    /// Fewest proxies (1 to 100; default 1).
    #[schemars(range(min = 1, max = 100))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_replicas: Option<i32>,
    /// Most proxies (1 to 100, at least `minReplicas`).
    #[schemars(range(min = 1, max = 100))]
    pub max_replicas: i32,
    /// Average CPU use, in percent of the CPU request, the autoscaler aims at (1 to 100;
    /// default 80).
    #[serde(
        rename = "targetCPUUtilizationPercentage",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 100))]
    pub target_cpu_utilization_percentage: Option<i32>,
}

/// A PodDisruptionBudget: exactly one of the two.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodDisruptionBudgetSpec {
    /// Proxy pods that must stay available during a voluntary disruption (a count or a
    /// percentage such as `50%`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<IntOrString>,
    /// Proxy pods that may be unavailable during a voluntary disruption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
}

/// The Service exposing a Gateway's listeners.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceParameters {
    /// `LoadBalancer`, `ClusterIP` or `NodePort` (default: the controller's
    /// `--service-type`).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<ServiceType>,
    /// Annotations of the Service only (a cloud load balancer's settings); they win over the
    /// Gateway's `spec.infrastructure.annotations`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// Type of the provisioned Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ServiceType {
    /// A cloud (or MetalLB) load balancer address.
    LoadBalancer,
    /// A cluster-internal address only.
    #[serde(rename = "ClusterIP")]
    ClusterIp,
    /// A port on every node.
    NodePort,
}

impl ServiceType {
    /// The Service `spec.type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LoadBalancer => "LoadBalancer",
            Self::ClusterIp => "ClusterIP",
            Self::NodePort => "NodePort",
        }
    }
}

/// A proxy log level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warn,
    /// The default.
    Info,
    /// Verbose.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    /// The `RUST_LOG` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warn => "warn",
            Self::Info => "info",
            Self::Debug => "debug",
            Self::Trace => "trace",
        }
    }
}

/// The proxies' access log (the `--access-log*` flags of `tollgate-proxy`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessLogParameters {
    /// Whether a line is written per request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `json` or `logfmt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<AccessLogFormat>,
    /// The fields written (default: all), as `--access-log-fields` names them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<String>>,
    /// A CEL expression choosing the requests logged, as `--access-log-filter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
}

/// An access log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AccessLogFormat {
    /// One JSON object per line.
    Json,
    /// `key=value` pairs.
    Logfmt,
}
