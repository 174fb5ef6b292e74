//! Command-line selection of the rate-limit storage, shared by `tollgate-proxy`,
//! `tollgate run` and `tollgate controller` (which passes it on to the proxies it
//! provisions).
//!
//! In: `--rate-limit-storage`, `--redis-url`, `--redis-flush-ms`. Out: a [`Storage`], or
//! the flags to hand to another process.

use std::time::Duration;

use super::ratelimit::Storage;

/// How counters are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StorageKind {
    /// In each process: every replica counts alone.
    Memory,
    /// In Redis, one atomic script call per decision: replicas share exact counts.
    Redis,
    /// Counted locally and flushed to Redis in batches: far fewer Redis calls, bounded
    /// overshoot.
    RedisCached,
}

/// The rate-limit storage flags.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct RateLimitArgs {
    /// Where rate-limit counters live: memory, redis or redis-cached. Default: memory, or
    /// redis when --redis-url is given. When Redis is unreachable, limits keep being enforced
    /// with local counters.
    #[arg(long, value_enum)]
    pub rate_limit_storage: Option<StorageKind>,
    /// Redis address: redis://[user:password@]host[:port][/db], redis+cluster://h1,h2,... or
    /// redis+sentinel://h1,h2,.../service[/db].
    #[arg(long)]
    pub redis_url: Option<String>,
    /// How often redis-cached flushes local counts to Redis, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub redis_flush_ms: u64,
}

/// Inconsistent flags.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageArgsError {
    /// Redis storage without an address.
    #[error("--rate-limit-storage {0} needs --redis-url")]
    NoUrl(&'static str),
    /// A zero flush interval.
    #[error("--redis-flush-ms must be at least 1")]
    ZeroFlush,
}

impl RateLimitArgs {
    /// The storage these flags select.
    pub fn storage(&self) -> Result<Storage, StorageArgsError> {
        let kind = self
            .rate_limit_storage
            .unwrap_or(if self.redis_url.is_some() {
                StorageKind::Redis
            } else {
                StorageKind::Memory
            });
        match (kind, &self.redis_url) {
            (StorageKind::Memory, _) => Ok(Storage::Memory),
            (StorageKind::Redis, Some(url)) => Ok(Storage::redis(url.clone())),
            (StorageKind::RedisCached, Some(url)) => {
                if self.redis_flush_ms == 0 {
                    return Err(StorageArgsError::ZeroFlush);
                }
                Ok(Storage::redis_cached(
                    url.clone(),
                    Duration::from_millis(self.redis_flush_ms),
                ))
            }
            (StorageKind::Redis, None) => Err(StorageArgsError::NoUrl("redis")),
            (StorageKind::RedisCached, None) => Err(StorageArgsError::NoUrl("redis-cached")),
        }
    }

    /// The same selection as command-line flags (for a process started with them).
    pub fn to_flags(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(kind) = self.rate_limit_storage {
            let k = match kind {
                StorageKind::Memory => "memory",
                StorageKind::Redis => "redis",
                StorageKind::RedisCached => "redis-cached",
            };
            out.push(format!("--rate-limit-storage={k}"));
        }
        if let Some(url) = &self.redis_url {
            out.push(format!("--redis-url={url}"));
        }
        if self.redis_flush_ms != 100 {
            out.push(format!("--redis-flush-ms={}", self.redis_flush_ms));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        rl: RateLimitArgs,
    }

    fn parse(args: &[&str]) -> RateLimitArgs {
        Cli::parse_from(std::iter::once("x").chain(args.iter().copied())).rl
    }

    #[test]
    fn defaults_and_selection() {
        assert_eq!(parse(&[]).storage(), Ok(Storage::Memory));
        assert_eq!(
            parse(&["--redis-url", "redis://127.0.0.1:6379"]).storage(),
            Ok(Storage::redis("redis://127.0.0.1:6379"))
        );
        assert_eq!(
            parse(&[
                "--redis-url",
                "redis://r",
                "--rate-limit-storage",
                "redis-cached",
                "--redis-flush-ms",
                "50"
            ])
            .storage(),
            Ok(Storage::redis_cached(
                "redis://r",
                Duration::from_millis(50)
            ))
        );
        assert_eq!(
            parse(&["--rate-limit-storage", "redis"]).storage(),
            Err(StorageArgsError::NoUrl("redis"))
        );
        assert_eq!(
            parse(&["--redis-url", "redis://r", "--rate-limit-storage", "memory"]).storage(),
            Ok(Storage::Memory)
        );
    }

    #[test]
    fn flags_round_trip() {
        for args in [
            vec![],
            vec!["--redis-url", "redis://r"],
            vec![
                "--rate-limit-storage",
                "redis-cached",
                "--redis-url",
                "redis://r",
                "--redis-flush-ms",
                "25",
            ],
        ] {
            let a = parse(&args);
            let flags = a.to_flags();
            let back = parse(&flags.iter().map(String::as_str).collect::<Vec<_>>());
            assert_eq!(back, a, "{flags:?}");
        }
    }
}
