//! Access log: one line per request (JSON or logfmt, the fields chosen, the requests chosen
//! by a CEL filter), written off the hot path at about nginx's cost. In: an [`AccessRecord`]
//! of borrowed fields per answered request and the [`LogSettings`]. Out: lines on stdout or
//! in a file.
//!
//! A request writes its line (module `format`) into its thread's scratch buffer (no allocation once warm:
//! the record borrows what the request already holds, times come from a per-thread cache of
//! the current second) and appends it to the pending batch under a short lock (one copy). A
//! writer thread of its own takes the batch every [`FLUSH_INTERVAL`], or at once when it
//! passes [`BATCH_BYTES`], and writes it with one `write` per batch; a request never waits on
//! stdout. When the writer falls behind (the batch past [`MAX_PENDING`]) or stdout fails,
//! lines are dropped and counted in `tollgate_access_log_dropped_total`.
//!
//! The record holds no headers, so credentials (`Authorization`, cookies) can never reach it.

mod args;
mod format;

use std::cell::RefCell;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

pub use self::args::{AccessLogArgs, AccessLogArgsError};
pub use self::format::{Fields, Format};
use crate::lifecycle::call::Retried;
use crate::lifecycle::policy::cel::{LogFilter, LogVars};
use crate::metrics::Metrics;

/// How a proxy writes its access log (besides whether: `ProxyOptions::access_log`).
#[derive(Debug, Clone, Default)]
pub struct LogSettings {
    /// JSON (default) or logfmt.
    pub format: Format,
    /// The fields written (default: all).
    pub fields: Fields,
    /// Only the requests this expression keeps are written (default: all).
    pub filter: Option<LogFilter>,
    /// Where lines go: this file, opened for appending, or stdout (default).
    pub file: Option<Arc<std::fs::File>>,
}

/// Longest a line waits in the batch before it is written.
const FLUSH_INTERVAL: Duration = Duration::from_millis(50);
/// A batch this large is written at once (nginx's `buffer=64k`).
const BATCH_BYTES: usize = 64 * 1024;
/// Lines past this much unwritten text are dropped (and counted).
const MAX_PENDING: usize = 4 * 1024 * 1024;
/// A thread's scratch buffer grown past this (a huge path) is not kept.
const SCRATCH_KEEP: usize = 64 * 1024;

/// One access log line; every field borrows from the request it describes.
#[derive(Debug)]
pub(crate) struct AccessRecord<'a> {
    /// RFC 3339 UTC time the request arrived, with milliseconds.
    pub time: Rfc3339,
    pub method: &'a str,
    pub host: &'a str,
    /// Path without the query string (queries may carry tokens).
    pub path: &'a str,
    pub status: u16,
    pub duration_ms: f64,
    /// `namespace/name` of the route, if one matched.
    pub route: Option<&'a str>,
    /// `ip:port` of the endpoint used, if any.
    pub upstream: Option<SocketAddr>,
    /// Response body bytes sent.
    pub bytes: u64,
    pub request_id: &'a str,
    /// Client `ip:port`; the address alone when the port is 0 (an address from
    /// X-Forwarded-For, which names no port).
    pub peer: SocketAddr,
    /// The call's gRPC status, for a gRPC call (a POST with a gRPC `Content-Type`) whose answer
    /// carried one: in the response head (Trailers-Only, which is also how the gateway
    /// answers such a call itself) or in the trailers. Absent otherwise: the HTTP `status` of
    /// a gRPC call is 200 whatever the call's outcome.
    pub grpc_status: Option<u32>,
    /// The call was gRPC-Web (`application/grpc-web` or `-text`): written `true`, absent
    /// otherwise.
    pub grpc_web: bool,
    /// Why the client's request body was cut as too slow (`body_idle`, `body_rate`,
    /// `body_deadline`, as `tollgate_client_timeouts_total`'s kinds); absent otherwise.
    pub client_timeout: Option<&'static str>,
    /// Each upstream attempt made again under the route's retry rule, as `ip:port reason`
    /// of the attempt that failed (`upstream` is the last attempt's); absent without retries.
    pub retried: &'a [Retried],
    /// The `mode: Shadow` rate limits (`namespace/policy/limit`) that would have refused the
    /// request, had they been enforced; absent when none would.
    pub shadow_limited: &'a [Arc<str>],
    /// The trace id, when the request was traced and sampled.
    pub trace_id: Option<opentelemetry::trace::TraceId>,
}

/// A time written as RFC 3339 UTC with milliseconds, formatted without allocating.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rfc3339(pub SystemTime);

thread_local! {
    /// The second last formatted on this thread and its `YYYY-MM-DDTHH:MM:SS`.
    static SECOND: std::cell::Cell<(u64, [u8; 19])> = const { std::cell::Cell::new((u64::MAX, [0; 19])) };
    /// Where this thread serializes a line before appending it to the batch.
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(512));
}

impl Rfc3339 {
    /// `YYYY-MM-DDTHH:MM:SS.mmmZ`.
    pub(crate) fn bytes(self) -> [u8; 24] {
        let d = self
            .0
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let secs = d.as_secs();
        let (cached, mut prefix) = SECOND.get();
        if cached != secs {
            prefix = second_prefix(secs);
            SECOND.set((secs, prefix));
        }
        let mut out = [0u8; 24];
        out[..19].copy_from_slice(&prefix);
        let ms = d.subsec_millis();
        out[19] = b'.';
        out[20] = b'0' + u8::try_from(ms / 100).unwrap_or(0);
        out[21] = b'0' + u8::try_from(ms / 10 % 10).unwrap_or(0);
        out[22] = b'0' + u8::try_from(ms % 10).unwrap_or(0);
        out[23] = b'Z';
        out
    }
}

fn second_prefix(secs: u64) -> [u8; 19] {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = tollgate_h1::encode::civil_from_days(i64::try_from(days).unwrap_or(0));
    let text = format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    );
    let mut out = [b'0'; 19];
    let n = text.len().min(19);
    out[..n].copy_from_slice(&text.as_bytes()[..n]);
    out
}

/// The batch and the writer's state, shared by every request thread and the writer thread.
struct Sink {
    format: Format,
    fields: Fields,
    filter: Option<LogFilter>,
    pending: Mutex<Vec<u8>>,
    wake: Condvar,
    out: Mutex<Box<dyn Write + Send>>,
    /// stdout failed: nothing more is written.
    broken: AtomicBool,
    /// The log was dropped: the writer writes what is pending and ends.
    closed: AtomicBool,
    metrics: Arc<Metrics>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Sink {
    fn new(out: Box<dyn Write + Send>, settings: &LogSettings, metrics: Arc<Metrics>) -> Self {
        Self {
            format: settings.format,
            fields: settings.fields,
            filter: settings.filter.clone(),
            pending: Mutex::new(Vec::with_capacity(2 * BATCH_BYTES)),
            wake: Condvar::new(),
            out: Mutex::new(out),
            broken: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            metrics,
        }
    }

    fn log(&self, record: &AccessRecord<'_>) {
        if let Some(filter) = &self.filter {
            let vars = LogVars {
                method: record.method,
                host: record.host,
                path: record.path,
                status: record.status,
                route: record.route.unwrap_or(""),
                duration_ms: record.duration_ms,
            };
            match filter.keep(&vars, fastrand::f64()) {
                Ok(false) => return,
                Ok(true) => {}
                Err(e) => {
                    // Written anyway: a filter must not hide what it did not understand.
                    tracing::debug!(error = %e, "access log filter failed; the line is written");
                }
            }
        }
        SCRATCH.with_borrow_mut(|line| {
            line.clear();
            format::write_line(line, record, self.format, self.fields);
            let mut pending = lock(&self.pending);
            if self.broken.load(Ordering::Relaxed) || pending.len() + line.len() > MAX_PENDING {
                drop(pending);
                self.metrics.access_log_dropped();
            } else {
                pending.extend_from_slice(line);
                let full = pending.len() >= BATCH_BYTES;
                drop(pending);
                if full {
                    self.wake.notify_one();
                }
            }
            if line.capacity() > SCRATCH_KEEP {
                *line = Vec::with_capacity(512);
            }
        });
    }

    /// Takes the batch (waiting up to [`FLUSH_INTERVAL`] for it to fill) and writes it.
    fn write_batch(&self, spare: &mut Vec<u8>, wait: bool) -> std::io::Result<()> {
        let mut pending = lock(&self.pending);
        if wait && pending.len() < BATCH_BYTES {
            pending = self
                .wake
                .wait_timeout(pending, FLUSH_INTERVAL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        std::mem::swap(&mut *pending, spare);
        drop(pending);
        if spare.is_empty() {
            return Ok(());
        }
        let mut out = lock(&self.out);
        let written = out.write_all(spare).and_then(|()| out.flush());
        drop(out);
        if written.is_err() {
            self.broken.store(true, Ordering::Relaxed);
            for _ in spare.iter().filter(|&&b| b == b'\n') {
                self.metrics.access_log_dropped();
            }
        }
        spare.clear();
        written
    }
}

/// The writer thread: batches until stdout fails, or until its log is dropped (then it
/// writes what is pending and ends, so a proxy that goes away, as a Gateway `tollgate run`
/// stops serving, leaves no thread behind).
fn write_loop(sink: &Sink) {
    let mut spare = Vec::with_capacity(2 * BATCH_BYTES);
    while !sink.closed.load(Ordering::Acquire) {
        if sink.write_batch(&mut spare, true).is_err() {
            return;
        }
    }
    let _ = sink.write_batch(&mut spare, false);
}

/// A file several proxies of one process may share (`&File` writes).
struct SharedFile(Arc<std::fs::File>);

impl Write for SharedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        (&*self.0).write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        (&*self.0).flush()
    }
}

/// The access log of one proxy.
pub(crate) struct AccessLog {
    sink: Option<Arc<Sink>>,
    started: AtomicBool,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("enabled", &self.enabled())
            .finish()
    }
}

impl AccessLog {
    /// Creates the log (writing once started, to the settings' file or stdout); a disabled
    /// log drops records.
    pub fn new(enabled: bool, settings: &LogSettings, metrics: Arc<Metrics>) -> Self {
        let out = enabled.then(|| match &settings.file {
            Some(f) => Box::new(SharedFile(f.clone())) as Box<dyn Write + Send>,
            None => Box::new(std::io::stdout()),
        });
        Self::to(out, settings, metrics)
    }

    fn to(
        out: Option<Box<dyn Write + Send>>,
        settings: &LogSettings,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            sink: out.map(|o| Arc::new(Sink::new(o, settings, metrics))),
            started: AtomicBool::new(false),
        }
    }

    /// True when records are wanted (skip building them otherwise).
    pub fn enabled(&self) -> bool {
        self.sink.is_some()
    }

    /// Starts the writer thread once.
    pub fn start(&self) {
        let Some(sink) = &self.sink else {
            return;
        };
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let sink = Arc::clone(sink);
        let spawned = std::thread::Builder::new()
            .name("tollgate-access-log".into())
            .spawn(move || write_loop(&sink));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "access log: no writer thread; lines are dropped and counted");
            if let Some(sink) = &self.sink {
                sink.broken.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Adds a line to the batch; drops and counts it when the writer is behind or broken.
    pub fn log(&self, record: &AccessRecord<'_>) {
        if let Some(sink) = &self.sink {
            sink.log(record);
        }
    }

    /// Writes what is pending now (at shutdown, so the last lines are not lost).
    pub fn flush(&self) {
        if let Some(sink) = &self.sink {
            let mut spare = Vec::new();
            let _ = sink.write_batch(&mut spare, false);
        }
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        if let Some(sink) = &self.sink {
            sink.closed.store(true, Ordering::Release);
            sink.wake.notify_one();
        }
    }
}

/// Formats a time as RFC 3339 UTC with milliseconds.
#[cfg(test)]
fn rfc3339(t: SystemTime) -> String {
    String::from_utf8_lossy(&Rfc3339(t).bytes()).into_owned()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn formats_rfc3339() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_486_109_123);
        assert_eq!(rfc3339(t), "2025-11-30T07:01:49.123Z");
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // The same second again comes from the cache; the next one does not.
        assert_eq!(
            rfc3339(t + Duration::from_millis(5)),
            "2025-11-30T07:01:49.128Z"
        );
        assert_eq!(
            rfc3339(t + Duration::from_millis(877)),
            "2025-11-30T07:01:50.000Z"
        );
        assert_eq!(
            rfc3339(t - Duration::from_millis(124)),
            "2025-11-30T07:01:48.999Z"
        );
    }

    /// A `Write` the test reads back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            lock(&self.0).extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    struct Broken;

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn lines(out: &Shared) -> Vec<serde_json::Value> {
        String::from_utf8(lock(&out.0).clone())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn writes_one_json_line_per_record() {
        let out = Shared::default();
        let log = AccessLog::to(
            Some(Box::new(out.clone())),
            &LogSettings::default(),
            Arc::new(Metrics::new()),
        );
        let mut rec = record();
        rec.route = Some("default/shop");
        log.log(&rec);
        rec.status = 404;
        rec.peer = "10.1.2.3:0".parse().unwrap();
        log.log(&rec);
        log.flush();
        let lines = lines(&out);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["route"], "default/shop");
        assert_eq!(lines[0]["status"], 200);
        assert_eq!(lines[0]["upstream"], "10.0.0.1:80");
        assert_eq!(lines[0]["peer"], "127.0.0.1:1");
        assert_eq!(lines[1]["status"], 404);
        assert_eq!(lines[1]["peer"], "10.1.2.3", "no port from X-Forwarded-For");
        // Every field but those written only when they apply.
        for field in &format::FIELD_NAMES[..11] {
            assert!(lines[0].get(field).is_some(), "missing {field}");
        }
    }

    #[test]
    fn the_writer_thread_writes_batches_without_a_flush_call() {
        let out = Shared::default();
        let log = AccessLog::to(
            Some(Box::new(out.clone())),
            &LogSettings::default(),
            Arc::new(Metrics::new()),
        );
        log.start();
        for _ in 0..1_000 {
            log.log(&record());
        }
        // Bounded wait for the writer (not a speed check).
        for _ in 0..500 {
            if lines(&out).len() == 1_000 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(lines(&out).len(), 1_000);
    }

    #[test]
    fn a_dropped_log_writes_its_last_lines_and_ends_its_writer_thread() {
        let out = Shared::default();
        let log = AccessLog::to(
            Some(Box::new(out.clone())),
            &LogSettings::default(),
            Arc::new(Metrics::new()),
        );
        log.start();
        let sink = log.sink.clone().unwrap();
        log.log(&record());
        drop(log);
        // Bounded wait for the writer thread to let go of the sink (not a speed check).
        for _ in 0..500 {
            if Arc::strong_count(&sink) == 1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(Arc::strong_count(&sink), 1, "the writer thread still runs");
        assert_eq!(lines(&out).len(), 1, "the last line was not written");
    }

    fn record() -> AccessRecord<'static> {
        AccessRecord {
            time: Rfc3339(SystemTime::now()),
            method: "GET",
            host: "h",
            path: "/",
            status: 200,
            duration_ms: 1.0,
            route: None,
            upstream: Some("10.0.0.1:80".parse().unwrap()),
            bytes: 10,
            request_id: "r",
            peer: "127.0.0.1:1".parse().unwrap(),
            grpc_status: None,
            grpc_web: false,
            client_timeout: None,
            retried: &[],
            shadow_limited: &[],
            trace_id: None,
        }
    }

    fn json(rec: &AccessRecord<'_>) -> serde_json::Value {
        let mut out = Vec::new();
        format::write_line(&mut out, rec, Format::Json, Fields::ALL);
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn optional_fields_are_written_only_when_set() {
        let mut rec = record();
        let plain = json(&rec);
        for absent in [
            "shadow_limited",
            "grpc_status",
            "client_timeout",
            "retried",
            "grpc_web",
        ] {
            assert!(plain.get(absent).is_none(), "{absent}: {plain}");
        }
        let shadow: [Arc<str>; 1] = [Arc::from("shop/tokens/per-user")];
        let retried = [Retried {
            upstream: "10.0.0.2:8080".parse().unwrap(),
            reason: crate::lifecycle::retry::RetryReason::Connect,
        }];
        rec.shadow_limited = &shadow;
        rec.grpc_status = Some(14);
        rec.grpc_web = true;
        rec.client_timeout = Some("body_rate");
        rec.retried = &retried;
        let all = json(&rec);
        assert_eq!(all["shadow_limited"][0], "shop/tokens/per-user", "{all}");
        assert_eq!(all["grpc_status"], 14, "{all}");
        assert_eq!(all["grpc_web"], true, "{all}");
        assert_eq!(all["client_timeout"], "body_rate", "{all}");
        assert_eq!(
            all["retried"][0],
            format!("10.0.0.2:8080 {}", retried[0].reason.as_str()),
            "{all}"
        );
    }

    #[test]
    fn the_filter_chooses_the_lines() {
        let out = Shared::default();
        let settings = LogSettings {
            filter: Some(LogFilter::compile("response.code >= 500").unwrap()),
            format: Format::Logfmt,
            fields: Fields::parse("status,path").unwrap(),
            file: None,
        };
        let log = AccessLog::to(
            Some(Box::new(out.clone())),
            &settings,
            Arc::new(Metrics::new()),
        );
        let mut rec = record();
        log.log(&rec);
        rec.status = 502;
        rec.path = "/broken";
        log.log(&rec);
        log.flush();
        assert_eq!(
            String::from_utf8(lock(&out.0).clone()).unwrap(),
            "path=/broken status=502\n"
        );
    }

    #[test]
    fn a_full_batch_drops_and_counts() {
        let metrics = Arc::new(Metrics::new());
        let log = AccessLog::to(
            Some(Box::new(Shared::default())),
            &LogSettings::default(),
            metrics.clone(),
        );
        // No writer thread: the batch only fills.
        let mut n = 0;
        while !metrics
            .encode()
            .contains("tollgate_access_log_dropped_total 1")
        {
            log.log(&record());
            n += 1;
            assert!(n < MAX_PENDING, "never dropped");
        }
        assert!(n > MAX_PENDING / 400, "dropped after {n} lines");
    }

    #[test]
    fn a_failed_stdout_drops_and_counts_instead_of_blocking() {
        let metrics = Arc::new(Metrics::new());
        let log = AccessLog::to(
            Some(Box::new(Broken)),
            &LogSettings::default(),
            metrics.clone(),
        );
        log.log(&record());
        log.log(&record());
        log.flush();
        log.log(&record());
        assert!(
            metrics
                .encode()
                .contains("tollgate_access_log_dropped_total 3"),
            "{}",
            metrics.encode()
        );
    }
}
