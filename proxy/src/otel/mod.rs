//! OpenTelemetry tracing of the request path. In: a request's `traceparent`/`tracestate`
//! (module [`w3c`]), its policy decisions (noted where `tollgate_policy_decisions_total`
//! counts them: [`note_decision`]), each upstream attempt, and its answer. Out: one server
//! span per request, one client span per upstream attempt (so retries show), a
//! `traceparent` naming our client span on every upstream request, and the spans, batched,
//! to an OTLP collector (module [`export`]). Module [`span`] gives the same tracer to work
//! that is not a request (the controller's reconciles).
//!
//! Sampling is parent-based: a valid incoming parent's sampled flag decides; without one the
//! SDK's trace-id ratio sampler does, on a new trace id. An unsampled request still gets ids
//! and a `traceparent` (flag 00) for the upstream, so the services behind the gateway see
//! one consistent decision; no span of it is recorded.
//!
//! With tracing off (no [`Tracer`]), the request path does one `Option` check in
//! `RequestCtx::arrive` and nothing else: no ids, no clock reads, no allocation, and the
//! client's `traceparent` goes to the upstream as the client sent it (the gateway is then
//! not a participant of the trace, and W3C lets an intermediary that does not participate
//! pass the fields on untouched).

pub mod args;
mod encode;
mod export;
mod span;
pub mod w3c;

use std::cell::RefCell;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use http::{HeaderMap, Method};
use opentelemetry::trace::{SpanId, SpanKind, TraceFlags, TraceId};
use opentelemetry_sdk::trace::{Sampler, SamplingDecision, ShouldSample};
use prometheus_client::metrics::counter::Counter;

use encode::{Code, Head, Kind};

pub use args::{Protocol, TraceArgs, TraceArgsError, TraceSettings};
pub use span::Span;

/// Set once a [`Tracer`] exists in the process: until then [`note_decision`] returns at
/// its first load, without looking for a request's event list.
static ACTIVE: AtomicBool = AtomicBool::new(false);

tokio::task_local! {
    /// The policy decisions of the sampled request whose policies are being enforced.
    static DECISIONS: RefCell<Vec<Decision>>;
}

std::thread_local! {
    /// Where a span is encoded before it is copied into the export queue.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// One policy decision: a span event.
#[derive(Debug)]
struct Decision {
    policy: Arc<str>,
    rule: Arc<str>,
    outcome: &'static str,
    time: SystemTime,
}

/// The process's tracer: the sampler and the export queue.
#[derive(Debug)]
pub struct Tracer {
    sampler: Sampler,
    queue: Arc<export::Queue>,
}

impl Tracer {
    /// Starts the export task (on the current tokio runtime) and returns the tracer that
    /// feeds it; `None` outside a runtime.
    pub fn start(settings: &TraceSettings, dropped: Counter) -> Option<Arc<Self>> {
        Self::start_as(settings, dropped, "tollgate-proxy")
    }

    /// [`Tracer::start`] for a process exporting as `service` (`service.name` of its spans'
    /// resource and their instrumentation scope), e.g. the controller.
    pub fn start_as(
        settings: &TraceSettings,
        dropped: Counter,
        service: &'static str,
    ) -> Option<Arc<Self>> {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let queue = Arc::new(export::Queue::new(settings, dropped));
        handle.spawn(export::run(settings.clone(), queue.clone(), service));
        ACTIVE.store(true, Ordering::Relaxed);
        Some(Arc::new(Self {
            sampler: Sampler::TraceIdRatioBased(settings.sampling_ratio),
            queue,
        }))
    }

    /// The trace of a request with these `headers` (`None` when it has no `traceparent`
    /// or `tracestate` field): the client's parent when its `traceparent` is valid, else a
    /// new trace; sampled as the parent says, else by ratio. The target (`uri`) and `host`
    /// are copied for the server span of a sampled request.
    pub fn begin(
        self: &Arc<Self>,
        headers: Option<&HeaderMap>,
        method: &Method,
        uri: &http::Uri,
        host: &http::HeaderValue,
    ) -> RequestTrace {
        let (parent, keep_state) = match headers {
            None => (None, false),
            Some(h) => w3c::client_fields(h),
        };
        let (trace_id, sampled) = match parent {
            Some(p) => (p.trace_id, p.sampled),
            None => {
                let id = TraceId::from(fastrand::u128(1..));
                let kept = self
                    .sampler
                    .should_sample(None, id, "", &SpanKind::Server, &[], &[])
                    .decision;
                (id, kept == SamplingDecision::RecordAndSample)
            }
        };
        RequestTrace {
            trace_id,
            span_id: SpanId::from(fastrand::u64(1..)),
            parent: parent.map(|p| p.span_id),
            keep_state,
            attempts: AtomicU32::new(0),
            // Nothing allocated, no clock read, for a request nothing of which is recorded.
            recording: sampled.then(|| {
                Box::new(Recording {
                    tracer: self.clone(),
                    start: SystemTime::now(),
                    method: method.clone(),
                    target: uri
                        .path_and_query()
                        .map_or("/", |pq| pq.as_str())
                        .to_owned(),
                    host: host.to_str().unwrap_or("").to_owned(),
                    rule: None,
                    events: Vec::new(),
                })
            }),
        }
    }

    /// Queues the span `head` with what `attrs` and `events` write. Never waits for the
    /// export: a full queue (the collector slower than the traffic) drops the span, counted.
    fn record(
        &self,
        head: &Head<'_>,
        attrs: impl FnOnce(&mut encode::Attrs<'_>),
        events: impl FnOnce(&mut encode::Events<'_>),
    ) {
        SCRATCH.with_borrow_mut(|buf| {
            buf.clear();
            encode::span(buf, head, attrs, events);
            self.queue.push(buf);
        });
    }
}

/// One request's place in a trace, from its arrival to the end of its answer's body.
#[derive(Debug)]
pub struct RequestTrace {
    pub trace_id: TraceId,
    /// The server span's id.
    span_id: SpanId,
    /// The client's span, when it sent a valid `traceparent`.
    parent: Option<SpanId>,
    /// Pass the client's `tracestate` on (its parent was valid, its state well-formed).
    keep_state: bool,
    /// Upstream attempts made so far.
    attempts: AtomicU32,
    /// What the spans of a sampled request are made of; `None` when it is not sampled.
    recording: Option<Box<Recording>>,
}

/// A sampled request's span material.
#[derive(Debug)]
struct Recording {
    tracer: Arc<Tracer>,
    /// The arrival.
    start: SystemTime,
    method: Method,
    /// The request target and host.
    target: String,
    host: String,
    /// The matched rule: its name, else its index.
    rule: Option<String>,
    /// Span events: the policy decisions.
    events: Vec<Decision>,
}

/// An upstream attempt in flight.
#[derive(Debug)]
pub struct Attempt {
    span_id: SpanId,
    start: SystemTime,
    resend: u32,
}

impl RequestTrace {
    /// The trace id, for the access log, when the request is sampled.
    pub fn sampled_id(&self) -> Option<TraceId> {
        self.recording.is_some().then_some(self.trace_id)
    }

    /// The route's rule matched (a span attribute).
    pub fn set_rule(&mut self, name: Option<&str>, index: u32) {
        if let Some(r) = self.recording.as_mut() {
            r.rule = Some(name.map_or_else(|| index.to_string(), str::to_owned));
        }
    }

    fn flags(&self) -> TraceFlags {
        if self.recording.is_some() {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        }
    }

    /// An upstream attempt starts: its client span's id goes to the upstream as the parent
    /// in the `traceparent` returned, to be sent in place of the client's (removed from
    /// `headers`, as is the client's `tracestate` unless it belongs to the trace continued).
    pub fn begin_attempt(&self, headers: &mut HeaderMap) -> (Attempt, http::HeaderValue) {
        let span_id = SpanId::from(fastrand::u64(1..));
        // Not only the client's: a header filter or an authorization service's answer may
        // have set these since the request arrived. None of them goes beside ours.
        headers.remove(w3c::TRACEPARENT);
        if !self.keep_state {
            headers.remove(w3c::TRACESTATE);
        }
        let attempt = Attempt {
            span_id,
            // No clock read for a request nothing of which is recorded.
            start: if self.recording.is_some() {
                SystemTime::now()
            } else {
                SystemTime::UNIX_EPOCH
            },
            resend: self.attempts.fetch_add(1, Ordering::Relaxed),
        };
        (attempt, w3c::format(self.trace_id, span_id, self.flags()))
    }

    /// The trace fields of a request sent without a client span of its own (a mirror's
    /// copy): the server span as its parent, as [`RequestTrace::begin_attempt`] otherwise.
    pub fn propagate(&self, headers: &mut HeaderMap) {
        headers.insert(
            w3c::TRACEPARENT,
            w3c::format(self.trace_id, self.span_id, self.flags()),
        );
        if !self.keep_state {
            headers.remove(w3c::TRACESTATE);
        }
    }

    /// The attempt ended: with the upstream's status, or the error's kind.
    pub fn end_attempt(
        &self,
        a: Attempt,
        endpoint: SocketAddr,
        outcome: Result<u16, &'static str>,
    ) {
        let Some(rec) = self.recording.as_deref() else {
            return;
        };
        let mut ip = StackStr::default();
        let _ = write!(ip, "{}", endpoint.ip());
        let mut code = StackStr::default();
        // Client spans: 4xx and 5xx are errors (semantic conventions, HTTP spans).
        let (status, error) = match outcome {
            Ok(c) if c >= 400 => {
                let _ = write!(code, "{c}");
                (Code::Error(""), Some(code.as_str()))
            }
            Ok(_) => (Code::Unset, None),
            Err(kind) => (Code::Error(kind), Some(kind)),
        };
        let head = Head {
            trace_id: self.trace_id,
            span_id: a.span_id,
            parent: self.span_id,
            remote_parent: false,
            kind: Kind::Client,
            name: &[span_method(&rec.method)],
            start: a.start,
            end: SystemTime::now(),
            status,
        };
        rec.tracer.record(
            &head,
            |attrs| {
                attrs
                    .str("http.request.method", known_method(&rec.method))
                    .str("server.address", ip.as_str())
                    .int("server.port", i64::from(endpoint.port()));
                if a.resend > 0 {
                    attrs.int("http.request.resend_count", i64::from(a.resend));
                }
                if let Ok(c) = outcome {
                    attrs.int("http.response.status_code", i64::from(c));
                }
                if let Some(e) = error {
                    attrs.str("error.type", e);
                }
            },
            |_| {},
        );
    }

    /// The answer's body ended: the server span goes to the export queue.
    pub fn finish(self, status: u16, route: Option<&str>, bytes: u64) {
        let Some(rec) = self.recording.as_deref() else {
            return;
        };
        let (path, query) = rec.target.split_once('?').unwrap_or((&rec.target, ""));
        let method = span_method(&rec.method);
        let name: [&str; 2];
        let head = Head {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent: self.parent.unwrap_or(SpanId::INVALID),
            remote_parent: self.parent.is_some(),
            kind: Kind::Server,
            name: match route {
                Some(r) => {
                    name = [method, r];
                    &name
                }
                None => std::slice::from_ref(&method),
            },
            start: rec.start,
            end: SystemTime::now(),
            // Server spans: only 5xx are errors (the client's 4xx is not the server's fault).
            status: if status >= 500 {
                Code::Error("")
            } else {
                Code::Unset
            },
        };
        rec.tracer.record(
            &head,
            |attrs| {
                attrs
                    .str("http.request.method", known_method(&rec.method))
                    .str("url.path", capped(path))
                    .str("server.address", capped(&rec.host))
                    .int("http.response.status_code", i64::from(status))
                    .int(
                        "http.response.body.size",
                        i64::try_from(bytes).unwrap_or(i64::MAX),
                    );
                if !query.is_empty() {
                    attrs.str("url.query", &redacted_query(query));
                }
                if let Some(route) = route {
                    attrs.str("tollgate.route", route);
                }
                if let Some(rule) = &rec.rule {
                    attrs.str("tollgate.rule", rule);
                }
            },
            |events| {
                for d in &rec.events {
                    events.add("policy.decision", d.time, |attrs| {
                        attrs
                            .str("tollgate.policy", &d.policy)
                            .str("tollgate.policy.rule", &d.rule)
                            .str("tollgate.policy.outcome", d.outcome);
                    });
                }
            },
        );
    }
}

/// A short string formatted without allocating (an IP address, a status code).
struct StackStr {
    buf: [u8; 48],
    len: usize,
}

impl Default for StackStr {
    fn default() -> Self {
        Self {
            buf: [0; 48],
            len: 0,
        }
    }
}

impl StackStr {
    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

impl std::fmt::Write for StackStr {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let room = self.buf.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        room.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// The method as the semantic conventions name it: one of HTTP's own, else `_OTHER` (a
/// client's extension method, up to the request head's size, never goes into a span).
fn known_method(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::CONNECT => "CONNECT",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::PATCH => "PATCH",
        _ => "_OTHER",
    }
}

/// The method in a span's name: `HTTP` for one not known.
fn span_method(m: &Method) -> &'static str {
    match known_method(m) {
        "_OTHER" => "HTTP",
        k => k,
    }
}

/// Runs `fut` (a request's policy enforcement) with its decisions noted as events of the
/// request's server span, when the request is sampled; else just runs it.
pub async fn with_decisions<F: Future>(trace: Option<&mut RequestTrace>, fut: F) -> F::Output {
    match trace.and_then(|t| t.recording.as_deref_mut()) {
        None => fut.await,
        Some(t) => {
            let (out, events) = DECISIONS
                .scope(RefCell::new(std::mem::take(&mut t.events)), async {
                    let out = fut.await;
                    (out, DECISIONS.with(RefCell::take))
                })
                .await;
            t.events = events;
            out
        }
    }
}

/// Notes one policy decision on the sampled request being enforced, if any (called where
/// the decision is counted).
pub fn note_decision(policy: &Arc<str>, rule: &Arc<str>, outcome: &'static str) {
    if !ACTIVE.load(Ordering::Relaxed) {
        return;
    }
    let _ = DECISIONS.try_with(|d| {
        d.borrow_mut().push(Decision {
            // The route table's names, shared (a reference count each), not copied.
            policy: policy.clone(),
            rule: rule.clone(),
            outcome,
            time: SystemTime::now(),
        });
    });
}

/// Longest attribute taken from the request (path, query, host): the export queue is
/// bounded in spans, so a client must not make each span as large as its request line.
const ATTRIBUTE_MAX: usize = 1024;

/// The query with every value replaced by `REDACTED`, keys kept so its shape shows: any
/// value may be a credential (`?api_key=...`), which must not reach the collector (semantic
/// conventions, `url.query`; the access log leaves the query out altogether). A member
/// without `=` is all value, and redacted whole.
fn redacted_query(query: &str) -> String {
    let mut out = String::with_capacity(query.len().min(ATTRIBUTE_MAX));
    for (i, member) in capped(query).split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        if let Some((key, _)) = member.split_once('=') {
            out.push_str(key);
            out.push('=');
        }
        out.push_str("REDACTED");
    }
    // A query of many bare members grows eightfold: the attribute stays within the cap.
    out.truncate(capped(&out).len());
    out
}

/// `s` cut to at most [`ATTRIBUTE_MAX`] bytes, on a character boundary.
fn capped(s: &str) -> &str {
    if s.len() <= ATTRIBUTE_MAX {
        return s;
    }
    let mut end = ATTRIBUTE_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// How long a batch waits for more spans before it is sent.
pub const DEFAULT_BATCH_DELAY: Duration = Duration::from_millis(1000);

#[cfg(test)]
mod capped_tests {
    use super::{ATTRIBUTE_MAX, capped, redacted_query};

    #[test]
    fn query_values_are_redacted() {
        assert_eq!(
            redacted_query("api_key=s3cret&n=1&token&empty="),
            "api_key=REDACTED&n=REDACTED&REDACTED&empty=REDACTED"
        );
    }

    #[test]
    fn long_attributes_are_cut_on_a_character_boundary() {
        assert_eq!(capped("/short"), "/short");
        let long = "é".repeat(ATTRIBUTE_MAX);
        let cut = capped(&long);
        assert!(cut.len() <= ATTRIBUTE_MAX && cut.len() >= ATTRIBUTE_MAX - 1);
        assert!(long.starts_with(cut));
    }
}
