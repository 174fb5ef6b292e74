//! Tests of what GatewayParameters change in the desired objects.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn gateway(annotations: &str) -> Gateway {
    serde_yaml_ng::from_str(&format!(
        r"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: web, namespace: apps, uid: 0b8a5c36-6d0c-4f7e-9a51-3f6f5c1d2e10{annotations}}}
spec:
  gatewayClassName: tollgate
  infrastructure: {{annotations: {{example.com/team: payments}}}}
  listeners: [{{name: http, port: 80, protocol: HTTP}}]
"
    ))
    .unwrap()
}

fn config() -> ProvisionConfig {
    ProvisionConfig {
        proxy_args: vec!["--redis-url=redis://redis.cache:6379".into()],
        access_log: tollgate_proxy::AccessLogArgs {
            access_log_format: tollgate_proxy::AccessLogFormat::Logfmt,
            access_log_filter: Some("response.code >= 400".into()),
            ..tollgate_proxy::AccessLogArgs::default()
        },
        ..ProvisionConfig::default()
    }
}

fn params(yaml: &str) -> GatewayParametersSpec {
    serde_yaml_ng::from_str(yaml).unwrap()
}

fn build(yaml: &str) -> Desired {
    desired(&config(), &gateway(""), &params(yaml), &[]).unwrap()
}

use super::tests::pod_spec_of as pod;

fn container(d: &Desired) -> &Container {
    &pod(d).containers[0]
}

fn replicas(d: &Desired) -> Option<i32> {
    d.deployment.spec.as_ref().unwrap().replicas
}

#[test]
fn without_parameters_nothing_extra_is_made() {
    let d = build("{}");
    assert!(d.autoscaler.is_none() && d.disruption_budget.is_none());
    assert_eq!(replicas(&d), None);
    let p = pod(&d);
    assert!(p.node_selector.is_none() && p.tolerations.is_none());
    assert!(p.priority_class_name.is_none() && p.topology_spread_constraints.is_none());
    let args = container(&d).args.as_ref().unwrap();
    assert!(!args.iter().any(|a| a.starts_with("--workers")));
    assert!(!args.iter().any(|a| a.starts_with("--cache-size")));
    // The controller's own access log flags reach the proxy.
    assert!(
        args.contains(&"--access-log-format=logfmt".to_owned()),
        "{args:?}"
    );
    assert!(args.contains(&"--access-log-filter=response.code >= 400".to_owned()));
    assert!(
        !container(&d)
            .env
            .iter()
            .flatten()
            .any(|e| e.name == "RUST_LOG")
    );
}

#[test]
fn replicas_win_over_the_annotation_and_autoscaling_leaves_them_unset() {
    let annotated = ", annotations: {tollgate.dev/replicas: '4'}";
    let d = desired(&config(), &gateway(annotated), &params("{}"), &[]).unwrap();
    assert_eq!(replicas(&d), Some(4), "the annotation still works alone");
    let d = desired(&config(), &gateway(annotated), &params("replicas: 6"), &[]).unwrap();
    assert_eq!(replicas(&d), Some(6));
    let d = build("autoscaling: {maxReplicas: 8}");
    assert_eq!(replicas(&d), None, "the autoscaler owns the count");
}

#[test]
fn autoscaling_makes_an_hpa_on_cpu_for_the_deployment() {
    let d =
        build("autoscaling: {minReplicas: 2, maxReplicas: 8, targetCPUUtilizationPercentage: 65}");
    let hpa = d.autoscaler.as_ref().unwrap();
    assert_eq!(
        hpa.metadata, d.deployment.metadata,
        "named, labelled and owned alike"
    );
    let spec = hpa.spec.as_ref().unwrap();
    assert_eq!(spec.scale_target_ref.kind, "Deployment");
    assert_eq!(
        spec.scale_target_ref.api_version.as_deref(),
        Some("apps/v1")
    );
    assert_eq!(
        Some(&spec.scale_target_ref.name),
        d.deployment.metadata.name.as_ref()
    );
    assert_eq!((spec.min_replicas, spec.max_replicas), (Some(2), 8));
    let metric = &spec.metrics.as_ref().unwrap()[0];
    let resource = metric.resource.as_ref().unwrap();
    assert_eq!(
        (metric.type_.as_str(), resource.name.as_str()),
        ("Resource", "cpu")
    );
    assert_eq!(resource.target.type_, "Utilization");
    assert_eq!(resource.target.average_utilization, Some(65));

    let defaults = build("autoscaling: {maxReplicas: 3}");
    let spec = defaults.autoscaler.as_ref().unwrap().spec.as_ref().unwrap();
    assert_eq!(spec.min_replicas, Some(1));
    let target = &spec.metrics.as_ref().unwrap()[0]
        .resource
        .as_ref()
        .unwrap()
        .target;
    assert_eq!(
        target.average_utilization,
        Some(scaling::DEFAULT_CPU_TARGET)
    );
}

#[test]
fn a_disruption_budget_selects_the_proxy_pods() {
    let d = build("podDisruptionBudget: {maxUnavailable: '25%'}");
    let pdb = d.disruption_budget.as_ref().unwrap();
    let spec = pdb.spec.as_ref().unwrap();
    assert_eq!(
        spec.max_unavailable,
        Some(IntOrString::String("25%".into()))
    );
    assert_eq!(spec.min_available, None);
    assert_eq!(
        spec.selector.as_ref().unwrap().match_labels,
        d.deployment.spec.as_ref().unwrap().selector.match_labels
    );
}

#[test]
fn pod_settings_reach_the_pod_template() {
    let d = build(
        r"
resources: {requests: {cpu: 500m, memory: 256Mi}, limits: {memory: 512Mi}}
workers: 4
cache: {size: 256Mi}
logLevel: debug
nodeSelector: {pool: edge}
tolerations: [{key: dedicated, operator: Equal, value: edge, effect: NoSchedule}]
priorityClassName: gateway-critical
topologySpreadConstraints:
- {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}
- {maxSkew: 2, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {x: y}}}
",
    );
    let c = container(&d);
    let resources = c.resources.as_ref().unwrap();
    assert_eq!(
        resources.requests.as_ref().unwrap()["cpu"],
        Quantity("500m".into())
    );
    assert_eq!(
        resources.limits.as_ref().unwrap()["memory"],
        Quantity("512Mi".into())
    );
    assert!(c.args.as_ref().unwrap().contains(&"--workers=4".to_owned()));
    assert!(
        c.args
            .as_ref()
            .unwrap()
            .contains(&"--cache-size=268435456".to_owned())
    );
    let log = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "RUST_LOG")
        .unwrap();
    assert_eq!(log.value.as_deref(), Some("debug"));
    let p = pod(&d);
    assert_eq!(p.node_selector.as_ref().unwrap()["pool"], "edge");
    assert_eq!(
        p.tolerations.as_ref().unwrap()[0].key.as_deref(),
        Some("dedicated")
    );
    assert_eq!(p.priority_class_name.as_deref(), Some("gateway-critical"));
    let spread = p.topology_spread_constraints.as_ref().unwrap();
    // A constraint without a selector spreads this Gateway's proxy pods; one with keeps it.
    assert_eq!(
        spread[0].label_selector.as_ref().unwrap().match_labels,
        d.deployment.spec.as_ref().unwrap().selector.match_labels
    );
    assert_eq!(
        spread[1]
            .label_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()["x"],
        "y"
    );
}

#[test]
fn service_type_and_annotations_apply_to_the_service_alone() {
    let d = build(
        "service: {type: NodePort, annotations: {lb.example.com/scheme: internal, example.com/team: edge}}",
    );
    let spec = d.service.spec.as_ref().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("NodePort"));
    let on_service = d.service.metadata.annotations.as_ref().unwrap();
    assert_eq!(on_service["lb.example.com/scheme"], "internal");
    // The parameters' annotation wins over the infrastructure one of the same key.
    assert_eq!(on_service["example.com/team"], "edge");
    let on_deployment = d.deployment.metadata.annotations.as_ref().unwrap();
    assert!(!on_deployment.contains_key("lb.example.com/scheme"));
    assert_eq!(on_deployment["example.com/team"], "payments");
}

#[test]
fn access_log_parameters_replace_the_controllers_flags_field_by_field() {
    let d = build("accessLog: {fields: [time, status, route]}");
    let args = container(&d).args.as_ref().unwrap();
    assert!(args.contains(&"--access-log-fields=time,status,route".to_owned()));
    // Unset in the parameters: the controller's flags stay.
    assert!(args.contains(&"--access-log-format=logfmt".to_owned()));
    assert!(args.contains(&"--access-log-filter=response.code >= 400".to_owned()));

    let d = build("accessLog: {enabled: false, format: json}");
    let args = container(&d).args.as_ref().unwrap();
    assert!(args.contains(&"--access-log=false".to_owned()), "{args:?}");
    assert!(
        !args.iter().any(|a| a.starts_with("--access-log-format")),
        "{args:?}"
    );
    // Each flag once: the proxy's parser refuses repeated flags.
    let mut names: Vec<&str> = args.iter().map(|a| a.split('=').next().unwrap()).collect();
    let all = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), all, "{args:?}");
}

#[test]
fn tracing_parameters_become_the_proxys_tracing_flags() {
    let d = build(
        "telemetry: {tracing: {endpoint: 'http://otel.observability:4318', protocol: http, samplingRatio: 0.25}}",
    );
    let args = container(&d).args.as_ref().unwrap();
    for flag in [
        "--otlp-endpoint=http://otel.observability:4318",
        "--otlp-protocol=http",
        "--trace-sampling=0.25",
    ] {
        assert!(args.contains(&flag.to_owned()), "{flag}: {args:?}");
    }
    // The proxy's own flag parser reads them back.
    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        tracing: tollgate_proxy::otel::TraceArgs,
    }
    let d = build("telemetry: {tracing: {endpoint: 'http://otel:4317'}}");
    let args = container(&d).args.as_ref().unwrap();
    let ours = args
        .iter()
        .filter(|a| a.starts_with("--otlp") || a.starts_with("--trace"));
    let parsed = <Flags as clap::Parser>::try_parse_from(
        std::iter::once("tollgate-proxy").chain(ours.map(String::as_str)),
    )
    .unwrap();
    let settings = parsed.tracing.settings().unwrap().unwrap();
    assert_eq!(settings.endpoint, "http://otel:4317");
    assert_eq!(settings.protocol, tollgate_proxy::otel::Protocol::Grpc);
    assert!((settings.sampling_ratio - 1.0).abs() < f64::EPSILON);
    // Without the section: tracing off, no flag.
    let d = build("workers: 2");
    let args = container(&d).args.as_ref().unwrap();
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--otlp") || a.starts_with("--trace")),
        "{args:?}"
    );
}
