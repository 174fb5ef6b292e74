//! Rule validation (UnsupportedValue) and filter conversion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compile_support;

use compile_support::*;
use tollgate_api::{
    BackendKey, Cors, Filter, HeaderMatch, HeaderModifier, Mirror, PathMatch, PathModifier,
    Redirect, Retry, RouteMatch, StringMatch, Timeouts, UrlRewrite,
};

fn out() -> tollgate::compile::Output {
    run(&["rules"], "")
}

#[track_caller]
fn assert_unsupported(out: &tollgate::compile::Output, name: &str, needle: &str) {
    let c = parent_conds(out, "apps", name, 0);
    assert_cond(c, "Accepted", "False", "UnsupportedValue");
    let msg = &cond(c, "Accepted").message;
    assert!(msg.contains(needle), "{name}: {msg:?} lacks {needle:?}");
}

#[test]
fn unsupported_value_bad_regex() {
    let out = out();
    assert_unsupported(&out, "bad-regex", "spec.rules[1].matches[0].path");
    assert_unsupported(
        &out,
        "bad-header-regex",
        "spec.rules[0].matches[0].headers[0]",
    );
}

#[test]
fn unsupported_value_unknown_filter() {
    assert_unsupported(&out(), "extension-ref", "spec.rules[0].filters[0]");
}

#[test]
fn unsupported_value_redirect_with_rewrite() {
    assert_unsupported(
        &out(),
        "redirect-and-rewrite",
        "RequestRedirect and URLRewrite",
    );
}

#[test]
fn unsupported_value_replace_prefix_without_prefix_match() {
    assert_unsupported(&out(), "prefix-replace-on-exact", "ReplacePrefixMatch");
}

#[test]
fn unsupported_value_relative_path() {
    assert_unsupported(&out(), "relative-path", "must start with '/'");
}

#[test]
fn unsupported_value_duplicate_header_in_modifier() {
    assert_unsupported(&out(), "duplicate-header", "x-a appears more than once");
}

#[test]
fn unsupported_value_backend_timeout_above_request() {
    assert_unsupported(&out(), "bad-timeouts", "backendRequest");
}

#[test]
fn unsupported_value_retry_out_of_range() {
    let out = out();
    assert_unsupported(&out, "retry-storm", "spec.rules[0].retry.attempts: 101");
    assert_unsupported(&out, "retry-bad-code", "spec.rules[0].retry.codes[1]: 200");
    assert_unsupported(&out, "retry-bad-backoff", "spec.rules[0].retry.backoff");
}

#[test]
fn retry_compiles_with_defaults_and_sorted_codes() {
    let out = out();
    assert_route_ok(&out, "apps", "retries");
    let v = vhost(
        table_listener(table(&out, "apps", "gw"), "http"),
        "retry.test",
    );
    let by_path = |p: &str| {
        v.routes
            .iter()
            .find(|r| r.matcher.path == PathMatch::PathPrefix(p.into()))
            .unwrap()
            .retry
            .clone()
    };
    assert_eq!(
        by_path("/given"),
        Some(Retry {
            attempts: 3,
            backoff_ms: 100,
            codes: vec![500, 503],
        })
    );
    assert_eq!(
        by_path("/defaults"),
        Some(Retry {
            attempts: 1,
            backoff_ms: 25,
            codes: vec![],
        })
    );
    assert_eq!(by_path("/off"), None);
    assert_eq!(by_path("/none"), None);
}

#[test]
fn session_persistence_compiles_with_its_defaults() {
    use tollgate_api::backend::{Session, SessionCarrier};
    let out = out();
    assert_route_ok(&out, "apps", "sessions");
    let v = vhost(
        table_listener(table(&out, "apps", "gw"), "http"),
        "session.test",
    );
    let by_path = |p: &str| {
        v.routes
            .iter()
            .find(|r| r.matcher.path == PathMatch::PathPrefix(p.into()))
            .unwrap()
            .session
            .clone()
    };
    assert_eq!(
        by_path("/cookie"),
        Some(Session {
            name: "shop".into(),
            carrier: SessionCarrier::Cookie,
            absolute_secs: Some(3600),
            idle_secs: None,
            permanent: true,
        })
    );
    assert_eq!(
        by_path("/header"),
        Some(Session {
            name: "x-session".into(),
            carrier: SessionCarrier::Header,
            absolute_secs: None,
            idle_secs: None,
            permanent: false,
        })
    );
    assert_eq!(by_path("/defaults").unwrap().name, "tollgate-session");
    assert_unsupported(&out, "session-bad-name", "sessionPersistence.sessionName");
    assert_unsupported(
        &out,
        "session-permanent-forever",
        "Permanent needs absoluteTimeout",
    );
}

#[test]
fn bad_route_rejects_only_itself() {
    let out = out();
    assert_route_ok(&out, "apps", "good");
    let gw = gateway_conds(&out, "apps", "gw");
    assert_cond(gw, "Accepted", "True", "Accepted");
    assert_cond(gw, "Programmed", "True", "Programmed");
    let shared = vhost(
        table_listener(table(&out, "apps", "gw"), "http"),
        "shared.test",
    );
    // Not even bad-regex's valid first rule is served.
    assert_eq!(order(shared), vec!["good#0"]);
    assert_eq!(
        shared.routes[0].matcher.path,
        PathMatch::PathPrefix("/good".into())
    );
    // Every bad route shows up as a rejection, the good one does not.
    let rejected: Vec<String> = out
        .rejections()
        .iter()
        .map(|r| r.key.name.clone())
        .collect();
    assert!(!rejected.contains(&"good".to_owned()));
    assert!(rejected.contains(&"bad-regex".to_owned()));
}

#[test]
fn every_filter_converts() {
    let out = out();
    assert_route_ok(&out, "apps", "every-filter");
    let v = vhost(
        table_listener(table(&out, "apps", "gw"), "http"),
        "filters.test",
    );
    assert_eq!(
        order(v),
        vec!["every-filter#1", "every-filter#0", "every-filter#2"]
    );
    let main = &v.routes[1];
    assert_eq!(main.rule_name.as_deref(), Some("main"));
    assert_eq!(
        main.matcher,
        RouteMatch {
            path: PathMatch::PathPrefix("/api".into()),
            method: Some("POST".into()),
            headers: vec![HeaderMatch {
                name: "x-env".into(),
                value: StringMatch::Exact("canary".into()),
            }],
            query_params: vec![HeaderMatch {
                name: "Debug".into(),
                value: StringMatch::RegularExpression("on|yes".into()),
            }],
        }
    );
    assert_eq!(
        main.timeouts,
        Timeouts {
            request_ms: Some(90_000),
            backend_request_ms: Some(500),
        }
    );
    let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    assert_eq!(
        main.filters,
        vec![
            Filter::RequestHeaderModifier(HeaderModifier {
                set: vec![pair("x-set", "s")],
                add: vec![pair("x-add", "a")],
                remove: vec!["x-remove".into()],
            }),
            Filter::ResponseHeaderModifier(HeaderModifier {
                add: vec![pair("x-resp", "r")],
                ..HeaderModifier::default()
            }),
            Filter::UrlRewrite(UrlRewrite {
                hostname: Some("internal.test".into()),
                path: Some(PathModifier::ReplacePrefixMatch("/v2".into())),
            }),
            Filter::RequestMirror(Mirror {
                backend: Some(BackendKey::of("apps", "api", 8080)),
                per_million: 333_333,
                sampler: Default::default(),
            }),
            Filter::RequestMirror(Mirror {
                backend: Some(BackendKey::of("apps", "web", 80)),
                per_million: 1_000_000,
                sampler: Default::default(),
            }),
            Filter::Cors(Cors {
                allow_origins: vec!["https://*.example.com".into()],
                allow_credentials: true,
                allow_methods: vec!["GET".into()],
                max_age: 5,
                ..Cors::default()
            }),
        ]
    );
    assert_eq!(
        main.backends[0].filters,
        vec![Filter::RequestHeaderModifier(HeaderModifier {
            set: vec![pair("x-backend", "web")],
            ..HeaderModifier::default()
        })]
    );
    let redirect = &v.routes[0];
    assert_eq!(redirect.matcher.path, PathMatch::Exact("/old".into()));
    assert_eq!(
        redirect.filters,
        vec![Filter::RequestRedirect(Redirect {
            scheme: Some("https".into()),
            hostname: None,
            port: Some(8443),
            path: Some(PathModifier::ReplaceFullPath("/new".into())),
            status_code: 301,
        })]
    );
    // `0s` = no timeout; no matches = PathPrefix "/".
    let catch_all = &v.routes[2];
    assert!(catch_all.timeouts.is_empty());
    assert_eq!(catch_all.matcher.path, PathMatch::PathPrefix("/".into()));
}

#[test]
fn route_without_rules_gets_the_crd_default_rule() {
    let out = run(
        &["rules"],
        r"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: no-rules, namespace: apps}
spec:
  parentRefs: [{name: gw}]
  hostnames: [bare.test]
",
    );
    assert_route_ok(&out, "apps", "no-rules");
    let v = vhost(
        table_listener(table(&out, "apps", "gw"), "http"),
        "bare.test",
    );
    assert_eq!(v.routes.len(), 1);
    assert_eq!(v.routes[0].matcher.path, PathMatch::PathPrefix("/".into()));
    assert!(v.routes[0].backends.is_empty());
}

#[test]
fn unsupported_value_repeated_filter_type() {
    let out = run(
        &["rules"],
        r"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: twice, namespace: apps}
spec:
  parentRefs: [{name: gw}]
  rules:
  - filters:
    - {type: URLRewrite, urlRewrite: {hostname: a.test}}
    - {type: URLRewrite, urlRewrite: {hostname: b.test}}
",
    );
    assert_unsupported(
        &out,
        "twice",
        "filter type URLRewrite appears more than once",
    );
}

#[test]
fn unsupported_value_invalid_hostname_and_header_name() {
    let out = run(
        &["rules"],
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: ip-host, namespace: apps}
spec:
  parentRefs: [{name: gw}]
  hostnames: [10.0.0.1]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: bad-header, namespace: apps}
spec:
  parentRefs: [{name: gw}]
  rules:
  - filters:
    - type: ResponseHeaderModifier
      responseHeaderModifier: {set: [{name: "x bad", value: v}]}
"#,
    );
    assert_unsupported(&out, "ip-host", "spec.hostnames[0]");
    assert_unsupported(&out, "bad-header", "not a valid header name");
}
