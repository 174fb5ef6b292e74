//! GatewayParameters: resolution from a GatewayClass and a Gateway, merge order, and the
//! `InvalidParameters` status of every reference that cannot be used.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use tollgate::compile::Output;
use tollgate::crds::GatewayParametersSpec;
use tollgate::crds::parameters::{LogLevel, ServiceType};
use tollgate_api::ObjectKey;

/// A class `params-class` naming `infra/class-defaults` (unless `class_ref` says otherwise), a
/// Gateway `infra/edge` of it with `gateway_infra` as its `spec.infrastructure`, and `extra`.
fn compile(class_ref: &str, gateway_meta: &str, gateway_infra: &str, extra: &str) -> Output {
    run(
        &[],
        &format!(
            r"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: params-class}}
spec:
  controllerName: tollgate.dev/gateway-controller
  {class_ref}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: infra{gateway_meta}}}
spec:
  gatewayClassName: params-class
  {gateway_infra}
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
---
{extra}
"
        ),
    )
}

const CLASS_REF: &str = "parametersRef: {group: tollgate.dev, kind: GatewayParameters, name: class-defaults, namespace: infra}";
const GATEWAY_REF: &str =
    "infrastructure: {parametersRef: {group: tollgate.dev, kind: GatewayParameters, name: edge}}";

const CLASS_DEFAULTS: &str = r"
apiVersion: tollgate.dev/v1alpha1
kind: GatewayParameters
metadata: {name: class-defaults, namespace: infra}
spec:
  replicas: 2
  workers: 2
  logLevel: warn
  nodeSelector: {pool: edge}
  service: {type: ClusterIP, annotations: {lb.example.com/scheme: internal}}
  accessLog: {format: logfmt, fields: [time, status]}
";

const EDGE: &str = r"
apiVersion: tollgate.dev/v1alpha1
kind: GatewayParameters
metadata: {name: edge, namespace: infra}
spec:
  autoscaling: {minReplicas: 3, maxReplicas: 10, targetCPUUtilizationPercentage: 60}
  logLevel: debug
  service: {annotations: {lb.example.com/scheme: internet-facing}}
  accessLog: {filter: 'response.code >= 500'}
";

fn edge() -> ObjectKey {
    ObjectKey::new("infra", "edge")
}

fn params(out: &Output) -> &GatewayParametersSpec {
    out.parameters[&edge()].as_ref().unwrap()
}

fn error(out: &Output) -> &str {
    out.parameters[&edge()].as_ref().unwrap_err()
}

fn class_accepted(out: &Output) -> (&str, &str, &str) {
    let c = cond(
        out.gateway_classes["params-class"]
            .conditions
            .as_deref()
            .unwrap(),
        "Accepted",
    );
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

#[test]
fn no_reference_gives_the_defaults() {
    let out = compile("", "", "", "");
    assert_eq!(params(&out), &GatewayParametersSpec::default());
    assert_eq!(class_accepted(&out).0, "True");
}

#[test]
fn a_class_reference_applies_to_its_gateways() {
    let out = compile(CLASS_REF, "", "", CLASS_DEFAULTS);
    assert_eq!(class_accepted(&out).0, "True");
    assert_cond(
        gateway_conds(&out, "infra", "edge"),
        "Accepted",
        "True",
        "Accepted",
    );
    let p = params(&out);
    assert_eq!(p.replicas, Some(2));
    assert_eq!(p.workers, Some(2));
    assert_eq!(p.log_level, Some(LogLevel::Warn));
    assert_eq!(p.node_selector.as_ref().unwrap()["pool"], "edge");
}

#[test]
fn a_gateway_reference_alone_applies() {
    let out = compile("", "", GATEWAY_REF, EDGE);
    let p = params(&out);
    assert_eq!(p.autoscaling.as_ref().unwrap().max_replicas, 10);
    assert_eq!(p.replicas, None);
    assert_cond(
        gateway_conds(&out, "infra", "edge"),
        "Accepted",
        "True",
        "Accepted",
    );
}

#[test]
fn the_gateways_fields_win_over_the_classs_field_by_field() {
    let out = compile(
        CLASS_REF,
        "",
        GATEWAY_REF,
        &format!("{CLASS_DEFAULTS}---{EDGE}"),
    );
    let p = params(&out);
    // Scaling is one choice: the Gateway's autoscaling replaces the class's replicas.
    assert_eq!(p.replicas, None);
    assert_eq!(p.autoscaling.as_ref().unwrap().min_replicas, Some(3));
    // The Gateway's own field wins; the class's fills what the Gateway leaves unset.
    assert_eq!(p.log_level, Some(LogLevel::Debug));
    assert_eq!(p.workers, Some(2));
    assert_eq!(p.node_selector.as_ref().unwrap()["pool"], "edge");
    // service and accessLog merge by field.
    let service = p.service.as_ref().unwrap();
    assert_eq!(service.type_, Some(ServiceType::ClusterIp));
    assert_eq!(
        service.annotations.as_ref().unwrap()["lb.example.com/scheme"],
        "internet-facing"
    );
    let log = p.access_log.as_ref().unwrap();
    assert_eq!(
        log.fields.as_deref(),
        Some(&["time".to_owned(), "status".to_owned()][..])
    );
    assert_eq!(log.filter.as_deref(), Some("response.code >= 500"));
    assert!(log.format.is_some());
}

#[test]
fn the_replicas_annotation_wins_over_the_class_but_not_over_the_gateways_parameters() {
    let annotated = ", annotations: {tollgate.dev/replicas: '4'}";
    let out = compile(CLASS_REF, annotated, "", CLASS_DEFAULTS);
    let p = params(&out);
    // The class's replicas are dropped; the provisioner reads the annotation.
    assert_eq!((p.replicas, p.autoscaling.is_none()), (None, true));
    assert_eq!(p.workers, Some(2), "the class's other fields still apply");

    let out = compile(
        CLASS_REF,
        annotated,
        GATEWAY_REF,
        &format!("{CLASS_DEFAULTS}---{EDGE}"),
    );
    assert!(params(&out).autoscaling.is_some());
}

#[test]
fn a_class_reference_that_cannot_be_used_is_invalid_parameters_and_its_gateways_served() {
    for (class_ref, extra, expect) in [
        (
            "parametersRef: {group: tollgate.dev, kind: GatewayParameters, name: missing, namespace: infra}",
            "",
            "GatewayParameters infra/missing not found",
        ),
        (
            "parametersRef: {group: tollgate.dev, kind: GatewayParameters, name: class-defaults}",
            CLASS_DEFAULTS,
            "the reference needs a namespace",
        ),
        (
            "parametersRef: {group: '', kind: ConfigMap, name: class-defaults, namespace: infra}",
            "",
            "only tollgate.dev/GatewayParameters is supported",
        ),
    ] {
        let out = compile(class_ref, "", "", extra);
        let (status, reason, message) = class_accepted(&out);
        assert_eq!(
            (status, reason),
            ("False", "InvalidParameters"),
            "{class_ref}"
        );
        assert!(message.contains(expect), "{message}");
        let gw = cond(gateway_conds(&out, "infra", "edge"), "Accepted");
        assert_eq!(
            (gw.status.as_str(), gw.reason.as_str()),
            ("False", "InvalidParameters")
        );
        assert!(gw.message.contains(expect), "{}", gw.message);
        assert!(error(&out).contains(expect), "{}", error(&out));
        // Served: a bad reference holds provisioning, never the routes.
        assert!(out.tables.contains_key(&edge()));
        assert_cond(
            gateway_conds(&out, "infra", "edge"),
            "Programmed",
            "True",
            "Programmed",
        );
    }
}

#[test]
fn a_gateway_reference_that_cannot_be_used_is_invalid_parameters() {
    for (infra, extra, expect) in [
        (GATEWAY_REF, "", "GatewayParameters infra/edge not found"),
        (
            "infrastructure: {parametersRef: {group: example.com, kind: Config, name: edge}}",
            EDGE,
            "only tollgate.dev/GatewayParameters is supported",
        ),
        // Another namespace's object of that name does not count.
        (
            GATEWAY_REF,
            "apiVersion: tollgate.dev/v1alpha1\nkind: GatewayParameters\nmetadata: {name: edge, namespace: other}\nspec: {replicas: 1}",
            "GatewayParameters infra/edge not found",
        ),
    ] {
        let out = compile("", "", infra, extra);
        let gw = cond(gateway_conds(&out, "infra", "edge"), "Accepted");
        assert_eq!(
            (gw.status.as_str(), gw.reason.as_str()),
            ("False", "InvalidParameters"),
            "{infra}"
        );
        assert!(gw.message.contains(expect), "{}", gw.message);
        assert!(
            gw.message.contains("nothing is provisioned or changed"),
            "{}",
            gw.message
        );
        assert!(error(&out).contains(expect));
        assert!(out.tables.contains_key(&edge()));
        assert_eq!(class_accepted(&out).0, "True", "the class has no reference");
    }
}

#[test]
fn parameters_out_of_range_are_invalid_with_every_reason() {
    for (spec, expect) in [
        (
            "replicas: 101",
            "spec.replicas 101 is out of range (0 to 100)",
        ),
        (
            "replicas: 2\n  autoscaling: {maxReplicas: 3}",
            "spec.replicas and spec.autoscaling are exclusive",
        ),
        (
            "autoscaling: {minReplicas: 5, maxReplicas: 3}",
            "spec.autoscaling.minReplicas 5 is above maxReplicas 3",
        ),
        (
            "autoscaling: {maxReplicas: 0}",
            "spec.autoscaling.maxReplicas 0 is out of range (1 to 100)",
        ),
        (
            "autoscaling: {maxReplicas: 3, targetCPUUtilizationPercentage: 0}",
            "targetCPUUtilizationPercentage 0 is out of range (1 to 100)",
        ),
        ("workers: 0", "spec.workers 0 is out of range (1 to 64)"),
        (
            "cache: {size: lots}",
            "spec.cache.size: \"lots\" is not a quantity",
        ),
        (
            "cache: {size: 1500m}",
            "spec.cache.size: \"1500m\" is not a whole number of bytes",
        ),
        (
            "cache: {size: 2Ti}",
            "spec.cache.size: \"2Ti\" is above the limit of 1Ti",
        ),
        (
            "podDisruptionBudget: {minAvailable: 1, maxUnavailable: 1}",
            "needs exactly one of minAvailable and maxUnavailable",
        ),
        (
            "podDisruptionBudget: {minAvailable: '150%'}",
            "spec.podDisruptionBudget.minAvailable: \"150%\" is neither a count nor a percentage",
        ),
        (
            "resources: {requests: {cpu: lots}}",
            "spec.resources.requests.cpu: \"lots\" is not a quantity",
        ),
        (
            "resources: {requests: {memory: 1Gi}, limits: {memory: 512Mi}}",
            "spec.resources.requests.memory is above spec.resources.limits.memory",
        ),
        (
            "priorityClassName: Not_Valid",
            "spec.priorityClassName \"Not_Valid\" is not a valid PriorityClass name",
        ),
        (
            "accessLog: {fields: [time, nonsense]}",
            "spec.accessLog: --access-log-fields",
        ),
        (
            "accessLog: {filter: 'response.code >'}",
            "spec.accessLog: --access-log-filter",
        ),
        (
            "telemetry: {tracing: {endpoint: 'collector:4317'}}",
            "spec.telemetry.tracing.endpoint \"collector:4317\" is not an http:// URL",
        ),
        (
            "telemetry: {tracing: {endpoint: 'https://c:4317'}}",
            "spec.telemetry.tracing.endpoint \"https://c:4317\" is not an http:// URL with a host (TLS to the collector is not supported)",
        ),
        (
            "telemetry: {tracing: {endpoint: 'http://c:4317', samplingRatio: 1.5}}",
            "spec.telemetry.tracing.samplingRatio 1.5 is out of range (0 to 1)",
        ),
    ] {
        let extra = format!(
            "apiVersion: tollgate.dev/v1alpha1\nkind: GatewayParameters\nmetadata: {{name: edge, namespace: infra}}\nspec:\n  {spec}\n"
        );
        let out = compile("", "", GATEWAY_REF, &extra);
        let gw = cond(gateway_conds(&out, "infra", "edge"), "Accepted");
        assert_eq!(gw.reason, "InvalidParameters", "{spec}");
        assert!(gw.message.contains(expect), "{spec}: {}", gw.message);
    }
}

#[test]
fn a_cache_size_is_a_quantity_of_bytes_and_the_gateways_replaces_the_classs() {
    let class = CLASS_DEFAULTS.replace("  workers: 2\n", "  workers: 2\n  cache: {size: 64Mi}\n");
    let out = compile(CLASS_REF, "", "", &class);
    assert_eq!(
        params(&out)
            .cache
            .as_ref()
            .unwrap()
            .size
            .as_ref()
            .unwrap()
            .0,
        "64Mi"
    );
    let edge = "apiVersion: tollgate.dev/v1alpha1\nkind: GatewayParameters\nmetadata: {name: edge, namespace: infra}\nspec:\n  cache: {size: 1G}\n";
    let out = compile(CLASS_REF, "", GATEWAY_REF, &format!("{class}\n---\n{edge}"));
    assert_cond(
        gateway_conds(&out, "infra", "edge"),
        "Accepted",
        "True",
        "Accepted",
    );
    let size = &params(&out)
        .cache
        .as_ref()
        .unwrap()
        .size
        .as_ref()
        .unwrap()
        .0;
    assert_eq!(size, "1G");
    assert_eq!(
        tollgate::compile::parameters::cache_size(size),
        Ok(1_000_000_000)
    );
    assert_eq!(
        tollgate::compile::parameters::cache_size("256Mi"),
        Ok(256 << 20)
    );
    assert_eq!(tollgate::compile::parameters::cache_size("0"), Ok(0));
}

#[test]
fn autoscaling_needs_a_cpu_request_after_the_merge() {
    // Valid alone each, together the class's resources leave the autoscaler nothing to
    // measure against.
    let class = r"
apiVersion: tollgate.dev/v1alpha1
kind: GatewayParameters
metadata: {name: class-defaults, namespace: infra}
spec:
  resources: {requests: {memory: 128Mi}}
";
    let out = compile(CLASS_REF, "", GATEWAY_REF, &format!("{class}---{EDGE}"));
    assert!(
        error(&out)
            .contains("spec.autoscaling scales on CPU, so spec.resources needs a cpu request"),
        "{}",
        error(&out)
    );
    assert_cond(
        gateway_conds(&out, "infra", "edge"),
        "Accepted",
        "False",
        "InvalidParameters",
    );
}
