//! Spans of a process's own work rather than of a request: the controller's reconciles and
//! their phases. In: a name, attributes, an error if any. Out: the span, when it ends, to the
//! tracer's bounded export queue (the same queue, batching and drop counting as the request
//! spans). A root span starts a new trace, kept or not by the tracer's ratio sampler (no
//! parent); its children share its trace and its decision. An unsampled root is `None`, so
//! the caller does no span work for it.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::SystemTime;

use opentelemetry::trace::{SpanId, SpanKind, TraceId};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{SamplingDecision, ShouldSample};

use super::Tracer;
use super::encode::{Code, Head, Kind};

/// An internal span in progress; sent to the collector by [`Span::end`].
#[derive(Debug)]
pub struct Span {
    tracer: Arc<Tracer>,
    trace_id: TraceId,
    span_id: SpanId,
    parent: SpanId,
    name: Cow<'static, str>,
    start: SystemTime,
    attributes: Vec<KeyValue>,
    /// The failure's description, when the span failed.
    error: Option<Cow<'static, str>>,
}

impl Tracer {
    /// A root span starting a new trace now, or `None` when the sampler drops the trace.
    pub fn root(self: &Arc<Self>, name: &'static str) -> Option<Span> {
        let trace_id = TraceId::from(fastrand::u128(1..));
        let decision = self
            .sampler
            .should_sample(None, trace_id, name, &SpanKind::Internal, &[], &[])
            .decision;
        (decision == SamplingDecision::RecordAndSample)
            .then(|| Span::start(self.clone(), trace_id, SpanId::INVALID, name))
    }
}

impl Span {
    fn start(tracer: Arc<Tracer>, trace_id: TraceId, parent: SpanId, name: &'static str) -> Self {
        Self {
            tracer,
            trace_id,
            span_id: SpanId::from(fastrand::u64(1..)),
            parent,
            name: Cow::Borrowed(name),
            start: SystemTime::now(),
            attributes: Vec::new(),
            error: None,
        }
    }

    /// A child of this span starting now.
    pub fn child(&self, name: &'static str) -> Span {
        Span::start(self.tracer.clone(), self.trace_id, self.span_id, name)
    }

    /// Sets an attribute (a later value of the same key adds a second entry: set each once).
    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        self.attributes.push(KeyValue::new(key, value));
    }

    /// Marks the span failed, with what went wrong.
    pub fn fail(&mut self, description: impl Into<Cow<'static, str>>) {
        self.error = Some(description.into());
    }

    /// The trace's id.
    pub fn trace_id(&self) -> TraceId {
        self.trace_id
    }

    /// The span's id.
    pub fn span_id(&self) -> SpanId {
        self.span_id
    }

    /// Ends the span now and queues it for export (dropped and counted if the queue is full).
    pub fn end(self) {
        let head = Head {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent: self.parent,
            remote_parent: false,
            kind: Kind::Internal,
            name: &[&self.name],
            start: self.start,
            end: SystemTime::now(),
            status: self.error.as_deref().map_or(Code::Unset, Code::Error),
        };
        self.tracer.record(
            &head,
            |attrs| {
                for kv in &self.attributes {
                    attrs.add(kv.key.as_str(), &kv.value);
                }
            },
            |_| {},
        );
    }
}
