//! The shared cache's storage rules on the wire (RFC 9111 and the CachePolicy fields): a
//! counting origin answers as each request asks (module `cache_support`), and each test
//! checks what the proxy stored by how many requests reached the origin and by `X-Cache`.
//! One test per rule: each Cache-Control directive, Expires, Age, Vary, Authorization,
//! Set-Cookie, defaultTTL and maxTTL, methods, Range, HEAD beside GET, maxEntryBytes and the
//! bound on answers being stored at once, the
//! query key (parameter names compared percent-decoded) and the normalized host.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cache_support;
mod common;

use std::time::Duration;

use cache_support::*;
use tollgate_api::cache::QueryKey;

const CC: &str = "x-origin-header";

#[tokio::test]
async fn max_age_is_served_from_the_cache_with_age() {
    let o = origin().await;
    let c = cached(&o, rule(), |_| {}).await;
    let h = [(CC, "cache-control: max-age=60")];
    let a = fetch(&c.url, "/a", &h).await;
    assert_eq!((a.status.as_u16(), x_cache(&a)), (200, "MISS"));
    let b = fetch(&c.url, "/a", &h).await;
    assert_eq!(x_cache(&b), "HIT");
    assert_eq!(body(&b), "/a #1");
    assert!(b.headers.contains_key("age"));
    assert_eq!(o.count("/a"), 1);
    let text = c.metrics.encode();
    assert!(
        text.contains("tollgate_cache_requests_total{outcome=\"hit\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn no_store_and_private_answers_are_never_stored() {
    let o = origin().await;
    let c = cached(&o, rule(), |_| {}).await;
    for (path, cc) in [
        ("/ns", "cache-control: no-store, max-age=60"),
        ("/pv", "cache-control: private, max-age=60"),
    ] {
        for _ in 0..2 {
            let a = fetch(&c.url, path, &[(CC, cc)]).await;
            assert_eq!(x_cache(&a), "MISS", "{cc}");
        }
        assert_eq!(o.count(path), 2, "{cc}");
    }
    // A request's own no-store: not looked up, not stored.
    let h = [
        (CC, "cache-control: max-age=60"),
        ("cache-control", "no-store"),
    ];
    assert_eq!(x_cache(&fetch(&c.url, "/rq", &h).await), "BYPASS");
    assert_eq!(x_cache(&fetch(&c.url, "/rq", &h[..1]).await), "MISS");
}

#[tokio::test]
async fn no_cache_answers_are_revalidated_on_every_use() {
    let o = origin().await;
    let c = cached(&o, rule(), |_| {}).await;
    let h = [
        (CC, "cache-control: no-cache, max-age=60"),
        (CC, "etag: \"v1\""),
    ];
    assert_eq!(body(&fetch(&c.url, "/nc", &h).await), "/nc #1");
    let b = fetch(&c.url, "/nc", &h).await;
    // The origin saw a conditional request and answered 304: the client gets the stored body.
    assert_eq!(o.count("/nc"), 2);
    assert_eq!(o.last("/nc").get("if-none-match").unwrap(), "\"v1\"");
    assert_eq!(
        (b.status.as_u16(), body(&b).as_str(), x_cache(&b)),
        (200, "/nc #1", "HIT")
    );
}

#[tokio::test]
async fn s_maxage_wins_over_max_age_for_a_shared_cache() {
    let o = origin().await;
    let c = cached(&o, rule(), |_| {}).await;
    let h = [(CC, "cache-control: max-age=0, s-maxage=60")];
    fetch(&c.url, "/s", &h).await;
    assert_eq!(x_cache(&fetch(&c.url, "/s", &h).await), "HIT");
    assert_eq!(o.count("/s"), 1);
}

#[tokio::test]
async fn must_and_proxy_revalidate_forbid_stale_answers_on_error() {
    let o = origin().await;
    let mut r = rule();
    r.stale_if_error_ms = 60_000;
    let c = cached(&o, r, |_| {}).await;
    for (path, d) in [
        ("/mr", "must-revalidate"),
        ("/pr", "proxy-revalidate"),
        ("/ok", "public"),
    ] {
        let cc = format!("cache-control: max-age=1, {d}");
        fetch(&c.url, path, &[(CC, &cc)]).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let a = fetch(&c.url, path, &[(CC, &cc), ("x-origin-status", "500")]).await;
        if d == "public" {
            // The control: without the directive, staleIfError answers.
            assert_eq!((a.status.as_u16(), x_cache(&a)), (200, "STALE"), "{d}");
        } else {
            assert_eq!((a.status.as_u16(), x_cache(&a)), (500, "MISS"), "{d}");
        }
    }
}

#[tokio::test]
async fn authorization_is_answered_only_from_answers_that_allow_it() {
    let o = origin().await;
    let c = cached(&o, rule(), |_| {}).await;
    // Stored for anonymous clients; a client with credentials is not answered from it.
    let h = [(CC, "cache-control: max-age=60")];
    fetch(&c.url, "/plain", &h).await;
    let a = fetch(&c.url, "/plain", &[h[0], ("authorization", "Bearer alice")]).await;
    assert_eq!(x_cache(&a), "MISS");
    // Nor is an answer to credentials stored without public / s-maxage / must-revalidate.
    fetch(&c.url, "/mine", &[h[0], ("authorization", "Bearer alice")]).await;
    assert_eq!(x_cache(&fetch(&c.url, "/mine", &h).await), "MISS");
    assert_eq!(o.count("/mine"), 2);
    // `public`: stored and shared.
    let p = [
        (CC, "cache-control: public, max-age=60"),
        ("authorization", "Bearer alice"),
    ];
    fetch(&c.url, "/pub", &p).await;
    let b = fetch(&c.url, "/pub", &[p[0], ("authorization", "Bearer bob")]).await;
    assert_eq!(x_cache(&b), "HIT");
    assert_eq!(o.count("/pub"), 1);
}

#[tokio::test]
async fn set_cookie_answers_are_stored_only_when_the_rule_allows() {
    let o = origin().await;
    let h = [
        (CC, "cache-control: max-age=60"),
        (CC, "set-cookie: session=abc"),
    ];
    let c = cached(&o, rule(), |_| {}).await;
    fetch(&c.url, "/sc", &h).await;
    assert_eq!(x_cache(&fetch(&c.url, "/sc", &h).await), "MISS");
    let mut r = rule();
    r.store_set_cookie = true;
    let c2 = cached(&o, r, |_| {}).await;
    fetch(&c2.url, "/sc2", &h).await;
    let b = fetch(&c2.url, "/sc2", &h).await;
    assert_eq!(x_cache(&b), "HIT");
    assert_eq!(b.headers.get("set-cookie").unwrap(), "session=abc");
}

#[tokio::test]
async fn expires_and_age_set_freshness() {
    let o = origin().await;
    let c = cached(&o, rule(), |_| {}).await;
    let now = std::time::SystemTime::now();
    let date = httpdate::fmt_http_date(now);
    let later = format!(
        "expires: {}",
        httpdate::fmt_http_date(now + Duration::from_secs(120))
    );
    let h = [(CC, later.as_str()), (CC, &format!("date: {date}"))];
    fetch(&c.url, "/ex", &h).await;
    assert_eq!(x_cache(&fetch(&c.url, "/ex", &h).await), "HIT");
    // Already expired: nothing to store.
    let past = [(CC, "expires: Thu, 01 Jan 1970 00:00:00 GMT")];
    fetch(&c.url, "/old", &past).await;
    assert_eq!(x_cache(&fetch(&c.url, "/old", &past).await), "MISS");
    // `Age: 100` on a 60 s answer: it arrived stale.
    let aged = [(CC, "cache-control: max-age=60"), (CC, "age: 100")];
    fetch(&c.url, "/aged", &aged).await;
    assert_eq!(x_cache(&fetch(&c.url, "/aged", &aged).await), "MISS");
    // `Age: 10` on a 60 s answer: served, older by at least 10 s.
    let young = [(CC, "cache-control: max-age=60"), (CC, "age: 10")];
    fetch(&c.url, "/young", &young).await;
    let y = fetch(&c.url, "/young", &young).await;
    assert_eq!(x_cache(&y), "HIT");
    assert!(y.headers["age"].to_str().unwrap().parse::<u64>().unwrap() >= 10);
}

#[tokio::test]
async fn vary_stores_one_answer_per_variant_and_star_none() {
    let o = origin().await;
    let c = cached(&o, rule(), |_| {}).await;
    let h = |lang| {
        [
            (CC, "cache-control: max-age=60"),
            (CC, "vary: Accept-Language"),
            ("accept-language", lang),
        ]
    };
    assert_eq!(x_cache(&fetch(&c.url, "/v", &h("en")).await), "MISS");
    assert_eq!(x_cache(&fetch(&c.url, "/v", &h("fr")).await), "MISS");
    let en = fetch(&c.url, "/v", &h("en")).await;
    let fr = fetch(&c.url, "/v", &h("fr")).await;
    assert_eq!((x_cache(&en), body(&en).as_str()), ("HIT", "/v #1"));
    assert_eq!((x_cache(&fr), body(&fr).as_str()), ("HIT", "/v #2"));
    let star = [(CC, "cache-control: max-age=60"), (CC, "vary: *")];
    fetch(&c.url, "/star", &star).await;
    assert_eq!(x_cache(&fetch(&c.url, "/star", &star).await), "MISS");
}

#[tokio::test]
async fn default_ttl_only_for_heuristically_cacheable_statuses_and_max_ttl_caps() {
    let o = origin().await;
    let none = cached(&o, rule(), |_| {}).await;
    fetch(&none.url, "/d", &[]).await;
    assert_eq!(
        x_cache(&fetch(&none.url, "/d", &[]).await),
        "MISS",
        "no defaultTTL"
    );
    let mut r = rule();
    r.default_ttl_ms = Some(60_000);
    r.max_ttl_ms = Some(1_000);
    let c = cached(&o, r, |_| {}).await;
    fetch(&c.url, "/d2", &[]).await;
    assert_eq!(x_cache(&fetch(&c.url, "/d2", &[]).await), "HIT");
    let created = [("x-origin-status", "201")];
    fetch(&c.url, "/c", &created).await;
    assert_eq!(
        x_cache(&fetch(&c.url, "/c", &created).await),
        "MISS",
        "201 has no heuristic"
    );
    // maxTTL 1 s caps max-age=3600.
    let long = [(CC, "cache-control: max-age=3600")];
    fetch(&c.url, "/long", &long).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(x_cache(&fetch(&c.url, "/long", &long).await), "MISS");
}

#[tokio::test]
async fn other_methods_and_ranges_bypass_and_head_is_its_own_entry() {
    let o = origin().await;
    let c = cached(&o, rule(), |_| {}).await;
    let h = [(CC, "cache-control: max-age=60")];
    assert_eq!(
        x_cache(&fetch_method(&c.url, "POST", "/m", &h).await),
        "BYPASS"
    );
    fetch(&c.url, "/r", &h).await;
    let ranged = fetch(&c.url, "/r", &[h[0], ("range", "bytes=0-1")]).await;
    assert_eq!(x_cache(&ranged), "BYPASS");
    assert_eq!(o.count("/r"), 2);
    // HEAD first: its entry has no body to give a GET.
    let head = fetch_method(&c.url, "HEAD", "/h", &h).await;
    assert!(head.body.is_empty());
    let get = fetch(&c.url, "/h", &h).await;
    assert_eq!((x_cache(&get), body(&get).as_str()), ("MISS", "/h #2"));
    let head2 = fetch_method(&c.url, "HEAD", "/h", &h).await;
    assert_eq!(x_cache(&head2), "HIT");
    assert!(head2.body.is_empty());
    assert_eq!(x_cache(&fetch(&c.url, "/h", &h).await), "HIT");
}

#[tokio::test]
async fn a_body_over_max_entry_bytes_is_streamed_whole_and_not_stored() {
    let o = origin().await;
    let mut r = rule();
    r.max_entry_bytes = 1000;
    let c = cached(&o, r, |_| {}).await;
    let h = [
        (CC, "cache-control: max-age=60"),
        ("x-origin-size", "200000"),
    ];
    let a = fetch(&c.url, "/big", &h).await;
    assert_eq!(a.body.len(), 200_000);
    assert_eq!(x_cache(&fetch(&c.url, "/big", &h).await), "MISS");
    assert_eq!(o.count("/big"), 2);
    let small = [(CC, "cache-control: max-age=60"), ("x-origin-size", "1000")];
    fetch(&c.url, "/small", &small).await;
    assert_eq!(x_cache(&fetch(&c.url, "/small", &small).await), "HIT");
}

#[tokio::test]
async fn the_key_is_the_routed_host_and_the_kept_query() {
    let o = origin().await;
    let mut r = rule();
    r.query = QueryKey::Exclude(vec!["utm_source".into()]);
    let c = cached(&o, r, |_| {}).await;
    let h = |host| [(CC, "cache-control: max-age=60"), ("host", host)];
    fetch(&c.url, "/q?a=1&utm_source=mail", &h("Shop.Example")).await;
    let b = fetch(&c.url, "/q?a=1&utm_source=ads", &h("SHOP.EXAMPLE")).await;
    assert_eq!(x_cache(&b), "HIT", "same host, same kept query");
    let other = fetch(&c.url, "/q?a=2", &h("shop.example")).await;
    assert_eq!(x_cache(&other), "MISS");
    // Another host never gets shop.example's entry, nor does an unkeyed header change it.
    let evil = fetch(
        &c.url,
        "/q?a=1",
        &[
            h("evil.example")[0],
            ("host", "evil.example"),
            ("x-forwarded-host", "shop.example"),
        ],
    )
    .await;
    assert_eq!(x_cache(&evil), "MISS");
}

#[tokio::test]
async fn answers_being_stored_at_once_are_bounded_to_a_quarter_of_the_cache() {
    let o = origin().await;
    let mut r = rule();
    r.max_entry_bytes = 4 << 20;
    // 16 MiB: 4 MiB may be copied for storage at once.
    let c = cached(&o, r, |_| {}).await;
    let h = |size| [(CC, "cache-control: max-age=60"), ("x-origin-size", size)];
    // The first's body is held upstream: its declared 3 000 000 bytes stay taken.
    let url = c.url.clone();
    let first = tokio::spawn(async move {
        let [a, b] = h("3000000");
        fetch(&url, "/one", &[a, b, ("x-origin-hold-body", "1")]).await
    });
    assert!(common::eventually(|| o.count("/one") == 1).await);
    let second = fetch(&c.url, "/two", &h("1500000")).await;
    assert_eq!((second.body.len(), x_cache(&second)), (1_500_000, "MISS"));
    assert_eq!(metric(&c.metrics, "tollgate_cache_buffer_full_total"), 1);
    let again = fetch(&c.url, "/two", &h("1500000")).await;
    assert_eq!(x_cache(&again), "MISS", "not stored");
    o.release();
    assert_eq!(first.await.unwrap().body.len(), 3_000_000);
    // The bound is given back: the next answer is stored.
    assert_eq!(x_cache(&fetch(&c.url, "/two", &h("1000")).await), "MISS");
    assert_eq!(x_cache(&fetch(&c.url, "/two", &h("1000")).await), "HIT");
}

#[tokio::test]
async fn a_percent_encoded_parameter_name_is_the_name_it_decodes_to() {
    let o = origin().await;
    let mut r = rule();
    r.query = QueryKey::Include(vec!["a".into()]);
    let c = cached(&o, r, |_| {}).await;
    let h = [(CC, "cache-control: max-age=60")];
    fetch(&c.url, "/q?a=1&b=2", &h).await;
    assert_eq!(x_cache(&fetch(&c.url, "/q?a=1&b=3", &h).await), "HIT");
    // A backend reads `%61` as `a`: not the entry of `?a=1`.
    let evil = fetch(&c.url, "/q?a=1&%61=evil", &h).await;
    assert_eq!((x_cache(&evil), body(&evil).as_str()), ("MISS", "/q #2"));

    let mut r = rule();
    r.query = QueryKey::Exclude(vec!["utm_source".into()]);
    let c = cached(&o, r, |_| {}).await;
    fetch(&c.url, "/e?x=1", &h).await;
    let tracked = fetch(&c.url, "/e?x=1&%75tm_source=mail", &h).await;
    assert_eq!(
        x_cache(&tracked),
        "HIT",
        "an excluded name, however spelled"
    );
}

#[tokio::test]
async fn an_identity_key_without_an_identity_does_not_share_credentialed_answers() {
    // The key reads auth.identity, but no AuthPolicy set one: every request's expression is
    // null, so two clients' credentials must not meet in one entry.
    let o = origin().await;
    let mut r = rule();
    r.expressions = vec!["auth.identity.sub".into()];
    let c = cached(&o, r, |_| {}).await;
    let h = (CC, "cache-control: max-age=60");
    fetch(&c.url, "/id", &[h, ("authorization", "Bearer alice")]).await;
    let bob = fetch(&c.url, "/id", &[h, ("authorization", "Bearer bob")]).await;
    assert_eq!((x_cache(&bob), body(&bob).as_str()), ("MISS", "/id #2"));
}
