//! What leaves the gateway besides the primary request's `traceparent`: the query on the
//! server span (values redacted), the trace fields of a mirror's copy (the trace the
//! primary request continues, never the client's fields as they came), a `tracestate`
//! that breaks the W3C grammar or limits (dropped, not passed on), and trace fields a
//! header filter set (replaced by the gateway's, never sent beside them).

use super::*;
use tollgate_api::{Filter, HeaderModifier, Mirror};

/// A RequestMirror filter copying every request to `backend`.
fn mirror_all(backend: &str) -> Filter {
    Filter::RequestMirror(Mirror {
        backend: Some(backend.into()),
        per_million: 1_000_000,
        sampler: Default::default(),
    })
}

/// The `traceparent` the mirror backend received with the request to `path`.
async fn mirrored_parent(shadow: &EchoBackend, path: &str) -> (Option<String>, Option<String>) {
    assert!(
        eventually(|| shadow
            .seen
            .lock()
            .unwrap()
            .iter()
            .any(|v| v["path"] == path))
        .await
    );
    let seen = shadow.seen.lock().unwrap().clone();
    let copy = seen.iter().find(|v| v["path"] == path).unwrap();
    let field = |name: &str| copy["headers"][name].as_str().map(str::to_owned);
    (field("traceparent"), field("tracestate"))
}

#[tokio::test]
async fn query_values_are_redacted_on_the_server_span() {
    let Traced {
        rx,
        url,
        _app,
        _proxy,
    } = traced(1.0).await;
    let incoming = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01");
    let a = get_with(
        &h1_client(),
        &format!("{url}/things?api_key=s3cret-key&n=1&bare-token"),
        &[("traceparent", &incoming)],
    )
    .await;
    assert_eq!(a.status, 200);
    let spans = rx.spans_of(PARENT_TRACE, 2).await;
    let server = spans
        .iter()
        .find(|s| s.kind == SpanKind::Server as i32)
        .unwrap();
    assert_eq!(
        str_attr(&server.attributes, "url.query").as_deref(),
        Some("api_key=REDACTED&n=REDACTED&REDACTED")
    );
    let exported = format!("{spans:?}");
    assert!(!exported.contains("s3cret"), "{exported}");
    assert!(!exported.contains("bare-token"), "{exported}");
}

#[tokio::test]
async fn a_mirror_carries_the_trace_of_the_primary_request() {
    let (rx, collector) = Receiver::start().await;
    let main = echo_backend("main").await;
    let shadow = echo_backend("shadow").await;
    let (_p, url) = proxy_with_options(
        tracing_opts(collector, 1.0),
        vec![with_filters(
            route("r", "/", vec![wb("main", 1)]),
            vec![mirror_all("shadow")],
        )],
        vec![
            ("main", backend_of(&[&main])),
            ("shadow", backend_of(&[&shadow])),
        ],
    )
    .await;
    let c = h1_client();

    // A malformed parent: the mirror gets the new trace, not the client's value.
    let bad = format!("00-{}-{PARENT_SPAN}-01", PARENT_TRACE.to_uppercase());
    let a = get_with(
        &c,
        &format!("{url}/bad"),
        &[("traceparent", &bad), ("tracestate", "congo=t61rcWkgMzE")],
    )
    .await;
    let (trace, _, flags) = upstream_parent(&a);
    let (parent, state) = mirrored_parent(&shadow, "/bad").await;
    let parent = parent.expect("a traceparent on the mirror's copy");
    assert_ne!(parent, bad);
    let parts: Vec<&str> = parent.split('-').collect();
    assert_eq!(
        (parts[1], parts[3]),
        (trace.as_str(), flags.as_str()),
        "{parent}"
    );
    assert_eq!(state, None);

    // A valid parent: the same trace, the server span as the copy's parent, the state kept.
    let good = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01");
    get_with(
        &c,
        &format!("{url}/good"),
        &[("traceparent", &good), ("tracestate", "congo=t61rcWkgMzE")],
    )
    .await;
    let (parent, state) = mirrored_parent(&shadow, "/good").await;
    let spans = rx.spans_of(PARENT_TRACE, 2).await;
    let server = spans
        .iter()
        .find(|s| s.kind == SpanKind::Server as i32)
        .unwrap();
    assert_eq!(
        parent.as_deref(),
        Some(format!("00-{PARENT_TRACE}-{}-01", hex(&server.span_id)).as_str())
    );
    assert_eq!(state.as_deref(), Some("congo=t61rcWkgMzE"));
}

#[tokio::test]
async fn a_tracestate_outside_the_w3c_grammar_or_limits_is_dropped() {
    let Traced {
        url, _app, _proxy, ..
    } = traced(1.0).await;
    let c = h1_client();
    let parent = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01");
    let members = |n: usize| {
        (0..n)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let upstream_state = |state: String| {
        let (c, url, parent) = (c.clone(), url.clone(), parent.clone());
        async move {
            get_with(
                &c,
                &format!("{url}/"),
                &[("traceparent", &parent), ("tracestate", &state)],
            )
            .await
            .upstream_header("tracestate")
        }
    };
    for bad in [
        "Congo=t61rcWkgMzE".to_owned(),
        "congo=a=b".to_owned(),
        "congo=1,congo=2".to_owned(),
        "tenant@Vendor=x".to_owned(),
        format!("congo={}", "v".repeat(257)),
        members(33),
    ] {
        assert_eq!(upstream_state(bad.clone()).await, None, "{bad}");
    }
    for good in [
        members(32),
        "fw529a3039@dt=abc, rojo=00f067aa0ba902b7".to_owned(),
    ] {
        assert_eq!(upstream_state(good.clone()).await, Some(good));
    }
    // Several fields are one list: passed on when the list is valid, dropped when it is not
    // (a key twice across them, more than 32 members in all).
    let fields = |states: Vec<String>| {
        let (c, url, parent) = (c.clone(), url.clone(), parent.clone());
        async move {
            let mut h = vec![("traceparent", parent.as_str())];
            h.extend(states.iter().map(|s| ("tracestate", s.as_str())));
            get_with(&c, &format!("{url}/"), &h)
                .await
                .upstream_header("tracestate")
        }
    };
    assert_eq!(
        fields(vec!["congo=1".into(), "rojo=2".into()])
            .await
            .as_deref(),
        Some("congo=1, rojo=2")
    );
    assert_eq!(fields(vec!["congo=1".into(), "congo=2".into()]).await, None);
    assert_eq!(
        fields(vec![members(20), members(20).replace('k', "j")]).await,
        None
    );
}

#[tokio::test]
async fn an_extension_method_is_named_other_never_copied_into_spans() {
    let Traced {
        rx,
        url,
        _app,
        _proxy,
    } = traced(1.0).await;
    let method = "X".repeat(8000);
    let incoming = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01");
    let req = Request::builder()
        .method(http::Method::from_bytes(method.as_bytes()).unwrap())
        .uri(format!("{url}/ext"))
        .header("traceparent", &incoming)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let a = send(&h1_client(), req).await;
    assert_eq!(a.status, 200);
    let spans = rx.spans_of(PARENT_TRACE, 2).await;
    for s in &spans {
        assert_eq!(
            str_attr(&s.attributes, "http.request.method").as_deref(),
            Some("_OTHER"),
            "{}",
            s.name
        );
        assert!(s.name.starts_with("HTTP"), "{}", s.name);
    }
    assert!(!format!("{spans:?}").contains("XXXX"));
}

/// Fields set after the request arrived (here by a RequestHeaderModifier; an authorization
/// service's answer can do the same) do not go upstream beside the gateway's own: exactly
/// one `traceparent` reaches an HTTP/1 backend, and no `tracestate` without a client parent.
#[tokio::test]
async fn trace_fields_a_filter_set_are_replaced_not_repeated() {
    let (_rx, collector) = Receiver::start().await;
    let app = echo_backend("app").await;
    let planted = format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01");
    let set = HeaderModifier {
        set: vec![
            ("traceparent".into(), planted.clone()),
            ("tracestate".into(), "congo=t61rcWkgMzE".into()),
        ],
        add: vec![],
        remove: vec![],
    };
    let (_p, url) = proxy_with_options(
        tracing_opts(collector, 1.0),
        vec![with_filters(
            route("r", "/", vec![wb("app", 1)]),
            vec![Filter::RequestHeaderModifier(set)],
        )],
        vec![("app", backend_of(&[&app]))],
    )
    .await;
    let a = get(&h1_client(), &format!("{url}/")).await;
    assert_eq!(a.status, 200);
    // The echo backend joins repeated fields with ", ": one field is one value.
    let sent = a.upstream_header("traceparent").unwrap();
    assert!(!sent.contains(','), "{sent}");
    let (trace, _, flags) = upstream_parent(&a);
    assert_ne!(trace, PARENT_TRACE);
    assert_eq!(flags, "01");
    assert_eq!(a.upstream_header("tracestate"), None);
}
