use std::collections::BTreeMap;

use tollgate_api::backend::{BackendSettings, OutlierDetection, Probe};
use tollgate_api::{Backend, Endpoint, LoadBalancer};

use super::*;
use crate::upstream::{Upstream, build_balancers};

fn check(unhealthy: u32, healthy: u32) -> HealthCheck {
    HealthCheck {
        probe: Probe::Tcp,
        interval_ms: 3_600_000,
        timeout_ms: 1_000,
        unhealthy_threshold: unhealthy,
        healthy_threshold: healthy,
    }
}

#[test]
fn a_healthy_endpoint_goes_out_after_the_unhealthy_threshold_of_failures_in_a_row() {
    let mut v = Verdicts::new(true, &check(3, 2));
    assert_eq!(v.record(false), None);
    assert_eq!(v.record(false), None);
    // A pass ends the run.
    assert_eq!(v.record(true), None);
    assert_eq!(v.record(false), None);
    assert_eq!(v.record(false), None);
    assert_eq!(v.record(false), Some(Transition::Unhealthy));
    // Out already: more failures change nothing.
    assert_eq!(v.record(false), None);
}

#[test]
fn a_failing_endpoint_comes_back_after_the_healthy_threshold_of_passes_in_a_row() {
    // Starting out (a verdict carried over to new settings).
    let mut v = Verdicts::new(false, &check(3, 2));
    assert_eq!(v.record(true), None);
    // A failure ends the run of passes.
    assert_eq!(v.record(false), None);
    assert_eq!(v.record(true), None);
    assert_eq!(v.record(true), Some(Transition::Healthy));
    assert_eq!(v.record(true), None);
    // Healthy again: the failure count starts from zero.
    assert_eq!(v.record(false), None);
    assert_eq!(v.record(false), None);
    assert_eq!(v.record(false), Some(Transition::Unhealthy));
}

#[test]
fn zero_thresholds_count_as_one() {
    let mut v = Verdicts::new(true, &check(0, 0));
    assert_eq!(v.record(false), Some(Transition::Unhealthy));
    assert_eq!(v.record(true), Some(Transition::Healthy));
}

fn backend(ports: &[u16], settings: BackendSettings) -> Backend {
    Backend {
        protocol: BackendProtocol::Http1,
        load_balancer: LoadBalancer::RoundRobin,
        endpoints: ports
            .iter()
            .map(|&port| Endpoint {
                ip: "127.0.0.1".into(),
                port,
            })
            .collect(),
        settings,
        tls: None,
    }
}

fn checked(ports: &[u16], hc: HealthCheck) -> Backend {
    backend(
        ports,
        BackendSettings {
            health_check: Some(hc),
            ..BackendSettings::default()
        },
    )
}

fn table(backends: &[(&str, &Backend)]) -> BTreeMap<String, Backend> {
    backends
        .iter()
        .map(|(k, b)| ((*k).to_owned(), (*b).clone()))
        .collect()
}

fn task_keys(c: &HealthChecker) -> Vec<(String, u16)> {
    let mut keys: Vec<_> = lock(&c.state)
        .tasks
        .keys()
        .map(|(b, a)| (b.clone(), a.port()))
        .collect();
    keys.sort();
    keys
}

fn stop_flag(c: &HealthChecker, backend: &str, port: u16) -> Arc<Mutex<bool>> {
    let state = lock(&c.state);
    let task = state
        .tasks
        .iter()
        .find(|((b, a), _)| b == backend && a.port() == port)
        .map(|(_, t)| t)
        .unwrap();
    task.stopped.clone()
}

#[tokio::test]
async fn sync_checks_exactly_the_endpoints_of_checked_backends_once_each() {
    let metrics = Arc::new(Metrics::new());
    let c = HealthChecker::new(metrics.clone());
    let up = Upstream::new();
    let a = checked(&[1000, 1001], check(2, 2));
    let plain = backend(&[1002], BackendSettings::default());
    let outlier_only = backend(
        &[1003],
        BackendSettings {
            outlier: Some(OutlierDetection {
                consecutive_5xx: Some(5),
                consecutive_gateway_errors: None,
                consecutive_local_origin_failures: None,
                interval_ms: 10_000,
                base_ejection_ms: 30_000,
                max_ejection_percent: 10,
            }),
            ..BackendSettings::default()
        },
    );
    let t1 = table(&[("a", &a), ("plain", &plain), ("od", &outlier_only)]);
    let b1 = build_balancers(&t1, None, &up).unwrap();
    c.sync(&b1);
    assert_eq!(task_keys(&c), [("a".into(), 1000), ("a".into(), 1001)]);
    let text = metrics.encode();
    assert!(text.contains(r#"tollgate_backend_healthy_endpoints{backend="a"} 2"#));
    assert!(text.contains(r#"tollgate_backend_healthy_endpoints{backend="od"} 1"#));
    assert!(!text.contains(r#"backend="plain""#), "{text}");

    // The same table again (the states carried over): the same tasks, none added.
    let first = stop_flag(&c, "a", 1000);
    let b2 = build_balancers(&t1, Some(&b1), &up).unwrap();
    c.sync(&b2);
    c.sync(&b2);
    assert_eq!(task_keys(&c).len(), 2);
    assert!(Arc::ptr_eq(&first, &stop_flag(&c, "a", 1000)));
    assert!(!*lock(&first));

    // An endpoint leaves: its task stops. New settings: the other's task starts again and
    // goes on from the verdict the endpoint carries.
    let gone = stop_flag(&c, "a", 1001);
    b2["a"].endpoints[0]
        .health
        .check_failing
        .store(true, Ordering::Relaxed);
    let a = checked(&[1000], check(3, 3));
    let t3 = table(&[("a", &a), ("plain", &plain)]);
    let b3 = build_balancers(&t3, Some(&b2), &up).unwrap();
    c.sync(&b3);
    assert_eq!(task_keys(&c), [("a".into(), 1000)]);
    assert!(*lock(&gone) && *lock(&first));
    assert!(!Arc::ptr_eq(&first, &stop_flag(&c, "a", 1000)));
    assert!(
        b3["a"].endpoints[0]
            .health
            .check_failing
            .load(Ordering::Relaxed)
    );
    let text = metrics.encode();
    assert!(text.contains(r#"tollgate_backend_healthy_endpoints{backend="a"} 0"#));
    assert!(
        !text.contains(r#"backend="od""#),
        "a removed backend's series goes: {text}"
    );

    // The check is removed: no task, and the endpoint is no longer held out by it.
    let last = stop_flag(&c, "a", 1000);
    let a = backend(&[1000], BackendSettings::default());
    let b4 = build_balancers(&table(&[("a", &a)]), Some(&b3), &up).unwrap();
    c.sync(&b4);
    assert!(task_keys(&c).is_empty());
    assert!(*lock(&last));
    assert!(
        !b4["a"].endpoints[0]
            .health
            .check_failing
            .load(Ordering::Relaxed)
    );
    assert!(
        !metrics
            .encode()
            .contains("tollgate_backend_healthy_endpoints{")
    );
}

#[tokio::test]
async fn a_task_ends_by_itself_once_its_endpoint_state_is_dropped() {
    let c = HealthChecker::new(Arc::new(Metrics::new()));
    // A port nothing listens on: every check fails at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut hc = check(1, 1);
    hc.interval_ms = 10;
    let a = checked(&[port], hc);
    let up = Upstream::new();
    let balancers = build_balancers(&table(&[("a", &a)]), None, &up).unwrap();
    c.sync(&balancers);
    drop(balancers);
    // The checker was not told; the task's weak reference tells it.
    let (_, mut task) = lock(&c.state).tasks.drain().next().unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), &mut task.handle).await;
    assert!(
        matches!(ended, Ok(Ok(()))),
        "the task returned by itself: {ended:?}"
    );
}
