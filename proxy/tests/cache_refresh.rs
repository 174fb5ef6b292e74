//! staleWhileRevalidate on the wire: a stale entry within its window answers at once
//! (`X-Cache: STALE`, with `Age`) and one background revalidation per key refreshes it
//! (conditional with the entry's validators; a 304 refreshes, a 200 replaces, an error
//! leaves the stale entry), never more than the proxy's bound at once, and a purge or a
//! table swap while one runs keeps its answer out of the store (but a swap of endpoints
//! only does not).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cache_support;
mod common;

use std::time::Duration;

use cache_support::*;
use tollgate_proxy::Purge;

const CC: &str = "x-origin-header";
const HOLD: (&str, &str) = ("x-origin-hold", "1");

fn swr() -> tollgate_api::cache::CacheRule {
    let mut r = rule();
    r.stale_while_revalidate_ms = 60_000;
    r
}

fn refreshing(c: &Cached) -> u64 {
    metric(&c.metrics, "tollgate_cache_refreshing")
}

#[tokio::test]
async fn a_stale_entry_answers_at_once_and_one_background_request_revalidates_it() {
    let o = origin().await;
    let c = cached(&o, swr(), |_| {}).await;
    let h = [(CC, "cache-control: max-age=1"), (CC, "etag: \"v1\"")];
    assert_eq!(x_cache(&fetch(&c.url, "/swr", &h).await), "MISS");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // The origin holds the revalidation: the answer comes without waiting for it.
    let s = fetch(&c.url, "/swr", &[h[0], h[1], HOLD]).await;
    assert_eq!(
        (s.status.as_u16(), x_cache(&s), body(&s).as_str()),
        (200, "STALE", "/swr #1")
    );
    assert!(s.headers.contains_key("age"));
    assert!(common::eventually(|| o.count("/swr") == 2).await);
    assert_eq!(o.last("/swr").get("if-none-match").unwrap(), "\"v1\"");
    // Others in the window: stale answers, no second refresh of the key.
    for _ in 0..5 {
        let s = fetch(&c.url, "/swr", &[h[0], h[1], HOLD]).await;
        assert_eq!((x_cache(&s), body(&s).as_str()), ("STALE", "/swr #1"));
    }
    assert_eq!(metric(&c.metrics, "tollgate_cache_refreshes_total"), 1);
    assert_eq!(refreshing(&c), 1);
    // The origin answers 304: the entry is fresh again, its body kept.
    o.release();
    assert!(common::eventually(|| refreshing(&c) == 0).await);
    let hit = fetch(&c.url, "/swr", &h).await;
    assert_eq!((x_cache(&hit), body(&hit).as_str()), ("HIT", "/swr #1"));
    assert_eq!(o.count("/swr"), 2);
}

#[tokio::test]
async fn a_background_200_replaces_the_entry_and_an_error_leaves_it() {
    let o = origin().await;
    let c = cached(&o, swr(), |_| {}).await;
    let h = [(CC, "cache-control: max-age=1")];
    fetch(&c.url, "/new", &h).await;
    fetch(&c.url, "/err", &h).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let s = fetch(&c.url, "/new", &h).await;
    assert_eq!((x_cache(&s), body(&s).as_str()), ("STALE", "/new #1"));
    let s = fetch(&c.url, "/err", &[h[0], ("x-origin-status", "500")]).await;
    assert_eq!((x_cache(&s), body(&s).as_str()), ("STALE", "/err #1"));
    assert!(
        common::eventually(|| refreshing(&c) == 0 && o.count("/new") == 2 && o.count("/err") == 2)
            .await
    );
    // No validators: an unconditional request, whose 200 replaced the entry.
    assert!(!o.last("/new").contains_key("if-none-match"));
    let hit = fetch(&c.url, "/new", &h).await;
    assert_eq!((x_cache(&hit), body(&hit).as_str()), ("HIT", "/new #2"));
    // The 500 stored nothing: the stale entry still answers.
    let s = fetch(&c.url, "/err", &h).await;
    assert_eq!((x_cache(&s), body(&s).as_str()), ("STALE", "/err #1"));
}

#[tokio::test]
async fn a_purge_while_a_refresh_runs_keeps_its_answer_out_of_the_store() {
    let o = origin().await;
    let c = cached(&o, swr(), |_| {}).await;
    let h = [(CC, "cache-control: max-age=1")];
    fetch(&c.url, "/pg", &h).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(x_cache(&fetch(&c.url, "/pg", &[h[0], HOLD]).await), "STALE");
    assert!(common::eventually(|| o.count("/pg") == 2).await);
    assert_eq!(c.cache.purge(&Purge::default()), 1);
    o.release();
    assert!(common::eventually(|| refreshing(&c) == 0).await);
    assert!(c.cache.is_empty(), "the refresh began before the purge");
    let m = fetch(&c.url, "/pg", &h).await;
    assert_eq!((x_cache(&m), body(&m).as_str()), ("MISS", "/pg #3"));
}

#[tokio::test]
async fn a_table_swap_while_a_refresh_runs_keeps_its_answer_out_of_the_store() {
    let o = origin().await;
    let c = cached(&o, swr(), |_| {}).await;
    let h = [(CC, "cache-control: max-age=1")];
    fetch(&c.url, "/sw", &h).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(x_cache(&fetch(&c.url, "/sw", &[h[0], HOLD]).await), "STALE");
    assert!(common::eventually(|| o.count("/sw") == 2).await);
    // A new table whose policies changed (an answer may depend on them): the refresh of the
    // old one stores nothing.
    let mut t = c.table.clone();
    t.version += 1;
    t.policies
        .insert("other".into(), tollgate_api::PolicySet::default());
    c.proxy.apply(t).await.unwrap();
    o.release();
    assert!(common::eventually(|| refreshing(&c) == 0).await);
    let s = fetch(&c.url, "/sw", &h).await;
    assert_eq!((x_cache(&s), body(&s).as_str()), ("STALE", "/sw #1"));
}

/// Endpoints change all day in a cluster: a table that differs from the last only in its
/// version and its endpoints keeps the answer in flight, which is stored.
#[tokio::test]
async fn an_endpoint_change_keeps_the_answer_in_flight() {
    let o = origin().await;
    let c = cached(&o, rule(), |_| {}).await;
    let h = (CC, "cache-control: max-age=60");
    let url = c.url.clone();
    let held = tokio::spawn(async move { fetch(&url, "/ep", &[h, HOLD]).await });
    assert!(common::eventually(|| o.count("/ep") == 1).await);
    let mut t = c.table.clone();
    t.version += 1;
    let b = t.backends.get_mut("o").unwrap();
    let again = b.endpoints[0].clone();
    b.endpoints.push(again);
    c.proxy.apply(t).await.unwrap();
    o.release();
    assert_eq!(x_cache(&held.await.unwrap()), "MISS");
    let hit = fetch(&c.url, "/ep", &[h]).await;
    assert_eq!((x_cache(&hit), body(&hit).as_str()), ("HIT", "/ep #1"));
    assert_eq!(o.count("/ep"), 1);
}

#[tokio::test]
async fn background_refreshes_are_bounded() {
    let o = origin().await;
    let c = cached(&o, swr(), |_| {}).await;
    let h = [(CC, "cache-control: max-age=1")];
    let n = 70;
    for i in 0..n {
        fetch(&c.url, &format!("/b/{i}"), &h).await;
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for i in 0..n {
        let s = fetch(&c.url, &format!("/b/{i}"), &[h[0], HOLD]).await;
        assert_eq!(x_cache(&s), "STALE");
    }
    // 64 run (held by the origin); the others answered stale without one.
    assert_eq!(metric(&c.metrics, "tollgate_cache_refreshes_total"), 64);
    assert_eq!(refreshing(&c), 64);
    assert!(
        common::eventually(|| (0..n).map(|i| o.count(&format!("/b/{i}"))).sum::<usize>() == n + 64)
            .await
    );
    o.release();
    assert!(common::eventually(|| refreshing(&c) == 0).await);
}

#[tokio::test]
async fn a_background_request_is_neither_mirrored_nor_carries_the_clients_trace() {
    let o = origin().await;
    // The backend's RequestMirror copies every request to the origin itself.
    let c = cached(&o, swr(), |r| {
        r.backends[0]
            .filters
            .push(tollgate_api::Filter::RequestMirror(tollgate_api::Mirror {
                backend: Some("o".into()),
                per_million: 1_000_000,
                sampler: Default::default(),
            }));
    })
    .await;
    let h = [(CC, "cache-control: max-age=1"), (CC, "etag: \"v1\"")];
    fetch(&c.url, "/t", &h).await;
    assert!(
        common::eventually(|| o.count("/t") == 2).await,
        "the miss and its copy"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let trace = (
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    );
    let s = fetch(&c.url, "/t", &[h[0], h[1], trace, ("tracestate", "k=v")]).await;
    assert_eq!(x_cache(&s), "STALE");
    assert!(common::eventually(|| refreshing(&c) == 0 && o.count("/t") >= 3).await);
    let last = o.last("/t");
    assert_eq!(last.get("if-none-match").unwrap(), "\"v1\"", "the refresh");
    assert!(!last.contains_key("traceparent"), "{last:?}");
    assert!(!last.contains_key("tracestate"), "{last:?}");
    // A copy of the refresh would have come right behind it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(o.count("/t"), 3, "the refresh was not mirrored");
}
