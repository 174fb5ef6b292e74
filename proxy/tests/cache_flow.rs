//! The shared cache over time, on the wire: 200 concurrent misses of one key make one
//! upstream request; a waiter never hangs on a slow lead (it goes upstream itself after the
//! lock wait) nor gets its error; revalidation
//! upstream (ETag, Last-Modified, a 304 refreshing the entry) and a client's own conditional
//! request answered 304 from the cache; staleIfError with every
//! endpoint gone (stale within the window, 502/503 after); purge refused without the token.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cache_support;
mod common;

use std::sync::Arc;
use std::time::Duration;

use cache_support::*;
use tollgate_proxy::ExplainAccess;

const CC: &str = "x-origin-header";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_misses_make_one_upstream_request() {
    let o = origin().await;
    let c = cached(&o, rule(), |_| {}).await;
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let url = c.url.clone();
        tasks.push(tokio::spawn(async move {
            fetch(
                &url,
                "/cold",
                &[(CC, "cache-control: max-age=60"), ("x-origin-hold", "1")],
            )
            .await
        }));
    }
    // The origin holds the one request it got until the other 199 wait for it.
    let m = c.metrics.clone();
    assert!(
        common::eventually(|| metric(&m, "tollgate_cache_coalesced_total") >= 199).await,
        "coalesced: {}",
        metric(&m, "tollgate_cache_coalesced_total")
    );
    o.release();
    for t in tasks {
        let a = t.await.unwrap();
        assert_eq!((a.status.as_u16(), body(&a).as_str()), (200, "/cold #1"));
    }
    assert_eq!(o.count("/cold"), 1);
}

#[tokio::test]
async fn a_waiter_is_bounded_by_the_lead_and_never_gets_the_leads_error() {
    let o = origin().await;
    let c = cached(&o, rule(), |r| r.timeouts.request_ms = Some(1500)).await;
    // The lead hangs (never released) and ends with the route's 504; its waiter then goes
    // upstream itself and gets its own answer rather than the lead's error or a hang.
    let url = c.url.clone();
    let lead = tokio::spawn(async move { fetch(&url, "/slow", &[("x-origin-hold", "1")]).await });
    assert!(common::eventually(|| o.count("/slow") == 1).await);
    // The waiter's deadline runs from its own arrival: arriving later than the lead, it has
    // time left for its own upstream request when the lead's deadline ends the lead.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let url = c.url.clone();
    let waiter =
        tokio::spawn(
            async move { fetch(&url, "/slow", &[(CC, "cache-control: max-age=60")]).await },
        );
    let m = c.metrics.clone();
    assert!(common::eventually(|| metric(&m, "tollgate_cache_coalesced_total") >= 1).await);
    assert_eq!(lead.await.unwrap().status.as_u16(), 504);
    let w = waiter.await.unwrap();
    assert_eq!((w.status.as_u16(), body(&w).as_str()), (200, "/slow #2"));

    // A lead answered 500: its waiters go upstream themselves and get their own answers.
    let url = c.url.clone();
    let lead = tokio::spawn(async move {
        fetch(
            &url,
            "/err",
            &[("x-origin-hold", "1"), ("x-origin-status", "500")],
        )
        .await
    });
    assert!(common::eventually(|| o.count("/err") == 1).await);
    let url = c.url.clone();
    let waiter =
        tokio::spawn(
            async move { fetch(&url, "/err", &[(CC, "cache-control: max-age=60")]).await },
        );
    let m = c.metrics.clone();
    assert!(common::eventually(|| metric(&m, "tollgate_cache_coalesced_total") >= 2).await);
    o.release();
    assert_eq!(lead.await.unwrap().status.as_u16(), 500);
    let w = waiter.await.unwrap();
    assert_eq!((w.status.as_u16(), body(&w).as_str()), (200, "/err #2"));
}

#[tokio::test]
async fn a_slow_lead_holds_its_waiters_no_longer_than_the_lock_wait() {
    let o = origin().await;
    // The route's deadline is far: the waiter must not wait for it (nor end in its 504).
    let c = cached(&o, rule(), |r| r.timeouts.request_ms = Some(60_000)).await;
    let url = c.url.clone();
    let h = [(CC, "cache-control: max-age=60")];
    let lead =
        tokio::spawn(async move { fetch(&url, "/lock", &[h[0], ("x-origin-hold", "1")]).await });
    assert!(common::eventually(|| o.count("/lock") == 1).await);
    // After the lock wait it goes upstream itself; its answer is not stored.
    let w = fetch(&c.url, "/lock", &h).await;
    assert_eq!(
        (w.status.as_u16(), body(&w).as_str(), x_cache(&w)),
        (200, "/lock #2", "MISS")
    );
    assert_eq!(metric(&c.metrics, "tollgate_cache_coalesced_total"), 1);
    assert!(c.cache.is_empty(), "the waiter's answer is not stored");
    o.release();
    assert_eq!(body(&lead.await.unwrap()), "/lock #1");
    let hit = fetch(&c.url, "/lock", &h).await;
    assert_eq!((x_cache(&hit), body(&hit).as_str()), ("HIT", "/lock #1"));
}

#[tokio::test]
async fn a_waiter_past_its_deadline_gets_504_counted_as_an_upstream_timeout() {
    let o = origin().await;
    let c = cached(&o, rule(), |r| r.timeouts.request_ms = Some(1500)).await;
    // The lead has its head and holds the key while its body is held upstream.
    let url = c.url.clone();
    let lead = tokio::spawn(async move {
        fetch(
            &url,
            "/body",
            &[
                (CC, "cache-control: max-age=60"),
                ("x-origin-hold-body", "1"),
            ],
        )
        .await
    });
    assert!(common::eventually(|| o.count("/body") == 1).await);
    let w = fetch(&c.url, "/body", &[(CC, "cache-control: max-age=60")]).await;
    assert_eq!(w.status.as_u16(), 504);
    assert_eq!(o.count("/body"), 1, "the waiter never went upstream");
    // The gateway's own timeout, not an upstream's answer.
    assert!(
        c.metrics
            .encode()
            .contains(r#"tollgate_upstream_errors_total{kind="timeout"} 1"#),
        "{}",
        c.metrics.encode()
    );
    o.release();
    assert_eq!(body(&lead.await.unwrap()), "/body #1");
}

#[tokio::test]
async fn a_stale_entry_is_revalidated_with_its_etag_or_last_modified() {
    let o = origin().await;
    let c = cached(&o, rule(), |_| {}).await;
    let lm = "last-modified: Mon, 07 Dec 2026 10:00:00 GMT";
    for (path, validator, sent) in [
        ("/etag", "etag: \"v7\"", "if-none-match"),
        ("/lm", lm, "if-modified-since"),
    ] {
        let h = [(CC, "cache-control: max-age=1"), (CC, validator)];
        fetch(&c.url, path, &h).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let b = fetch(&c.url, path, &h).await;
        assert!(
            o.last(path).contains_key(sent),
            "{path}: {:?}",
            o.last(path)
        );
        if path == "/etag" {
            // The origin answered 304: the stored body, refreshed.
            assert_eq!(
                (b.status.as_u16(), body(&b).as_str(), x_cache(&b)),
                (200, "/etag #1", "HIT")
            );
            assert_eq!(x_cache(&fetch(&c.url, path, &h).await), "HIT");
            assert_eq!(o.count(path), 2);
        }
    }
}

#[tokio::test]
async fn a_304_refreshes_the_entry_but_never_shares_its_cookies_or_a_refusal() {
    let o = origin().await;
    let c = cached(&o, rule(), |_| {}).await;
    let stored = [(CC, "cache-control: max-age=1"), (CC, "etag: \"v1\"")];
    fetch(&c.url, "/session", &stored).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Alice's revalidation: the origin's 304 rolls her session cookie.
    let alice = [
        (CC, "cache-control: max-age=60"),
        (CC, "etag: \"v1\""),
        (CC, "set-cookie: sid=alice"),
    ];
    let a = fetch(&c.url, "/session", &alice).await;
    assert_eq!((a.status.as_u16(), x_cache(&a)), (200, "HIT"));
    assert_eq!(
        o.count("/session"),
        2,
        "a conditional request went upstream"
    );
    assert_eq!(
        a.headers.get("set-cookie").map(|v| v.to_str().unwrap()),
        Some("sid=alice"),
        "the client the 304 answered gets its cookie"
    );
    // Bob gets the refreshed entry, without Alice's cookie.
    let b = fetch(&c.url, "/session", &[]).await;
    assert_eq!((x_cache(&b), body(&b).as_str()), ("HIT", "/session #1"));
    assert_eq!(
        o.count("/session"),
        2,
        "the entry was refreshed: fresh for 60 s"
    );
    assert!(b.headers.get("set-cookie").is_none(), "{:?}", b.headers);

    // A 304 that says no-store refreshes nothing: the next request revalidates again.
    fetch(&c.url, "/refused", &stored).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let refusing = [(CC, "cache-control: no-store"), (CC, "etag: \"v1\"")];
    let r = fetch(&c.url, "/refused", &refusing).await;
    assert_eq!((r.status.as_u16(), body(&r).as_str()), (200, "/refused #1"));
    fetch(&c.url, "/refused", &stored).await;
    assert_eq!(o.count("/refused"), 3, "the stale entry was not refreshed");
}

#[tokio::test]
async fn a_clients_conditional_request_is_answered_304_from_the_cache() {
    let o = origin().await;
    let c = cached(&o, rule(), |_| {}).await;
    let h = [(CC, "cache-control: max-age=60"), (CC, "etag: \"abc\"")];
    fetch(&c.url, "/c", &h).await;
    let a = fetch(&c.url, "/c", &[h[0], h[1], ("if-none-match", "\"abc\"")]).await;
    assert_eq!((a.status.as_u16(), x_cache(&a)), (304, "HIT"));
    assert!(a.body.is_empty());
    let b = fetch(&c.url, "/c", &[h[0], h[1], ("if-none-match", "\"other\"")]).await;
    assert_eq!((b.status.as_u16(), body(&b).as_str()), (200, "/c #1"));
    assert_eq!(o.count("/c"), 1);
}

#[tokio::test]
async fn stale_if_error_serves_within_its_window_when_every_endpoint_is_gone() {
    let o = origin().await;
    let mut r = rule();
    r.stale_if_error_ms = 2_000;
    let c = cached(&o, r, |_| {}).await;
    let h = [(CC, "cache-control: max-age=1")];
    fetch(&c.url, "/sie", &h).await;
    o.kill();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let s = fetch(&c.url, "/sie", &h).await;
    assert_eq!(
        (s.status.as_u16(), x_cache(&s), body(&s).as_str()),
        (200, "STALE", "/sie #1")
    );
    // Past max-age + staleIfError: the gateway's own error.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let e = fetch(&c.url, "/sie", &h).await;
    assert!(matches!(e.status.as_u16(), 502 | 503), "{}", e.status);
    assert_eq!(x_cache(&e), "MISS");
}

#[tokio::test]
async fn purge_is_refused_without_the_token_and_removes_what_it_names() {
    let o = origin().await;
    let c = cached(&o, rule(), |_| {}).await;
    let h = [(CC, "cache-control: max-age=60")];
    fetch(&c.url, "/p/1", &h).await;
    fetch(&c.url, "/q/1", &h).await;
    let admin = |token: Option<&str>| {
        let access = ExplainAccess {
            token: token.map(Arc::from),
            cache: Some(c.cache.clone()),
            ..ExplainAccess::default()
        };
        let metrics = c.metrics.clone();
        async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", l.local_addr().unwrap());
            tokio::spawn(tollgate_proxy::serve_admin_with(
                l,
                metrics,
                || true,
                access,
            ));
            url
        }
    };
    let purge = |url: String, auth: Option<&'static str>, body: &'static str| async move {
        let client = common::h1_client();
        let mut b = http::Request::post(format!("{url}/cache/purge"));
        if let Some(a) = auth {
            b = b.header("authorization", a);
        }
        common::send(&client, b.body(http_body_util::Full::from(body)).unwrap()).await
    };
    let open = admin(None).await;
    assert_eq!(
        purge(open, Some("Bearer s3cret"), "{}")
            .await
            .status
            .as_u16(),
        403,
        "no token configured"
    );
    let guarded = admin(Some("s3cret")).await;
    assert_eq!(
        purge(guarded.clone(), None, "{}").await.status.as_u16(),
        401
    );
    assert_eq!(
        purge(guarded.clone(), Some("Bearer wrong"), "{}")
            .await
            .status
            .as_u16(),
        403
    );
    assert_eq!(
        x_cache(&fetch(&c.url, "/p/1", &h).await),
        "HIT",
        "nothing purged yet"
    );
    let ok = purge(
        guarded,
        Some("Bearer s3cret"),
        r#"{"prefix": "GET http://"}"#,
    )
    .await;
    assert_eq!(ok.status.as_u16(), 200);
    assert_eq!(body(&ok).trim(), r#"{"purged":2}"#);
    assert_eq!(x_cache(&fetch(&c.url, "/p/1", &h).await), "MISS");
    assert_eq!(x_cache(&fetch(&c.url, "/q/1", &h).await), "MISS");
}
