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
mod export;
mod span;
pub mod w3c;

use std::borrow::Cow;
use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use http::{HeaderMap, Method};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{
    Sampler, SamplingDecision, ShouldSample, SpanData, SpanEvents, SpanLinks,
};
use prometheus_client::metrics::counter::Counter;

pub use args::{Protocol, TraceArgs, TraceArgsError, TraceSettings};
pub use span::Span;

/// Set once a [`Tracer`] exists in the process: until then [`note_decision`] returns at
/// its first load, without looking for a request's event list.
static ACTIVE: AtomicBool = AtomicBool::new(false);

tokio::task_local! {
    /// The policy decisions of the sampled request whose policies are being enforced.
    static DECISIONS: RefCell<Vec<opentelemetry::trace::Event>>;
}

/// The process's tracer: the sampler and the export queue.
#[derive(Debug)]
pub struct Tracer {
    sampler: Sampler,
    queue: tokio::sync::mpsc::Sender<SpanData>,
    /// `tollgate_trace_spans_dropped_total`.
    dropped: Counter,
    scope: InstrumentationScope,
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
        let (queue, rx) = tokio::sync::mpsc::channel(settings.queue_size.max(1));
        handle.spawn(export::run(settings.clone(), rx, dropped.clone(), service));
        ACTIVE.store(true, Ordering::Relaxed);
        Some(Arc::new(Self {
            sampler: Sampler::TraceIdRatioBased(settings.sampling_ratio),
            queue,
            dropped,
            scope: InstrumentationScope::builder(service)
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        }))
    }

    /// The trace of a request with these `headers`: the client's parent when its
    /// `traceparent` is valid, else a new trace; sampled as the parent says, else by ratio.
    pub fn begin(
        self: &Arc<Self>,
        headers: &HeaderMap,
        method: &Method,
        target: &str,
        host: &str,
    ) -> Box<RequestTrace> {
        let mut fields = headers.get_all(w3c::TRACEPARENT).iter();
        let parent = match (fields.next(), fields.next()) {
            (Some(v), None) => w3c::parse(v.as_bytes()),
            _ => None,
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
        let mut states = headers.get_all(w3c::TRACESTATE).iter();
        let keep_state = parent.is_some()
            && match (states.next(), states.next()) {
                (Some(v), None) => w3c::valid_state(v.as_bytes()),
                (None, _) => true,
                _ => false,
            };
        Box::new(RequestTrace {
            tracer: self.clone(),
            trace_id,
            span_id: SpanId::from(fastrand::u64(1..)),
            parent: parent.map(|p| p.span_id),
            sampled,
            keep_state,
            // No clock read for a request nothing of which is recorded.
            start: if sampled {
                SystemTime::now()
            } else {
                SystemTime::UNIX_EPOCH
            },
            method: method.clone(),
            target: sampled.then(|| (target.to_owned(), host.to_owned())),
            attempts: AtomicU32::new(0),
            rule: None,
            events: Vec::new(),
        })
    }

    fn send(&self, span: SpanData) {
        // Never waits: a full queue (the collector slower than the traffic) drops the span.
        if self.queue.try_send(span).is_err() {
            self.dropped.inc();
        }
    }
}

/// One request's place in a trace, from its arrival to the end of its answer's body.
#[derive(Debug)]
pub struct RequestTrace {
    tracer: Arc<Tracer>,
    pub trace_id: TraceId,
    /// The server span's id.
    span_id: SpanId,
    /// The client's span, when it sent a valid `traceparent`.
    parent: Option<SpanId>,
    pub sampled: bool,
    /// Pass the client's `tracestate` on (its parent was valid, its state well-formed).
    keep_state: bool,
    /// The arrival (the epoch for an unsampled request: never read).
    start: SystemTime,
    method: Method,
    /// The request target and host, for the server span (sampled requests only).
    target: Option<(String, String)>,
    /// Upstream attempts made so far.
    attempts: AtomicU32,
    /// The matched rule: its name, else its index (sampled requests only).
    rule: Option<String>,
    /// Span events: the policy decisions.
    events: Vec<opentelemetry::trace::Event>,
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
        self.sampled.then_some(self.trace_id)
    }

    /// The route's rule matched (a span attribute).
    pub fn set_rule(&mut self, name: Option<&str>, index: u32) {
        if self.sampled {
            self.rule = Some(name.map_or_else(|| index.to_string(), str::to_owned));
        }
    }

    fn flags(&self) -> TraceFlags {
        if self.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        }
    }

    /// An upstream attempt starts: its client span's id goes to the upstream as the parent
    /// in `traceparent` (the client's value replaced), the client's `tracestate` with it
    /// only when it belongs to the trace continued.
    pub fn begin_attempt(&self, headers: &mut HeaderMap) -> Attempt {
        let span_id = SpanId::from(fastrand::u64(1..));
        self.set_fields(headers, span_id);
        Attempt {
            span_id,
            start: if self.sampled {
                SystemTime::now()
            } else {
                SystemTime::UNIX_EPOCH
            },
            resend: self.attempts.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The trace fields of a request sent without a client span of its own (a mirror's
    /// copy): the server span as its parent, as [`RequestTrace::begin_attempt`] otherwise.
    pub fn propagate(&self, headers: &mut HeaderMap) {
        self.set_fields(headers, self.span_id);
    }

    fn set_fields(&self, headers: &mut HeaderMap, parent: SpanId) {
        headers.insert(
            w3c::TRACEPARENT,
            w3c::format(self.trace_id, parent, self.flags()),
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
        if !self.sampled {
            return;
        }
        let mut attributes = vec![
            KeyValue::new("http.request.method", known_method(&self.method)),
            KeyValue::new("server.address", endpoint.ip().to_string()),
            KeyValue::new("server.port", i64::from(endpoint.port())),
        ];
        if a.resend > 0 {
            attributes.push(KeyValue::new(
                "http.request.resend_count",
                i64::from(a.resend),
            ));
        }
        let status = match outcome {
            Ok(code) => {
                attributes.push(KeyValue::new("http.response.status_code", i64::from(code)));
                // Client spans: 4xx and 5xx are errors (semantic conventions, HTTP spans).
                if code >= 400 {
                    attributes.push(KeyValue::new("error.type", code.to_string()));
                    Status::error("")
                } else {
                    Status::Unset
                }
            }
            Err(kind) => {
                attributes.push(KeyValue::new("error.type", kind));
                Status::error(kind)
            }
        };
        self.tracer.send(self.span(
            a.span_id,
            self.span_id,
            false,
            SpanKind::Client,
            Cow::Borrowed(span_method(&self.method)),
            a.start,
            attributes,
            Vec::new(),
            status,
        ));
    }

    /// The answer's body ended: the server span goes to the export queue.
    pub fn finish(mut self, status: u16, route: Option<&str>, bytes: u64) {
        if !self.sampled {
            return;
        }
        let (target, host) = self.target.take().unwrap_or_default();
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let mut attributes = vec![
            KeyValue::new("http.request.method", known_method(&self.method)),
            KeyValue::new("url.path", capped(path).to_owned()),
            KeyValue::new("server.address", capped(&host).to_owned()),
            KeyValue::new("http.response.status_code", i64::from(status)),
            KeyValue::new(
                "http.response.body.size",
                i64::try_from(bytes).unwrap_or(i64::MAX),
            ),
        ];
        if !query.is_empty() {
            attributes.push(KeyValue::new("url.query", redacted_query(query)));
        }
        if let Some(route) = route {
            attributes.push(KeyValue::new("tollgate.route", route.to_owned()));
        }
        if let Some(rule) = self.rule.take() {
            attributes.push(KeyValue::new("tollgate.rule", rule));
        }
        // Server spans: only 5xx are errors (the client's 4xx is not the server's fault).
        let status_ = if status >= 500 {
            Status::error("")
        } else {
            Status::Unset
        };
        let name = match route {
            Some(r) => Cow::Owned(format!("{} {r}", span_method(&self.method))),
            None => Cow::Borrowed(span_method(&self.method)),
        };
        let events = std::mem::take(&mut self.events);
        let span = self.span(
            self.span_id,
            self.parent.unwrap_or(SpanId::INVALID),
            self.parent.is_some(),
            SpanKind::Server,
            name,
            self.start,
            attributes,
            events,
            status_,
        );
        self.tracer.send(span);
    }

    #[allow(clippy::too_many_arguments)]
    fn span(
        &self,
        span_id: SpanId,
        parent: SpanId,
        remote_parent: bool,
        kind: SpanKind,
        name: Cow<'static, str>,
        start: SystemTime,
        attributes: Vec<KeyValue>,
        events: Vec<opentelemetry::trace::Event>,
        status: Status,
    ) -> SpanData {
        let mut span_events = SpanEvents::default();
        span_events.events = events;
        SpanData {
            span_context: SpanContext::new(
                self.trace_id,
                span_id,
                self.flags(),
                false,
                TraceState::default(),
            ),
            parent_span_id: parent,
            parent_span_is_remote: remote_parent,
            span_kind: kind,
            name,
            start_time: start,
            end_time: SystemTime::now(),
            attributes,
            dropped_attributes_count: 0,
            events: span_events,
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.tracer.scope.clone(),
        }
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
    match trace.filter(|t| t.sampled) {
        None => fut.await,
        Some(t) => {
            let (out, events) = DECISIONS
                .scope(RefCell::new(Vec::new()), async {
                    let out = fut.await;
                    (out, DECISIONS.with(RefCell::take))
                })
                .await;
            t.events.extend(events);
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
        d.borrow_mut().push(opentelemetry::trace::Event::new(
            "policy.decision",
            SystemTime::now(),
            vec![
                // The route table's names, shared (a reference count each), not copied.
                KeyValue::new("tollgate.policy", policy.clone()),
                KeyValue::new("tollgate.policy.rule", rule.clone()),
                KeyValue::new("tollgate.policy.outcome", outcome),
            ],
            0,
        ));
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
