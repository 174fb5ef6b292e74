//! Tests of the desired-object builders, on Gateways written as YAML.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn mk_gateway(yaml: &str) -> Gateway {
    serde_yaml_ng::from_str(yaml).unwrap()
}

fn mk_config() -> ProvisionConfig {
    ProvisionConfig {
        proxy_image: "example.com/tollgate-proxy:1.0".into(),
        service_type: "LoadBalancer".into(),
        controller_url: "https://tollgate.tollgate-system.svc:9443".into(),
        controller_namespace: "tollgate-system".into(),
        proxy_args: vec!["--redis-url=redis://redis.cache:6379".into()],
        access_log: tollgate_proxy::AccessLogArgs::default(),
    }
}

const WEB: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: web, namespace: apps, uid: 0b8a5c36-6d0c-4f7e-9a51-3f6f5c1d2e10}
spec:
  gatewayClassName: tollgate
  infrastructure:
    labels: {team: payments, app.kubernetes.io/name: hijack}
    annotations: {example.com/cost-center: "42"}
  listeners:
  - {name: http, port: 80, protocol: HTTP}
  - {name: https, port: 443, protocol: HTTPS, hostname: a.example.com}
  - {name: https-b, port: 443, protocol: HTTPS, hostname: b.example.com}
  - {name: dns, port: 53, protocol: UDP}
  - {name: alt, port: 8080, protocol: example.com/custom}
"#;

fn web() -> Desired {
    desired(
        &mk_config(),
        &mk_gateway(WEB),
        &GatewayParametersSpec::default(),
        &[],
    )
    .unwrap()
}

pub(super) fn pod_spec_of(d: &Desired) -> &PodSpec {
    d.deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
}

fn metas(d: &Desired) -> [&ObjectMeta; 4] {
    let template = d
        .deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref();
    [
        &d.service_account.metadata,
        &d.deployment.metadata,
        &d.service.metadata,
        template.unwrap(),
    ]
}

#[test]
fn all_objects_are_named_after_the_gateway_in_its_namespace() {
    let d = web();
    for meta in [
        &d.service_account.metadata,
        &d.deployment.metadata,
        &d.service.metadata,
    ] {
        assert_eq!(meta.name.as_deref(), Some("web-tollgate"));
        assert_eq!(meta.namespace.as_deref(), Some("apps"));
    }
    assert_eq!(
        pod_spec_of(&d).service_account_name.as_deref(),
        Some("web-tollgate")
    );
}

#[test]
fn owner_reference_is_a_blocking_controller_reference() {
    let d = web();
    for meta in [
        &d.service_account.metadata,
        &d.deployment.metadata,
        &d.service.metadata,
    ] {
        let refs = meta.owner_references.as_ref().unwrap();
        assert_eq!(refs.len(), 1);
        let r = &refs[0];
        assert_eq!(r.api_version, "gateway.networking.k8s.io/v1");
        assert_eq!(r.kind, "Gateway");
        assert_eq!(r.name, "web");
        assert_eq!(r.uid, "0b8a5c36-6d0c-4f7e-9a51-3f6f5c1d2e10");
        assert_eq!(r.controller, Some(true));
        assert_eq!(r.block_owner_deletion, Some(true));
    }
}

#[test]
fn infrastructure_labels_and_annotations_reach_every_object_and_the_pod_template() {
    let d = web();
    for meta in metas(&d) {
        let labels = meta.labels.as_ref().unwrap();
        assert_eq!(labels["team"], "payments");
        assert_eq!(labels[GATEWAY_NAME_LABEL], "web");
        assert_eq!(labels[GATEWAY_CLASS_LABEL], "tollgate");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "tollgate");
        let annotations = meta.annotations.as_ref().unwrap();
        assert_eq!(annotations["example.com/cost-center"], "42");
    }
}

#[test]
fn standard_labels_win_over_infrastructure_labels() {
    let d = web();
    for meta in metas(&d) {
        assert_eq!(
            meta.labels.as_ref().unwrap()["app.kubernetes.io/name"],
            "tollgate-proxy"
        );
    }
}

#[test]
fn selectors_use_only_stable_labels_that_the_pods_carry() {
    let d = web();
    let expected = BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "tollgate-proxy".to_string(),
        ),
        (GATEWAY_NAME_LABEL.to_string(), "web".to_string()),
    ]);
    let spec = d.deployment.spec.as_ref().unwrap();
    assert_eq!(spec.selector.match_labels.as_ref(), Some(&expected));
    assert_eq!(
        d.service.spec.as_ref().unwrap().selector.as_ref(),
        Some(&expected)
    );
    let pod_labels = spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .as_ref()
        .unwrap();
    for (k, v) in &expected {
        assert_eq!(&pod_labels[k], v);
    }
}

#[test]
fn without_infrastructure_there_are_no_annotations() {
    let gw = mk_gateway(&WEB.replace(
        "  infrastructure:\n    labels: {team: payments, app.kubernetes.io/name: hijack}\n    annotations: {example.com/cost-center: \"42\"}\n",
        "",
    ));
    let d = desired(&mk_config(), &gw, &GatewayParametersSpec::default(), &[]).unwrap();
    for meta in metas(&d) {
        assert_eq!(meta.annotations, None);
        assert!(!meta.labels.as_ref().unwrap().contains_key("team"));
    }
}

#[test]
fn one_service_port_per_distinct_listener_port_and_protocol() {
    let d = web();
    let ports: Vec<(String, i32, String)> = d
        .service
        .spec
        .as_ref()
        .unwrap()
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| (p.name.clone().unwrap(), p.port, p.protocol.clone().unwrap()))
        .collect();
    assert_eq!(
        ports,
        [
            ("udp-53".to_string(), 53, "UDP".to_string()),
            ("http-80".to_string(), 80, "TCP".to_string()),
            ("https-443".to_string(), 443, "TCP".to_string()),
            ("tcp-8080".to_string(), 8080, "TCP".to_string()),
        ]
    );
    for p in d.service.spec.as_ref().unwrap().ports.as_ref().unwrap() {
        assert_eq!(p.target_port, Some(IntOrString::Int(p.port)));
    }
}

#[test]
fn listener_set_ports_are_exposed_beside_the_gateways() {
    // What the route table serves: the Gateway's own ports and two a ListenerSet adds.
    let served = [
        (80, tollgate_api::Protocol::Http),
        (8081, tollgate_api::Protocol::Http),
        (5353, tollgate_api::Protocol::Udp),
    ];
    let d = desired(
        &mk_config(),
        &mk_gateway(WEB),
        &GatewayParametersSpec::default(),
        &served,
    )
    .unwrap();
    let service: Vec<(String, i32, String)> = d
        .service
        .spec
        .as_ref()
        .unwrap()
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| (p.name.clone().unwrap(), p.port, p.protocol.clone().unwrap()))
        .collect();
    let want = |n: &str, port, l4: &str| (n.to_string(), port, l4.to_string());
    assert_eq!(
        service,
        [
            want("udp-53", 53, "UDP"),
            want("http-80", 80, "TCP"),
            want("https-443", 443, "TCP"),
            want("udp-5353", 5353, "UDP"),
            want("tcp-8080", 8080, "TCP"),
            want("http-8081", 8081, "TCP"),
        ]
    );
    let container = d
        .deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| p.container_port)
        .collect::<Vec<_>>();
    assert!(
        container.contains(&8081) && container.contains(&5353),
        "{container:?}"
    );
}

#[test]
fn container_ports_cover_every_listener_port_and_the_admin_port() {
    let d = web();
    let ports: Vec<(String, i32)> = pod_spec_of(&d).containers[0]
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| (p.name.clone().unwrap(), p.container_port))
        .collect();
    assert_eq!(
        ports,
        [
            ("udp-53".to_string(), 53),
            ("http-80".to_string(), 80),
            ("https-443".to_string(), 443),
            ("tcp-8080".to_string(), 8080),
            ("admin".to_string(), 9902),
        ]
    );
}

#[test]
fn service_type_comes_from_the_config() {
    let d = web();
    assert_eq!(
        d.service.spec.as_ref().unwrap().type_.as_deref(),
        Some("LoadBalancer")
    );
    let config = ProvisionConfig {
        service_type: "ClusterIP".into(),
        ..mk_config()
    };
    let d = desired(
        &config,
        &mk_gateway(WEB),
        &GatewayParametersSpec::default(),
        &[],
    )
    .unwrap();
    assert_eq!(
        d.service.spec.as_ref().unwrap().type_.as_deref(),
        Some("ClusterIP")
    );
    let config = ProvisionConfig {
        service_type: "External".into(),
        ..mk_config()
    };
    let err = desired(
        &config,
        &mk_gateway(WEB),
        &GatewayParametersSpec::default(),
        &[],
    )
    .unwrap_err();
    assert!(matches!(err, ProvisionError::InvalidConfig(_)), "{err}");
}

#[test]
fn proxy_container_runs_the_gateway_with_the_controller_url() {
    let d = web();
    let c = &pod_spec_of(&d).containers[0];
    assert_eq!(c.image.as_deref(), Some("example.com/tollgate-proxy:1.0"));
    assert_eq!(
        c.args.as_ref().unwrap(),
        &[
            "--controller",
            "https://tollgate.tollgate-system.svc:9443",
            "--gateway",
            "apps/web",
            "--tls-dir",
            "/etc/tollgate/tls",
            "--state-dir",
            "/var/lib/tollgate",
            "--admin",
            "0.0.0.0:9902",
            "--redis-url=redis://redis.cache:6379",
        ]
    );
    let env = c.env.as_ref().unwrap();
    assert_eq!(env[0].name, "POD_NAME");
    let field = env[0]
        .value_from
        .as_ref()
        .unwrap()
        .field_ref
        .as_ref()
        .unwrap();
    assert_eq!(field.field_path, "metadata.name");
}

#[test]
fn tls_secret_and_state_dir_are_mounted() {
    let d = web();
    let pod = pod_spec_of(&d);
    let volumes = pod.volumes.as_ref().unwrap();
    let tls = volumes[0].secret.as_ref().unwrap();
    assert_eq!(tls.secret_name.as_deref(), Some("web-tollgate-proxy-tls"));
    assert!(volumes[1].empty_dir.is_some());
    let mounts = pod.containers[0].volume_mounts.as_ref().unwrap();
    assert_eq!(
        (mounts[0].name.as_str(), mounts[0].mount_path.as_str()),
        ("tls", TLS_DIR)
    );
    assert_eq!(mounts[0].read_only, Some(true));
    assert_eq!(
        (mounts[1].name.as_str(), mounts[1].mount_path.as_str()),
        ("state", STATE_DIR)
    );
}

#[test]
fn probes_hit_the_admin_port() {
    let d = web();
    let c = &pod_spec_of(&d).containers[0];
    let ready = c
        .readiness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(ready.path.as_deref(), Some("/readyz"));
    assert_eq!(ready.port, IntOrString::String("admin".into()));
    let live = c
        .liveness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(live.path.as_deref(), Some("/healthz"));
    assert!(c.resources.as_ref().unwrap().requests.is_some());
}

#[test]
fn pod_is_non_root_read_only_without_token_or_capabilities() {
    let gw = mk_gateway(
        &WEB.replace("port: 80,", "port: 8081,")
            .replace("port: 443,", "port: 8443,")
            .replace("port: 53,", "port: 5353,"),
    );
    let d = desired(&mk_config(), &gw, &GatewayParametersSpec::default(), &[]).unwrap();
    let pod = pod_spec_of(&d);
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(
        d.service_account.automount_service_account_token,
        Some(false)
    );
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    assert_eq!(psc.sysctls, None);
    let sc = pod.containers[0].security_context.as_ref().unwrap();
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert_eq!(caps.add, None);
}

#[test]
fn listener_below_1024_adds_net_bind_service_and_the_unprivileged_port_sysctl() {
    let d = web();
    let pod = pod_spec_of(&d);
    let caps = pod.containers[0]
        .security_context
        .as_ref()
        .unwrap()
        .capabilities
        .as_ref()
        .unwrap();
    assert_eq!(
        caps.add.as_deref(),
        Some(&["NET_BIND_SERVICE".to_string()][..])
    );
    let sysctls = pod
        .security_context
        .as_ref()
        .unwrap()
        .sysctls
        .as_ref()
        .unwrap();
    assert_eq!(sysctls[0].name, "net.ipv4.ip_unprivileged_port_start");
    assert_eq!(sysctls[0].value, "53", "the lowest listener port");
}

#[test]
fn replicas_annotation_sets_replicas() {
    let d = web();
    assert_eq!(
        d.deployment.spec.as_ref().unwrap().replicas,
        None,
        "API default (1)"
    );
    for (value, expected) in [("3", 3), (" 0 ", 0), ("100", 100)] {
        let mut gw = mk_gateway(WEB);
        gw.metadata.annotations =
            Some(BTreeMap::from([(REPLICAS_ANNOTATION.into(), value.into())]));
        let d = desired(&mk_config(), &gw, &GatewayParametersSpec::default(), &[]).unwrap();
        assert_eq!(
            d.deployment.spec.as_ref().unwrap().replicas,
            Some(expected),
            "{value}"
        );
    }
}

#[test]
fn invalid_replicas_annotation_rejects_the_gateway() {
    for value in ["", "two", "-1", "101", "1.5"] {
        let mut gw = mk_gateway(WEB);
        gw.metadata.annotations =
            Some(BTreeMap::from([(REPLICAS_ANNOTATION.into(), value.into())]));
        let err = desired(&mk_config(), &gw, &GatewayParametersSpec::default(), &[]).unwrap_err();
        assert!(
            matches!(&err, ProvisionError::InvalidGateway { reason, .. } if reason.contains(REPLICAS_ANNOTATION)),
            "{value}: {err}"
        );
    }
}

#[test]
fn listener_on_the_admin_port_rejects_the_gateway() {
    let gw = mk_gateway(&WEB.replace("port: 8080,", "port: 9902,"));
    let err = desired(&mk_config(), &gw, &GatewayParametersSpec::default(), &[]).unwrap_err();
    assert!(err.to_string().contains("admin port"), "{err}");
}

#[test]
fn gateway_without_uid_is_rejected() {
    let mut gw = mk_gateway(WEB);
    gw.metadata.uid = None;
    assert!(matches!(
        desired(&mk_config(), &gw, &GatewayParametersSpec::default(), &[]),
        Err(ProvisionError::InvalidGateway { .. })
    ));
}

#[test]
fn long_gateway_names_give_valid_names_and_labels() {
    let long = "g".repeat(100);
    let gw = mk_gateway(&WEB.replace("name: web,", &format!("name: {long},")));
    let d = desired(&mk_config(), &gw, &GatewayParametersSpec::default(), &[]).unwrap();
    assert!(d.service.metadata.name.as_ref().unwrap().len() <= 63);
    for meta in metas(&d) {
        assert!(meta.labels.as_ref().unwrap()[GATEWAY_NAME_LABEL].len() <= 63);
    }
    let args = pod_spec_of(&d).containers[0].args.as_ref().unwrap();
    assert_eq!(
        args[3],
        format!("apps/{long}"),
        "the proxy still gets the real name"
    );
}

#[test]
fn same_gateway_gives_byte_identical_objects() {
    let a = serde_json::to_string(&web().deployment).unwrap();
    let b = serde_json::to_string(&web().deployment).unwrap();
    assert_eq!(a, b);
}

#[test]
fn a_static_address_is_requested_of_the_load_balancer() {
    let gw = mk_gateway(&WEB.replace(
        "  listeners:",
        "  addresses:\n  - {value: 127.0.1.250}\n  - {type: IPAddress, value: 127.0.1.251}\n  listeners:",
    ));
    assert_eq!(requested_addresses(&gw), ["127.0.1.250", "127.0.1.251"]);
    let d = desired(&mk_config(), &gw, &GatewayParametersSpec::default(), &[]).unwrap();
    let spec = d.service.spec.as_ref().unwrap();
    assert_eq!(spec.load_balancer_ip.as_deref(), Some("127.0.1.250"));
    // Without addresses, or with a Service type that has no load balancer, none is asked.
    assert!(web().service.spec.unwrap().load_balancer_ip.is_none());
    let cfg = ProvisionConfig {
        service_type: "ClusterIP".into(),
        ..mk_config()
    };
    let d = desired(&cfg, &gw, &GatewayParametersSpec::default(), &[]).unwrap();
    assert!(d.service.spec.unwrap().load_balancer_ip.is_none());
}
