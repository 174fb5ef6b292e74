//! The cache tests' origin and proxy. The origin answers as each request tells it (request
//! fields, so a cached answer needs none): `x-origin-status`, `x-origin-header: name: value`
//! (repeatable), `x-origin-size` (a body of that many bytes), `x-origin-hold` (wait for
//! [`Origin::release`]), `x-origin-hold-body` (the head at once, with its `content-length`,
//! the body after [`Origin::release`]); without a size the body is `path #n`, n counting that path's
//! requests. A request whose `If-None-Match` matches the `etag` it asks for gets a 304. The
//! origin counts every request it answers per path and keeps the last one's fields.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tollgate_api::cache::{CacheRule, QueryKey};
use tollgate_api::{ObjectKey, Route};
use tollgate_proxy::{HttpCache, Metrics, Proxy, ProxyOptions};

use crate::common::{backend_at, http_port, route, table, wb};

#[derive(Default)]
pub struct Seen {
    pub count: HashMap<String, usize>,
    pub last: HashMap<String, HeaderMap>,
}

pub struct Origin {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Seen>>,
    pub hold: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Origin {
    pub fn count(&self, path: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .count
            .get(path)
            .copied()
            .unwrap_or(0)
    }
    pub fn last(&self, path: &str) -> HeaderMap {
        self.seen
            .lock()
            .unwrap()
            .last
            .get(path)
            .cloned()
            .unwrap_or_default()
    }
    /// Lets every held request answer.
    pub fn release(&self) {
        self.hold.notify_waiters();
    }
    /// Stops listening and drops every open connection.
    pub fn kill(&self) {
        self.task.abort();
    }
}

pub async fn origin() -> Origin {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let hold = Arc::new(Notify::new());
    let (s, h) = (seen.clone(), hold.clone());
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (s, h) = (s.clone(), h.clone());
            conns.spawn(async move {
                let svc = service_fn(move |req| answer(req, s.clone(), h.clone()));
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Origin {
        addr,
        seen,
        hold,
        task,
    }
}

type OriginBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn answer(
    req: Request<Incoming>,
    seen: Arc<Mutex<Seen>>,
    hold: Arc<Notify>,
) -> Result<Response<OriginBody>, Infallible> {
    let hold_body = req.headers().contains_key("x-origin-hold-body");
    let resp = answer_whole(req, seen, hold.clone()).await?;
    if !hold_body {
        return Ok(resp.map(BodyExt::boxed));
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    parts.headers.insert("content-length", bytes.len().into());
    let wait = hold.notified_owned();
    let later = futures_util::stream::once(async move {
        wait.await;
        Ok::<_, Infallible>(hyper::body::Frame::data(bytes))
    });
    Ok(Response::from_parts(
        parts,
        BodyExt::boxed(http_body_util::StreamBody::new(later)),
    ))
}

async fn answer_whole(
    req: Request<Incoming>,
    seen: Arc<Mutex<Seen>>,
    hold: Arc<Notify>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    let h = req.headers().clone();
    let n = {
        let mut s = seen.lock().unwrap();
        let c = s.count.entry(path.clone()).or_default();
        *c += 1;
        let n = *c;
        s.last.insert(path.clone(), h.clone());
        n
    };
    if h.contains_key("x-origin-hold") {
        let wait = hold.notified();
        wait.await;
    }
    let _ = req.into_body().collect().await;
    let status: u16 = h
        .get("x-origin-status")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(200);
    let mut resp = Response::new(Full::new(match h.get("x-origin-size") {
        Some(v) => Bytes::from(vec![b'x'; v.to_str().unwrap().parse().unwrap()]),
        None => Bytes::from(format!("{path} #{n}")),
    }));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap();
    for v in h.get_all("x-origin-header") {
        let (name, value) = v.to_str().unwrap().split_once(':').unwrap();
        resp.headers_mut().append(
            http::HeaderName::from_bytes(name.trim().as_bytes()).unwrap(),
            value.trim().parse().unwrap(),
        );
    }
    let etag = resp.headers().get("etag").cloned();
    if let (Some(inm), Some(etag)) = (h.get("if-none-match"), etag)
        && inm == etag
    {
        *resp.status_mut() = StatusCode::NOT_MODIFIED;
        *resp.body_mut() = Full::new(Bytes::new());
    }
    Ok(resp)
}

/// A rule caching GET and HEAD, answers without freshness information not stored.
pub fn rule() -> CacheRule {
    CacheRule {
        policy: ObjectKey::new("default", "cache"),
        default_ttl_ms: None,
        max_ttl_ms: None,
        stale_while_revalidate_ms: 0,
        stale_if_error_ms: 0,
        max_entry_bytes: 1 << 20,
        query: QueryKey::All,
        expressions: vec![],
        methods: vec!["GET".into(), "HEAD".into()],
        store_set_cookie: false,
    }
}

pub struct Cached {
    pub proxy: Proxy,
    /// The table applied (to apply again, say with another version).
    pub table: tollgate_api::RouteTable,
    pub url: String,
    pub metrics: Arc<Metrics>,
    pub cache: Arc<HttpCache>,
}

/// A proxy with a 16 MiB cache, one route `/` to `origin` under `rule` (edited by `edit`).
pub async fn cached(origin: &Origin, rule: CacheRule, edit: impl FnOnce(&mut Route)) -> Cached {
    cached_with(origin, rule, edit, vec![]).await
}

/// [`cached`], with `policies` in the table (the route names one with `policy`).
pub async fn cached_with(
    origin: &Origin,
    rule: CacheRule,
    edit: impl FnOnce(&mut Route),
    policies: Vec<(&str, tollgate_api::PolicySet)>,
) -> Cached {
    cached_sized(origin, rule, edit, policies, 16 << 20).await
}

/// [`cached_with`], with a cache of `bytes`.
pub async fn cached_sized(
    origin: &Origin,
    rule: CacheRule,
    edit: impl FnOnce(&mut Route),
    policies: Vec<(&str, tollgate_api::PolicySet)>,
    bytes: u64,
) -> Cached {
    let metrics = Arc::new(Metrics::new());
    let cache = HttpCache::new(bytes, &metrics);
    let proxy = Proxy::new(ProxyOptions {
        metrics: metrics.clone(),
        cache: Some(cache.clone()),
        ..ProxyOptions::default()
    });
    let mut r = route("site", "/", vec![wb("o", 1)]);
    r.cache = Some(Box::new(rule));
    edit(&mut r);
    let mut t = table(
        1,
        vec![http_port(0, vec![r])],
        vec![("o", backend_at(origin.addr))],
    );
    t.policies = policies
        .into_iter()
        .map(|(k, s)| (k.to_owned(), s))
        .collect();
    proxy.apply(t.clone()).await.unwrap();
    let url = format!("http://{}", proxy.local_addr(0).unwrap());
    Cached {
        proxy,
        table: t,
        url,
        metrics,
        cache,
    }
}

/// A GET of `path` with `headers` (`name: value` pairs), read to the end.
pub async fn fetch(url: &str, path: &str, headers: &[(&str, &str)]) -> crate::common::Answer {
    fetch_method(url, "GET", path, headers).await
}

pub async fn fetch_method(
    url: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> crate::common::Answer {
    let client = crate::common::h1_client();
    let mut b = Request::builder()
        .method(method)
        .uri(format!("{url}{path}"));
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    tokio::time::timeout(
        Duration::from_secs(20),
        crate::common::send(&client, b.body(Full::default()).unwrap()),
    )
    .await
    .expect("answer within 20 s")
}

pub fn x_cache(a: &crate::common::Answer) -> &str {
    a.headers.get("x-cache").map_or("", |v| v.to_str().unwrap())
}

pub fn body(a: &crate::common::Answer) -> String {
    String::from_utf8_lossy(&a.body).into_owned()
}

/// A counter's value in the metrics text (0 when absent).
pub fn metric(m: &Metrics, line_prefix: &str) -> u64 {
    m.encode()
        .lines()
        .find(|l| {
            l.strip_prefix(line_prefix)
                .is_some_and(|r| r.starts_with(' '))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}
