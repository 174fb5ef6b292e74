//! The indexed lookup must agree with a linear scan: random tables, random requests.

use std::sync::Arc;

use http::{HeaderMap, Method};
use tollgate_api::Route;

use super::index::{Entry, RouteSet};
use super::matcher::Matcher;
use super::test_support::*;
use super::{CompiledRoute, Router};

const SEGMENTS: &[&str] = &["a", "b", "api", "v1", "v10", "x", ""];

fn rand_path(rng: &mut fastrand::Rng) -> String {
    let depth = rng.usize(0..5);
    let mut p = String::new();
    for _ in 0..depth {
        p.push('/');
        p.push_str(SEGMENTS[rng.usize(..SEGMENTS.len())]);
    }
    if p.is_empty() || rng.u8(..8) == 0 {
        p.push('/');
    }
    p
}

fn rand_route(rng: &mut fastrand::Rng, i: usize) -> Route {
    let name = format!("r{i}");
    let mut r = match rng.u8(..10) {
        0..=3 => mk_exact(&name, &rand_path(rng)),
        4..=8 => {
            // The root prefix would match every request; keep it rare.
            let p = rand_path(rng);
            let p = if p == "/" && rng.u8(..50) != 0 {
                "/b/x".into()
            } else {
                p
            };
            mk_prefix(&name, &p)
        }
        _ => mk_regex(&name, "/(a|b)/.*"),
    };
    if rng.u8(..4) == 0 {
        r = with_header(r, "x-h", if rng.bool() { "1" } else { "2" });
    }
    if rng.u8(..6) == 0 {
        r = with_query(r, "q", if rng.bool() { "1" } else { "2" });
    }
    if rng.u8(..6) == 0 {
        r = with_method(r, "POST");
    }
    r
}

fn rand_headers(rng: &mut fastrand::Rng) -> HeaderMap {
    match rng.u8(..4) {
        0 => mk_headers(&[("x-h", "1")]),
        1 => mk_headers(&[("x-h", "2")]),
        2 => mk_headers(&[("x-h", "1"), ("x-h", "2")]),
        _ => HeaderMap::new(),
    }
}

fn rand_target(rng: &mut fastrand::Rng) -> String {
    let mut t = rand_path(rng);
    match rng.u8(..4) {
        0 => t.push_str("?q=1"),
        1 => t.push_str("?q=2&q=1"),
        2 => t.push_str("?x&q=2"),
        _ => {}
    }
    t
}

#[test]
fn index_agrees_with_linear_scan() {
    let mut rng = fastrand::Rng::with_seed(0x7011_6a7e);
    let mut compared = 0;
    let mut matched = 0;
    let metrics = crate::metrics::Metrics::default();
    for _table in 0..20 {
        let n = rng.usize(1..300);
        let entries: Vec<Entry> = (0..n)
            .map(|i| {
                let api = rand_route(&mut rng, i);
                let matcher = Matcher::compile(&api.matcher, "ns/r").unwrap();
                Entry {
                    route: CompiledRoute {
                        label: format!("ns/r{i}").into(),
                        metrics: metrics.route(&format!("ns/r{i}")),
                        api,
                        external: None,
                    },
                    matcher,
                }
            })
            .collect();
        let set = RouteSet::new(Arc::default(), entries);
        for _ in 0..500 {
            let target = rand_target(&mut rng);
            let (path, query) = super::split_path_and_query(&target);
            let method = if rng.bool() {
                Method::GET
            } else {
                Method::POST
            };
            let headers = rand_headers(&mut rng);
            let fast = set.find(path, query, &method, &headers);
            let slow = set.find_linear(path, query, &method, &headers);
            let name = |e: Option<&Entry>| e.map(|e| e.route.api.route.name.clone());
            assert_eq!(name(fast), name(slow), "{method} {target} {headers:?}");
            compared += 1;
            matched += usize::from(slow.is_some());
        }
    }
    assert_eq!(compared, 10_000);
    // The generator must exercise both outcomes for the comparison to mean anything.
    assert!(matched > 1_000 && matched < 9_000, "matched {matched}");
}

#[test]
fn router_agrees_with_linear_scan_across_hosts() {
    let mut rng = fastrand::Rng::with_seed(42);
    let hosts = ["a.com", "x.a.com", "y.x.a.com", "b.com", "c.org"];
    let patterns = ["a.com", "*.a.com", "*.x.a.com", "*"];
    let mut vhosts = Vec::new();
    let mut all: Vec<(String, Vec<Route>)> = Vec::new();
    for (vi, pat) in patterns.iter().enumerate() {
        let routes: Vec<Route> = (0..100)
            .map(|i| rand_route(&mut rng, vi * 1000 + i))
            .collect();
        all.push((pat.to_string(), routes.clone()));
        vhosts.push(mk_vhost(pat, routes));
    }
    let router = Router::build(&mk_table(vec![mk_port(
        80,
        vec![mk_listener("l", None, vhosts)],
    )]))
    .unwrap();
    // Reference: pick the vhost by the documented rule, then scan linearly.
    let pick = |host: &str| -> usize {
        match host {
            "a.com" => 0,
            "y.x.a.com" => 2,
            "x.a.com" => 1,
            _ => 3,
        }
    };
    for _ in 0..3_000 {
        let host = hosts[rng.usize(..hosts.len())];
        let target = rand_target(&mut rng);
        let (path, query) = super::split_path_and_query(&target);
        let headers = rand_headers(&mut rng);
        let got = router
            .route(80, host, &Method::GET, &target, &headers)
            .map(|m| m.route.api.route.name.clone());
        let want = all[pick(host)].1.iter().find(|r| {
            Matcher::compile(&r.matcher, "ns/r").unwrap().matches(
                path,
                query,
                &Method::GET,
                &headers,
            )
        });
        assert_eq!(got, want.map(|r| r.route.name.clone()), "{host} {target}");
    }
}
