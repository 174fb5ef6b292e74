//! Access log: one JSON line per request, written off the hot path. In: an [`AccessRecord`]
//! per answered request, sent with `try_send` to a bounded channel. Out: JSON lines on stdout,
//! written by one background task. When the writer falls behind, records are dropped and
//! counted in `tollgate_access_log_dropped_total` rather than slowing requests down.
//!
//! The record holds no headers, so credentials (`Authorization`, cookies) can never reach it.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::metrics::Metrics;

/// Capacity of the channel between requests and the writer.
const CHANNEL_CAPACITY: usize = 8192;

/// One access log line.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AccessRecord {
    /// RFC 3339 UTC time the request arrived.
    pub time: String,
    pub method: String,
    pub host: String,
    /// Path without the query string (queries may carry tokens).
    pub path: String,
    pub status: u16,
    pub duration_ms: f64,
    /// `namespace/name` of the route, if one matched.
    pub route: Option<String>,
    /// `ip:port` of the endpoint used, if any.
    pub upstream: Option<String>,
    /// Response body bytes sent.
    pub bytes: u64,
    pub request_id: String,
    /// Client `ip:port`.
    pub peer: String,
    /// The call's gRPC status, for a gRPC call (a POST with a gRPC `Content-Type`) whose answer
    /// carried one: in the response head (Trailers-Only, which is also how the gateway
    /// answers such a call itself) or in the trailers. Absent otherwise: the HTTP `status` of
    /// a gRPC call is 200 whatever the call's outcome.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<u32>,
    /// Why the client's request body was cut as too slow (`body_idle`, `body_rate`,
    /// `body_deadline`, as `tollgate_client_timeouts_total`'s kinds); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_timeout: Option<&'static str>,
    /// Each upstream attempt made again under the route's retry rule, as `ip:port reason`
    /// of the attempt that failed (`upstream` is the last attempt's); absent without retries.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub retried: Vec<String>,
    /// The `mode: Shadow` rate limits (`namespace/policy/limit`) that would have refused the
    /// request, had they been enforced; absent when none would.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shadow_limited: Vec<String>,
}

/// Sender side of the access log.
#[derive(Debug)]
pub(crate) struct AccessLog {
    tx: Option<mpsc::Sender<AccessRecord>>,
    rx: Mutex<Option<mpsc::Receiver<AccessRecord>>>,
    metrics: Arc<Metrics>,
}

impl AccessLog {
    /// Creates the log; disabled logs drop records without a channel.
    pub fn new(enabled: bool, metrics: Arc<Metrics>) -> Self {
        if !enabled {
            return Self {
                tx: None,
                rx: Mutex::new(None),
                metrics,
            };
        }
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        Self {
            tx: Some(tx),
            rx: Mutex::new(Some(rx)),
            metrics,
        }
    }

    /// True when records are wanted (skip building them otherwise).
    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Starts the writer task once; needs a Tokio runtime, so it is called from `apply`.
    pub fn start(&self) {
        let rx = match self.rx.lock() {
            Ok(mut guard) => guard.take(),
            Err(_) => None,
        };
        if let Some(rx) = rx {
            tokio::spawn(write_lines(rx, tokio::io::stdout()));
        }
    }

    /// Queues a record; drops and counts it when the channel is full.
    pub fn log(&self, record: AccessRecord) {
        if let Some(tx) = &self.tx
            && tx.try_send(record).is_err()
        {
            self.metrics.access_log_dropped();
        }
    }
}

async fn write_lines(
    mut rx: mpsc::Receiver<AccessRecord>,
    out: impl tokio::io::AsyncWrite + Unpin,
) {
    let mut out = tokio::io::BufWriter::new(out);
    let mut line = Vec::with_capacity(512);
    while let Some(record) = rx.recv().await {
        line.clear();
        if serde_json::to_writer(&mut line, &record).is_err() {
            continue;
        }
        line.push(b'\n');
        if out.write_all(&line).await.is_err() {
            return;
        }
        // Flush when the queue is drained, so lines appear promptly but batch under load.
        if rx.is_empty() && out.flush().await.is_err() {
            return;
        }
    }
    let _ = out.flush().await;
}

/// Formats a time as RFC 3339 UTC with milliseconds.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = tollgate_h1::encode::civil_from_days(i64::try_from(days).unwrap_or(0));
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        d.subsec_millis()
    )
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
    }

    #[tokio::test]
    async fn writes_one_json_line_per_record() {
        let (tx, rx) = mpsc::channel(4);
        let (w, mut r) = tokio::io::duplex(4096);
        let writer = tokio::spawn(write_lines(rx, w));
        let mut rec = record();
        rec.route = Some("default/shop".into());
        tx.send(rec.clone()).await.unwrap();
        rec.status = 404;
        tx.send(rec).await.unwrap();
        drop(tx);
        writer.await.unwrap();
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut r, &mut out)
            .await
            .unwrap();
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert_eq!(lines[0]["route"], "default/shop");
        assert_eq!(lines[0]["status"], 200);
        assert_eq!(lines[1]["status"], 404);
        for field in [
            "time",
            "method",
            "host",
            "path",
            "status",
            "duration_ms",
            "route",
            "upstream",
            "bytes",
            "request_id",
            "peer",
        ] {
            assert!(lines[0].get(field).is_some(), "missing {field}");
        }
    }

    fn record() -> AccessRecord {
        AccessRecord {
            time: rfc3339(SystemTime::now()),
            method: "GET".into(),
            host: "h".into(),
            path: "/".into(),
            status: 200,
            duration_ms: 1.0,
            route: None,
            upstream: Some("10.0.0.1:80".into()),
            bytes: 10,
            request_id: "r".into(),
            peer: "127.0.0.1:1".into(),
            grpc_status: None,
            client_timeout: None,
            retried: Vec::new(),
            shadow_limited: Vec::new(),
        }
    }

    #[test]
    fn shadow_limited_is_written_only_when_a_shadow_limit_would_have_refused() {
        let mut rec = record();
        let plain = serde_json::to_value(&rec).unwrap();
        assert!(plain.get("shadow_limited").is_none(), "{plain}");
        rec.shadow_limited = vec!["shop/tokens/per-user".into()];
        let shadow = serde_json::to_value(&rec).unwrap();
        assert_eq!(
            shadow["shadow_limited"][0], "shop/tokens/per-user",
            "{shadow}"
        );
    }

    #[test]
    fn grpc_status_is_written_only_when_known() {
        let mut rec = record();
        let plain = serde_json::to_value(&rec).unwrap();
        assert!(plain.get("grpc_status").is_none(), "{plain}");
        rec.grpc_status = Some(14);
        let grpc = serde_json::to_value(&rec).unwrap();
        assert_eq!(grpc["grpc_status"], 14, "{grpc}");
    }

    #[test]
    fn client_timeout_is_written_only_for_a_cut_body() {
        let mut rec = record();
        let plain = serde_json::to_value(&rec).unwrap();
        assert!(plain.get("client_timeout").is_none(), "{plain}");
        rec.client_timeout = Some("body_rate");
        let cut = serde_json::to_value(&rec).unwrap();
        assert_eq!(cut["client_timeout"], "body_rate", "{cut}");
    }

    #[test]
    fn full_channel_drops_and_counts() {
        let metrics = Arc::new(Metrics::new());
        let log = AccessLog::new(true, metrics.clone());
        let rec = record();
        for _ in 0..=CHANNEL_CAPACITY {
            log.log(rec.clone());
        }
        assert!(
            metrics
                .encode()
                .contains("tollgate_access_log_dropped_total 1")
        );
    }
}
