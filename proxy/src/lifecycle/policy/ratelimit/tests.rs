//! The limiter end to end with memory storage and a manual clock.

use std::time::Duration;

use tollgate_api::policy::{Algorithm, Rate, RateLimit};

use super::*;

fn limit(id: &str, alg: Algorithm, limit: u64, window_ms: u64) -> CompiledLimit {
    CompiledLimit::new(&RateLimit {
        id: id.into(),
        rates: vec![Rate { limit, window_ms }],
        algorithm: alg,
        counters: vec![],
        when: vec![],
        cost: None,
        cost_max_body_bytes: None,
        mode: Default::default(),
    })
    .unwrap()
}

fn memory(clock: &Arc<ManualClock>) -> RateLimiter {
    RateLimiter::with_clock(Storage::Memory, clock.clone()).unwrap()
}

/// A fixed window of 5 per minute with one counter per value of `counter`.
fn limit_by(id: &str, counter: &str) -> CompiledLimit {
    CompiledLimit::new(&RateLimit {
        id: id.into(),
        rates: vec![Rate {
            limit: 5,
            window_ms: 60_000,
        }],
        algorithm: Algorithm::FixedWindow,
        counters: vec![counter.into()],
        when: vec![],
        cost: None,
        cost_max_body_bytes: None,
        mode: Default::default(),
    })
    .unwrap()
}

/// A `GET /` to host `h` from 10.0.0.7:4000 with `headers`.
fn get_from_10_0_0_7(headers: &http::HeaderMap) -> crate::lifecycle::policy::cel::Attrs<'_> {
    crate::lifecycle::policy::cel::Attrs {
        method: "GET",
        host: "h",
        path: "/",
        scheme: "http",
        headers,
        source: "10.0.0.7:4000".parse().unwrap(),
    }
}

async fn admitted(rl: &RateLimiter, l: &CompiledLimit, key: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        ok += usize::from(rl.check(l, key).await.allowed);
    }
    ok
}

#[tokio::test]
async fn token_bucket_capacity_10_refill_5_per_second_through_the_limiter() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let rl = memory(&clock);
    let l = limit("ns/p/tb", Algorithm::TokenBucket, 10, 2_000);
    assert_eq!(admitted(&rl, &l, "k", 15).await, 10);
    clock.advance(Duration::from_millis(400));
    assert_eq!(admitted(&rl, &l, "k", 2).await, 2);
    let d = rl.check(&l, "k").await;
    assert!(!d.allowed);
    let mut h = http::HeaderMap::new();
    d.insert_headers(&mut h);
    assert_eq!(h["retry-after"], "1", "200 ms rounded up");
    assert_eq!(h["x-ratelimit-limit"], "10");
    assert_eq!(h["x-ratelimit-remaining"], "0");
    assert_eq!(h["x-ratelimit-reset"], "2");
    assert_eq!(rl.metrics().decisions("ns/p", true), 12);
    assert_eq!(rl.metrics().decisions("ns/p", false), 6);
    assert!(!rl.in_fallback());
}

#[tokio::test]
async fn fixed_window_resets_through_the_limiter() {
    let clock = Arc::new(ManualClock::new(60_000));
    let rl = memory(&clock);
    let l = limit("ns/p/fw", Algorithm::FixedWindow, 5, 60_000);
    assert_eq!(admitted(&rl, &l, "k", 8).await, 5);
    clock.advance(Duration::from_millis(59_999));
    assert_eq!(admitted(&rl, &l, "k", 8).await, 0);
    clock.advance(Duration::from_millis(1));
    assert_eq!(admitted(&rl, &l, "k", 8).await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_concurrent_tasks_on_one_key_admit_exactly_the_limit() {
    let clock = Arc::new(ManualClock::new(1_000));
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ] {
        let rl = memory(&clock);
        let l = Arc::new(limit("ns/p/hot", alg, 37, 60_000));
        let tasks: Vec<_> = (0..100)
            .map(|_| {
                let (rl, l) = (rl.clone(), l.clone());
                tokio::spawn(async move { rl.check(&l, "hot").await.allowed })
            })
            .collect();
        let mut ok = 0;
        for t in tasks {
            ok += usize::from(t.await.unwrap());
        }
        assert_eq!(ok, 37, "{alg:?}");
    }
}

#[tokio::test]
async fn counters_are_per_key_and_per_limit() {
    let clock = Arc::new(ManualClock::new(0));
    let rl = memory(&clock);
    let a = limit("ns/p/a", Algorithm::FixedWindow, 2, 1_000);
    let b = limit("ns/p/b", Algorithm::FixedWindow, 2, 1_000);
    let ka = encode_key_for_test(&a, "alice");
    let kb = encode_key_for_test(&b, "alice");
    assert_eq!(admitted(&rl, &a, &ka, 3).await, 2);
    assert_eq!(
        admitted(&rl, &b, &kb, 3).await,
        2,
        "another limit, another counter"
    );
    let kc = encode_key_for_test(&a, "carol");
    assert_eq!(
        admitted(&rl, &a, &kc, 3).await,
        2,
        "another value, another counter"
    );
}

fn encode_key_for_test(l: &CompiledLimit, v: &str) -> String {
    limit::encode_key(l.id(), &[Some(v.to_owned())])
}

#[tokio::test]
async fn check_all_stops_at_the_first_refusal_and_reports_the_most_restrictive() {
    let clock = Arc::new(ManualClock::new(0));
    let rl = memory(&clock);
    let wide = limit("ns/p/wide", Algorithm::FixedWindow, 100, 60_000);
    let narrow = limit("ns/p/narrow", Algorithm::FixedWindow, 2, 1_000);
    let checks = [(&wide, "w"), (&narrow, "n")];
    let d = rl.check_all(&checks).await.unwrap();
    assert!(d.allowed);
    assert_eq!(
        (d.limit, d.remaining),
        (2, 1),
        "the narrow limit is the most restrictive"
    );
    assert!(rl.check_all(&checks).await.unwrap().allowed);
    let d = rl.check_all(&checks).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.limit, 2);
    assert_eq!(d.retry_after, Some(Duration::from_secs(1)));
    // Refused by the second limit, the first one counted the request; a refusal by the first
    // one stops before the second.
    let d = rl.check(&wide, "w").await;
    assert_eq!(d.remaining, 100 - 4);
    assert_eq!(rl.check_all::<&str>(&[]).await, None);
}

#[test]
fn storage_constructors_and_bad_addresses() {
    assert_eq!(Storage::default(), Storage::Memory);
    assert!(matches!(
        Storage::redis_cached("redis://h", Duration::from_millis(200)),
        Storage::RedisCached { .. }
    ));
    let err = RateLimiter::new(Storage::redis("rediss://:pw@h:1")).unwrap_err();
    assert!(matches!(err, RateLimitError::RedisUrl { .. }));
    assert!(!err.to_string().contains("pw@"), "{err}");
    // A well-formed address is accepted without a runtime and without a server.
    assert!(RateLimiter::new(Storage::redis("redis://127.0.0.1:1")).is_ok());
}

#[tokio::test]
async fn an_unreachable_redis_falls_back_to_local_counters() {
    let clock = Arc::new(ManualClock::new(0));
    let rl = RateLimiter::with_clock(Storage::redis("redis://127.0.0.1:1"), clock.clone()).unwrap();
    let l = limit("ns/p/fb", Algorithm::FixedWindow, 3, 1_000);
    assert_eq!(
        admitted(&rl, &l, "k", 5).await,
        3,
        "still limited, by local counters"
    );
    assert!(rl.in_fallback());
    assert_eq!(rl.metrics().fallback(), 1);
    let cached = RateLimiter::with_clock(
        Storage::redis_cached("redis://127.0.0.1:1", Duration::from_secs(60)),
        clock,
    )
    .unwrap();
    assert_eq!(admitted(&cached, &l, "k", 5).await, 3);
    assert!(cached.in_fallback());
    cached.flush().await;
}

#[test]
fn a_hasher_after_a_prefix_hashes_keys_as_the_whole_key_hasher_does() {
    let whole = KeyHasher::new();
    let text = "default/bench-limit/per-client|=127.0.0.1|=\\|x";
    for cut in 0..=text.len() {
        let prefix = &text[..cut];
        let after = KeyHasher::after_prefix(prefix);
        for end in cut..=text.len() {
            let key = &text[..end];
            assert_eq!(
                after.hash(key),
                whole.hash(key),
                "prefix {prefix:?}, key {key:?}"
            );
        }
    }
    assert_ne!(whole.hash("a"), whole.hash("b"));
}

#[tokio::test]
async fn applicable_limits_count_on_the_same_counters_as_explicit_keys() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let rl = memory(&clock);
    let l = limit_by("ns/per-client/limit-with-a-long-name", "source.address");
    let headers = http::HeaderMap::new();
    let attrs = get_from_10_0_0_7(&headers);
    let act = Activation::new(&attrs);
    let key = l.key(&act);
    assert_eq!(admitted(&rl, &l, &key, 2).await, 2);
    let limits = [l];
    let d = rl.check_applicable(&limits, &act).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.remaining, 2, "the same counter as the explicit key");
    assert_eq!(admitted(&rl, &limits[0], &key, 5).await, 2);
}

#[test]
fn key_buffers_give_each_key_its_own_hash_whether_it_repeats_or_not() {
    let by_user = |id: &str| limit_by(id, "request.headers['x-user']");
    let (a, b) = (by_user("ns/p/a"), by_user("ns/p/b-with-a-longer-id"));
    let whole = KeyHasher::new();
    let mut buffers = KeyBuffers::default();
    for (limit, user) in [
        (&a, "alice"),
        (&a, "alice"),
        (&a, "bob"),
        (&b, "bob"),
        (&b, "bob"),
        (&a, "alice"),
        (&b, "alice"),
        (&b, ""),
        (&b, ""),
    ] {
        let mut headers = http::HeaderMap::new();
        headers.insert("x-user", user.parse().unwrap());
        let attrs = get_from_10_0_0_7(&headers);
        let act = Activation::new(&attrs);
        let want = limit.key(&act);
        let (key, hash) = buffers.key_of(limit, &act);
        assert_eq!(key, want);
        assert_eq!(hash, whole.hash(&want), "{want}");
    }
}
