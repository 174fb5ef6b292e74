//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the `traceparent` field
//! parsed strictly and written back. In: the client's field value. Out: its trace id,
//! parent span id and sampled flag, or `None` for anything malformed (the request is then
//! treated as carrying no parent: a new trace, and the client's `tracestate` ignored, as
//! §3.3 says).

use opentelemetry::trace::{SpanId, TraceFlags, TraceId};

/// `traceparent`.
pub const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
/// `tracestate`.
pub const TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");

/// A parent as the client sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub sampled: bool,
}

/// Parses a `traceparent` value: `version-traceid-parentid-flags`, lowercase hex only.
/// Version `00` must be exactly 55 bytes; a higher version may carry more after a `-`
/// (forward compatibility, §3.2.4); version `ff`, an all-zero trace or span id, or any
/// other deviation is malformed.
pub fn parse(value: &[u8]) -> Option<Parent> {
    if value.len() < 55 {
        return None;
    }
    let version = hex_u8(&value[0..2])?;
    if version == 0xff || (version == 0 && value.len() != 55) {
        return None;
    }
    if value.len() > 55 && value[55] != b'-' {
        return None;
    }
    if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let trace = hex_u128(&value[3..35])?;
    let span = hex_u64(&value[36..52])?;
    let flags = hex_u8(&value[53..55])?;
    if trace == 0 || span == 0 {
        return None;
    }
    Some(Parent {
        trace_id: TraceId::from(trace),
        span_id: SpanId::from(span),
        sampled: flags & 1 == 1,
    })
}

/// The `traceparent` value (version 00) naming `span_id` in `trace_id`.
pub fn format(trace_id: TraceId, span_id: SpanId, flags: TraceFlags) -> http::HeaderValue {
    let mut buf = [0u8; 55];
    const HEX: &[u8; 16] = b"0123456789abcdef";
    buf[0] = b'0';
    buf[1] = b'0';
    buf[2] = b'-';
    for (i, b) in trace_id.to_bytes().iter().enumerate() {
        buf[3 + 2 * i] = HEX[usize::from(b >> 4)];
        buf[4 + 2 * i] = HEX[usize::from(b & 0xf)];
    }
    buf[35] = b'-';
    for (i, b) in span_id.to_bytes().iter().enumerate() {
        buf[36 + 2 * i] = HEX[usize::from(b >> 4)];
        buf[37 + 2 * i] = HEX[usize::from(b & 0xf)];
    }
    buf[52] = b'-';
    let f = flags.to_u8();
    buf[53] = HEX[usize::from(f >> 4)];
    buf[54] = HEX[usize::from(f & 0xf)];
    // Only ASCII hex digits and dashes: always a valid field value.
    http::HeaderValue::from_bytes(&buf).unwrap_or_else(|_| http::HeaderValue::from_static(""))
}

/// What a request's fields say: its parent (exactly one `traceparent` field, valid), and
/// whether its `tracestate` goes on (a valid parent, and the fields' list valid).
pub fn client_fields(headers: &http::HeaderMap) -> (Option<Parent>, bool) {
    let mut fields = headers.get_all(TRACEPARENT).iter();
    let parent = match (fields.next(), fields.next()) {
        (Some(v), None) => parse(v.as_bytes()),
        _ => None,
    };
    let states = headers.get_all(TRACESTATE).iter();
    let keep_state = parent.is_some() && valid_states(states.map(http::HeaderValue::as_bytes));
    (parent, keep_state)
}

/// The `tracestate` of a request that sent it in several fields: one list, the fields
/// joined with commas (§3.3.1.1, RFC 9110 §5.3), worth passing on when that list is
/// ([`valid_state`]). The fields then go on as they came, which means the same list.
pub fn valid_states<'a>(fields: impl Iterator<Item = &'a [u8]>) -> bool {
    let mut joined = [0u8; 512];
    let mut len = 0;
    for (i, f) in fields.enumerate() {
        let sep = usize::from(i > 0);
        let Some(room) = joined.get_mut(len..len + sep + f.len()) else {
            return false;
        };
        if sep == 1 {
            room[0] = b',';
        }
        room[sep..].copy_from_slice(f);
        len += sep + f.len();
    }
    valid_state(&joined[..len])
}

/// A `tracestate` worth passing on (§3.3.1): at most 512 bytes (§3.3.1.5 lets a vendor
/// truncate beyond; we drop it whole instead of cutting entries), at most 32 list members,
/// each `key=value` with the grammar's key (`lcalpha` then `a-z0-9_-*/`, up to 256, or the
/// `tenant@system` form) and value (up to 256 printable characters, no `,` or `=`, not
/// ending in a space), no key twice; empty members (optional white space) are allowed. An
/// invalid `tracestate` is dropped, not passed on.
pub fn valid_state(value: &[u8]) -> bool {
    if value.len() > 512 {
        return false;
    }
    let mut keys: [&[u8]; MAX_MEMBERS] = [&[]; MAX_MEMBERS];
    let mut n = 0;
    for member in value.split(|&b| b == b',') {
        let m = trim_ows(member);
        if m.is_empty() {
            continue;
        }
        let Some(eq) = m.iter().position(|&b| b == b'=') else {
            return false;
        };
        let (key, val) = (&m[..eq], &m[eq + 1..]);
        if n == MAX_MEMBERS || !valid_key(key) || !valid_value(val) || keys[..n].contains(&key) {
            return false;
        }
        keys[n] = key;
        n += 1;
    }
    true
}

/// Most list members a `tracestate` may have (§3.3.1.1).
const MAX_MEMBERS: usize = 32;

/// `s` without the optional white space (spaces, tabs) around it.
fn trim_ows(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&b| b != b' ' && b != b'\t');
    let end = s.iter().rposition(|&b| b != b' ' && b != b'\t');
    match (start, end) {
        (Some(a), Some(b)) => &s[a..=b],
        _ => &[],
    }
}

fn key_char(b: u8) -> bool {
    matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'*' | b'/')
}

/// `simple-key` (`lcalpha` then up to 255 key characters) or `multi-tenant-key`
/// (`tenant-id@system-id`: up to 241 key characters starting with `lcalpha` or a digit, then
/// up to 14 starting with `lcalpha`).
fn valid_key(key: &[u8]) -> bool {
    match key.iter().position(|&b| b == b'@') {
        None => {
            key.len() <= 256
                && key.first().is_some_and(u8::is_ascii_lowercase)
                && key.iter().all(|&b| key_char(b))
        }
        Some(at) => {
            let (tenant, system) = (&key[..at], &key[at + 1..]);
            (1..=241).contains(&tenant.len())
                && tenant
                    .first()
                    .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                && tenant.iter().all(|&b| key_char(b))
                && (1..=14).contains(&system.len())
                && system.first().is_some_and(u8::is_ascii_lowercase)
                && system.iter().all(|&b| key_char(b))
        }
    }
}

/// `value`: 1 to 256 characters of 0x20-0x7E except `,` and `=`, the last not a space.
fn valid_value(value: &[u8]) -> bool {
    (1..=256).contains(&value.len())
        && value
            .iter()
            .all(|&b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
        && value.last() != Some(&b' ')
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

fn hex_u8(s: &[u8]) -> Option<u8> {
    Some(hex_digit(s[0])? << 4 | hex_digit(s[1])?)
}

fn hex_u64(s: &[u8]) -> Option<u64> {
    s.iter()
        .try_fold(0u64, |acc, &b| Some(acc << 4 | u64::from(hex_digit(b)?)))
}

fn hex_u128(s: &[u8]) -> Option<u128> {
    s.iter()
        .try_fold(0u128, |acc, &b| Some(acc << 4 | u128::from(hex_digit(b)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_formats_the_spec_example() {
        let p = parse(GOOD.as_bytes()).unwrap();
        assert!(p.sampled);
        assert_eq!(
            p.trace_id,
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        assert_eq!(p.span_id, SpanId::from_hex("00f067aa0ba902b7").unwrap());
        assert_eq!(format(p.trace_id, p.span_id, TraceFlags::SAMPLED), GOOD);
        let unsampled = parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!unsampled.sampled);
    }

    #[test]
    fn malformed_values_are_absent() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert_eq!(parse(bad.as_bytes()), None, "{bad}");
        }
        // A later version may append fields after a dash.
        assert!(parse(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what").is_some());
    }

    #[test]
    fn tracestate_checks() {
        assert!(valid_state(b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"));
        assert!(valid_state(b""));
        assert!(valid_state(b" , congo=x ,\trojo=y\t,"));
        assert!(valid_state(b"fw529a3039@dt=abc,0tenant@sys-1=v w"));
        assert!(!valid_state(b"congo"));
        assert!(!valid_state(b"=x"));
        assert!(!valid_state(b"congo="));
        assert!(!valid_state("a=\u{e9}".as_bytes()));
        assert!(!valid_state(&[b'a'; 600]));
        // Key grammar.
        for bad in [
            "Congo=x",
            "1congo=x",
            "con go=x",
            "congo!=x",
            "@sys=x",
            "t@=x",
            "t@Sys=x",
            "t@0sys=x",
            "t@abcdefghijklmno=x",
            "a@b@c=x",
        ] {
            assert!(!valid_state(bad.as_bytes()), "{bad}");
        }
        assert!(!valid_state(format!("a{}=x", "b".repeat(256)).as_bytes()));
        assert!(valid_state(format!("a{}=x", "b".repeat(255)).as_bytes()));
        // Value grammar.
        assert!(!valid_state(b"congo=a=b"));
        assert!(!valid_state(b"congo=a\tb"));
        assert!(!valid_state(format!("k={}", "v".repeat(257)).as_bytes()));
        // Unique keys, at most 32 members.
        assert!(!valid_state(b"congo=1,congo=2"));
        let members = |n: usize| {
            (0..n)
                .map(|i| format!("k{i}=v"))
                .collect::<Vec<_>>()
                .join(",")
        };
        assert!(valid_state(members(32).as_bytes()));
        fn fields(f: &[&str]) -> bool {
            valid_states(f.iter().map(|s| s.as_bytes()))
        }
        assert!(fields(&["congo=1", "rojo=2"]));
        assert!(fields(&[]));
        assert!(!fields(&["congo=1", "congo=2"]));
        assert!(!fields(&["congo=1", "Rojo=2"]));
        // 34 members across two fields: more than 32 in the list.
        let half = members(17);
        assert!(!fields(&[&half, &half.replace('k', "j")]));
        // 253 + 1 + 253 + 1 + 3 = 511 bytes joined: within 512; one more field is not.
        let (a, b) = (
            format!("a={}", "v".repeat(250)),
            format!("b={}", "v".repeat(250)),
        );
        assert!(fields(&[&a, &b, "c=1"]));
        assert!(!fields(&[&a, &b, "c=1", "d=1"]));
        assert!(!valid_state(members(33).as_bytes()));
    }
}
