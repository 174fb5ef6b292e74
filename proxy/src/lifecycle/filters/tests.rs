//! Filter behaviour, one test per rule; CORS cases mirror the HTTPRouteCORS and
//! CORSAllowCredentialsBehavior conformance tests.

use http::header::{LOCATION, VARY};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use tollgate_api::{Cors, HeaderModifier, PathModifier, Redirect, UrlRewrite};

use super::*;

fn mk_headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

fn values(h: &HeaderMap, name: &str) -> Vec<String> {
    h.get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

fn one(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name).map(|v| v.to_str().unwrap().to_owned())
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

// --- header modifiers -------------------------------------------------------------------

#[test]
fn set_replaces_all_values() {
    let mut h = mk_headers(&[("x-set", "a"), ("x-set", "b")]);
    let m = HeaderModifier {
        set: pairs(&[("X-Set", "new")]),
        ..Default::default()
    };
    modify_headers(&m, &mut h);
    assert_eq!(values(&h, "x-set"), ["new"]);
}

#[test]
fn add_appends() {
    let mut h = mk_headers(&[("x-add", "a")]);
    let m = HeaderModifier {
        add: pairs(&[("x-add", "b"), ("x-new", "c")]),
        ..Default::default()
    };
    modify_headers(&m, &mut h);
    assert_eq!(values(&h, "x-add"), ["a", "b"]);
    assert_eq!(values(&h, "x-new"), ["c"]);
}

#[test]
fn remove_deletes_every_value_case_insensitively() {
    let mut h = mk_headers(&[("x-rm", "a"), ("x-rm", "b"), ("x-keep", "c")]);
    let m = HeaderModifier {
        remove: vec!["X-RM".into()],
        ..Default::default()
    };
    modify_headers(&m, &mut h);
    assert!(h.get("x-rm").is_none());
    assert_eq!(values(&h, "x-keep"), ["c"]);
}

#[test]
fn invalid_header_edits_are_skipped() {
    let mut h = HeaderMap::new();
    let m = HeaderModifier {
        set: pairs(&[("bad name", "v"), ("x-a", "bad\nvalue")]),
        add: pairs(&[("x-ok", "v")]),
        remove: vec!["bad name".into()],
    };
    modify_headers(&m, &mut h);
    assert_eq!(h.len(), 1);
    assert_eq!(values(&h, "x-ok"), ["v"]);
}

// --- redirects and rewrites --------------------------------------------------------------

fn view<'a>(scheme: &'a str, port: u16, path: &'a str, query: Option<&'a str>) -> RequestView<'a> {
    RequestView {
        scheme,
        host: "example.com",
        port,
        path,
        query,
        matched_prefix: None,
    }
}

fn mk_redirect(scheme: Option<&str>, port: Option<u16>) -> Redirect {
    Redirect {
        scheme: scheme.map(Into::into),
        hostname: None,
        port,
        path: None,
        status_code: 302,
    }
}

fn location(r: &Redirect, v: &RequestView<'_>) -> String {
    one(redirect(r, v).headers(), LOCATION.as_str()).unwrap()
}

#[test]
fn redirect_https_omits_443() {
    let r = mk_redirect(Some("https"), None);
    assert_eq!(
        location(&r, &view("http", 80, "/a", None)),
        "https://example.com/a"
    );
}

#[test]
fn redirect_scheme_without_port_uses_well_known_port() {
    let r = mk_redirect(Some("http"), None);
    assert_eq!(
        location(&r, &view("https", 8443, "/a", None)),
        "http://example.com/a"
    );
}

#[test]
fn redirect_keeps_listener_port_when_nothing_set() {
    let r = mk_redirect(None, None);
    assert_eq!(
        location(&r, &view("http", 8080, "/a", None)),
        "http://example.com:8080/a"
    );
    assert_eq!(
        location(&r, &view("http", 80, "/a", None)),
        "http://example.com/a"
    );
    assert_eq!(
        location(&r, &view("https", 443, "/a", None)),
        "https://example.com/a"
    );
}

#[test]
fn redirect_explicit_port_is_kept_unless_well_known() {
    let r = mk_redirect(Some("https"), Some(8443));
    assert_eq!(
        location(&r, &view("http", 80, "/", None)),
        "https://example.com:8443/"
    );
    let r = mk_redirect(None, Some(80));
    assert_eq!(
        location(&r, &view("http", 8080, "/", None)),
        "http://example.com/"
    );
}

#[test]
fn redirect_hostname_and_status() {
    let mut r = mk_redirect(None, None);
    r.hostname = Some("other.org".into());
    r.status_code = 301;
    let resp = redirect(&r, &view("http", 80, "/p", None));
    assert_eq!(resp.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(
        one(resp.headers(), "location").unwrap(),
        "http://other.org/p"
    );
}

#[test]
fn redirect_preserves_query() {
    let r = mk_redirect(None, None);
    assert_eq!(
        location(&r, &view("http", 80, "/p", Some("a=1&b"))),
        "http://example.com/p?a=1&b"
    );
}

#[test]
fn redirect_replace_full_path() {
    let mut r = mk_redirect(None, None);
    r.path = Some(PathModifier::ReplaceFullPath("/new".into()));
    assert_eq!(
        location(&r, &view("http", 80, "/old/x", Some("q"))),
        "http://example.com/new?q"
    );
}

#[test]
fn redirect_replace_prefix_match() {
    let mut r = mk_redirect(None, None);
    r.path = Some(PathModifier::ReplacePrefixMatch("/replacement".into()));
    let mut v = view("http", 80, "/original/lemon", None);
    v.matched_prefix = Some("/original");
    assert_eq!(location(&r, &v), "http://example.com/replacement/lemon");
}

#[test]
fn redirect_brackets_ipv6_hosts() {
    let r = mk_redirect(None, None);
    let mut v = view("http", 8080, "/", None);
    v.host = "::1";
    assert_eq!(location(&r, &v), "http://[::1]:8080/");
    v.host = "[::1]";
    assert_eq!(location(&r, &v), "http://[::1]:8080/");
}

#[test]
fn redirect_bad_status_becomes_302() {
    let mut r = mk_redirect(None, None);
    r.status_code = 200;
    assert_eq!(
        redirect(&r, &view("http", 80, "/", None)).status(),
        StatusCode::FOUND
    );
}

#[test]
fn redirect_unencodable_location_is_500() {
    let mut r = mk_redirect(None, None);
    r.hostname = Some("bad\nhost".into());
    let resp = redirect(&r, &view("http", 80, "/", None));
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(resp.headers().get(LOCATION).is_none());
}

#[test]
fn rewrite_host_and_prefix() {
    let r = UrlRewrite {
        hostname: Some("internal.svc".into()),
        path: Some(PathModifier::ReplacePrefixMatch("/one".into())),
    };
    let mut v = view("http", 80, "/prefix/one/two", Some("x=1"));
    v.matched_prefix = Some("/prefix/one");
    let out = rewrite(&r, &v);
    assert_eq!(out.host.as_deref(), Some("internal.svc"));
    assert_eq!(out.path_and_query, "/one/two?x=1");
}

#[test]
fn rewrite_full_path_keeps_query() {
    let r = UrlRewrite {
        hostname: None,
        path: Some(PathModifier::ReplaceFullPath("/one".into())),
    };
    let out = rewrite(&r, &view("http", 80, "/full/one/two", Some("a=b")));
    assert_eq!(
        out,
        Rewritten {
            host: None,
            path_and_query: "/one?a=b".into()
        }
    );
}

#[test]
fn rewrite_prefix_without_prefix_match_keeps_path() {
    let r = UrlRewrite {
        hostname: None,
        path: Some(PathModifier::ReplacePrefixMatch("/x".into())),
    };
    assert_eq!(
        rewrite(&r, &view("http", 80, "/exact", None)).path_and_query,
        "/exact"
    );
}

// --- CORS ---------------------------------------------------------------------------------

fn cors_1() -> Cors {
    Cors {
        allow_origins: vec!["https://www.foo.com".into(), "https://*.bar.com".into()],
        allow_credentials: true,
        allow_methods: vec!["GET".into(), "OPTIONS".into()],
        allow_headers: vec!["x-header-1".into(), "x-header-2".into()],
        expose_headers: vec!["x-header-3".into(), "x-header-4".into()],
        max_age: 3600,
    }
}

fn cors_wildcards(creds: bool) -> Cors {
    Cors {
        allow_origins: vec!["*".into()],
        allow_credentials: creds,
        allow_methods: vec!["*".into()],
        allow_headers: vec!["*".into()],
        ..Cors::default()
    }
}

fn preflight(c: &Cors, origin: &str, extra: &[(&str, &str)]) -> http::Response<()> {
    let mut h = mk_headers(&[("origin", origin), ("access-control-request-method", "GET")]);
    for (k, v) in extra {
        h.insert(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    cors_preflight(c, &Method::OPTIONS, &h).unwrap()
}

#[test]
fn preflight_needs_options_origin_and_request_method() {
    let c = cors_1();
    let full = mk_headers(&[
        ("origin", "https://www.foo.com"),
        ("access-control-request-method", "GET"),
    ]);
    assert!(cors_preflight(&c, &Method::GET, &full).is_none());
    let no_acrm = mk_headers(&[("origin", "https://www.foo.com")]);
    assert!(cors_preflight(&c, &Method::OPTIONS, &no_acrm).is_none());
    let no_origin = mk_headers(&[("access-control-request-method", "GET")]);
    assert!(cors_preflight(&c, &Method::OPTIONS, &no_origin).is_none());
    assert!(cors_preflight(&c, &Method::OPTIONS, &full).is_some());
}

#[test]
fn preflight_from_allowed_origin_lists_everything() {
    let resp = preflight(
        &cors_1(),
        "https://xpto.www.bar.com",
        &[("access-control-request-headers", "x-header-1")],
    );
    let h = resp.headers();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        one(h, "access-control-allow-origin").unwrap(),
        "https://xpto.www.bar.com"
    );
    assert_eq!(
        one(h, "access-control-allow-methods").unwrap(),
        "GET, OPTIONS"
    );
    assert_eq!(
        one(h, "access-control-allow-headers").unwrap(),
        "x-header-1, x-header-2"
    );
    assert_eq!(
        one(h, "access-control-expose-headers").unwrap(),
        "x-header-3, x-header-4"
    );
    assert_eq!(one(h, "access-control-max-age").unwrap(), "3600");
    assert_eq!(one(h, "access-control-allow-credentials").unwrap(), "true");
    assert_eq!(values(h, "vary"), ["Origin"]);
}

#[test]
fn preflight_from_disallowed_origin_has_no_allow_headers() {
    let resp = preflight(&cors_1(), "https://foobar.com", &[]);
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers()
            .keys()
            .all(|k| !k.as_str().starts_with("access-control-"))
    );
    assert_eq!(values(resp.headers(), "vary"), ["Origin"]);
}

#[test]
fn preflight_star_methods_echo_the_requested_method() {
    let mut h = mk_headers(&[
        ("origin", "https://a.com"),
        ("access-control-request-method", "PUT"),
    ]);
    h.insert(
        "access-control-request-headers",
        HeaderValue::from_static("x-1, x-2"),
    );
    let resp = cors_preflight(&cors_wildcards(true), &Method::OPTIONS, &h).unwrap();
    assert_eq!(
        one(resp.headers(), "access-control-allow-methods").unwrap(),
        "PUT"
    );
    assert_eq!(
        one(resp.headers(), "access-control-allow-headers").unwrap(),
        "x-1, x-2"
    );
}

#[test]
fn credentials_never_answer_star_origin() {
    let resp = preflight(&cors_wildcards(true), "https://other.foo.com", &[]);
    assert_eq!(
        one(resp.headers(), "access-control-allow-origin").unwrap(),
        "https://other.foo.com"
    );
    assert_eq!(
        one(resp.headers(), "access-control-allow-credentials").unwrap(),
        "true"
    );
    // No headers were requested: with credentials `*` is not allowed, so none is sent.
    assert!(resp.headers().get("access-control-allow-headers").is_none());
}

#[test]
fn star_origin_without_credentials_answers_star() {
    let resp = preflight(&cors_wildcards(false), "https://foobar.com:12345", &[]);
    let h = resp.headers();
    assert_eq!(one(h, "access-control-allow-origin").unwrap(), "*");
    assert_eq!(one(h, "access-control-allow-headers").unwrap(), "*");
    assert!(h.get("access-control-allow-credentials").is_none());
    assert!(h.get(VARY).is_none());
}

#[test]
fn no_credentials_no_credentials_header() {
    let c = Cors {
        allow_origins: vec!["https://www.foo.com".into()],
        allow_methods: vec!["*".into()],
        ..Cors::default()
    };
    let resp = preflight(&c, "https://www.foo.com", &[]);
    assert!(
        resp.headers()
            .get("access-control-allow-credentials")
            .is_none()
    );
    assert!(resp.headers().get("access-control-max-age").is_none());
}

#[test]
fn decorate_allowed_origin() {
    let mut h = HeaderMap::new();
    let origin = HeaderValue::from_static("https://www.foo.com");
    cors_decorate(&cors_1(), Some(&origin), &mut h);
    assert_eq!(
        one(&h, "access-control-allow-origin").unwrap(),
        "https://www.foo.com"
    );
    assert_eq!(one(&h, "access-control-allow-credentials").unwrap(), "true");
    assert_eq!(
        one(&h, "access-control-expose-headers").unwrap(),
        "x-header-3, x-header-4"
    );
    assert_eq!(values(&h, "vary"), ["Origin"]);
    assert!(h.get("access-control-allow-methods").is_none());
}

#[test]
fn decorate_disallowed_origin_strips_upstream_grants() {
    let mut h = mk_headers(&[
        ("access-control-allow-origin", "*"),
        ("vary", "Accept-Encoding"),
    ]);
    let origin = HeaderValue::from_static("https://foobar.com");
    cors_decorate(&cors_1(), Some(&origin), &mut h);
    assert!(h.get("access-control-allow-origin").is_none());
    assert_eq!(values(&h, "vary"), ["Accept-Encoding", "Origin"]);
}

#[test]
fn decorate_without_origin_only_varies() {
    let mut h = mk_headers(&[("vary", "origin")]);
    cors_decorate(&cors_1(), None, &mut h);
    assert_eq!(values(&h, "vary"), ["origin"]);
    assert_eq!(h.len(), 1);
}

#[test]
fn empty_allow_origins_echoes_origin_with_credentials() {
    // CORSAllowCredentialsBehavior: only allowCredentials is configured.
    let origin = HeaderValue::from_static("https://app.example");
    let mut h = HeaderMap::new();
    let c = Cors {
        allow_credentials: true,
        ..Cors::default()
    };
    cors_decorate(&c, Some(&origin), &mut h);
    assert_eq!(
        one(&h, "access-control-allow-origin").unwrap(),
        "https://app.example"
    );
    assert_eq!(one(&h, "access-control-allow-credentials").unwrap(), "true");
    let mut h = HeaderMap::new();
    cors_decorate(&Cors::default(), Some(&origin), &mut h);
    assert!(h.get("access-control-allow-credentials").is_none());
}

#[test]
fn decorate_echoes_the_origin_even_for_allow_all() {
    // An actual request may carry credentials (cookies): a browser refuses `*` for those, so
    // the origin is echoed, with Vary, and Allow-Credentials stays absent when not allowed.
    let origin = HeaderValue::from_static("https://other.foo.com");
    let mut h = mk_headers(&[("access-control-allow-credentials", "true")]);
    cors_decorate(&cors_wildcards(false), Some(&origin), &mut h);
    assert_eq!(
        one(&h, "access-control-allow-origin").unwrap(),
        "https://other.foo.com"
    );
    assert_eq!(values(&h, "vary"), ["Origin"]);
    assert!(h.get("access-control-allow-credentials").is_none());
}
