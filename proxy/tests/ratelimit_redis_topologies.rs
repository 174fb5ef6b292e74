//! The rate limiter on the other Redis topologies it accepts: a three-master Redis Cluster
//! (`redis+cluster://` and a list of `redis://` seeds) and a Sentinel-managed master
//! (`redis+sentinel://`). Real servers on loopback, started and killed by the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ratelimit_support;

use std::sync::Arc;
use std::time::Duration;

use ratelimit_support::{Redis, T0, admitted, free_port, limit, options, start_cluster, temp_dir};
use tollgate_api::policy::Algorithm;
use tollgate_proxy::policy::ratelimit::{KEY_PREFIX, ManualClock, RateLimiter, Storage};

fn redis_at(url: &str, clock: &Arc<ManualClock>) -> RateLimiter {
    let storage = Storage::Redis {
        url: url.to_owned(),
        options: options(5_000),
    };
    RateLimiter::with_clock(storage, clock.clone()).unwrap()
}

/// The hash slot of `key`, asked of a node.
fn slot(node: &Redis, key: &str) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut node.conn())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_shares_counters_whatever_node_holds_them() {
    let (nodes, _tmp) = start_cluster(0);
    let clock = Arc::new(ManualClock::new(T0));
    let a = redis_at(
        &format!(
            "redis+cluster://127.0.0.1:{},127.0.0.1:{}",
            nodes[0].port, nodes[1].port
        ),
        &clock,
    );
    let b = redis_at(
        &format!(
            "redis://127.0.0.1:{},redis://127.0.0.1:{}",
            nodes[1].port, nodes[2].port
        ),
        &clock,
    );
    // One limit id per third of the slot space, so each master holds one counter
    // (`--cluster create` splits 0..16384 in three equal ranges).
    let mut ids: Vec<String> = Vec::new();
    for third in 0..3u16 {
        let id = (0..)
            .map(|i| format!("ns/cluster/l{i}"))
            .find(|id| slot(&nodes[0], &format!("{KEY_PREFIX}{id}")) / 5_462 == third)
            .unwrap();
        ids.push(id);
    }
    for id in &ids {
        let l = limit(id, Algorithm::SlidingWindow, &[(10, 60_000)]);
        let mut ok = 0;
        for _ in 0..15 {
            ok += admitted(&a, &l, 1).await;
            ok += admitted(&b, &l, 1).await;
        }
        assert_eq!(ok, 10, "{id}: one limit across both proxies");
    }
    let held: Vec<i64> = nodes
        .iter()
        .map(|n| redis::cmd("DBSIZE").query(&mut n.conn()).unwrap())
        .collect();
    assert_eq!(held, vec![1, 1, 1], "one counter on each master");
    assert!(!a.in_fallback() && !b.in_fallback());

    // Cached replicas flush concurrently to all three masters; a shared-mode proxy then sees
    // their counts.
    let cached = RateLimiter::with_clock(
        Storage::RedisCached {
            url: format!("redis+cluster://127.0.0.1:{}", nodes[2].port),
            flush_interval: Duration::from_secs(3_600),
            options: options(5_000),
        },
        clock.clone(),
    )
    .unwrap();
    clock.set(T0 + 60_000);
    let limits: Vec<_> = ids
        .iter()
        .map(|id| limit(id, Algorithm::FixedWindow, &[(10, 60_000)]))
        .collect();
    for l in &limits {
        assert_eq!(admitted(&cached, l, 4).await, 4);
    }
    cached.flush().await;
    for l in &limits {
        assert_eq!(
            admitted(&a, l, 10).await,
            6,
            "{}: 4 flushed + 6 = 10",
            l.id()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_addresses_reach_the_master_it_names() {
    let master = Redis::start();
    let tmp = temp_dir("sentinel");
    let dir = tmp.path();
    let conf = dir.join("sentinel.conf");
    let mut sentinel = None;
    for _ in 0..5 {
        let port = free_port();
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor tollgate 127.0.0.1 {} 1\n",
                dir.display(),
                master.port
            ),
        )
        .unwrap();
        sentinel = Redis::spawn_raw(port, &[conf.display().to_string(), "--sentinel".into()]);
        if sentinel.is_some() {
            break;
        }
    }
    let sentinel = sentinel.expect("redis-server --sentinel did not start");
    let clock = Arc::new(ManualClock::new(T0));
    let via_sentinel = redis_at(
        &format!("redis+sentinel://127.0.0.1:{}/tollgate", sentinel.port),
        &clock,
    );
    let direct = redis_at(&master.url(), &clock);
    let l = limit("ns/sentinel/l", Algorithm::TokenBucket, &[(12, 60_000)]);
    let mut ok = 0;
    for _ in 0..10 {
        ok += admitted(&via_sentinel, &l, 1).await;
        ok += admitted(&direct, &l, 1).await;
    }
    assert_eq!(
        ok, 12,
        "the sentinel's master is the one the direct proxy counts on"
    );
    assert!(!via_sentinel.in_fallback());
}
