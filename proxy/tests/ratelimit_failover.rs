//! Redis failover under load: two proxies enforce one shared limit through a Sentinel-managed
//! master (with a replica and three sentinels) or a Redis Cluster of three masters with a
//! replica each, while clients keep sending; the master holding the counter is killed
//! (SIGKILL) mid-run and its replica promoted. For `redis` and `redis-cached` storage:
//!
//! - every answer is the upstream's 200 or the limit's 429: no 5xx, no failed connection;
//! - both proxies fall back to local counters and share counters again once the new master
//!   answers (the `in_fallback` state each limiter reports as `tollgate_ratelimit_redis_fallback`);
//! - the requests admitted in each fixed window stay within the documented bound (README,
//!   "Rate limits when Redis fails over"): `limit` while shared (`redis`), `R × limit` for
//!   `redis-cached`, and around the failover `(R + 2) × limit` (`redis`) or
//!   `2 × R × limit` (`redis-cached`), R = 2 proxies here.
//!
//! Real servers on loopback, real proxies on real sockets. Each test prints the admitted count
//! of every window, the figures the README quotes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod ratelimit_support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{EchoBackend, backend_of, echo_backend, h1_client, http_port, route, table, wb};
use http_body_util::{BodyExt, Full};
use ratelimit_support::{Redis, Sentinels, start_cluster};
use tollgate_api::PolicySet;
use tollgate_api::policy::{Algorithm, Rate, RateLimit};
use tollgate_proxy::policy::ratelimit::{RateLimiter, Storage};
use tollgate_proxy::{Proxy, ProxyOptions};

/// Requests admitted per window across both proxies.
const LIMIT: u64 = 100;
const WINDOW_MS: u64 = 1_000;
/// Proxies sharing the limit.
const R: u64 = 2;
/// Clients per proxy, each sending its next request when the last is answered.
const CLIENTS: usize = 4;
/// Requests in flight when a window ends are answered in the next one: a client-side count
/// per window may hold that many of the previous window's admits.
const SLACK: u64 = (R as usize * CLIENTS) as u64;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Redis,
    Cached,
}

fn storage(kind: Kind, url: &str) -> Storage {
    match kind {
        Kind::Redis => Storage::redis(url.to_owned()),
        Kind::Cached => Storage::redis_cached(url.to_owned(), Duration::from_millis(100)),
    }
}

/// A proxy in front of `app` whose only route enforces one fixed-window limit, on `storage`.
async fn proxy(app: &EchoBackend, storage: Storage) -> (Proxy, String, RateLimiter) {
    let limiter = RateLimiter::new(storage).unwrap();
    let proxy = Proxy::new(ProxyOptions {
        rate_limiter: Some(limiter.clone()),
        ..ProxyOptions::default()
    });
    let mut r = route("r", "/", vec![wb("app", 1)]);
    r.policy = Some("limits".into());
    let mut t = table(
        1,
        vec![http_port(0, vec![r])],
        vec![("app", backend_of(&[app]))],
    );
    t.policies.insert(
        "limits".into(),
        PolicySet {
            auth: None,
            rate_limits: vec![RateLimit {
                id: "default/failover/shared".into(),
                rates: vec![Rate {
                    limit: LIMIT,
                    window_ms: WINDOW_MS,
                }],
                algorithm: Algorithm::FixedWindow,
                counters: vec![],
                when: vec![],
                cost: None,
                cost_max_body_bytes: None,
                mode: Default::default(),
            }],
        },
    );
    proxy.apply(t).await.unwrap();
    let url = format!("http://{}/", proxy.local_addr(0).unwrap());
    (proxy, url, limiter)
}

/// What the clients saw: (wall-clock ms when answered, status; 0 = no answer).
type Log = Arc<Mutex<Vec<(u64, u16)>>>;

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// `CLIENTS` clients on `url` until `stop`.
fn load(
    url: String,
    log: Log,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..CLIENTS)
        .map(|_| {
            let (url, log, stop) = (url.clone(), log.clone(), stop.clone());
            tokio::spawn(async move {
                let client = h1_client();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let req = http::Request::get(&url).body(Full::default()).unwrap();
                    let status =
                        match tokio::time::timeout(Duration::from_secs(5), client.request(req))
                            .await
                        {
                            Ok(Ok(resp)) => {
                                let status = resp.status().as_u16();
                                match resp.into_body().collect().await {
                                    Ok(_) => status,
                                    Err(_) => 0,
                                }
                            }
                            _ => 0,
                        };
                    log.lock().unwrap().push((now_ms(), status));
                }
            })
        })
        .collect()
}

/// Runs both proxies under load, calls `kill` 3 s in, and ends once both have shared counters
/// again for 3 s; checks the answers and the windows' counts.
async fn failover_under_load(name: &str, kind: Kind, url: &str, kill: impl FnOnce()) {
    let app = echo_backend("app").await;
    let (_pa, url_a, rl_a) = proxy(&app, storage(kind, url)).await;
    let (_pb, url_b, rl_b) = proxy(&app, storage(kind, url)).await;
    let log: Log = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = load(url_a, log.clone(), stop.clone());
    clients.extend(load(url_b, log.clone(), stop.clone()));

    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !rl_a.in_fallback() && !rl_b.in_fallback(),
        "{name}: not on Redis before the failover"
    );
    let killed_at = now_ms();
    let killed = Instant::now();
    kill();
    // Both fall back, then share again for good: 3 s without either in fallback (a cluster
    // client may reconnect before the replica is promoted and fall back once more). Bounded
    // waits, not speed checks.
    let mut fell_back = [false, false];
    let mut last_fallback_at = killed_at;
    let mut episodes = 0;
    let mut was_down = false;
    loop {
        let down = [rl_a.in_fallback(), rl_b.in_fallback()];
        fell_back[0] |= down[0];
        fell_back[1] |= down[1];
        let any = down[0] || down[1];
        if any {
            last_fallback_at = now_ms();
            episodes += usize::from(!was_down);
        }
        was_down = any;
        if fell_back == [true, true] && now_ms() - last_fallback_at >= 3_000 {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "{name}: fell back {fell_back:?}, in fallback now {down:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }

    let log = log.lock().unwrap();
    let bad: Vec<_> = log.iter().filter(|(_, s)| *s != 200 && *s != 429).collect();
    assert!(
        bad.is_empty(),
        "{name}: {} answers neither 200 nor 429 (0 = no answer), first: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    // Admitted per window, from the first whole window to the last whole one.
    let first = log.iter().map(|(t, _)| t).min().unwrap() / WINDOW_MS + 1;
    let last = log.iter().map(|(t, _)| t).max().unwrap() / WINDOW_MS - 1;
    let mut report = Vec::new();
    for w in first..=last {
        let (start, end) = (w * WINDOW_MS, (w + 1) * WINDOW_MS);
        let admitted = log
            .iter()
            .filter(|(t, s)| *s == 200 && (start..end).contains(t))
            .count() as u64;
        let answered = log.iter().filter(|(t, _)| (start..end).contains(t)).count();
        // The window holds part of the failover: from the kill until counters were last
        // local, and the window after (the new master's counts may miss writes the old one
        // had not yet replicated).
        let around = end > killed_at && start <= last_fallback_at + WINDOW_MS;
        let bound = match (kind, around) {
            (Kind::Redis, false) => LIMIT,
            (Kind::Redis, true) => (R + 2) * LIMIT,
            (Kind::Cached, false) => R * LIMIT,
            (Kind::Cached, true) => 2 * R * LIMIT,
        };
        report.push(format!(
            "{}{admitted}/{answered}",
            if around { "*" } else { "" }
        ));
        assert!(
            admitted <= bound + SLACK,
            "{name}: window {w} admitted {admitted} (bound {bound} + {SLACK} in flight); windows: {}",
            report.join(" ")
        );
    }
    let total: usize = log.len();
    println!(
        "{name}: {total} requests, none failed; local counters in {episodes} episode(s), the last ending {} ms after the kill; admitted/answered per {WINDOW_MS} ms window (limit {LIMIT}, * = around the failover): {}",
        last_fallback_at - killed_at,
        report.join(" ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_under_load_keeps_serving_and_limiting_redis() {
    let mut s = Sentinels::start();
    let url = s.url();
    failover_under_load("sentinel/redis", Kind::Redis, &url, || s.master.kill()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_under_load_keeps_serving_and_limiting_redis_cached() {
    let mut s = Sentinels::start();
    let url = s.url();
    failover_under_load("sentinel/redis-cached", Kind::Cached, &url, || {
        s.master.kill()
    })
    .await;
}

/// The master holding the counter: the one node with a key that is a master (its replica
/// holds the key too).
fn holder(nodes: &mut [Redis]) -> &mut Redis {
    nodes
        .iter_mut()
        .find(|n| {
            let role: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut n.conn())
                .unwrap();
            role.contains("role:master")
                && redis::cmd("DBSIZE").query::<i64>(&mut n.conn()).unwrap() > 0
        })
        .expect("no master holds the counter")
}

async fn cluster_failover(name: &str, kind: Kind) {
    let (mut nodes, _tmp) = start_cluster(1);
    let seeds: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let url = format!("redis+cluster://{}", seeds.join(","));
    failover_under_load(name, kind, &url, || holder(&mut nodes).kill()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_under_load_keeps_serving_and_limiting_redis() {
    cluster_failover("cluster/redis", Kind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_under_load_keeps_serving_and_limiting_redis_cached() {
    cluster_failover("cluster/redis-cached", Kind::Cached).await;
}
