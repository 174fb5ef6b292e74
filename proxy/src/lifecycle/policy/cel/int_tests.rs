//! The fast integer forms of cost expressions (module `int`) against the interpreter, over a
//! table of values: `int()` of strings with spaces, signs, leading zeros, overflow, other
//! types, missing headers and keys.

use http::{HeaderMap, HeaderValue};
use serde_json::json;

use super::*;

/// Header values a cost header may carry (one `HeaderValue` each; `None`: absent).
fn header_values() -> Vec<Vec<HeaderValue>> {
    let text = [
        "400",
        "0",
        "-0",
        "-3",
        "+7",
        "++7",
        "007",
        " 7",
        "7 ",
        "",
        "+",
        "-",
        "1.5",
        "1e3",
        "0x10",
        "1_000",
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775808",
        "-9223372036854775809",
        "99999999999999999999999",
        "lots",
    ];
    let mut out: Vec<Vec<HeaderValue>> = text
        .iter()
        .map(|t| vec![HeaderValue::from_str(t).unwrap()])
        .collect();
    out.push(Vec::new());
    out.push(vec![
        HeaderValue::from_static("1"),
        HeaderValue::from_static("2"),
    ]);
    // Not text: CEL does not see it.
    out.push(vec![HeaderValue::from_bytes(b"\xff12").unwrap()]);
    out.push(vec![
        HeaderValue::from_bytes(b"\xff").unwrap(),
        HeaderValue::from_static("12"),
    ]);
    out
}

fn identities() -> Vec<serde_json::Value> {
    vec![
        json!({"n": 5}),
        json!({"n": -5}),
        json!({"n": 5.9}),
        json!({"n": -5.9}),
        json!({"n": 1e19}),
        json!({"n": -1e19}),
        json!({"n": 9_223_372_036_854_775_807_u64}),
        json!({"n": 18_446_744_073_709_551_615_u64}),
        json!({"n": "12"}),
        json!({"n": " 12"}),
        json!({"n": true}),
        json!({"n": null}),
        json!({"n": [1]}),
        json!({"n": {"a": 1}}),
        json!({}),
        json!("not an object"),
    ]
}

const REQUEST_COSTS: [&str; 7] = [
    "int(request.headers['x-cost'])",
    "int(request.headers.x_cost)",
    "int(request.headers['X-Cost'])",
    "int(auth.identity.n)",
    "int(source.port)",
    "7",
    "int(request.method)",
];

#[test]
fn request_costs_are_fast_and_agree_with_the_interpreter() {
    let exprs: Vec<Expr> = REQUEST_COSTS
        .iter()
        .map(|s| Expr::compile(s).unwrap())
        .collect();
    for e in &exprs {
        assert!(e.is_fast(), "{}", e.source());
    }
    let needs: Needs = exprs.iter().collect();
    assert!(!needs.all_headers, "fast costs name their headers");
    let mut checked = 0;
    for values in header_values() {
        for identity in identities() {
            let mut h = HeaderMap::new();
            for v in &values {
                h.append("x-cost", v.clone());
                h.append("x_cost", v.clone());
            }
            let attrs = Attrs {
                method: "POST",
                host: "llm.example.com",
                path: "/v1/chat",
                scheme: "https",
                headers: &h,
                source: "10.1.2.3:5555".parse().unwrap(),
            };
            let mut full = Activation::new(&attrs);
            let mut lean = Activation::with_needs(&attrs, &needs);
            full.set_identity(&identity);
            lean.set_identity(&identity);
            for e in &exprs {
                // What `cost.request` made of the interpreter's value before the fast path.
                let want = e
                    .interpret_string(&full)
                    .and_then(|s| s.trim().parse::<i64>().ok());
                assert_eq!(
                    e.eval_int(&full),
                    want,
                    "`{}` on {values:?} {identity}",
                    e.source()
                );
                assert_eq!(e.eval_int(&lean), want, "`{}` (with_needs)", e.source());
                assert_eq!(e.eval_string(&lean), e.interpret_string(&full));
                assert_eq!(e.eval_bool(&lean), e.interpret_bool(&full));
                checked += 1;
            }
        }
    }
    assert!(checked > 1000);
}

#[test]
fn the_edges_of_int_are_cels() {
    let e = Expr::compile("int(request.headers['x-cost'])").unwrap();
    let cost = |v: &str| {
        let mut h = HeaderMap::new();
        h.insert("x-cost", v.parse().unwrap());
        let attrs = Attrs {
            method: "GET",
            host: "h",
            path: "/",
            scheme: "http",
            headers: &h,
            source: "10.1.2.3:5555".parse().unwrap(),
        };
        e.eval_int(&Activation::new(&attrs))
    };
    assert_eq!(cost("400"), Some(400));
    assert_eq!(cost("+7"), Some(7));
    assert_eq!(cost("007"), Some(7));
    assert_eq!(
        cost("-3"),
        Some(-3),
        "negative: the limit counts it as an error"
    );
    assert_eq!(cost(" 7"), None, "int() takes no spaces");
    assert_eq!(cost("9223372036854775808"), None, "overflow");
    assert_eq!(cost("1.5"), None);
}

const RESPONSE_COSTS: [&str; 10] = [
    "int(response.headers['x-tokens-used'])",
    "response.headers['x-tokens-used']",
    "int(response.headers['X-Tokens-Used'])",
    "int(response.headers.x_tokens)",
    "response.status",
    "int(response.status)",
    "400",
    "18446744073709551615u",
    "int(response.body.usage.total_tokens)",
    "response.body.usage.total_tokens",
];

/// Bodies as a response cost may see them (`None`: not read).
fn bodies() -> Vec<Option<serde_json::Value>> {
    let mut out: Vec<Option<serde_json::Value>> = identities()
        .into_iter()
        .map(|n| Some(json!({"usage": {"total_tokens": n.get("n").cloned()}})))
        .collect();
    out.extend([
        None,
        Some(json!({"usage": {"total_tokens": 400}, "id": "x"})),
        Some(json!({"usage": {}})),
        Some(json!({"usage": null})),
        Some(json!({"usage": [1]})),
        Some(json!([1, 2])),
        Some(json!("text")),
        Some(json!(null)),
    ]);
    out
}

#[test]
fn response_costs_are_fast_and_agree_with_the_interpreter() {
    let exprs: Vec<ResponseExpr> = RESPONSE_COSTS
        .iter()
        .map(|s| ResponseExpr::compile(s).unwrap())
        .collect();
    for e in &exprs {
        assert!(e.is_fast(), "{}", e.source());
    }
    let mut checked = 0;
    for values in header_values() {
        let mut h = HeaderMap::new();
        for v in &values {
            h.append("x-tokens-used", v.clone());
            h.append("x_tokens", v.clone());
        }
        for body in bodies() {
            for status in [200, 503] {
                for e in &exprs {
                    let want = e.interpret_int(status, &h, body.as_ref()).ok();
                    assert_eq!(
                        e.eval_int(status, &h, body.as_ref()).ok(),
                        want,
                        "`{}` on {values:?} {body:?}",
                        e.source()
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 5000);
}

#[test]
fn only_expressions_that_read_the_body_keep_it() {
    for src in [
        "int(response.body.usage.total_tokens)",
        "response.body['usage']['total_tokens']",
        "has(response.body.usage) ? int(response.body.usage.total_tokens) : 1",
        "size(response)",
        "response['bo' + 'dy'].n",
    ] {
        assert!(ResponseExpr::compile(src).unwrap().reads_body(), "{src}");
    }
    for src in [
        "int(response.headers['x-tokens-used'])",
        "response.status == 200 ? 10 : 1",
        "response['headers']['x']",
        "7",
    ] {
        assert!(!ResponseExpr::compile(src).unwrap().reads_body(), "{src}");
    }
}

#[test]
fn a_body_guarded_with_has_is_read_by_the_interpreter() {
    let e = ResponseExpr::compile(
        "has(response.body.usage) ? int(response.body.usage.total_tokens) : 1",
    )
    .unwrap();
    assert!(!e.is_fast());
    let h = HeaderMap::new();
    let body = json!({"usage": {"total_tokens": 250}});
    assert_eq!(e.eval_int(200, &h, Some(&body)), Ok(250));
    assert_eq!(e.eval_int(200, &h, Some(&json!({}))), Ok(1));
    assert!(e.eval_int(200, &h, None).is_err(), "no body: has() fails");
}
