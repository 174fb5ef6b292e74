//! The rate limiter on the other Redis topologies it accepts: a three-master Redis Cluster
//! (`redis+cluster://` and a list of `redis://` seeds) and a Sentinel-managed master
//! (`redis+sentinel://`). Real servers on loopback, started and killed by the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ratelimit_support;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimit_support::{Redis, T0, TempDir, admitted, free_port, limit, options, temp_dir};
use tollgate_api::policy::Algorithm;
use tollgate_proxy::policy::ratelimit::{KEY_PREFIX, ManualClock, RateLimiter, Storage};

const REDIS_CLI: &str = "/usr/bin/redis-cli";

fn redis_at(url: &str, clock: &Arc<ManualClock>) -> RateLimiter {
    let storage = Storage::Redis {
        url: url.to_owned(),
        options: options(5_000),
    };
    RateLimiter::with_clock(storage, clock.clone()).unwrap()
}

/// Three masters, slots spread by `redis-cli --cluster create`, state ok on every node (and
/// the directory of their cluster files, removed when dropped after them).
fn start_cluster() -> (Vec<Redis>, TempDir) {
    assert!(
        std::path::Path::new(REDIS_CLI).exists(),
        "{REDIS_CLI} is missing: install Debian's redis-tools"
    );
    let tmp = temp_dir("cluster");
    let dir = tmp.path();
    let nodes: Vec<Redis> = (0..3)
        .map(|i| {
            Redis::start_with(
                &[
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    dir.join(format!("nodes-{i}.conf")).display().to_string(),
                    "--dir".into(),
                    dir.display().to_string(),
                ],
                true,
            )
        })
        .collect();
    let status = Command::new(REDIS_CLI)
        .arg("--cluster")
        .arg("create")
        .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "redis-cli --cluster create failed");
    let deadline = Instant::now() + Duration::from_secs(30);
    for n in &nodes {
        loop {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut n.conn())
                .unwrap();
            if info.contains("cluster_state:ok") {
                break;
            }
            assert!(Instant::now() < deadline, "cluster never became ok: {info}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    (nodes, tmp)
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
    let (nodes, _tmp) = start_cluster();
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
