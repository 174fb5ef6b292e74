//! Shared by the rate-limit Redis tests: a `redis-server` of the test's own on a free
//! loopback port (killed on drop), limit builders and small waits.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_api::policy::{Algorithm, Rate, RateLimit};
use tollgate_proxy::policy::ratelimit::{CompiledLimit, RateLimiter, RedisOptions};

pub const REDIS_SERVER: &str = "/usr/bin/redis-server";
/// 2023-11-14T22:14:00Z: a multiple of every window used here, so windows start at T0.
pub const T0: u64 = 1_700_000_040_000;

/// A `redis-server` of this test's own, killed on drop.
pub struct Redis {
    pub port: u16,
    child: Child,
}

impl Redis {
    pub fn start() -> Self {
        Self::start_with(&[], false)
    }

    /// Starts a server with `extra` arguments on a free port; `bus`: the cluster bus port
    /// (port + 10000) must be free too.
    pub fn start_with(extra: &[String], bus: bool) -> Self {
        assert!(
            std::path::Path::new(REDIS_SERVER).exists(),
            "{REDIS_SERVER} is missing: install Debian's redis-server (apt-get install redis-server); \
             the rate-limit Redis tests need a real server"
        );
        for _ in 0..10 {
            let port = free_port();
            if bus && (port > 55_535 || TcpListener::bind(("127.0.0.1", port + 10_000)).is_err()) {
                continue;
            }
            if let Some(r) = Self::spawn(port, extra) {
                return r;
            }
        }
        panic!("redis-server did not start on any free port");
    }

    /// Starts a server on `port`; `None` if it did not come up (port taken meanwhile).
    pub fn start_on(port: u16) -> Option<Self> {
        Self::spawn(port, &[])
    }

    fn spawn(port: u16, extra: &[String]) -> Option<Self> {
        let mut args: Vec<String> = ["--port", &port.to_string(), "--bind", "127.0.0.1"]
            .into_iter()
            .chain(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
            .map(str::to_owned)
            .collect();
        args.extend_from_slice(extra);
        Self::spawn_raw(port, &args)
    }

    /// Starts `redis-server ARGS` expected to listen on `port` (e.g. a sentinel from a
    /// config file, which must come first).
    pub fn spawn_raw(port: u16, args: &[String]) -> Option<Self> {
        let child = Command::new(REDIS_SERVER)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let mut r = Redis { port, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = r.child.try_wait() {
                return None;
            }
            if let Ok(mut c) = redis::Client::open(r.url()).and_then(|c| c.get_connection())
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return Some(r);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        r.kill();
        None
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    }

    /// Calls of every command since the last `CONFIG RESETSTAT`, this test's own excluded.
    pub fn commands_since_reset(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn())
            .unwrap();
        info.lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter(|l| !l.starts_with("info:") && !l.starts_with("config|"))
            .map(|l| {
                let calls = l.split("calls=").nth(1).unwrap();
                calls.split(',').next().unwrap().parse::<u64>().unwrap()
            })
            .sum()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A fresh directory under the system temp dir (for config files a server writes), removed
/// on drop.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!(
        "tollgate-rl-{name}-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

pub fn limit(id: &str, alg: Algorithm, rates: &[(u64, u64)]) -> CompiledLimit {
    CompiledLimit::new(&RateLimit {
        id: id.into(),
        rates: rates
            .iter()
            .map(|&(limit, window_ms)| Rate { limit, window_ms })
            .collect(),
        algorithm: alg,
        counters: vec![],
        when: vec![],
        cost: None,
        cost_max_body_bytes: None,
        mode: Default::default(),
    })
    .unwrap()
}

pub fn options(call_timeout_ms: u64) -> RedisOptions {
    RedisOptions {
        call_timeout: Duration::from_millis(call_timeout_ms),
        connect_timeout: Duration::from_millis(500),
        probe_interval: Duration::from_millis(50),
    }
}

pub async fn admitted(rl: &RateLimiter, l: &CompiledLimit, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        ok += usize::from(rl.check(l, l.id()).await.allowed);
    }
    ok
}

/// Waits (bounded) until `rl` is back on Redis. Not a timing assertion: the bound only turns
/// a hang into a failure.
pub async fn wait_shared(rl: &RateLimiter) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while rl.in_fallback() {
        assert!(Instant::now() < deadline, "never reconnected to Redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn encoded(rl: &RateLimiter) -> String {
    let mut registry = prometheus_client::registry::Registry::with_prefix("tollgate");
    rl.metrics().register(&mut registry);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    out
}

pub const REDIS_CLI: &str = "/usr/bin/redis-cli";

/// A Redis Cluster of three masters, slots spread by `redis-cli --cluster create`, each with
/// `replicas` replicas (failure noticed after 1 s without an answer), state ok on every node
/// and every replica's link up; the nodes (masters first, as `--cluster create` assigns
/// them) and the directory of their cluster files, removed when dropped after them.
pub fn start_cluster(replicas: usize) -> (Vec<Redis>, TempDir) {
    assert!(
        std::path::Path::new(REDIS_CLI).exists(),
        "{REDIS_CLI} is missing: install Debian's redis-tools"
    );
    let tmp = temp_dir("cluster");
    let dir = tmp.path();
    let nodes: Vec<Redis> = (0..3 * (1 + replicas))
        .map(|i| {
            Redis::start_with(
                &[
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-node-timeout".into(),
                    "1000".into(),
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
        .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
        .stdout(Stdio::null())
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
            let replication: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut n.conn())
                .unwrap();
            if info.contains("cluster_state:ok")
                && (replication.contains("role:master")
                    || replication.contains("master_link_status:up"))
            {
                break;
            }
            assert!(Instant::now() < deadline, "cluster never became ok: {info}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    (nodes, tmp)
}

/// A master, its replica and three sentinels watching them as `tollgate` (quorum 2; a master
/// silent for 1 s is down), each sentinel aware of the replica and of the two others.
pub struct Sentinels {
    pub master: Redis,
    pub replica: Redis,
    pub sentinels: Vec<Redis>,
    _dir: TempDir,
}

impl Sentinels {
    pub fn start() -> Self {
        // The replica writes the copy it receives to its directory: the temporary one.
        let dir = temp_dir("sentinels");
        let in_dir = ["--dir".to_owned(), dir.path().display().to_string()];
        let master = Redis::start_with(&in_dir, false);
        let replica = Redis::start_with(
            &[
                in_dir[0].clone(),
                in_dir[1].clone(),
                "--replicaof".into(),
                "127.0.0.1".into(),
                master.port.to_string(),
            ],
            false,
        );
        let sentinels: Vec<Redis> = (0..3)
            .map(|i| {
                (0..5)
                    .find_map(|_| {
                        let port = free_port();
                        let conf = dir.path().join(format!("sentinel-{i}.conf"));
                        std::fs::write(
                            &conf,
                            format!(
                                "port {port}\nbind 127.0.0.1\ndir {}\n\
                                 sentinel monitor tollgate 127.0.0.1 {} 2\n\
                                 sentinel down-after-milliseconds tollgate 1000\n\
                                 sentinel failover-timeout tollgate 5000\n",
                                dir.path().display(),
                                master.port
                            ),
                        )
                        .unwrap();
                        Redis::spawn_raw(port, &[conf.display().to_string(), "--sentinel".into()])
                    })
                    .expect("redis-server --sentinel did not start")
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        for s in &sentinels {
            loop {
                let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
                    .arg("REPLICAS")
                    .arg("tollgate")
                    .query(&mut s.conn())
                    .unwrap();
                let others: Vec<redis::Value> = redis::cmd("SENTINEL")
                    .arg("SENTINELS")
                    .arg("tollgate")
                    .query(&mut s.conn())
                    .unwrap();
                if replicas.len() == 1 && others.len() == 2 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "sentinel {} sees {} replicas and {} other sentinels",
                    s.port,
                    replicas.len(),
                    others.len()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Self {
            master,
            replica,
            sentinels,
            _dir: dir,
        }
    }

    /// `redis+sentinel://` naming all three sentinels.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/tollgate", hosts.join(","))
    }
}
