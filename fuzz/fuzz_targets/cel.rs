//! CEL compilation (`tollgate_proxy::policy::cel`), on arbitrary expression text, and
//! evaluation of what compiles against a fixed request. Checks, besides not panicking (a
//! panic in compile would take down a table build; in eval, a request): `check` and
//! `compile` agree on what is valid.
#![no_main]

use std::sync::LazyLock;

use http::HeaderMap;
use libfuzzer_sys::fuzz_target;
use tollgate_proxy::policy::cel::{Activation, Attrs, Expr, check};

static HEADERS: LazyLock<HeaderMap> = LazyLock::new(|| {
    let mut h = HeaderMap::new();
    h.insert("x-tenant", http::HeaderValue::from_static("acme"));
    h.append("accept", http::HeaderValue::from_static("text/html"));
    h.append("accept", http::HeaderValue::from_static("*/*"));
    h
});

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    let compiled = Expr::compile(source);
    assert_eq!(
        check(source).is_ok(),
        compiled.is_ok(),
        "check and compile differ"
    );
    let Ok(expr) = compiled else {
        return;
    };
    let act = Activation::new(&Attrs {
        method: "GET",
        host: "shop.example.com",
        path: "/api/v1/items?q=1",
        scheme: "https",
        headers: &HEADERS,
        source: std::net::SocketAddr::from(([127, 0, 0, 1], 40000)),
    });
    let _ = expr.eval(&act);
    let _ = expr.eval_bool(&act);
    let _ = expr.eval_string(&act);
});
