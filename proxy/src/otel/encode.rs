//! OTLP protobuf (opentelemetry-proto's `trace/v1`, `common/v1`, `resource/v1` and
//! `collector/trace/v1` messages) written straight from a span's fields into a byte buffer.
//! In: a span's ids, name, times, attributes, events and status. Out: its encoded `Span`
//! message, and around a batch of them the `ExportTraceServiceRequest` that carries it.
//! No intermediate message values: a span is written where it will be sent from, with no
//! allocation per attribute, which is what a sampled request's tracing costs most otherwise.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry::{Array, StringValue, Value};

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// `Span.kind` (`SPAN_KIND_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Internal = 1,
    Server = 2,
    Client = 3,
}

/// `Status.code` and its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code<'a> {
    Unset,
    Error(&'a str),
}

/// `SpanFlags`: the context's remote bit is always given (`CONTEXT_HAS_IS_REMOTE`).
const HAS_IS_REMOTE: u32 = 0x100;
const IS_REMOTE: u32 = 0x200;
/// The W3C trace flags' sampled bit (the flags are the low byte).
const SAMPLED: u32 = 0x01;

/// What identifies a span and places it in its trace.
#[derive(Debug, Clone, Copy)]
pub struct Head<'a> {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// `SpanId::INVALID` for a root.
    pub parent: SpanId,
    pub remote_parent: bool,
    pub kind: Kind,
    /// The name, written as its parts joined with a space (`GET route`).
    pub name: &'a [&'a str],
    pub start: SystemTime,
    pub end: SystemTime,
    pub status: Code<'a>,
}

fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    // 1 byte per started 7 bits, at least one.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn tag(buf: &mut Vec<u8>, field: u32, wire: u8) {
    varint(buf, u64::from(field << 3 | u32::from(wire)));
}

fn bytes_field(buf: &mut Vec<u8>, field: u32, b: &[u8]) {
    tag(buf, field, LEN);
    varint(buf, b.len() as u64);
    buf.extend_from_slice(b);
}

/// A length-delimited field whose content `f` writes: one length byte is reserved and the
/// content moved along in the rare case its length needs more.
fn message(buf: &mut Vec<u8>, field: u32, f: impl FnOnce(&mut Vec<u8>)) {
    tag(buf, field, LEN);
    let at = buf.len();
    buf.push(0);
    f(buf);
    let len = buf.len() - at - 1;
    let n = varint_len(len as u64);
    if n > 1 {
        buf.splice(at + 1..at + 1, std::iter::repeat_n(0, n - 1));
    }
    let mut v = len as u64;
    for i in 0..n {
        let more = if i + 1 < n { 0x80 } else { 0 };
        buf[at + i] = (v as u8 & 0x7f) | more;
        v >>= 7;
    }
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// An attribute's value as `AnyValue`.
pub trait AttrValue {
    fn write(&self, buf: &mut Vec<u8>);
}

impl AttrValue for str {
    fn write(&self, buf: &mut Vec<u8>) {
        bytes_field(buf, 1, self.as_bytes());
    }
}

impl AttrValue for i64 {
    fn write(&self, buf: &mut Vec<u8>) {
        tag(buf, 3, VARINT);
        // int64: two's complement, ten bytes for a negative number.
        varint(buf, *self as u64);
    }
}

impl AttrValue for bool {
    fn write(&self, buf: &mut Vec<u8>) {
        tag(buf, 2, VARINT);
        varint(buf, u64::from(*self));
    }
}

impl AttrValue for f64 {
    fn write(&self, buf: &mut Vec<u8>) {
        tag(buf, 4, FIXED64);
        buf.extend_from_slice(&self.to_bits().to_le_bytes());
    }
}

impl AttrValue for Value {
    fn write(&self, buf: &mut Vec<u8>) {
        match self {
            Value::Bool(b) => b.write(buf),
            Value::I64(i) => i.write(buf),
            Value::F64(f) => f.write(buf),
            Value::String(s) => s.as_str().write(buf),
            Value::Array(a) => message(buf, 5, |b| match a {
                Array::Bool(v) => each(b, v),
                Array::I64(v) => each(b, v),
                Array::F64(v) => each(b, v),
                Array::String(v) => {
                    for s in v {
                        message(b, 1, |b| StringValue::as_str(s).write(b));
                    }
                }
                _ => {}
            }),
            _ => {}
        }
    }
}

fn each<T: AttrValue>(buf: &mut Vec<u8>, values: &[T]) {
    for v in values {
        message(buf, 1, |b| v.write(b));
    }
}

/// Writes `KeyValue`s as the repeated field `field` of the message being written.
pub struct Attrs<'b> {
    buf: &'b mut Vec<u8>,
    field: u32,
}

impl Attrs<'_> {
    pub fn add<V: AttrValue + ?Sized>(&mut self, key: &str, value: &V) -> &mut Self {
        message(self.buf, self.field, |b| {
            bytes_field(b, 1, key.as_bytes());
            message(b, 2, |b| value.write(b));
        });
        self
    }

    pub fn str(&mut self, key: &str, value: &str) -> &mut Self {
        self.add(key, value)
    }

    pub fn int(&mut self, key: &str, value: i64) -> &mut Self {
        self.add(key, &value)
    }
}

/// Writes a span's events (`Span.events`).
pub struct Events<'b> {
    buf: &'b mut Vec<u8>,
}

impl Events<'_> {
    pub fn add(&mut self, name: &str, time: SystemTime, attrs: impl FnOnce(&mut Attrs<'_>)) {
        message(self.buf, 11, |b| {
            tag(b, 1, FIXED64);
            b.extend_from_slice(&nanos(time).to_le_bytes());
            bytes_field(b, 2, name.as_bytes());
            attrs(&mut Attrs { buf: b, field: 3 });
        });
    }
}

/// Appends one `Span` message's content (not its field tag or length) to `buf`.
pub fn span(
    buf: &mut Vec<u8>,
    head: &Head<'_>,
    attrs: impl FnOnce(&mut Attrs<'_>),
    events: impl FnOnce(&mut Events<'_>),
) {
    bytes_field(buf, 1, &head.trace_id.to_bytes());
    bytes_field(buf, 2, &head.span_id.to_bytes());
    if head.parent != SpanId::INVALID {
        bytes_field(buf, 4, &head.parent.to_bytes());
    }
    tag(buf, 5, LEN);
    let sep = head.name.len().saturating_sub(1);
    varint(
        buf,
        (head.name.iter().map(|p| p.len()).sum::<usize>() + sep) as u64,
    );
    for (i, part) in head.name.iter().enumerate() {
        if i > 0 {
            buf.push(b' ');
        }
        buf.extend_from_slice(part.as_bytes());
    }
    tag(buf, 6, VARINT);
    varint(buf, head.kind as u64);
    tag(buf, 7, FIXED64);
    buf.extend_from_slice(&nanos(head.start).to_le_bytes());
    tag(buf, 8, FIXED64);
    buf.extend_from_slice(&nanos(head.end).to_le_bytes());
    attrs(&mut Attrs { buf, field: 9 });
    events(&mut Events { buf });
    message(buf, 15, |b| {
        if let Code::Error(m) = head.status {
            if !m.is_empty() {
                bytes_field(b, 2, m.as_bytes());
            }
            tag(b, 3, VARINT);
            varint(b, 2);
        }
    });
    // Only sampled spans are recorded: the trace flags' sampled bit is always set.
    let mut flags = HAS_IS_REMOTE | SAMPLED;
    if head.remote_parent {
        flags |= IS_REMOTE;
    }
    tag(buf, 16, FIXED32);
    buf.extend_from_slice(&flags.to_le_bytes());
}

/// The part of every export request that precedes its spans: the process's resource
/// (`service.name`) and instrumentation scope, fixed for the process.
#[derive(Debug, Clone)]
pub struct Envelope {
    /// `ResourceSpans.resource`, tag and length included.
    resource: Vec<u8>,
    /// `ScopeSpans.scope`, tag and length included.
    scope: Vec<u8>,
}

/// Field tag of a span within `ScopeSpans` (`spans`, 2, length-delimited).
pub const SPAN_TAG: u8 = 2 << 3 | LEN;

impl Envelope {
    pub fn new(service: &str, version: &str) -> Self {
        let mut resource = Vec::new();
        message(&mut resource, 1, |b| {
            Attrs { buf: b, field: 1 }.str("service.name", service);
        });
        let mut scope = Vec::new();
        message(&mut scope, 1, |b| {
            bytes_field(b, 1, service.as_bytes());
            bytes_field(b, 2, version.as_bytes());
        });
        Self { resource, scope }
    }

    /// The `ExportTraceServiceRequest` carrying `spans` (each written as a `ScopeSpans.spans`
    /// field: [`SPAN_TAG`], length, content), behind a gRPC message prefix when `grpc`.
    pub fn request(&self, spans: &[u8], grpc: bool) -> Vec<u8> {
        let scope_spans = self.scope.len() + spans.len();
        let resource_spans = self.resource.len() + 1 + varint_len(scope_spans as u64) + scope_spans;
        let total = 1 + varint_len(resource_spans as u64) + resource_spans;
        let mut out = Vec::with_capacity(total + 5);
        if grpc {
            out.push(0);
            out.extend_from_slice(&u32::try_from(total).unwrap_or(u32::MAX).to_be_bytes());
        }
        tag(&mut out, 1, LEN);
        varint(&mut out, resource_spans as u64);
        out.extend_from_slice(&self.resource);
        tag(&mut out, 2, LEN);
        varint(&mut out, scope_spans as u64);
        out.extend_from_slice(&self.scope);
        out.extend_from_slice(spans);
        out
    }
}

/// Appends `content` (a `Span` message written by [`span`]) as a `ScopeSpans.spans` field.
pub fn push_span(batch: &mut Vec<u8>, content: &[u8]) {
    batch.push(SPAN_TAG);
    varint(batch, content.len() as u64);
    batch.extend_from_slice(content);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_lengths() {
        for (v, n) in [
            (0u64, 1),
            (1, 1),
            (127, 1),
            (128, 2),
            (16_383, 2),
            (16_384, 3),
            (u64::MAX, 10),
        ] {
            let mut b = Vec::new();
            varint(&mut b, v);
            assert_eq!((v, b.len()), (v, n));
            assert_eq!((v, varint_len(v)), (v, n));
        }
    }

    #[test]
    fn long_messages_get_their_whole_length() {
        let mut b = Vec::new();
        let long = "x".repeat(300);
        message(&mut b, 1, |b| bytes_field(b, 1, long.as_bytes()));
        // tag, two length bytes (303), inner tag, two length bytes (300), content.
        assert_eq!(&b[..6], &[0x0a, 0xaf, 0x02, 0x0a, 0xac, 0x02]);
        assert_eq!(b.len(), 6 + 300);
    }

    /// What this module writes decodes to exactly what the OTLP exporter's own transform
    /// (opentelemetry-proto) makes of the same span.
    #[test]
    fn matches_the_sdk_transform() {
        use opentelemetry::trace::{
            Event, SpanContext, SpanKind, Status, TraceFlags, TraceId, TraceState,
        };
        use opentelemetry::{InstrumentationScope, KeyValue};
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
        use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
        use opentelemetry_sdk::Resource;
        use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
        use prost::Message as _;
        use std::time::Duration;

        let trace_id = TraceId::from(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736_u128);
        let start = UNIX_EPOCH + Duration::from_nanos(1_765_000_000_123_456_789);
        let end = start + Duration::from_micros(250);
        let long = "p".repeat(200);
        let attributes = vec![
            KeyValue::new("http.request.method", "GET"),
            KeyValue::new("url.path", long.clone()),
            KeyValue::new("http.response.status_code", 503_i64),
            KeyValue::new("negative", -7_i64),
            KeyValue::new("flag", true),
            KeyValue::new("ratio", 0.25),
            KeyValue::new(
                "list",
                Value::Array(Array::String(vec!["a".into(), "b".into()])),
            ),
            KeyValue::new("ints", Value::Array(Array::I64(vec![1, -2]))),
        ];
        let event_attrs = vec![
            KeyValue::new("tollgate.policy", "default/p"),
            KeyValue::new("tollgate.policy.outcome", "deny"),
        ];
        for (remote, kind, status, parent) in [
            (
                true,
                SpanKind::Server,
                Status::error(""),
                SpanId::from(7_u64),
            ),
            (
                false,
                SpanKind::Client,
                Status::error("timeout"),
                SpanId::from(9_u64),
            ),
            (false, SpanKind::Internal, Status::Unset, SpanId::INVALID),
        ] {
            let mut events = SpanEvents::default();
            events.events = vec![Event::new("policy.decision", end, event_attrs.clone(), 0)];
            let data = SpanData {
                span_context: SpanContext::new(
                    trace_id,
                    SpanId::from(0x00f0_67aa_0ba9_02b7_u64),
                    TraceFlags::SAMPLED,
                    false,
                    TraceState::default(),
                ),
                parent_span_id: parent,
                parent_span_is_remote: remote,
                span_kind: kind.clone(),
                name: "GET default/route".into(),
                start_time: start,
                end_time: end,
                attributes: attributes.clone(),
                dropped_attributes_count: 0,
                events,
                links: SpanLinks::default(),
                status: status.clone(),
                instrumentation_scope: InstrumentationScope::builder("tollgate-proxy")
                    .with_version("9.9.9")
                    .build(),
            };
            let resource = Resource::builder_empty()
                .with_service_name("tollgate-proxy")
                .build();
            let expected = ExportTraceServiceRequest {
                resource_spans: group_spans_by_resource_and_scope(
                    vec![data],
                    &ResourceAttributesWithSchema::from(&resource),
                ),
            };

            let description = match &status {
                Status::Error { description } => description.to_string(),
                _ => String::new(),
            };
            let head = Head {
                trace_id,
                span_id: SpanId::from(0x00f0_67aa_0ba9_02b7_u64),
                parent,
                remote_parent: remote,
                kind: match kind {
                    SpanKind::Server => Kind::Server,
                    SpanKind::Client => Kind::Client,
                    _ => Kind::Internal,
                },
                name: &["GET", "default/route"],
                start,
                end,
                status: match status {
                    Status::Error { .. } => Code::Error(&description),
                    _ => Code::Unset,
                },
            };
            let mut content = Vec::new();
            span(
                &mut content,
                &head,
                |a| {
                    for kv in &attributes {
                        a.add(kv.key.as_str(), &kv.value);
                    }
                },
                |e| {
                    e.add("policy.decision", end, |a| {
                        a.str("tollgate.policy", "default/p")
                            .str("tollgate.policy.outcome", "deny");
                    })
                },
            );
            let mut batch = Vec::new();
            push_span(&mut batch, &content);
            let envelope = Envelope::new("tollgate-proxy", "9.9.9");
            let got = ExportTraceServiceRequest::decode(&envelope.request(&batch, false)[..])
                .expect("decodes");
            assert_eq!(got, expected, "{kind:?}");

            // Behind gRPC's message prefix: uncompressed, the message's length.
            let framed = envelope.request(&batch, true);
            assert_eq!(framed[0], 0);
            let len = u32::from_be_bytes([framed[1], framed[2], framed[3], framed[4]]);
            assert_eq!(len as usize, framed.len() - 5);
            assert_eq!(
                ExportTraceServiceRequest::decode(&framed[5..]).expect("decodes"),
                expected
            );
        }
    }
}
