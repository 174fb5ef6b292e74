//! Tests of `addresses`: a Gateway's `status.addresses` from its proxy Service as read back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceStatus};

fn mk_service(type_: &str, cluster_ip: &str, ingress: Vec<LoadBalancerIngress>) -> Service {
    Service {
        spec: Some(ServiceSpec {
            type_: Some(type_.into()),
            cluster_ip: Some(cluster_ip.into()),
            cluster_ips: Some(vec![cluster_ip.into()]),
            ..ServiceSpec::default()
        }),
        status: Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(ingress),
            }),
            ..ServiceStatus::default()
        }),
        ..Service::default()
    }
}

fn pairs(addresses: Vec<GatewayStatusAddresses>) -> Vec<(String, String)> {
    addresses
        .into_iter()
        .map(|a| (a.r#type.unwrap(), a.value))
        .collect()
}

#[test]
fn load_balancer_ingress_gives_ip_and_hostname_addresses() {
    let svc = mk_service(
        "LoadBalancer",
        "10.96.0.10",
        vec![
            LoadBalancerIngress {
                ip: Some("203.0.113.7".into()),
                ..Default::default()
            },
            LoadBalancerIngress {
                hostname: Some("lb.example.com".into()),
                ..Default::default()
            },
        ],
    );
    assert_eq!(
        pairs(addresses(&svc)),
        [
            ("IPAddress".to_string(), "203.0.113.7".to_string()),
            ("Hostname".to_string(), "lb.example.com".to_string()),
        ]
    );
}

#[test]
fn load_balancer_without_ingress_falls_back_to_the_cluster_ip() {
    let svc = mk_service("LoadBalancer", "10.96.0.10", vec![]);
    assert_eq!(
        pairs(addresses(&svc)),
        [("IPAddress".to_string(), "10.96.0.10".to_string())]
    );
}

#[test]
fn cluster_ip_service_gives_its_cluster_ip_even_with_ingress() {
    let ingress = vec![LoadBalancerIngress {
        ip: Some("203.0.113.7".into()),
        ..Default::default()
    }];
    let svc = mk_service("ClusterIP", "10.96.0.11", ingress);
    assert_eq!(
        pairs(addresses(&svc)),
        [("IPAddress".to_string(), "10.96.0.11".to_string())]
    );
}

#[test]
fn service_without_addresses_gives_none() {
    assert!(addresses(&Service::default()).is_empty());
    assert!(addresses(&mk_service("ClusterIP", "None", vec![])).is_empty());
}
