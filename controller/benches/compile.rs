//! Compiler throughput: 10k HTTPRoutes (exact, prefix and header-matched rules) on one Gateway
//! with 100 Services of 10 endpoints each. Goal: well under 500 ms per compile.
//!
//! `cargo bench -p tollgate --bench compile -- --warm-up-time 1 --measurement-time 5`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use tollgate::compile::{CompileCache, Inputs, compile, compile_cached};

/// The allocator of the `tollgate` binary (main.rs): a compile allocates and frees its whole
/// model, so glibc's malloc here would measure another program.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const ROUTES: usize = 10_000;
const SERVICES: usize = 100;
const HOSTS: usize = 500;

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn inputs() -> Inputs {
    let mut i = Inputs::new(Time(Timestamp::from_second(1_700_000_000).unwrap()));
    i.gateway_classes.push(from(json!({
        "metadata": {"name": "tollgate"},
        "spec": {"controllerName": "tollgate.dev/gateway-controller"}
    })));
    i.gateways.push(from(json!({
        "metadata": {"name": "gw", "namespace": "infra"},
        "spec": {"gatewayClassName": "tollgate", "listeners": [
            {"name": "http", "port": 80, "protocol": "HTTP",
             "allowedRoutes": {"namespaces": {"from": "All"}}}
        ]}
    })));
    for s in 0..SERVICES {
        let ns = format!("team-{}", s % 10);
        i.services.push(from(json!({
            "metadata": {"name": format!("svc-{s}"), "namespace": ns},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
        })));
        let endpoints: Vec<_> = (0..10)
            .map(|e| {
                json!({"addresses": [format!("10.{}.{}.{}", s / 256, s % 256, e + 1)],
                            "conditions": {"ready": e != 9}})
            })
            .collect();
        i.endpoint_slices.push(from(json!({
            "metadata": {"name": format!("svc-{s}-abc"), "namespace": ns,
                         "labels": {"kubernetes.io/service-name": format!("svc-{s}")}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": endpoints
        })));
    }
    for r in 0..ROUTES {
        let s = r % SERVICES;
        let ns = format!("team-{}", s % 10);
        let m = match r % 3 {
            0 => json!({"path": {"type": "Exact", "value": format!("/exact/{r}")}}),
            1 => json!({"path": {"type": "PathPrefix", "value": format!("/prefix/{r}")}}),
            _ => json!({"path": {"type": "PathPrefix", "value": "/"},
                        "headers": [{"name": "x-route", "value": r.to_string()}],
                        "method": "GET"}),
        };
        i.http_routes.push(from(json!({
            "metadata": {"name": format!("route-{r}"), "namespace": ns,
                         "creationTimestamp": "2024-01-01T00:00:00Z",
                         "resourceVersion": format!("{}", 1000 + r)},
            "spec": {
                "parentRefs": [{"name": "gw", "namespace": "infra"}],
                "hostnames": [format!("host-{}.example.com", r % HOSTS)],
                "rules": [{"matches": [m], "backendRefs": [{"name": format!("svc-{s}"), "port": 80}]}]
            }
        })));
    }
    i
}

fn bench(c: &mut Criterion) {
    let inputs = inputs();
    let out = compile(&inputs);
    assert!(out.rejections().is_empty());
    assert_eq!(out.tables.len(), 1);
    let mut g = c.benchmark_group("compile");
    g.sample_size(10);
    g.bench_function("10k_httproutes", |b| b.iter(|| compile(black_box(&inputs))));
    // What `tollgate run` does per change: one route added to (or, alternately, removed
    // from) 10k, compiled with the cache the previous compile returned, into which the
    // previous output was recycled.
    let mut changed = inputs.clone();
    let extra = changed.http_routes[0].clone();
    changed.http_routes[0].metadata.name = Some("route-extra".into());
    changed.http_routes[0].metadata.resource_version = Some("99999".into());
    changed.http_routes.push(extra);
    let (_, mut cache) = compile_cached(&inputs, CompileCache::default());
    let mut flip = false;
    g.bench_function("10k_httproutes_one_changed_cached", |b| {
        b.iter(|| {
            flip = !flip;
            let now = if flip { &changed } else { &inputs };
            let (out, next) = compile_cached(black_box(now), std::mem::take(&mut cache));
            cache = next;
            cache.recycle(black_box(out));
        })
    });
    // What the controller pays per change before compiling: a snapshot of every object
    // (`Stores::inputs` copies each one out of the watch stores).
    g.bench_function("10k_httproutes_snapshot", |b| {
        b.iter(|| black_box(&inputs).clone())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
