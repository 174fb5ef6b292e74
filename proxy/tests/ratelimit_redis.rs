//! The rate limiter against a real Redis: every test starts its own `redis-server` on a free
//! loopback port (no persistence) and kills it at the end. Without `/usr/bin/redis-server`
//! these tests fail; they never skip.
//!
//! Time comes from a manual clock, so the algorithms' arithmetic is exact; real time only
//! bounds how long a test waits for a background reconnection before it gives up.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ratelimit_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimit_support::{Redis, T0, admitted, encoded, limit, options, wait_shared};
use tollgate_api::policy::Algorithm;
use tollgate_proxy::policy::ratelimit::{
    Clock, Decision, KEY_PREFIX, ManualClock, RateLimiter, RedisOptions, Storage,
};

fn shared(redis: &Redis, clock: &Arc<ManualClock>, opts: RedisOptions) -> RateLimiter {
    let storage = Storage::Redis {
        url: redis.url(),
        options: opts,
    };
    RateLimiter::with_clock(storage, clock.clone()).unwrap()
}

fn cached(redis: &Redis, clock: &Arc<ManualClock>, flush: Duration) -> RateLimiter {
    let storage = Storage::RedisCached {
        url: redis.url(),
        flush_interval: flush,
        options: options(2_000),
    };
    RateLimiter::with_clock(storage, clock.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_sharing_redis_enforce_one_limit_exactly() {
    let redis = Redis::start();
    let clock = Arc::new(ManualClock::new(T0));
    // A generous call timeout: this test is about exactness, not about slowness.
    let a = shared(&redis, &clock, options(5_000));
    let b = shared(&redis, &clock, options(5_000));
    for (i, alg) in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ]
    .into_iter()
    .enumerate()
    {
        let l = Arc::new(limit(&format!("ns/shared/l{i}"), alg, &[(20, 60_000)]));
        let tasks: Vec<_> = (0..60)
            .map(|n| {
                let rl = if n % 2 == 0 { a.clone() } else { b.clone() };
                let l = l.clone();
                tokio::spawn(async move { rl.check(&l, l.id()).await.allowed })
            })
            .collect();
        let mut ok = 0;
        for t in tasks {
            ok += usize::from(t.await.unwrap());
        }
        assert_eq!(ok, 20, "{alg:?}: exactly the limit across both proxies");
    }
    assert!(!a.in_fallback() && !b.in_fallback());
    let total = a.metrics().decisions("ns/shared", true) + b.metrics().decisions("ns/shared", true);
    assert_eq!(total, 60);
}

/// Runs the same deterministic sequence through memory and Redis and compares every
/// decision: the Lua script and the Rust algorithms are the same rules.
#[tokio::test]
async fn redis_script_and_memory_algorithms_decide_alike() {
    let redis = Redis::start();
    let clock = Arc::new(ManualClock::new(T0));
    let remote = shared(&redis, &clock, options(5_000));
    let local = RateLimiter::with_clock(Storage::Memory, clock.clone()).unwrap();
    let cases: [(Algorithm, &[(u64, u64)]); 5] = [
        (Algorithm::FixedWindow, &[(7, 1_000)]),
        (Algorithm::SlidingWindow, &[(7, 1_000)]),
        (Algorithm::TokenBucket, &[(7, 1_000)]),
        (Algorithm::SlidingWindow, &[(3, 500), (10, 3_000)]),
        (Algorithm::TokenBucket, &[(5, 700), (9, 4_000)]),
    ];
    let mut rng = fastrand::Rng::with_seed(7);
    for (i, (alg, rates)) in cases.into_iter().enumerate() {
        let l = limit(&format!("ns/same/l{i}"), alg, rates);
        clock.set(T0);
        let mut trace: Vec<(u64, Decision)> = Vec::new();
        for _ in 0..400 {
            clock.advance(Duration::from_millis(rng.u64(0..180)));
            let want = local.check(&l, l.id()).await;
            let got = remote.check(&l, l.id()).await;
            trace.push((clock.now_ms(), want));
            assert_eq!(
                got,
                want,
                "{alg:?} {rates:?} at step {}: {trace:?}",
                trace.len()
            );
        }
        let admitted = trace.iter().filter(|(_, d)| d.allowed).count();
        assert!(
            admitted > 0 && admitted < 400,
            "{alg:?}: the sequence exercised both outcomes"
        );
    }
    assert!(!remote.in_fallback());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_run_falls_back_to_local_counters_then_shares_again() {
    let mut redis = Redis::start();
    let port = redis.port;
    let clock = Arc::new(ManualClock::new(T0));
    let a = shared(&redis, &clock, options(2_000));
    let b = shared(&redis, &clock, options(2_000));
    let l = limit("ns/outage/l", Algorithm::FixedWindow, &[(20, 60_000)]);
    assert_eq!(admitted(&a, &l, 5).await, 5);
    assert_eq!(admitted(&b, &l, 5).await, 5);
    // 40 decisions on A; Redis dies after the 10th. The first 10 take the shared count to
    // 20; the 30 after the kill are decided by A's local counter, which admits 20.
    let mut allowed = 0;
    for i in 0..40 {
        if i == 10 {
            redis.kill();
        }
        allowed += usize::from(a.check(&l, l.id()).await.allowed);
    }
    assert_eq!(
        allowed,
        10 + 20,
        "shared until the kill, then local, never unlimited"
    );
    assert!(a.in_fallback());
    assert_eq!(a.metrics().fallback(), 1);
    assert!(encoded(&a).contains("tollgate_ratelimit_redis_fallback 1"));
    assert!(encoded(&a).contains(r#"tollgate_ratelimit_redis_errors_total{kind="error"}"#));

    // Back on the same port: both proxies reconnect in the background.
    redis = Redis::start_on(port).expect("restart redis-server on its port");
    wait_shared(&a).await;
    assert_eq!(a.metrics().fallback(), 0);
    // B never called while Redis was down; its next call notices the dead connection and
    // falls back once, then its probe reconnects.
    let _ = b.check(&l, "warm-up").await;
    wait_shared(&b).await;

    // The restarted Redis kept nothing (no persistence): the next window is shared again,
    // exactly.
    clock.set(T0 + 60_000);
    let mut ok = 0;
    for _ in 0..15 {
        ok += admitted(&a, &l, 1).await;
        ok += admitted(&b, &l, 1).await;
    }
    assert_eq!(ok, 20, "one limit across both proxies again");
    assert!(encoded(&a).contains("tollgate_ratelimit_redis_fallback 0"));
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_times_out_to_local_counters_and_recovers() {
    let redis = Redis::start();
    let clock = Arc::new(ManualClock::new(T0));
    let rl = shared(&redis, &clock, options(500));
    let l = limit("ns/stall/l", Algorithm::TokenBucket, &[(10, 60_000)]);
    assert_eq!(admitted(&rl, &l, 4).await, 4);
    wait_shared(&rl).await;
    // SIGSTOP: the server holds its connections open and answers nothing.
    redis.signal("-STOP");
    assert_eq!(
        admitted(&rl, &l, 15).await,
        10,
        "a fresh local bucket of 10"
    );
    assert!(rl.in_fallback());
    assert!(encoded(&rl).contains(r#"tollgate_ratelimit_redis_errors_total{kind="timeout"} 1"#));
    redis.signal("-CONT");
    wait_shared(&rl).await;
    // The shared bucket lost the 4 taken before the stall, and one more: the call that timed
    // out was still in Redis's socket buffer and ran when it resumed (a timeout means
    // "unknown", not "not counted").
    assert_eq!(admitted(&rl, &l, 10).await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cached_overshoot_stays_within_the_documented_bound() {
    let redis = Redis::start();
    let clock = Arc::new(ManualClock::new(T0));
    // Flushes are driven by the test (the background flusher waits an hour), all replicas
    // at the same instants.
    let replicas: Vec<RateLimiter> = (0..3)
        .map(|_| cached(&redis, &clock, Duration::from_secs(3_600)))
        .collect();
    const LIMIT: usize = 100;
    const PER_ROUND: usize = 10;
    let l = limit(
        "ns/cached/l",
        Algorithm::FixedWindow,
        &[(LIMIT as u64, 60_000)],
    );
    let mut total = 0;
    let mut max_round = 0;
    for _round in 0..30 {
        let mut this_round = 0;
        for rl in &replicas {
            let n = admitted(rl, &l, PER_ROUND).await;
            this_round += n;
            max_round = max_round.max(n);
        }
        total += this_round;
        for rl in &replicas {
            rl.flush().await;
        }
    }
    // Documented bound (cached.rs): limit + (R − 1) × A, A = the most one replica admits in
    // three flush intervals; with flushes at the same instants, two.
    let bound = LIMIT + (replicas.len() - 1) * 3 * max_round;
    let synchronized = LIMIT + (replicas.len() - 1) * 2 * max_round;
    assert!(total >= LIMIT, "the limit is reached: {total}");
    assert!(total <= bound, "overshoot {total} > bound {bound}");
    assert!(total <= synchronized, "overshoot {total} > {synchronized}");
    // Nothing was lost on the way: Redis holds exactly what was admitted.
    let key = format!("{KEY_PREFIX}{}", l.id());
    let global: i64 = redis::cmd("HGET")
        .arg(&key)
        .arg("f100/60000:b")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(global, total as i64);
    assert!(replicas.iter().all(|r| !r.in_fallback()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cached_resyncs_a_counter_idle_for_two_flush_intervals() {
    let redis = Redis::start();
    let clock = Arc::new(ManualClock::new(T0));
    let flush = Duration::from_secs(1);
    let a = cached(&redis, &clock, flush);
    let b = cached(&redis, &clock, flush);
    let l = limit("ns/stale/l", Algorithm::FixedWindow, &[(10, 60_000)]);
    assert_eq!(admitted(&a, &l, 3).await, 3);
    a.flush().await;
    assert_eq!(admitted(&b, &l, 5).await, 5, "B loaded 3, admits 5");
    b.flush().await;
    // A's view (3) is older than two flush intervals when its next request comes: it loads
    // the global 8 before deciding, and admits 2, not 7.
    clock.advance(2 * flush + Duration::from_millis(1));
    assert_eq!(admitted(&a, &l, 10).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cached_costs_few_redis_commands_per_decision() {
    let redis = Redis::start();
    let clock = Arc::new(ManualClock::new(T0));
    let replicas: Vec<RateLimiter> = (0..2)
        .map(|_| cached(&redis, &clock, Duration::from_secs(3_600)))
        .collect();
    let l = limit(
        "ns/cost/l",
        Algorithm::SlidingWindow,
        &[(1_000_000, 60_000)],
    );
    // Warm up: each replica loads the counter once.
    for rl in &replicas {
        assert_eq!(admitted(rl, &l, 1).await, 1);
        rl.flush().await;
    }
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(&mut redis.conn())
        .unwrap();
    let mut decisions = 0;
    for _round in 0..10 {
        clock.advance(Duration::from_millis(100));
        for rl in &replicas {
            decisions += admitted(rl, &l, 500).await;
        }
        for rl in &replicas {
            rl.flush().await;
        }
    }
    assert_eq!(decisions, 10_000);
    let commands = redis.commands_since_reset();
    let per_decision = commands as f64 / decisions as f64;
    assert!(commands > 0, "the flushes reached Redis");
    assert!(
        per_decision < 0.05,
        "{commands} commands for {decisions} decisions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cached_flushes_in_the_background() {
    let redis = Redis::start();
    let clock = Arc::new(ManualClock::new(T0));
    let rl = cached(&redis, &clock, Duration::from_millis(50));
    let l = limit("ns/bg/l", Algorithm::FixedWindow, &[(100, 60_000)]);
    assert_eq!(admitted(&rl, &l, 7).await, 7);
    let key = format!("{KEY_PREFIX}{}", l.id());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let global: Option<i64> = redis::cmd("HGET")
            .arg(&key)
            .arg("f100/60000:b")
            .query(&mut redis.conn())
            .unwrap();
        if global == Some(7) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the flusher never pushed: {global:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cached_keeps_enforcing_while_redis_is_down() {
    let mut redis = Redis::start();
    let port = redis.port;
    let clock = Arc::new(ManualClock::new(T0));
    let rl = cached(&redis, &clock, Duration::from_secs(3_600));
    let l = limit("ns/cdown/l", Algorithm::FixedWindow, &[(10, 60_000)]);
    assert_eq!(admitted(&rl, &l, 4).await, 4);
    rl.flush().await;
    redis.kill();
    // Decided on the local view (global 4 + local hits); nothing needs Redis yet.
    assert_eq!(
        admitted(&rl, &l, 10).await,
        6,
        "the view keeps counting: 4 + 6 = 10"
    );
    rl.flush().await; // fails: Redis is gone; the 6 stay pending
    assert!(rl.in_fallback());
    assert_eq!(rl.metrics().fallback(), 1);
    assert_eq!(
        admitted(&rl, &l, 3).await,
        0,
        "still limited, never unlimited"
    );
    redis = Redis::start_on(port).expect("restart redis-server");
    wait_shared(&rl).await;
    rl.flush().await;
    // The 6 admitted during the outage reached the new (empty) Redis.
    let global: i64 = redis::cmd("HGET")
        .arg(format!("{KEY_PREFIX}{}", l.id()))
        .arg("f10/60000:b")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(global, 6);
}
