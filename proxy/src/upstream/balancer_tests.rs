use tollgate_api::Endpoint;

use super::*;
use tollgate_api::backend::{BackendSettings, HealthCheck, OutlierDetection, Probe};

fn backend(lb: LoadBalancer, n: u16) -> Backend {
    Backend {
        protocol: BackendProtocol::Http1,
        load_balancer: lb,
        endpoints: (0..n)
            .map(|i| Endpoint {
                ip: "127.0.0.1".into(),
                port: 1000 + i,
            })
            .collect(),
        settings: BackendSettings::default(),
        tls: None,
    }
}

#[test]
fn round_robin_cycles() {
    let b = Balancer::build(
        &backend(LoadBalancer::RoundRobin, 3),
        None,
        &crate::upstream::Upstream::new(),
    )
    .unwrap();
    let ports: Vec<u16> = (0..6)
        .map(|_| b.pick().unwrap().endpoint().addr.port())
        .collect();
    assert_eq!(ports, [1000, 1001, 1002, 1000, 1001, 1002]);
}

#[test]
fn no_endpoints_is_none() {
    let b = Balancer::build(
        &backend(LoadBalancer::RoundRobin, 0),
        None,
        &crate::upstream::Upstream::new(),
    )
    .unwrap();
    assert!(b.pick().is_none());
}

#[test]
fn least_request_avoids_busy_endpoint() {
    let b = Balancer::build(
        &backend(LoadBalancer::LeastRequest, 2),
        None,
        &crate::upstream::Upstream::new(),
    )
    .unwrap();
    let busy: Vec<_> = (0..10)
        .map(|_| EndpointGuard::new(b.endpoints[0].clone()))
        .collect();
    for _ in 0..50 {
        assert_eq!(b.pick().unwrap().endpoint().addr.port(), 1001);
    }
    drop(busy);
    assert_eq!(b.endpoints[0].in_flight.load(Ordering::Relaxed), 0);
}

#[test]
fn a_retry_goes_to_an_untried_endpoint_while_there_is_one() {
    for lb in [LoadBalancer::RoundRobin, LoadBalancer::LeastRequest] {
        let b = Balancer::build(&backend(lb, 3), None, &crate::upstream::Upstream::new()).unwrap();
        for _ in 0..50 {
            let mut tried = vec![b.pick().unwrap().endpoint().addr];
            let second = b.pick_untried(&tried).unwrap().endpoint().addr;
            assert!(!tried.contains(&second));
            tried.push(second);
            let third = b.pick_untried(&tried).unwrap().endpoint().addr;
            assert!(!tried.contains(&third));
            tried.push(third);
            // All tried: still an endpoint.
            assert!(b.pick_untried(&tried).is_some());
        }
    }
    let one = Balancer::build(
        &backend(LoadBalancer::RoundRobin, 1),
        None,
        &crate::upstream::Upstream::new(),
    )
    .unwrap();
    let only = one.pick().unwrap().endpoint().addr;
    assert_eq!(one.pick_untried(&[only]).unwrap().endpoint().addr, only);
}

#[test]
fn in_flight_state_survives_rebuild() {
    let def = backend(LoadBalancer::LeastRequest, 2);
    let up = crate::upstream::Upstream::new();
    let old = Balancer::build(&def, None, &up).unwrap();
    let _g = old.pick().unwrap();
    let new = Balancer::build(&def, Some(&old), &up).unwrap();
    let total: usize = new
        .endpoints
        .iter()
        .map(|e| e.in_flight.load(Ordering::Relaxed))
        .sum();
    assert_eq!(total, 1);
}

fn outlier(consecutive_5xx: u32, max_ejection_percent: u32) -> OutlierDetection {
    OutlierDetection {
        consecutive_5xx: Some(consecutive_5xx),
        consecutive_gateway_errors: None,
        consecutive_local_origin_failures: None,
        interval_ms: 10_000,
        base_ejection_ms: 60_000,
        max_ejection_percent,
    }
}

fn guarded(lb: LoadBalancer, n: u16, od: OutlierDetection) -> Balancer {
    let mut def = backend(lb, n);
    def.settings.outlier = Some(od);
    Balancer::build(&def, None, &crate::upstream::Upstream::new()).unwrap()
}

fn picks(b: &Balancer, times: usize) -> std::collections::BTreeSet<u16> {
    (0..times)
        .map(|_| b.pick().unwrap().endpoint().addr.port())
        .collect()
}

#[test]
fn an_endpoint_failing_in_a_row_is_ejected_and_skipped_by_every_algorithm() {
    for lb in [
        LoadBalancer::RoundRobin,
        LoadBalancer::LeastRequest,
        LoadBalancer::Random,
    ] {
        let b = guarded(lb, 3, outlier(2, 50));
        let sick = b.endpoints[1].clone();
        assert!(!b.record(&sick, Outcome::Answered(503)));
        assert!(b.record(&sick, Outcome::Answered(500)), "{lb:?}");
        assert_eq!(picks(&b, 200), [1000, 1002].into(), "{lb:?}");
        assert_eq!(b.availability(), (2, 3));
    }
}

#[test]
fn max_ejection_percent_holds_but_one_endpoint_may_always_go() {
    let b = guarded(LoadBalancer::RoundRobin, 4, outlier(1, 30));
    // 30% of 4 is 1.2 endpoints: the first goes, the second would be 50%.
    assert!(b.record(&b.endpoints[0], Outcome::Local));
    assert!(!b.record(&b.endpoints[1], Outcome::Local));
    assert_eq!(b.availability(), (3, 4));
    let one = guarded(LoadBalancer::RoundRobin, 1, outlier(1, 0));
    assert!(one.record(&one.endpoints[0], Outcome::Local));
}

#[test]
fn below_the_panic_threshold_every_endpoint_is_used_again() {
    let b = guarded(LoadBalancer::RoundRobin, 3, outlier(1, 100));
    assert!(b.record(&b.endpoints[0], Outcome::Answered(502)));
    // Two of three up (67%) is above the default 50%: the ejected one is skipped.
    assert_eq!(picks(&b, 30), [1001, 1002].into());
    assert!(b.record(&b.endpoints[1], Outcome::Answered(502)));
    // One of three (33%): panic, all three are used.
    assert_eq!(picks(&b, 30), [1000, 1001, 1002].into());
}

#[test]
fn failing_health_checks_take_an_endpoint_out_like_an_ejection() {
    let mut def = backend(LoadBalancer::LeastRequest, 3);
    def.settings.health_check = Some(HealthCheck {
        probe: Probe::Tcp,
        interval_ms: 1_000,
        timeout_ms: 500,
        unhealthy_threshold: 1,
        healthy_threshold: 1,
    });
    let b = Balancer::build(&def, None, &crate::upstream::Upstream::new()).unwrap();
    b.endpoints[2]
        .health
        .check_failing
        .store(true, Ordering::Relaxed);
    assert_eq!(picks(&b, 200), [1000, 1001].into());
    b.endpoints[2]
        .health
        .check_failing
        .store(false, Ordering::Relaxed);
    assert_eq!(picks(&b, 200), [1000, 1001, 1002].into());
}

#[test]
fn a_consistent_hash_keeps_a_key_on_its_endpoint_until_it_is_out_or_overloaded() {
    let b = guarded(LoadBalancer::ConsistentHash, 4, outlier(1, 100));
    let key = crate::upstream::hash::hash(b"alice");
    let home = b.pick_keyed(Some(key)).unwrap().endpoint().addr.port();
    for _ in 0..50 {
        assert_eq!(
            b.pick_keyed(Some(key)).unwrap().endpoint().addr.port(),
            home
        );
    }
    // Bounded load: holding many requests on the home endpoint sends the key elsewhere.
    let i = b
        .endpoints
        .iter()
        .position(|e| e.addr.port() == home)
        .unwrap();
    let held: Vec<_> = (0..8)
        .map(|_| EndpointGuard::new(b.endpoints[i].clone()))
        .collect();
    assert_ne!(
        b.pick_keyed(Some(key)).unwrap().endpoint().addr.port(),
        home
    );
    drop(held);
    assert!(b.record(&b.endpoints[i], Outcome::Local));
    let moved = b.pick_keyed(Some(key)).unwrap().endpoint().addr.port();
    assert_ne!(moved, home);
    // The same key keeps to its new endpoint while the home one is out.
    for _ in 0..20 {
        assert_eq!(
            b.pick_keyed(Some(key)).unwrap().endpoint().addr.port(),
            moved
        );
    }
}

#[test]
fn the_breaker_and_endpoint_health_survive_a_rebuild_with_the_same_settings() {
    let mut def = backend(LoadBalancer::RoundRobin, 2);
    def.settings.outlier = Some(outlier(1, 100));
    def.settings.circuit_breaker.max_requests = Some(5);
    let up = crate::upstream::Upstream::new();
    let old = Balancer::build(&def, None, &up).unwrap();
    assert!(old.record(&old.endpoints[0], Outcome::Local));
    let new = Balancer::build(&def, Some(&old), &up).unwrap();
    assert_eq!(new.availability(), (1, 2));
    assert!(Arc::ptr_eq(
        old.breaker.as_ref().unwrap(),
        new.breaker.as_ref().unwrap()
    ));
    def.settings.circuit_breaker.max_requests = Some(6);
    let changed = Balancer::build(&def, Some(&new), &up).unwrap();
    assert!(!Arc::ptr_eq(
        new.breaker.as_ref().unwrap(),
        changed.breaker.as_ref().unwrap()
    ));
}

#[test]
fn an_endpoint_outs_turns_are_shared_evenly_by_those_up() {
    for lb in [LoadBalancer::RoundRobin, LoadBalancer::Random] {
        let b = guarded(lb, 3, outlier(1, 100));
        assert!(b.record(&b.endpoints[1], Outcome::Local));
        let mut count = std::collections::BTreeMap::new();
        for _ in 0..30_000 {
            *count
                .entry(b.pick().unwrap().endpoint().addr.port())
                .or_insert(0) += 1;
        }
        assert_eq!(count.len(), 2, "{lb:?}: {count:?}");
        // 15,000 each; a random pick's spread is about 90 (one standard deviation), and an
        // out endpoint's turns given two to one (the bias this guards against) would make
        // 16,667 and 13,333.
        for (_, c) in count {
            assert!((14_250..=15_750).contains(&c), "{lb:?}: {c}");
        }
    }
}

#[test]
fn a_consistent_hash_below_the_panic_threshold_uses_every_endpoint() {
    let b = guarded(LoadBalancer::ConsistentHash, 4, outlier(1, 100));
    for i in 0..3 {
        assert!(b.record(&b.endpoints[i], Outcome::Local));
    }
    // One of four up (25%) is below 50%: keys go to their own endpoints again.
    let homes: std::collections::BTreeSet<u16> = (0..200u64)
        .map(|k| {
            b.pick_keyed(Some(crate::upstream::hash::hash(&k.to_le_bytes())))
                .unwrap()
                .endpoint()
                .addr
                .port()
        })
        .collect();
    assert_eq!(homes.len(), 4);
}

#[test]
fn a_hash_expression_is_compiled_with_the_balancer_and_a_bad_one_refuses_it() {
    let up = crate::upstream::Upstream::new();
    let mut def = backend(LoadBalancer::ConsistentHash, 3);
    assert!(Balancer::build(&def, None, &up).unwrap().key_expr.is_none());
    def.settings.hash = Some(tollgate_api::backend::HashOn::Expression(
        "auth.identity.sub".into(),
    ));
    let b = Balancer::build(&def, None, &up).unwrap();
    let again = Balancer::build(&def, Some(&b), &up).unwrap();
    assert_eq!(
        again.key_expr.as_ref().map(|k| k.source()),
        Some("auth.identity.sub")
    );
    def.settings.hash = Some(tollgate_api::backend::HashOn::Expression(
        "auth.identity.sub ==".into(),
    ));
    assert!(Balancer::build(&def, Some(&again), &up).is_err());
}
