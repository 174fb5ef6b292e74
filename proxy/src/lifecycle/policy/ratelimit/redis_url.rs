//! The Redis addresses the rate limiter accepts, parsed into a connection target.
//!
//! In: the `url` of [`super::Storage::Redis`] / [`super::Storage::RedisCached`]. Out: a
//! [`Target`] (how to connect) and a display form with any password replaced by `***`
//! (the only form that is ever logged).
//!
//! | form | topology |
//! |------|----------|
//! | `redis://[[user]:password@]host[:6379][/db]` | one server (the `redis` crate's URL) |
//! | `redis+unix:///path/redis.sock[?db=N]`, `unix:///path` | one server over a Unix socket |
//! | `redis+cluster://[[user]:password@]host1[:6379],host2[:6379],...` | Redis Cluster, seed nodes |
//! | `redis://host1:6379,redis://host2:6379,...` | Redis Cluster, seed nodes as single URLs |
//! | `redis+sentinel://[[user]:password@]host1[:26379],host2,.../service[/db]` | Sentinel: the master of `service` |
//!
//! Sentinel credentials are those of the Redis servers (the sentinels are contacted without).
//! TLS (`rediss://`) is not offered: the crate is built without a TLS stack.

use std::time::Duration;

use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{Client, ConnectionAddr, cluster::ClusterClient};

use super::RateLimitError;

/// How to reach Redis.
pub(crate) enum Target {
    /// One server.
    Single(Client),
    /// A cluster, through its seed nodes.
    Cluster(ClusterClient),
    /// The master that the sentinels name (asked again on every reconnect, so a failover is
    /// followed).
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Single(_) => "Single",
            Self::Cluster(_) => "Cluster",
            Self::Sentinel(_) => "Sentinel",
        })
    }
}

/// Parses `url`; `response_timeout` bounds a cluster call (single and sentinel connections
/// get theirs per connection).
pub(crate) fn parse(
    url: &str,
    response_timeout: Duration,
) -> Result<(Target, String), RateLimitError> {
    let url = url.trim();
    let display = redact(url);
    let bad = |reason: String| RateLimitError::RedisUrl {
        url: display.clone(),
        reason,
    };
    let target = if let Some(rest) = url.strip_prefix("redis+cluster://") {
        let (creds, hosts, _path) = split_authority(rest);
        let nodes = parse_hosts(hosts, 6379)
            .map_err(bad)?
            .into_iter()
            .map(|(h, p)| {
                format!(
                    "redis://{}{}",
                    creds.map(|c| format!("{c}@")).unwrap_or_default(),
                    host_port(&h, p)
                )
            })
            .collect::<Vec<_>>();
        cluster(nodes, response_timeout).map_err(|e| bad(e.to_string()))?
    } else if let Some(rest) = url.strip_prefix("redis+sentinel://") {
        let (creds, hosts, path) = split_authority(rest);
        let sentinels = parse_hosts(hosts, 26379).map_err(bad)?;
        let mut parts = path.split('/').filter(|p| !p.is_empty());
        let service = parts.next().ok_or_else(|| {
            bad("missing the service (master) name: redis+sentinel://host:26379/SERVICE".into())
        })?;
        let db = match parts.next() {
            Some(d) => Some(
                d.parse::<i64>()
                    .map_err(|_| bad(format!("bad database `{d}`")))?,
            ),
            None => None,
        };
        let addrs = sentinels
            .into_iter()
            .map(|(h, p)| ConnectionAddr::Tcp(h, p));
        let mut builder = SentinelClientBuilder::new(addrs, service, SentinelServerType::Master)
            .map_err(|e| bad(e.to_string()))?;
        if let Some(db) = db {
            builder = builder.set_client_to_redis_db(db);
        }
        if let Some(creds) = creds {
            let (user, pass) = match creds.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (creds, None),
            };
            if !user.is_empty() {
                builder = builder.set_client_to_redis_username(percent_decode(user));
            }
            if let Some(pass) = pass {
                builder = builder.set_client_to_redis_password(percent_decode(pass));
            }
        }
        Target::Sentinel(tokio::sync::Mutex::new(
            builder.build().map_err(|e| bad(e.to_string()))?,
        ))
    } else if url.contains(',') {
        let nodes: Vec<String> = url
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        if let Some(n) = nodes.iter().find(|n| !n.starts_with("redis://")) {
            return Err(bad(format!(
                "cluster seed `{}` is not a redis:// URL",
                redact(n)
            )));
        }
        cluster(nodes, response_timeout).map_err(|e| bad(e.to_string()))?
    } else if url.starts_with("redis://")
        || url.starts_with("redis+unix://")
        || url.starts_with("unix://")
    {
        Target::Single(Client::open(url).map_err(|e| bad(e.to_string()))?)
    } else {
        return Err(bad(
            "expected redis://, redis+unix://, redis+cluster:// or redis+sentinel:// (rediss:// is not supported)".into(),
        ));
    };
    Ok((target, display))
}

fn cluster(nodes: Vec<String>, response_timeout: Duration) -> redis::RedisResult<Target> {
    ClusterClient::builder(nodes)
        .connection_timeout(response_timeout)
        .response_timeout(response_timeout)
        .build()
        .map(Target::Cluster)
}

/// `[creds@]hosts[/path]` → (creds, hosts, path).
fn split_authority(rest: &str) -> (Option<&str>, &str, &str) {
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..], path),
        None => (None, authority, path),
    }
}

/// `h1[:p1],h2[:p2]` (IPv6 in brackets) with a default port.
fn parse_hosts(hosts: &str, default_port: u16) -> Result<Vec<(String, u16)>, String> {
    let mut out = Vec::new();
    for h in hosts.split(',').map(str::trim).filter(|h| !h.is_empty()) {
        let (host, port) = if let Some(v6) = h.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("bad host `{h}`"))?;
            (host, after.strip_prefix(':'))
        } else {
            match h.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (h, None),
            }
        };
        let port = match port {
            Some(p) => p.parse::<u16>().map_err(|_| format!("bad port in `{h}`"))?,
            None => default_port,
        };
        if host.is_empty() {
            return Err(format!("bad host `{h}`"));
        }
        out.push((host.to_owned(), port));
    }
    if out.is_empty() {
        return Err("no hosts".into());
    }
    Ok(out)
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The URL with the password (or lone credential) of every authority replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    url.split(',')
        .map(|part| {
            let Some(scheme_end) = part.find("://").map(|i| i + 3) else {
                return part.to_owned();
            };
            let rest = &part[scheme_end..];
            let auth_end = rest.find('/').unwrap_or(rest.len());
            match rest[..auth_end].rfind('@') {
                Some(at) => {
                    let creds = &rest[..at];
                    let user = creds.split_once(':').map(|(u, _)| u).unwrap_or("");
                    format!("{}{user}:***{}", &part[..scheme_end], &rest[at..])
                }
                None => part.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(v) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(url: &str) -> &'static str {
        match parse(url, Duration::from_millis(100)) {
            Ok((Target::Single(_), _)) => "single",
            Ok((Target::Cluster(_), _)) => "cluster",
            Ok((Target::Sentinel(_), _)) => "sentinel",
            Err(_) => "error",
        }
    }

    #[test]
    fn accepted_forms() {
        assert_eq!(kind("redis://127.0.0.1:6379"), "single");
        assert_eq!(kind("redis://:secret@redis.ns.svc:6379/2"), "single");
        assert_eq!(kind("redis+unix:///run/redis.sock"), "single");
        assert_eq!(kind("redis+cluster://a:7000,b:7001,c"), "cluster");
        assert_eq!(kind("redis+cluster://user:pw@a:7000,[::1]:7001"), "cluster");
        assert_eq!(kind("redis://a:7000, redis://b:7001"), "cluster");
        assert_eq!(kind("redis+sentinel://s1:26379,s2/mymaster"), "sentinel");
        assert_eq!(kind("redis+sentinel://:pw@s1/mymaster/3"), "sentinel");
    }

    #[test]
    fn refused_forms() {
        for url in [
            "rediss://host:6380",
            "http://host",
            "redis+sentinel://s1:26379",
            "redis+sentinel://s1/m/notanumber",
            "redis+cluster://",
            "redis+cluster://a:notaport",
            "redis://a:1,http://b:2",
        ] {
            assert_eq!(kind(url), "error", "{url}");
        }
    }

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact("redis://:hunter2@h:6379/0"), "redis://:***@h:6379/0");
        assert_eq!(redact("redis://bob:hunter2@h"), "redis://bob:***@h");
        assert_eq!(
            redact("redis+sentinel://hunter2@s1,s2/m"),
            "redis+sentinel://:***@s1,s2/m"
        );
        assert_eq!(
            redact("redis://a:1,redis://:pw@b:2"),
            "redis://a:1,redis://:***@b:2"
        );
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        let err = parse("rediss://:hunter2@h", Duration::from_millis(1)).unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn hosts_and_credentials_parse() {
        assert_eq!(
            parse_hosts("a:1, b ,[::1]:3", 9).unwrap(),
            vec![("a".into(), 1), ("b".into(), 9), ("::1".into(), 3)]
        );
        assert_eq!(
            split_authority("u:p@h1,h2/m/1"),
            (Some("u:p"), "h1,h2", "/m/1")
        );
        assert_eq!(percent_decode("p%40ss%2"), "p@ss%2");
    }
}
