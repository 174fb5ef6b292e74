//! `tollgate run DIR`: serve the Gateways described by manifest files, without a cluster.
//!
//! In: a directory of manifests, watched for changes. Out: one in-process proxy per Gateway
//! of our class, fed by the same [`compile`] the controller uses; a log line for every
//! rejected object with its conditions. A rejected object or a file that does not parse
//! changes nothing else: the other Gateways and routes keep serving. Each compile hands the
//! next the policies it found valid, so a policy edited into an invalid state keeps
//! enforcing its last valid version (see `compile::policies::last_valid`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tollgate_api::ObjectKey;
use tollgate_proxy::policy::ratelimit::RateLimiter;
use tollgate_proxy::{
    AccessLogArgs, AccessLogArgsError, ClientLimitArgs, LogSettings, Metrics, Proxy, ProxyOptions,
};
use tracing::{debug, error, info, warn};

use crate::compile::{CompileCache, Rejection, compile_cached};
use crate::k8s::controller::Batch;
use crate::manifests::ManifestDir;

/// Errors that stop `tollgate run`.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The manifest directory could not be read at start.
    #[error(transparent)]
    Manifests(#[from] crate::manifests::ManifestError),
    /// The directory could not be watched.
    #[error("watching {0}: {1}")]
    Watch(PathBuf, notify::Error),
}

/// Options of `tollgate run`.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The manifest directory.
    pub dir: PathBuf,
    /// The access log of every served Gateway (whether, format, fields, filter, file).
    pub access_log: AccessLogArgs,
    /// Rate-limit counters shared by every served Gateway (`None` = in memory).
    pub rate_limiter: Option<RateLimiter>,
    /// Slow-client limits of every served Gateway.
    pub client_limits: ClientLimitArgs,
    /// OpenTelemetry tracing of every served Gateway (`None`: off).
    pub tracing: Option<tollgate_proxy::otel::TraceSettings>,
    /// The shared HTTP cache every served Gateway's CachePolicy rules use (`None`: none).
    pub http_cache: Option<Arc<tollgate_proxy::HttpCache>>,
}

/// One served Gateway.
struct Served {
    proxy: Proxy,
    /// The version of the table last applied (the proxy keeps the table itself: a new table
    /// is compared with that one, not with a copy).
    version: u64,
}

/// The state of a running `tollgate run`.
pub struct Runner {
    manifests: ManifestDir,
    metrics: Arc<Metrics>,
    access_log: bool,
    access_log_settings: LogSettings,
    rate_limiter: RateLimiter,
    client_limits: ClientLimitArgs,
    tracing: Option<tollgate_proxy::otel::TraceSettings>,
    served: BTreeMap<ObjectKey, Served>,
    reported: BTreeSet<String>,
    /// True once the manifests have been compiled and every table applied: a later scan that
    /// changes nothing skips compiling.
    loaded: bool,
    /// What the last compile hands the next: a change recompiles what it touched, and the
    /// virtual hosts it did not touch reach the proxies as the same shared route lists.
    cache: CompileCache,
    /// The served proxies by Gateway, for the admin server's `/debug/explain`.
    explainable: ProxyRegistry,
    /// One cache, one memory bound, for every served Gateway.
    http_cache: Option<Arc<tollgate_proxy::HttpCache>>,
}

/// Proxies by Gateway (`namespace/name`), shared with the admin server.
pub type ProxyRegistry = Arc<std::sync::RwLock<BTreeMap<String, Proxy>>>;

impl Runner {
    /// A runner over `opts.dir`, reporting into `metrics`; an access log file that cannot
    /// be opened or a filter that does not compile is an error.
    pub fn new(opts: &RunOptions, metrics: Arc<Metrics>) -> Result<Self, AccessLogArgsError> {
        let access_log_settings = opts.access_log.settings()?;
        Ok(Self {
            manifests: ManifestDir::new(&opts.dir),
            rate_limiter: opts
                .rate_limiter
                .clone()
                .unwrap_or_else(|| RateLimiter::in_memory(metrics.rate_limit().clone())),
            metrics,
            access_log: opts.access_log.access_log,
            access_log_settings,
            client_limits: opts.client_limits.clone(),
            tracing: opts.tracing.clone(),
            served: BTreeMap::new(),
            reported: BTreeSet::new(),
            loaded: false,
            cache: CompileCache::default(),
            explainable: ProxyRegistry::default(),
            http_cache: opts.http_cache.clone(),
        })
    }

    /// The Gateways being served.
    pub fn gateways(&self) -> Vec<ObjectKey> {
        self.served.keys().cloned().collect()
    }

    /// The served proxies by Gateway, kept current as Gateways come and go (for the admin
    /// server's `/debug/explain`).
    pub fn explainable(&self) -> ProxyRegistry {
        self.explainable.clone()
    }

    /// The proxy serving `gateway`, if any.
    pub fn proxy(&self, gateway: &ObjectKey) -> Option<&Proxy> {
        self.served.get(gateway).map(|s| &s.proxy)
    }

    /// Reads the manifests again, compiles them and applies every changed table.
    pub async fn reload(&mut self, now: Time) -> Result<(), RunError> {
        let started = Instant::now();
        let scan = self.manifests.scan(&now)?;
        for e in &scan.errors {
            error!(error = %e, "manifest not loaded; keeping its last good version");
        }
        let (read, parsed) = (scan.read, scan.parsed);
        let scanned = started.elapsed();
        if !scan.changed && self.loaded {
            // Same objects as the last compile: same tables, nothing to apply.
            debug!(
                files_read = read,
                scan_ms = ms(scanned),
                "no manifest changed"
            );
            return Ok(());
        }
        self.loaded = true;
        let (mut out, cache) = compile_cached(scan.inputs, std::mem::take(&mut self.cache));
        self.cache = cache;
        // Fail closed: a policy edited into an invalid state keeps its last valid version.
        self.manifests
            .set_last_valid(std::mem::take(&mut out.last_valid));
        let compiled = started.elapsed();
        let tables = std::mem::take(&mut out.tables);
        let live: BTreeSet<ObjectKey> = tables.keys().cloned().collect();
        let gone: Vec<ObjectKey> = self
            .served
            .keys()
            .filter(|k| !live.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            if let Some(s) = self.served.remove(&key) {
                info!(gateway = %key, "gateway no longer served");
                self.registry_mut().remove(&key.to_string());
                s.proxy.shutdown().await;
            }
        }

        for (key, mut table) in tables {
            let served = self.served.entry(key.clone()).or_insert_with(|| {
                let mut opts = ProxyOptions {
                    metrics: self.metrics.clone(),
                    access_log: self.access_log,
                    access_log_settings: self.access_log_settings.clone(),
                    rate_limiter: Some(self.rate_limiter.clone()),
                    tracing: self.tracing.clone(),
                    cache: self.http_cache.clone(),
                    ..ProxyOptions::default()
                };
                self.client_limits.apply(&mut opts);
                Served {
                    proxy: Proxy::new(opts),
                    version: 0,
                }
            });
            table.version = served.version;
            if served.version > 0
                && served
                    .proxy
                    .table()
                    .is_some_and(|live| live.version == served.version && *live == table)
            {
                continue;
            }
            table.version = served.version + 1;
            match served.proxy.apply(table).await {
                Ok(()) => {
                    served.version += 1;
                    self.explainable
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(key.to_string(), served.proxy.clone());
                    info!(gateway = %key, version = served.version, "route table applied");
                }
                Err(e) => {
                    // Try again on the next change, even one that leaves the inputs as they are.
                    self.loaded = false;
                    error!(gateway = %key, error = %e, "route table not applied; the previous one keeps serving")
                }
            }
        }
        let applied = started.elapsed();
        // Rejections are logged once the new tables serve: reading 10k statuses for them need
        // not delay a route.
        self.report(&out.rejections());
        self.cache.recycle(out);
        let stats = self.cache.stats();
        debug!(
            files_read = read,
            files_parsed = parsed,
            routes_compiled = stats.routes_compiled,
            routes_reused = stats.routes_reused,
            attachments_reused = stats.attachments_reused,
            vhosts_built = stats.vhosts_built,
            vhosts_reused = stats.vhosts_reused,
            statuses_recycled = stats.statuses_recycled,
            scan_ms = ms(scanned),
            compile_ms = ms(compiled - scanned),
            apply_ms = ms(applied - compiled),
            "reloaded"
        );
        Ok(())
    }

    /// Logs rejections that are new since the last reload, and recoveries.
    fn report(&mut self, rejections: &[Rejection]) {
        let now: BTreeSet<String> = rejections.iter().map(|r| r.to_string()).collect();
        for r in now.difference(&self.reported) {
            warn!(rejection = %r, "object rejected");
        }
        for r in self.reported.difference(&now) {
            info!(rejection = %r, "no longer rejected");
        }
        self.reported = now;
    }

    fn registry_mut(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Proxy>> {
        // Only inserts and removes happen under the lock: a poisoned one holds a usable map.
        self.explainable
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stops every proxy.
    pub async fn shutdown(&mut self) {
        self.registry_mut().clear();
        for (_, s) in std::mem::take(&mut self.served) {
            s.proxy.shutdown().await;
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Watches `dir` and sends a unit each time something below it changes.
pub fn watch(
    dir: &std::path::Path,
) -> Result<(notify::RecommendedWatcher, tokio::sync::mpsc::Receiver<()>), RunError> {
    use notify::Watcher;
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if res.is_ok_and(|e| changes_content(&e.kind)) {
            let _ = tx.try_send(());
        }
    })
    .map_err(|e| RunError::Watch(dir.to_path_buf(), e))?;
    watcher
        .watch(dir, notify::RecursiveMode::Recursive)
        .map_err(|e| RunError::Watch(dir.to_path_buf(), e))?;
    Ok((watcher, rx))
}

/// Whether an event can change what a scan reads. Opening, reading and closing a file
/// unwritten cannot, and a scan does exactly that: counting those events made every reload
/// trigger the next one.
fn changes_content(kind: &notify::EventKind) -> bool {
    use notify::EventKind;
    use notify::event::{AccessKind, AccessMode};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// Debounces a change stream: after one change, waits until `quiet` passes without another,
/// within the limits of a [`Batch`] (a file rewritten without pause must not hold back every
/// reload).
pub async fn next_change(rx: &mut tokio::sync::mpsc::Receiver<()>, quiet: Duration) -> bool {
    if rx.recv().await.is_none() {
        return false;
    }
    let batch = Batch::start(quiet);
    while let Some(until) = batch.wait_until() {
        match tokio::time::timeout_at(until, rx.recv()).await {
            Ok(Some(())) => {}
            Ok(None) => return false,
            Err(_) => break,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::controller::MAX_BATCH_QUIET_PERIODS;
    use notify::EventKind;
    use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind, RemoveKind, RenameMode};

    #[test]
    fn reading_a_file_is_not_a_change() {
        for kind in [
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            EventKind::Access(AccessKind::Read),
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
        ] {
            assert!(!changes_content(&kind), "{kind:?}");
        }
        for kind in [
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            EventKind::Create(CreateKind::File),
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)),
            EventKind::Modify(ModifyKind::Any),
            EventKind::Remove(RemoveKind::File),
            EventKind::Any,
        ] {
            assert!(changes_content(&kind), "{kind:?}");
        }
    }

    /// A file rewritten every half quiet period, for ever, still reloads: the wait ends after
    /// MAX_BATCH_QUIET_PERIODS quiet periods (paused, virtual time).
    #[tokio::test(start_paused = true)]
    async fn changes_without_pause_still_reload() {
        let quiet = Duration::from_millis(20);
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let writer = tokio::spawn(async move {
            while tx.send(()).await.is_ok() {
                tokio::time::sleep(quiet / 2).await;
            }
        });
        let started = tokio::time::Instant::now();
        let changed = tokio::time::timeout(Duration::from_secs(3600), next_change(&mut rx, quiet))
            .await
            .expect("no reload while the file kept changing");
        assert!(changed);
        let took = started.elapsed();
        assert!(took <= quiet * (MAX_BATCH_QUIET_PERIODS + 1), "{took:?}");
        writer.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn one_change_reloads_after_the_quiet_period() {
        let quiet = Duration::from_millis(20);
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        tx.send(()).await.unwrap();
        let started = tokio::time::Instant::now();
        assert!(next_change(&mut rx, quiet).await);
        assert_eq!(started.elapsed(), quiet);
        drop(tx);
        assert!(!next_change(&mut rx, quiet).await);
    }
}
