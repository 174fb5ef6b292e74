//! Route matching cost on a large table. In: a synthetic table of 10k routes (a third exact
//! paths, a third prefixes, a third prefixes with a header match) spread over 100 hostnames
//! and a wildcard, plus the same 10k routes in one virtual host. Out: criterion timings of
//! `Router::route` for hits at the start, middle and end of a virtual host, and for misses.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue, Method};
use tollgate_api::{
    HeaderMatch, ListenerConfig, ObjectKey, PathMatch, PortConfig, Protocol, Route, RouteMatch,
    RouteTable, StringMatch, Timeouts, VirtualHost,
};
use tollgate_proxy::router::Router;

const HOSTS: usize = 100;
const ROUTES_PER_HOST: usize = 99;

fn route(name: String, path: PathMatch, header: Option<(&str, String)>) -> Route {
    Route {
        route: ObjectKey::new("bench", name),
        rule_index: 0,
        rule_name: None,
        matcher: RouteMatch {
            path,
            method: None,
            headers: header
                .map(|(n, v)| HeaderMatch {
                    name: n.into(),
                    value: StringMatch::Exact(v),
                })
                .into_iter()
                .collect(),
            query_params: vec![],
        },
        filters: vec![],
        backends: vec![],
        timeouts: Timeouts::default(),
        policy: None,
        request_trailers: false,
        max_request_body_bytes: None,
        compression_disabled: false,
        grpc_web: false,
        cache: None,
        retry: None,
        session: None,
    }
}

/// `n` routes for one virtual host, in Gateway API precedence order: exact paths, then
/// prefixes with a header match, then bare prefixes (all prefixes the same length).
fn routes(host: usize, n: usize) -> Vec<Route> {
    let third = n / 3;
    let mut out = Vec::with_capacity(n);
    for j in 0..third {
        out.push(route(
            format!("h{host}-exact{j}"),
            PathMatch::Exact(format!("/svc{j:04}/items/{j}")),
            None,
        ));
    }
    for j in 0..third {
        out.push(route(
            format!("h{host}-hdr{j}"),
            PathMatch::PathPrefix(format!("/tenant{j:04}")),
            Some(("x-tenant", format!("t{j}"))),
        ));
    }
    for j in 0..n - 2 * third {
        out.push(route(
            format!("h{host}-prefix{j}"),
            PathMatch::PathPrefix(format!("/svc{j:04}")),
            None,
        ));
    }
    out
}

fn table(vhosts: Vec<VirtualHost>) -> RouteTable {
    RouteTable {
        version: 1,
        gateway: ObjectKey::new("bench", "gw"),
        policies: Default::default(),
        closed: Default::default(),
        ports: vec![PortConfig {
            address: "0.0.0.0".into(),
            port: 80,
            protocol: Protocol::Http,
            listeners: vec![ListenerConfig {
                passthrough: false,
                name: "http".into(),
                hostname: None,
                certificates: vec![],
                virtual_hosts: vhosts,
            }],
            client_validation: None,
            client: Default::default(),
        }],
        backends: Default::default(),
    }
}

/// 100 exact hostnames and `*.example.com`, 99 routes each: 9,999 routes.
fn many_hosts() -> RouteTable {
    let mut vhosts: Vec<VirtualHost> = (0..HOSTS)
        .map(|i| VirtualHost {
            hostname: format!("host{i}.example.com"),
            routes: routes(i, ROUTES_PER_HOST).into(),
        })
        .collect();
    vhosts.push(VirtualHost {
        hostname: "*.example.com".into(),
        routes: routes(HOSTS, ROUTES_PER_HOST).into(),
    });
    table(vhosts)
}

/// 9,999 routes in a single `*` virtual host.
fn one_host() -> RouteTable {
    table(vec![VirtualHost {
        hostname: "*".into(),
        routes: routes(0, 9_999).into(),
    }])
}

fn bench(c: &mut Criterion) {
    let many = Router::build(&many_hosts()).unwrap_or_else(|e| panic!("{e}"));
    let one = Router::build(&one_host()).unwrap_or_else(|e| panic!("{e}"));
    let none = HeaderMap::new();
    let mut tenant = HeaderMap::new();
    tenant.insert("x-tenant", HeaderValue::from_static("t20"));
    tenant.insert("user-agent", HeaderValue::from_static("bench"));
    tenant.insert("accept", HeaderValue::from_static("*/*"));

    let cases: [(&str, &Router, &str, &str, &HeaderMap, bool); 10] = [
        (
            "hosts/exact_first",
            &many,
            "host50.example.com",
            "/svc0000/items/0",
            &none,
            true,
        ),
        (
            "hosts/exact_last",
            &many,
            "host50.example.com",
            "/svc0032/items/32?x=1",
            &none,
            true,
        ),
        (
            "hosts/header_prefix",
            &many,
            "host99.example.com:80",
            "/tenant0020/a/b",
            &tenant,
            true,
        ),
        (
            "hosts/prefix_last",
            &many,
            "host7.example.com",
            "/svc0032/deep/path/x",
            &none,
            true,
        ),
        (
            "hosts/wildcard_host",
            &many,
            "foo.bar.example.com",
            "/svc0010/x",
            &none,
            true,
        ),
        (
            "hosts/upper_case_host",
            &many,
            "HOST7.Example.com",
            "/svc0032/x",
            &none,
            true,
        ),
        (
            "hosts/miss_path",
            &many,
            "host7.example.com",
            "/nothing/here/at/all",
            &none,
            false,
        ),
        (
            "hosts/miss_header",
            &many,
            "host7.example.com",
            "/tenant0020/x",
            &none,
            false,
        ),
        (
            "one_vhost/prefix_last",
            &one,
            "any.host",
            "/svc3332/deep/path",
            &none,
            true,
        ),
        (
            "one_vhost/miss",
            &one,
            "any.host",
            "/nothing/here",
            &none,
            false,
        ),
    ];
    for (name, router, host, target, headers, hit) in cases {
        // A benchmark of the wrong outcome measures nothing.
        let got = router
            .route(80, host, &Method::GET, target, headers)
            .is_some();
        assert_eq!(got, hit, "{name}");
        c.bench_function(name, |b| {
            b.iter(|| {
                router
                    .route(
                        80,
                        black_box(host),
                        &Method::GET,
                        black_box(target),
                        black_box(headers),
                    )
                    .map(|r| r.route.api.rule_index)
            })
        });
    }
    c.bench_function("build/many_hosts_10k", |b| {
        let t = many_hosts();
        b.iter(|| Router::build(black_box(&t)).map(|r| r.serves_port(80)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
