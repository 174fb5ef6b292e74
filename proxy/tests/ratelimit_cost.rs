//! Cost and shadow limits on every storage: in memory, in a real Redis (one script call per
//! decision) and cached (decided locally, shared through Redis in batches). Each test starts
//! its own `redis-server` on a free loopback port and kills it at the end; without
//! `/usr/bin/redis-server` they fail, never skip.
//!
//! Time comes from a manual clock, so every count is exact.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ratelimit_support;

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use ratelimit_support::{Redis, T0, options};
use tollgate_api::policy::{Algorithm, Cost, LimitMode, Rate, RateLimit};
use tollgate_proxy::policy::cel::{Activation, Attrs};
use tollgate_proxy::policy::ratelimit::{
    CompiledLimit, Decision, ManualClock, RateLimiter, Storage,
};

/// A limit `id` of `rates` counting `cost`, in `mode`.
fn limit(
    id: &str,
    alg: Algorithm,
    rates: &[(u64, u64)],
    cost: Option<Cost>,
    mode: LimitMode,
) -> CompiledLimit {
    CompiledLimit::new(&RateLimit {
        id: id.into(),
        rates: rates
            .iter()
            .map(|&(limit, window_ms)| Rate { limit, window_ms })
            .collect(),
        algorithm: alg,
        counters: vec![],
        when: vec![],
        cost,
        cost_max_body_bytes: None,
        mode,
    })
    .unwrap()
}

fn request_cost() -> Option<Cost> {
    Some(Cost::Request("int(request.headers['x-cost'])".into()))
}

fn response_cost() -> Option<Cost> {
    Some(Cost::Response(
        "int(response.headers['x-tokens-used'])".into(),
    ))
}

/// The three storages on one clock (the Redis ones on `redis`); the cached one flushes only
/// when a test says so.
fn storages(redis: &Redis, clock: &Arc<ManualClock>) -> [(&'static str, RateLimiter); 3] {
    let mk = |s: Storage| RateLimiter::with_clock(s, clock.clone()).unwrap();
    [
        ("memory", mk(Storage::Memory)),
        (
            "redis",
            mk(Storage::Redis {
                url: redis.url(),
                options: options(5_000),
            }),
        ),
        (
            "redis-cached",
            mk(Storage::RedisCached {
                url: redis.url(),
                flush_interval: Duration::from_secs(3_600),
                options: options(5_000),
            }),
        ),
    ]
}

fn headers(pairs: &[(&'static str, String)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, v.parse().unwrap());
    }
    h
}

/// Decides a request carrying `h` on `limits`.
async fn decide<'l>(
    rl: &RateLimiter,
    limits: &'l [CompiledLimit],
    h: &HeaderMap,
) -> tollgate_proxy::policy::ratelimit::Checked<'l> {
    let attrs = Attrs {
        method: "GET",
        host: "llm.test",
        path: "/v1/chat",
        scheme: "http",
        headers: h,
        source: "127.0.0.1:4000".parse().unwrap(),
    };
    let act = Activation::new(&attrs);
    rl.check_request(limits, &act).await
}

/// One request through `limits`: admitted or not, and its response costs (`tokens`)
/// counted when admitted; the decisions before and after.
async fn serve(
    rl: &RateLimiter,
    limits: &[CompiledLimit],
    request: &HeaderMap,
    tokens: u64,
) -> (Option<Decision>, Option<Decision>, usize) {
    let checked = decide(rl, limits, request).await;
    let after = if checked.decision.is_none_or(|d| d.allowed) {
        let resp = headers(&[("x-tokens-used", tokens.to_string())]);
        rl.add_response_costs(&checked.pending, 200, &resp).await
    } else {
        None
    };
    (checked.decision, after, checked.shadow_refused.len())
}

/// The acceptance case of issue 33: 1,000 tokens a minute counted from the response, each
/// answer costing 400. Requests 1 to 3 are served (the third is admitted at 800 and crosses
/// the limit: 1,200); the fourth is refused. On each storage.
#[tokio::test]
async fn a_response_cost_refuses_the_request_after_the_one_that_crossed_the_limit() {
    let redis = Redis::start();
    let clock = Arc::new(ManualClock::new(T0));
    for alg in [
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
    ] {
        for (name, rl) in storages(&redis, &clock) {
            let id = format!("llm/tokens/{name}-{alg:?}");
            let limits = [limit(
                &id,
                alg,
                &[(1_000, 60_000)],
                response_cost(),
                LimitMode::Enforce,
            )];
            let none = HeaderMap::new();
            let mut remaining = Vec::new();
            for _ in 0..3 {
                let (before, after, _) = serve(&rl, &limits, &none, 400).await;
                assert!(before.unwrap().allowed, "{name} {alg:?}");
                remaining.push(after.unwrap().remaining);
            }
            assert_eq!(remaining, [600, 200, 0], "{name} {alg:?}");
            let (fourth, after, _) = serve(&rl, &limits, &none, 400).await;
            let fourth = fourth.unwrap();
            assert!(!fourth.allowed, "{name} {alg:?}: the fourth is refused");
            assert_eq!((fourth.limit, fourth.remaining), (1_000, 0));
            assert!(after.is_none(), "a refused request counts no response");
        }
    }
}

/// A request cost is admitted when the whole cost fits, and counted; each storage counts it
/// the same.
#[tokio::test]
async fn a_request_cost_is_admitted_when_it_fits_on_every_storage() {
    let redis = Redis::start();
    let clock = Arc::new(ManualClock::new(T0));
    for (name, rl) in storages(&redis, &clock) {
        let limits = [limit(
            &format!("api/bytes/{name}"),
            Algorithm::SlidingWindow,
            &[(10, 60_000)],
            request_cost(),
            LimitMode::Enforce,
        )];
        let cost = |n: &str| headers(&[("x-cost", n.to_owned())]);
        let d = decide(&rl, &limits, &cost("4")).await.decision.unwrap();
        assert!(d.allowed && d.remaining == 6, "{name}: {d:?}");
        let d = decide(&rl, &limits, &cost("7")).await.decision.unwrap();
        assert!(!d.allowed && d.remaining == 6, "{name}: 4 + 7 > 10: {d:?}");
        // A missing or malformed cost counts 1, never 0.
        let d = decide(&rl, &limits, &HeaderMap::new())
            .await
            .decision
            .unwrap();
        assert!(d.allowed && d.remaining == 5, "{name}: {d:?}");
        let d = decide(&rl, &limits, &cost("-3")).await.decision.unwrap();
        assert!(d.allowed && d.remaining == 4, "{name}: {d:?}");
        assert_eq!(rl.metrics().cost_errors("api/bytes"), 2, "{name}");
        let d = decide(&rl, &limits, &cost("4")).await.decision.unwrap();
        assert!(
            d.allowed && d.remaining == 0,
            "{name}: exactly the limit: {d:?}"
        );
        let d = decide(&rl, &limits, &cost("0")).await.decision.unwrap();
        assert!(
            !d.allowed,
            "{name}: a full counter refuses even a free request"
        );
    }
}

/// The same random sequence of request costs and response costs through the three storages:
/// every decision is the same (the Lua script and the cached store follow the Rust
/// algorithms), with the cached store flushed to Redis now and then.
#[tokio::test]
async fn memory_redis_and_cached_count_costs_alike() {
    let redis = Redis::start();
    let clock = Arc::new(ManualClock::new(T0));
    let cases: [(Algorithm, &[(u64, u64)]); 4] = [
        (Algorithm::FixedWindow, &[(20, 1_000)]),
        (Algorithm::SlidingWindow, &[(20, 1_000)]),
        (Algorithm::TokenBucket, &[(20, 1_000)]),
        (Algorithm::SlidingWindow, &[(8, 500), (30, 3_000)]),
    ];
    let mut rng = fastrand::Rng::with_seed(33);
    for (i, (alg, rates)) in cases.into_iter().enumerate() {
        clock.set(T0);
        let rls = storages(&redis, &clock);
        // Each storage its own counters (two of them share one Redis).
        let limits: Vec<Vec<CompiledLimit>> = rls
            .iter()
            .map(|(name, _)| {
                vec![
                    limit(
                        &format!("ns/req/l{i}-{name}"),
                        alg,
                        rates,
                        request_cost(),
                        LimitMode::Enforce,
                    ),
                    limit(
                        &format!("ns/resp/l{i}-{name}"),
                        alg,
                        rates,
                        response_cost(),
                        LimitMode::Enforce,
                    ),
                ]
            })
            .collect();
        let (mut refused, mut trace) = (0, Vec::new());
        for step in 0..300 {
            clock.advance(Duration::from_millis(rng.u64(0..120)));
            let req = headers(&[("x-cost", rng.u64(0..7).to_string())]);
            let tokens = rng.u64(0..9);
            let mut seen = Vec::new();
            for ((_, rl), limits) in rls.iter().zip(&limits) {
                seen.push(serve(rl, limits, &req, tokens).await);
            }
            trace.push(seen[0]);
            refused += usize::from(seen[0].0.is_some_and(|d| !d.allowed));
            for (n, got) in seen.iter().enumerate().skip(1) {
                assert_eq!(
                    *got, seen[0],
                    "{alg:?} {rates:?}, {} at step {step}",
                    rls[n].0
                );
            }
            if step % 25 == 24 {
                rls[2].1.flush().await;
            }
        }
        assert!(
            refused > 0 && refused < 300,
            "{alg:?}: the sequence exercised both outcomes ({refused} refused)"
        );
        for (name, rl) in &rls {
            assert!(!rl.in_fallback(), "{name}");
        }
    }
}

/// A shadow limit counts exactly what the same limit enforced counts: for one random
/// sequence (request costs), the shadow limit would have refused exactly the requests the
/// enforced one refuses, and ends with the same numbers. It never refuses, sends no
/// numbers of its own, and its would-be refusals are counted in the metrics.
#[tokio::test]
async fn a_shadow_limit_counts_what_the_enforced_one_counts_on_every_storage() {
    let redis = Redis::start();
    let clock = Arc::new(ManualClock::new(T0));
    for (name, rl) in storages(&redis, &clock) {
        clock.set(T0);
        let mk = |policy: &str, mode| {
            limit(
                &format!("{policy}/{name}"),
                Algorithm::SlidingWindow,
                &[(30, 1_000)],
                request_cost(),
                mode,
            )
        };
        let shadow = [mk("try/shadow", LimitMode::Shadow)];
        let enforced = [mk("try/enforced", LimitMode::Enforce)];
        let mut rng = fastrand::Rng::with_seed(5);
        let mut refusals = 0;
        for step in 0..200 {
            clock.advance(Duration::from_millis(rng.u64(0..40)));
            let req = headers(&[("x-cost", rng.u64(0..6).to_string())]);
            let s = decide(&rl, &shadow, &req).await;
            assert_eq!(s.decision, None, "{name}: a shadow limit never decides");
            let e = decide(&rl, &enforced, &req).await.decision.unwrap();
            assert_eq!(
                s.shadow_refused.len() == 1,
                !e.allowed,
                "{name} at step {step}"
            );
            refusals += usize::from(!e.allowed);
        }
        assert!(refusals > 10, "{name}: the sequence went over the limit");
        assert_eq!(
            rl.metrics().shadow_refusals("try/shadow"),
            u64::try_from(refusals).unwrap(),
            "{name}"
        );
        assert_eq!(
            rl.metrics().decisions("try/enforced", false),
            u64::try_from(refusals).unwrap(),
            "{name}"
        );
        assert_eq!(rl.metrics().decisions("try/shadow", false), 0, "{name}");
        // The counters' numbers now: adding nothing reads them.
        let numbers = |l: &CompiledLimit| {
            let rl = rl.clone();
            let l = l.clone();
            async move { rl.add(&l, l.id(), 0).await }
        };
        assert_eq!(
            numbers(&shadow[0]).await,
            numbers(&enforced[0]).await,
            "{name}: the same counts"
        );
    }
}

/// Shadow limits never stop the limits after them: an enforced limit after a shadow one
/// that would refuse still counts and decides.
#[tokio::test]
async fn a_shadow_refusal_does_not_stop_later_limits() {
    let clock = Arc::new(ManualClock::new(T0));
    let rl = RateLimiter::with_clock(Storage::Memory, clock.clone()).unwrap();
    let limits = [
        limit(
            "a/shadow/one",
            Algorithm::FixedWindow,
            &[(1, 60_000)],
            None,
            LimitMode::Shadow,
        ),
        limit(
            "a/enforced/three",
            Algorithm::FixedWindow,
            &[(3, 60_000)],
            None,
            LimitMode::Enforce,
        ),
    ];
    let none = HeaderMap::new();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let c = decide(&rl, &limits, &none).await;
        let d = c.decision.unwrap();
        seen.push((d.allowed, d.limit, d.remaining, c.shadow_refused.len()));
    }
    assert_eq!(
        seen,
        [
            (true, 3, 2, 0),
            (true, 3, 1, 1),
            (true, 3, 0, 1),
            (false, 3, 0, 1)
        ],
        "the numbers are the enforced limit's; the shadow one refuses from the second on"
    );
}
