//! The export queue and task. In: finished spans, already encoded as OTLP protobuf (module
//! [`super::encode`]), appended to a bounded in-memory batch without waiting for anything
//! but the batch's lock (held for a copy). Out: OTLP export requests of up to `batch_size`
//! spans, sent when a batch is full or `batch_delay` has passed, up to [`IN_FLIGHT`] at a
//! time: over gRPC (`TraceService/Export`, HTTP/2 without TLS) or OTLP/HTTP (protobuf
//! posted to `URL/v1/traces`). While requests are in flight spans keep collecting; beyond
//! `queue_size` waiting they are dropped and counted (at most twice `queue_size` spans are
//! held besides those in flight: the waiting ones, and those taken for the next requests).
//! So are the spans of a request the collector refuses, fails or does not answer within
//! [`EXPORT_TIMEOUT`] (logged when failing starts and when it ends).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri, header};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use prometheus_client::metrics::counter::Counter;

use super::args::{Protocol, TraceSettings};
use super::encode::{self, Envelope};

/// How long one export request may take, answer included (the OTLP exporters' default).
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Export requests in flight at once: a collector's round trip does not cap the spans a
/// second that can be exported (one at a time, a busy collector's pauses filled the queue).
pub const IN_FLIGHT: usize = 4;

/// Largest answer read from the collector (a partial-success message at most).
const ANSWER_MAX: usize = 64 * 1024;

/// Encoded spans waiting for export, shared by the request path and the export task.
#[derive(Debug)]
pub(super) struct Queue {
    batch: Mutex<Batch>,
    wake: tokio::sync::Notify,
    /// `tollgate_trace_spans_dropped_total`.
    pub(super) dropped: Counter,
    /// Most spans held (`queue_size`).
    capacity: usize,
    batch_size: usize,
}

#[derive(Debug, Default)]
struct Batch {
    /// `ScopeSpans.spans` fields, one after another.
    bytes: Vec<u8>,
    /// Where each span's field ends in `bytes`.
    ends: Vec<usize>,
}

impl Queue {
    pub(super) fn new(settings: &TraceSettings, dropped: Counter) -> Self {
        Self {
            batch: Mutex::new(Batch::default()),
            wake: tokio::sync::Notify::new(),
            dropped,
            capacity: settings.queue_size.max(1),
            batch_size: settings.batch_size.max(1),
        }
    }

    /// Queues one span (`content`: its `Span` message); drops and counts it when the queue
    /// is full. Never waits for the export.
    pub(super) fn push(&self, content: &[u8]) {
        let mut b = self.batch.lock().unwrap_or_else(PoisonError::into_inner);
        if b.ends.len() >= self.capacity {
            drop(b);
            self.dropped.inc();
            return;
        }
        encode::push_span(&mut b.bytes, content);
        let end = b.bytes.len();
        b.ends.push(end);
        let full = b.ends.len() == self.batch_size;
        drop(b);
        if full {
            self.wake.notify_one();
        }
    }

    /// Moves the queued spans into `into` (emptied first), leaving `into`'s buffers behind
    /// so the queue keeps allocated room.
    fn take(&self, into: &mut Batch) {
        into.bytes.clear();
        into.ends.clear();
        let mut b = self.batch.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut *b, into);
    }
}

/// Why an export request failed.
#[derive(Debug, thiserror::Error)]
enum ExportError {
    #[error("request: {0}")]
    Request(#[from] http::Error),
    #[error("no answer within {EXPORT_TIMEOUT:?}")]
    Timeout,
    #[error("connection: {0}")]
    Connection(#[from] hyper_util::client::legacy::Error),
    #[error("answer body: {0}")]
    Body(String),
    #[error("HTTP status {0}")]
    Status(http::StatusCode),
    #[error("gRPC status {code}: {message}")]
    Grpc { code: String, message: String },
}

/// Where and how export requests go.
struct Transport {
    /// Replaced after a request that timed out: a collector gone without a word (its
    /// address blackholed) would otherwise hold the pooled connection, HTTP/2's one above
    /// all, until the kernel gives up on it, minutes later.
    client: Mutex<Client<HttpConnector, Full<Bytes>>>,
    uri: Uri,
    grpc: bool,
}

impl Transport {
    fn new(settings: &TraceSettings) -> Result<Self, http::uri::InvalidUri> {
        let (uri, grpc) = match settings.protocol {
            Protocol::Grpc => {
                // The service's path on the endpoint's origin, as gRPC clients address it.
                let origin: Uri = settings.endpoint.parse()?;
                let authority = origin.authority().map_or("", |a| a.as_str());
                let uri = format!(
                    "http://{authority}/opentelemetry.proto.collector.trace.v1.TraceService/Export"
                );
                (uri.parse()?, true)
            }
            Protocol::Http => (format!("{}/v1/traces", settings.endpoint).parse()?, false),
        };
        Ok(Self {
            client: Mutex::new(client_for(grpc)),
            uri,
            grpc,
        })
    }

    async fn send(&self, body: Vec<u8>) -> Result<(), ExportError> {
        let mut req = Request::post(self.uri.clone());
        req = if self.grpc {
            req.header(header::CONTENT_TYPE, "application/grpc")
                .header(header::TE, "trailers")
        } else {
            req.header(header::CONTENT_TYPE, "application/x-protobuf")
        };
        let req = req.body(Full::new(Bytes::from(body)))?;
        let client = self
            .client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let exchange = async {
            let resp = client.request(req).await?;
            let status = resp.status();
            // A trailers-only gRPC answer has its status in the header block.
            let head_status = resp.headers().get("grpc-status").cloned();
            let head_message = resp.headers().get("grpc-message").cloned();
            let answer = Limited::new(resp.into_body(), ANSWER_MAX)
                .collect()
                .await
                .map_err(|e| ExportError::Body(e.to_string()))?;
            if !status.is_success() {
                return Err(ExportError::Status(status));
            }
            if !self.grpc {
                return Ok(());
            }
            let trailers = answer.trailers();
            let code = head_status.or_else(|| trailers.and_then(|t| t.get("grpc-status").cloned()));
            match code.as_ref().map(http::HeaderValue::as_bytes) {
                Some(b"0") => Ok(()),
                other => Err(ExportError::Grpc {
                    code: other.map_or_else(
                        || "missing".to_owned(),
                        |c| String::from_utf8_lossy(c).into_owned(),
                    ),
                    message: head_message
                        .or_else(|| trailers.and_then(|t| t.get("grpc-message").cloned()))
                        .map(|m| String::from_utf8_lossy(m.as_bytes()).into_owned())
                        .unwrap_or_default(),
                }),
            }
        };
        let result = tokio::time::timeout(EXPORT_TIMEOUT, exchange)
            .await
            .unwrap_or(Err(ExportError::Timeout));
        if matches!(result, Err(ExportError::Timeout)) {
            *self.client.lock().unwrap_or_else(PoisonError::into_inner) = client_for(self.grpc);
        }
        result
    }
}

/// A client of its own pool: HTTP/2 only (prior knowledge, no TLS) for gRPC.
fn client_for(http2: bool) -> Client<HttpConnector, Full<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(Duration::from_secs(5)));
    Client::builder(TokioExecutor::new())
        .http2_only(http2)
        .build(connector)
}

/// The export loop; ends once the tracer is gone, after sending what it had queued.
pub(super) async fn run(settings: TraceSettings, queue: Arc<Queue>, service: &'static str) {
    let transport = match Transport::new(&settings) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(endpoint = %settings.endpoint, error = %e, "tracing: cannot address the collector; spans are dropped");
            drain(&queue, &settings).await;
            return;
        }
    };
    let transport = Arc::new(transport);
    let envelope = Envelope::new(service, env!("CARGO_PKG_VERSION"));
    let mut taken = Batch::default();
    let mut sending = tokio::task::JoinSet::new();
    // Logged when exporting starts failing and when it recovers, not once per batch: an
    // unreachable collector would otherwise log several lines a second under load.
    let mut failing = false;
    let mut outcome = |r: Result<(usize, Result<(), ExportError>), tokio::task::JoinError>| {
        let (n, result) = match r {
            Ok(done) => done,
            // A send that panicked: nothing known of its spans but that they are lost.
            Err(e) => (0, Err(ExportError::Body(e.to_string()))),
        };
        match result {
            Err(e) => {
                queue.dropped.inc_by(u64::try_from(n).unwrap_or(u64::MAX));
                if !failing {
                    tracing::warn!(spans = n, error = %e, "tracing: export failing; spans are dropped and counted until it recovers");
                    failing = true;
                }
            }
            Ok(()) if failing => {
                tracing::info!("tracing: export recovered");
                failing = false;
            }
            Ok(()) => {}
        }
    };
    loop {
        let deadline = tokio::time::Instant::now() + settings.batch_delay;
        loop {
            tokio::select! {
                _ = tokio::time::timeout_at(deadline, queue.wake.notified()) => break,
                Some(r) = sending.join_next() => outcome(r),
            }
        }
        let last = Arc::strong_count(&queue) == 1;
        queue.take(&mut taken);
        let mut start = 0;
        for chunk in taken.ends.chunks(settings.batch_size.max(1)) {
            let Some(&end) = chunk.last() else { break };
            let body = envelope.request(&taken.bytes[start..end], transport.grpc);
            start = end;
            while sending.len() >= IN_FLIGHT {
                if let Some(r) = sending.join_next().await {
                    outcome(r);
                }
            }
            let (t, n) = (transport.clone(), chunk.len());
            sending.spawn(async move { (n, t.send(body).await) });
        }
        if last {
            while let Some(r) = sending.join_next().await {
                outcome(r);
            }
            return;
        }
    }
}

/// Without a collector to send to: counts every span queued as dropped, until the tracer
/// is gone.
async fn drain(queue: &Arc<Queue>, settings: &TraceSettings) {
    let mut taken = Batch::default();
    loop {
        let _ = tokio::time::timeout(settings.batch_delay, queue.wake.notified()).await;
        let last = Arc::strong_count(queue) == 1;
        queue.take(&mut taken);
        queue
            .dropped
            .inc_by(u64::try_from(taken.ends.len()).unwrap_or(u64::MAX));
        if last {
            return;
        }
    }
}
