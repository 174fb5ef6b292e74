//! Counters in Redis, shared by every replica: one atomic script call per decision.
//!
//! In: the rates of a limit, a counter key, `now` and what to do (decide one request, or
//! record a cached replica's hits). Out: the counter's states after the call, or `None` when
//! Redis did not answer in time, after which the caller decides with local counters.
//!
//! The script (`ratelimit.lua`) runs by `EVALSHA` on one multiplexed connection (concurrent
//! calls are pipelined on it); the crate reloads it after a `NOSCRIPT` (a restarted server).
//! Every call is bounded by [`RedisOptions::call_timeout`]. The first failure flips the
//! backend to *down*: it logs once, sets `tollgate_ratelimit_redis_fallback` to 1 and drops
//! the connection; from then on calls return `None` at once (no request waits on a dead
//! Redis) while one background probe reconnects every [`RedisOptions::probe_interval`]. When
//! it succeeds the backend is *up* again, logs once and sets the gauge back to 0.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, Script, Value};

use super::RateLimitError;
use super::algo::{Cost, RateState, Segment, Spec};
use super::metrics::{RateLimitMetrics, RedisErrorKind};
use super::redis_url::{self, Target};

/// Prefix of every counter key in Redis.
pub const KEY_PREFIX: &str = "tollgate:rl:";

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("ratelimit.lua")));

/// Timeouts and retry pacing of a Redis storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisOptions {
    /// Longest wait for one call (and for the first connection, which requests wait for).
    /// Past it the request is decided locally. Default 100 ms.
    pub call_timeout: Duration,
    /// Longest wait for a background reconnection. Default 1 s.
    pub connect_timeout: Duration,
    /// Pause between reconnection attempts while Redis is down. Default 1 s.
    pub probe_interval: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_millis(100),
            connect_timeout: Duration::from_secs(1),
            probe_interval: Duration::from_secs(1),
        }
    }
}

/// A connection of either topology, used through the crate's [`ConnectionLike`].
#[derive(Clone)]
pub(crate) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// What a call does to the counter.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op<'a> {
    /// Decide one request: admit it if every rate has room for `need` units, then count
    /// `take` ([`Cost::ONE`] for a plain request).
    Check(Cost),
    /// Record hits admitted by a cached replica, then read the counter back.
    Sync(&'a [Segment]),
    /// Count units after the fact (a cost known from the response), whether they fit or not.
    Add(i64),
}

/// The answer of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    /// Whether the request was admitted ([`Op::Check`]); always true for [`Op::Sync`].
    pub allowed: bool,
    /// The counter's states after the call, one per rate.
    pub states: Vec<RateState>,
}

const UNKNOWN: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

/// The connection to Redis and its health.
pub(crate) struct RedisBackend {
    target: Target,
    display: String,
    options: RedisOptions,
    /// [`UNKNOWN`] until the first connection attempt, then [`UP`] or [`DOWN`].
    state: AtomicU8,
    /// The live connection and its generation, so that a late failure of a call made on an
    /// old connection does not take down a new one.
    conn: Mutex<Option<(u64, Conn)>>,
    generation: AtomicU64,
    /// Serialises the first connection attempt (concurrent first requests wait for one).
    connecting: tokio::sync::Mutex<()>,
    metrics: RateLimitMetrics,
    this: Weak<RedisBackend>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("target", &self.target)
            .field("url", &self.display)
            .field("state", &self.state.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Parses `url`; connects on first use (or right away when called inside a runtime).
    pub fn new(
        url: &str,
        options: RedisOptions,
        metrics: RateLimitMetrics,
    ) -> Result<Arc<Self>, RateLimitError> {
        let (target, display) = redis_url::parse(url, options.call_timeout)?;
        let backend = Arc::new_cyclic(|this| Self {
            target,
            display,
            options,
            state: AtomicU8::new(UNKNOWN),
            conn: Mutex::new(None),
            generation: AtomicU64::new(0),
            connecting: tokio::sync::Mutex::new(()),
            metrics,
            this: this.clone(),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let b = backend.clone();
            rt.spawn(async move {
                b.conn().await;
            });
        }
        Ok(backend)
    }

    /// True while Redis is considered unreachable (decisions are local).
    pub fn is_down(&self) -> bool {
        self.state.load(Ordering::Acquire) == DOWN
    }

    /// Runs the script on `key`. `None` when Redis is down, failed or too slow.
    pub async fn call(&self, key: &str, specs: &[Spec], now: i64, op: Op<'_>) -> Option<Reply> {
        let (generation, mut conn) = self.conn().await?;
        let mut inv = SCRIPT.prepare_invoke();
        inv.key(redis_key(key)).arg(now);
        inv.arg(match op {
            Op::Check(_) => "c",
            Op::Sync(_) => "s",
            Op::Add(_) => "a",
        });
        inv.arg(specs.len());
        for s in specs {
            inv.arg(s.alg_code()).arg(s.limit).arg(s.window);
        }
        match op {
            Op::Check(cost) => {
                inv.arg(cost.need).arg(cost.take);
            }
            Op::Sync(segments) => {
                inv.arg(segments.len());
                for seg in segments {
                    inv.arg(seg.at).arg(seg.hits);
                }
            }
            Op::Add(units) => {
                inv.arg(units);
            }
        }
        let started = Instant::now();
        let result = tokio::time::timeout(
            self.options.call_timeout,
            inv.invoke_async::<Vec<i64>>(&mut conn),
        )
        .await;
        match result {
            Ok(Ok(v)) => {
                self.metrics.redis_latency(started.elapsed());
                match parse_reply(&v, specs.len()) {
                    Some(reply) => Some(reply),
                    None => {
                        self.metrics.redis_error(RedisErrorKind::Error);
                        self.mark_down(generation, "unexpected script reply");
                        None
                    }
                }
            }
            Ok(Err(e)) => {
                // The connection's own response timeout (the same bound) is a timeout too.
                self.metrics.redis_error(if e.is_timeout() {
                    RedisErrorKind::Timeout
                } else {
                    RedisErrorKind::Error
                });
                self.mark_down(generation, &e.to_string());
                None
            }
            Err(_) => {
                self.metrics.redis_error(RedisErrorKind::Timeout);
                self.mark_down(generation, "call timed out");
                None
            }
        }
    }

    /// The live connection, connecting on first use; `None` while down.
    async fn conn(&self) -> Option<(u64, Conn)> {
        if self.state.load(Ordering::Acquire) == UNKNOWN {
            let _first = self.connecting.lock().await;
            if self.state.load(Ordering::Acquire) == UNKNOWN {
                let generation = self.generation.load(Ordering::Acquire);
                match tokio::time::timeout(self.options.call_timeout, self.connect()).await {
                    Ok(Ok(conn)) => self.set_up(conn),
                    Ok(Err(e)) => {
                        self.metrics.redis_error(RedisErrorKind::Connect);
                        self.mark_down(generation, &e.to_string());
                    }
                    Err(_) => {
                        self.metrics.redis_error(RedisErrorKind::Connect);
                        self.mark_down(generation, "connection timed out");
                    }
                }
            }
        }
        if self.state.load(Ordering::Acquire) != UP {
            return None;
        }
        self.conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A new connection with the script loaded (which also proves the server answers).
    async fn connect(&self) -> redis::RedisResult<Conn> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.options.connect_timeout))
            .set_response_timeout(Some(self.options.call_timeout));
        let mut conn = match &self.target {
            Target::Single(client) => Conn::Single(
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?,
            ),
            Target::Cluster(client) => Conn::Cluster(client.get_async_connection().await?),
            Target::Sentinel(client) => Conn::Single(
                client
                    .lock()
                    .await
                    .get_async_connection_with_config(&config)
                    .await?,
            ),
        };
        SCRIPT.prepare_invoke().load_async(&mut conn).await?;
        Ok(conn)
    }

    fn set_up(&self, conn: Conn) {
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = Some((generation, conn));
        let before = self.state.swap(UP, Ordering::AcqRel);
        self.metrics.set_fallback(false);
        if before == DOWN {
            tracing::info!(redis = %self.display, "rate limit: Redis answers again; counters are shared again");
        } else {
            tracing::debug!(redis = %self.display, "rate limit: connected to Redis");
        }
    }

    /// A call on connection `generation` failed: go down (once), unless a newer connection
    /// already replaced it.
    fn mark_down(&self, generation: u64, reason: &str) {
        {
            let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
            if self.state.load(Ordering::Acquire) == UP
                && conn.as_ref().is_some_and(|(g, _)| *g != generation)
            {
                return;
            }
            *conn = None;
        }
        if self.state.swap(DOWN, Ordering::AcqRel) != DOWN {
            tracing::warn!(
                redis = %self.display,
                reason,
                "rate limit: Redis unavailable; enforcing limits with local counters until it answers"
            );
            self.metrics.set_fallback(true);
            self.spawn_probe();
        }
    }

    /// Reconnects in the background until it succeeds (or the backend is dropped).
    fn spawn_probe(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak = self.this.clone();
        let interval = self.options.probe_interval;
        rt.spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(backend) = weak.upgrade() else {
                    return;
                };
                match tokio::time::timeout(backend.options.connect_timeout, backend.connect())
                    .await
                {
                    Ok(Ok(conn)) => {
                        backend.set_up(conn);
                        return;
                    }
                    Ok(Err(e)) => {
                        backend.metrics.redis_error(RedisErrorKind::Connect);
                        tracing::debug!(redis = %backend.display, error = %e, "rate limit: Redis still unavailable");
                    }
                    Err(_) => {
                        backend.metrics.redis_error(RedisErrorKind::Connect);
                        tracing::debug!(redis = %backend.display, "rate limit: Redis reconnection timed out");
                    }
                }
            }
        });
    }
}

/// The Redis key of a counter.
pub(crate) fn redis_key(key: &str) -> String {
    let mut k = String::with_capacity(KEY_PREFIX.len() + key.len());
    k.push_str(KEY_PREFIX);
    k.push_str(key);
    k
}

fn parse_reply(v: &[i64], rates: usize) -> Option<Reply> {
    let (&allowed, rest) = v.split_first()?;
    if rest.len() != 3 * rates {
        return None;
    }
    Some(Reply {
        allowed: allowed == 1,
        states: rest
            .chunks_exact(3)
            .map(|c| RateState {
                a: c[0],
                b: c[1],
                c: c[2],
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_checked_against_the_rates() {
        assert_eq!(
            parse_reply(&[1, 10, 2, 0], 1),
            Some(Reply {
                allowed: true,
                states: vec![RateState { a: 10, b: 2, c: 0 }]
            })
        );
        assert_eq!(parse_reply(&[0, 1, 2], 1), None);
        assert_eq!(parse_reply(&[], 0), None);
    }

    #[tokio::test]
    async fn an_unreachable_redis_is_down_at_once_and_never_an_error() {
        // Port 1 on loopback: nothing listens, the connection is refused at once.
        let metrics = RateLimitMetrics::new();
        let b = RedisBackend::new(
            "redis://127.0.0.1:1",
            RedisOptions::default(),
            metrics.clone(),
        )
        .unwrap();
        let spec = Spec::new(
            tollgate_api::policy::Algorithm::FixedWindow,
            &tollgate_api::policy::Rate {
                limit: 1,
                window_ms: 1_000,
            },
        )
        .unwrap();
        assert_eq!(b.call("k", &[spec], 0, Op::Check(Cost::ONE)).await, None);
        assert!(b.is_down());
        assert_eq!(metrics.fallback(), 1);
        assert_eq!(
            b.call("k", &[spec], 0, Op::Check(Cost::ONE)).await,
            None,
            "down: no wait"
        );
    }
}
