//! Router behaviour, one test per rule.

use http::{HeaderMap, Method};

use super::test_support::*;
use super::*;

fn name_of(r: &Router, port: u16, host: &str, target: &str) -> Option<String> {
    name_with(r, port, host, &Method::GET, target, &HeaderMap::new())
}

fn name_with(
    r: &Router,
    port: u16,
    host: &str,
    method: &Method,
    target: &str,
    headers: &HeaderMap,
) -> Option<String> {
    r.route(port, host, method, target, headers)
        .map(|m| m.route.api.route.name.clone())
}

fn build(t: &tollgate_api::RouteTable) -> Router {
    Router::build(t).unwrap()
}

#[test]
fn first_match_wins_in_table_order() {
    let r = build(&mk_simple(vec![
        mk_prefix("a", "/api"),
        mk_exact("b", "/api/x"),
        mk_prefix("c", "/"),
    ]));
    // The compiler sorts; the router must not re-sort (b would win on precedence).
    assert_eq!(name_of(&r, 80, "h", "/api/x").as_deref(), Some("a"));
    assert_eq!(name_of(&r, 80, "h", "/other").as_deref(), Some("c"));
}

#[test]
fn no_matching_route_is_none() {
    let r = build(&mk_simple(vec![mk_exact("a", "/a")]));
    assert_eq!(name_of(&r, 80, "h", "/b"), None);
}

#[test]
fn unknown_port_is_none() {
    let r = build(&mk_simple(vec![mk_prefix("a", "/")]));
    assert_eq!(name_of(&r, 8080, "h", "/"), None);
    assert!(r.serves_port(80));
    assert!(!r.serves_port(8080));
}

#[test]
fn matched_prefix_is_reported_for_prefix_matches_only() {
    let r = build(&mk_simple(vec![
        mk_exact("e", "/e"),
        mk_prefix("p", "/api/"),
    ]));
    let h = HeaderMap::new();
    let m = r.route(80, "h", &Method::GET, "/api/x", &h).unwrap();
    assert_eq!(m.matched_prefix, Some("/api"));
    assert_eq!(m.listener, "http");
    assert_eq!(&*m.route.label, "ns/p");
    let m = r.route(80, "h", &Method::GET, "/e", &h).unwrap();
    assert_eq!(m.matched_prefix, None);
}

#[test]
fn labels_are_shared_per_httproute() {
    let r = build(&mk_simple(vec![mk_exact("a", "/1"), mk_exact("a", "/2")]));
    let h = HeaderMap::new();
    let one = r.route(80, "h", &Method::GET, "/1", &h).unwrap();
    let two = r.route(80, "h", &Method::GET, "/2", &h).unwrap();
    assert!(Arc::ptr_eq(&one.route.label, &two.route.label));
}

fn listeners_table() -> tollgate_api::RouteTable {
    mk_table(vec![mk_port(
        80,
        vec![
            mk_listener(
                "exact",
                Some("a.example.com"),
                vec![mk_vhost("a.example.com", vec![mk_prefix("exact", "/")])],
            ),
            mk_listener(
                "deep",
                Some("*.b.example.com"),
                vec![mk_vhost("*.b.example.com", vec![mk_prefix("deep", "/")])],
            ),
            mk_listener(
                "wild",
                Some("*.example.com"),
                vec![mk_vhost("*.example.com", vec![mk_prefix("wild", "/")])],
            ),
            mk_listener(
                "any",
                None,
                vec![mk_vhost("*", vec![mk_prefix("any", "/")])],
            ),
        ],
    )])
}

#[test]
fn exact_listener_beats_wildcard() {
    let r = build(&listeners_table());
    assert_eq!(
        name_of(&r, 80, "a.example.com", "/").as_deref(),
        Some("exact")
    );
}

#[test]
fn longest_wildcard_listener_wins() {
    let r = build(&listeners_table());
    assert_eq!(
        name_of(&r, 80, "x.b.example.com", "/").as_deref(),
        Some("deep")
    );
    assert_eq!(
        name_of(&r, 80, "x.c.example.com", "/").as_deref(),
        Some("wild")
    );
}

#[test]
fn wildcard_listener_needs_a_label() {
    let r = build(&listeners_table());
    assert_eq!(name_of(&r, 80, "example.com", "/").as_deref(), Some("any"));
    assert_eq!(
        name_of(&r, 80, "b.example.com", "/").as_deref(),
        Some("wild")
    );
}

#[test]
fn wildcard_matches_several_labels() {
    let r = build(&listeners_table());
    assert_eq!(
        name_of(&r, 80, "x.y.z.example.com", "/").as_deref(),
        Some("wild")
    );
}

#[test]
fn listener_without_hostname_takes_the_rest() {
    let r = build(&listeners_table());
    assert_eq!(name_of(&r, 80, "other.org", "/").as_deref(), Some("any"));
}

#[test]
fn host_port_case_and_trailing_dot_are_ignored() {
    let r = build(&listeners_table());
    assert_eq!(
        name_of(&r, 80, "A.Example.COM:80", "/").as_deref(),
        Some("exact")
    );
    assert_eq!(
        name_of(&r, 80, "a.example.com.", "/").as_deref(),
        Some("exact")
    );
    assert_eq!(name_of(&r, 80, "[::1]:80", "/").as_deref(), Some("any"));
}

#[test]
fn no_listener_for_host_is_none() {
    let t = mk_table(vec![mk_port(
        80,
        vec![mk_listener(
            "a",
            Some("a.com"),
            vec![mk_vhost("a.com", vec![mk_prefix("a", "/")])],
        )],
    )]);
    assert_eq!(name_of(&build(&t), 80, "b.com", "/"), None);
}

#[test]
fn vhost_exact_then_wildcard_then_star() {
    let t = mk_table(vec![mk_port(
        80,
        vec![mk_listener(
            "l",
            None,
            vec![
                mk_vhost("a.example.com", vec![mk_prefix("exact", "/")]),
                mk_vhost("*.example.com", vec![mk_prefix("wild", "/")]),
                mk_vhost("*", vec![mk_prefix("star", "/")]),
            ],
        )],
    )]);
    let r = build(&t);
    assert_eq!(
        name_of(&r, 80, "a.example.com", "/").as_deref(),
        Some("exact")
    );
    assert_eq!(
        name_of(&r, 80, "b.example.com", "/").as_deref(),
        Some("wild")
    );
    assert_eq!(name_of(&r, 80, "example.com", "/").as_deref(), Some("star"));
}

#[test]
fn exact_vhost_does_not_fall_back() {
    let t = mk_table(vec![mk_port(
        80,
        vec![mk_listener(
            "l",
            None,
            vec![
                mk_vhost("a.example.com", vec![mk_exact("exact", "/only")]),
                mk_vhost("*", vec![mk_prefix("star", "/")]),
            ],
        )],
    )]);
    let r = build(&t);
    assert_eq!(
        name_of(&r, 80, "a.example.com", "/only").as_deref(),
        Some("exact")
    );
    assert_eq!(name_of(&r, 80, "a.example.com", "/other"), None);
}

#[test]
fn specific_listener_does_not_fall_back() {
    let t = mk_table(vec![mk_port(
        80,
        vec![
            mk_listener(
                "a",
                Some("a.com"),
                vec![mk_vhost("a.com", vec![mk_exact("a", "/a")])],
            ),
            mk_listener(
                "any",
                None,
                vec![mk_vhost("*", vec![mk_prefix("any", "/")])],
            ),
        ],
    )]);
    assert_eq!(name_of(&build(&t), 80, "a.com", "/b"), None);
}

#[test]
fn listener_without_matching_vhost_is_none() {
    let t = mk_table(vec![mk_port(
        80,
        vec![mk_listener(
            "l",
            None,
            vec![mk_vhost("a.com", vec![mk_prefix("a", "/")])],
        )],
    )]);
    assert_eq!(name_of(&build(&t), 80, "b.com", "/"), None);
}

#[test]
fn ports_are_independent() {
    let t = mk_table(vec![
        mk_port(
            80,
            vec![mk_listener(
                "http",
                None,
                vec![mk_vhost("*", vec![mk_prefix("p80", "/")])],
            )],
        ),
        mk_port(
            443,
            vec![mk_listener(
                "https",
                None,
                vec![mk_vhost("*", vec![mk_prefix("p443", "/")])],
            )],
        ),
    ]);
    let r = build(&t);
    assert_eq!(name_of(&r, 80, "h", "/").as_deref(), Some("p80"));
    assert_eq!(name_of(&r, 443, "h", "/").as_deref(), Some("p443"));
}

#[test]
fn method_header_and_query_predicates_select_routes() {
    let r = build(&mk_simple(vec![
        with_method(mk_prefix("post", "/"), "POST"),
        with_header(mk_prefix("canary", "/"), "x-env", "canary"),
        with_query(mk_prefix("v2", "/"), "v", "2"),
        mk_prefix("default", "/"),
    ]));
    let none = HeaderMap::new();
    let canary = mk_headers(&[("X-Env", "canary")]);
    assert_eq!(
        name_with(&r, 80, "h", &Method::POST, "/", &none).as_deref(),
        Some("post")
    );
    assert_eq!(
        name_with(&r, 80, "h", &Method::GET, "/", &canary).as_deref(),
        Some("canary")
    );
    assert_eq!(
        name_with(&r, 80, "h", &Method::GET, "/?v=2", &none).as_deref(),
        Some("v2")
    );
    assert_eq!(
        name_with(&r, 80, "h", &Method::GET, "/", &none).as_deref(),
        Some("default")
    );
}

#[test]
fn regex_route_keeps_its_position() {
    let r = build(&mk_simple(vec![
        mk_regex("re", "/items/[0-9]+"),
        mk_prefix("items", "/items"),
    ]));
    assert_eq!(name_of(&r, 80, "h", "/items/42").as_deref(), Some("re"));
    assert_eq!(name_of(&r, 80, "h", "/items/x").as_deref(), Some("items"));
}

#[test]
fn invalid_regex_fails_the_build() {
    let err = Router::build(&mk_simple(vec![mk_regex("bad", "([")])).unwrap_err();
    assert!(matches!(err, RouterError::Regex { ref route, .. } if route == "ns/bad"));
}

#[test]
fn hostile_requests_do_not_panic() {
    let r = build(&listeners_table());
    let long_path = "/a".repeat(20_000);
    let long_host = "a.".repeat(10_000) + "example.com";
    for (host, target) in [
        ("", ""),
        ("", "*"),
        (":", "?"),
        ("[", "/?&&=&=="),
        ("é.example.com:é", "/é/ü?é=ü"),
        (long_host.as_str(), long_path.as_str()),
    ] {
        let _ = r.route(80, host, &Method::GET, target, &HeaderMap::new());
    }
    assert_eq!(name_of(&r, 80, &long_host, "/").as_deref(), Some("wild"));
}

#[test]
fn empty_table_routes_nothing() {
    let r = build(&mk_table(vec![]));
    assert_eq!(name_of(&r, 80, "h", "/"), None);
}

/// The route sets of a router, by (port, listener, virtual host position).
fn sets(r: &Router) -> Vec<((u16, String, usize), Arc<RouteSet>)> {
    let mut out = Vec::new();
    for (port, p) in &r.ports {
        for l in &p.listeners {
            for (i, set) in l.vhosts.iter().enumerate() {
                out.push(((*port, l.name.to_string(), i), set.clone()));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn rebuilding_keeps_the_virtual_hosts_whose_routes_are_shared() {
    let t1 = mk_table(vec![mk_port(
        80,
        vec![mk_listener(
            "http",
            None,
            vec![
                mk_vhost("a.test", vec![mk_prefix("a", "/")]),
                mk_vhost("b.test", vec![mk_prefix("b", "/")]),
            ],
        )],
    )]);
    let r1 = build(&t1);
    // The next table shares a.test's list and has a new one for b.test.
    let mut t2 = t1.clone();
    let vhosts = &mut t2.ports[0].listeners[0].virtual_hosts;
    vhosts[1].routes = vec![mk_exact("b2", "/only")].into();
    let r2 = Router::build_reusing(&t2, Some(&r1), &Metrics::default()).unwrap();
    let (s1, s2) = (sets(&r1), sets(&r2));
    assert!(Arc::ptr_eq(&s1[0].1, &s2[0].1), "a.test rebuilt");
    assert!(!Arc::ptr_eq(&s1[1].1, &s2[1].1), "b.test kept");
    // It routes exactly as a router built afresh.
    let fresh = build(&t2);
    for (host, path) in [("a.test", "/x"), ("b.test", "/only"), ("b.test", "/")] {
        assert_eq!(
            name_of(&r2, 80, host, path),
            name_of(&fresh, 80, host, path),
            "{host}{path}"
        );
    }
    assert_eq!(name_of(&r2, 80, "b.test", "/").as_deref(), None);
    assert_eq!(name_of(&r2, 80, "b.test", "/only").as_deref(), Some("b2"));
    // Equal content in a new allocation is built again (identity, not equality, decides).
    let mut t3 = t2.clone();
    let copy: Vec<Route> = t3.ports[0].listeners[0].virtual_hosts[0].routes.to_vec();
    t3.ports[0].listeners[0].virtual_hosts[0].routes = copy.into();
    let r3 = Router::build_reusing(&t3, Some(&r2), &Metrics::default()).unwrap();
    assert!(!Arc::ptr_eq(&sets(&r2)[0].1, &sets(&r3)[0].1));
    assert_eq!(name_of(&r3, 80, "a.test", "/x").as_deref(), Some("a"));
}
