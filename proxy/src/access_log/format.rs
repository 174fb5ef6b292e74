//! How an access log line is written: JSON or logfmt, with the fields chosen.
//!
//! In: an [`AccessRecord`] (borrowed fields), a [`Format`] and the [`Fields`] to write. Out:
//! one line appended to a byte buffer, newline included. No allocation: strings are escaped
//! straight into the buffer, numbers and addresses written through `Display`.

use std::fmt::Display;
use std::io::Write as _;

use super::{AccessRecord, Rfc3339};

/// The line format (`--access-log-format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One JSON object per line.
    #[default]
    Json,
    /// `key=value` pairs (values with spaces, quotes or `=` quoted as JSON strings).
    Logfmt,
}

/// The fields a line may carry, in the order they are written.
pub const FIELD_NAMES: [&str; 17] = [
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
    "grpc_status",
    "client_timeout",
    "retried",
    "shadow_limited",
    "grpc_web",
    "trace_id",
];

/// A set of [`FIELD_NAMES`] (`--access-log-fields`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fields(u32);

impl Default for Fields {
    fn default() -> Self {
        Self::ALL
    }
}

impl Fields {
    /// Every field.
    pub const ALL: Self = Self((1 << FIELD_NAMES.len()) - 1);

    /// A comma-separated list of field names; an unknown name is an error naming it and the
    /// known ones.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut bits = 0u32;
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let Some(i) = FIELD_NAMES.iter().position(|f| *f == name) else {
                return Err(format!(
                    "unknown access log field {name:?} (known: {})",
                    FIELD_NAMES.join(", ")
                ));
            };
            bits |= 1 << i;
        }
        if bits == 0 {
            return Err("no access log field named".to_owned());
        }
        Ok(Self(bits))
    }

    fn has(self, i: usize) -> bool {
        self.0 & (1 << i) != 0
    }
}

/// Appends `r` as one line to `out`.
pub(crate) fn write_line(out: &mut Vec<u8>, r: &AccessRecord<'_>, format: Format, fields: Fields) {
    let mut w = Line {
        out,
        format,
        first: true,
    };
    w.open();
    for (i, name) in FIELD_NAMES.iter().enumerate() {
        if !fields.has(i) {
            continue;
        }
        match i {
            0 => w.time(name, r.time),
            1 => w.string(name, r.method),
            2 => w.string(name, r.host),
            3 => w.string(name, r.path),
            4 => w.number(name, r.status),
            5 => w.number(name, Ms(r.duration_ms)),
            6 => w.opt_string(name, r.route),
            7 => match r.upstream {
                Some(a) => w.shown(name, a),
                None => w.null(name),
            },
            8 => w.number(name, r.bytes),
            9 => w.string(name, r.request_id),
            10 if r.peer.port() == 0 => w.shown(name, r.peer.ip()),
            10 => w.shown(name, r.peer),
            11 => {
                if let Some(s) = r.grpc_status {
                    w.number(name, s);
                }
            }
            12 => {
                if let Some(c) = r.client_timeout {
                    w.string(name, c);
                }
            }
            13 if !r.retried.is_empty() => w.list(
                name,
                r.retried
                    .iter()
                    .map(|a| Both(a.upstream, a.reason.as_str())),
            ),
            14 if !r.shadow_limited.is_empty() => {
                w.list(name, r.shadow_limited.iter().map(|s| Str(s)));
            }
            15 if r.grpc_web => w.number(name, true),
            16 => {
                if let Some(t) = r.trace_id {
                    w.shown(name, t);
                }
            }
            _ => {}
        }
    }
    w.close();
}

/// A duration in milliseconds, as serde_json would write the float.
struct Ms(f64);

impl Display for Ms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_finite() {
            Display::fmt(&self.0, f)
        } else {
            f.write_str("0")
        }
    }
}

/// `upstream reason` of a retried attempt.
struct Both<A, B>(A, B);

impl<A: Display, B: Display> Display for Both<A, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.0, self.1)
    }
}

/// A string that may need escaping, in a list.
struct Str<'a>(&'a str);

impl Display for Str<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

struct Line<'o> {
    out: &'o mut Vec<u8>,
    format: Format,
    first: bool,
}

impl Line<'_> {
    fn open(&mut self) {
        if self.format == Format::Json {
            self.out.push(b'{');
        }
    }

    fn close(&mut self) {
        if self.format == Format::Json {
            self.out.push(b'}');
        }
        self.out.push(b'\n');
    }

    fn key(&mut self, name: &str) {
        match (self.format, self.first) {
            (Format::Json, true) => {}
            (Format::Json, false) => self.out.push(b','),
            (Format::Logfmt, true) => {}
            (Format::Logfmt, false) => self.out.push(b' '),
        }
        self.first = false;
        match self.format {
            Format::Json => {
                self.out.push(b'"');
                self.out.extend_from_slice(name.as_bytes());
                self.out.extend_from_slice(b"\":");
            }
            Format::Logfmt => {
                self.out.extend_from_slice(name.as_bytes());
                self.out.push(b'=');
            }
        }
    }

    /// A JSON string, escaped (serde_json's rules).
    fn quoted(&mut self, s: &str) {
        let _ = serde_json::to_writer(&mut *self.out, s);
    }

    fn string(&mut self, name: &str, s: &str) {
        self.key(name);
        if self.format == Format::Logfmt && !s.is_empty() && s.bytes().all(plain) {
            self.out.extend_from_slice(s.as_bytes());
        } else {
            self.quoted(s);
        }
    }

    fn opt_string(&mut self, name: &str, s: Option<&str>) {
        match s {
            Some(s) => self.string(name, s),
            None => self.null(name),
        }
    }

    /// A value whose `Display` needs no escaping (numbers, addresses).
    fn number(&mut self, name: &str, v: impl Display) {
        self.key(name);
        let _ = write!(self.out, "{v}");
    }

    fn shown(&mut self, name: &str, v: impl Display) {
        self.key(name);
        match self.format {
            Format::Json => {
                let _ = write!(self.out, "\"{v}\"");
            }
            Format::Logfmt => {
                let _ = write!(self.out, "{v}");
            }
        }
    }

    fn time(&mut self, name: &str, t: Rfc3339) {
        let b = t.bytes();
        self.shown(
            name,
            std::str::from_utf8(&b).unwrap_or("1970-01-01T00:00:00.000Z"),
        );
    }

    fn null(&mut self, name: &str) {
        // logfmt has no null: the key is left out.
        if self.format == Format::Json {
            self.key(name);
            self.out.extend_from_slice(b"null");
        }
    }

    /// JSON: an array of strings; logfmt: one quoted value, the items joined with `,`.
    fn list<T: Display>(&mut self, name: &str, items: impl Iterator<Item = T>) {
        self.key(name);
        let json = self.format == Format::Json;
        if json {
            self.out.push(b'[');
        }
        let start = self.out.len();
        let mut scratch = String::new();
        for (n, item) in items.enumerate() {
            scratch.clear();
            let _ = std::fmt::Write::write_fmt(&mut scratch, format_args!("{item}"));
            if json {
                if n > 0 {
                    self.out.push(b',');
                }
                self.quoted(&scratch);
            } else {
                if n > 0 {
                    scratch.insert(0, ',');
                }
                self.out.extend_from_slice(scratch.as_bytes());
            }
        }
        if json {
            self.out.push(b']');
        } else {
            // Quote what was written as one JSON string.
            let joined = String::from_utf8_lossy(&self.out[start..]).into_owned();
            self.out.truncate(start);
            self.quoted(&joined);
        }
    }
}

/// A byte logfmt writes unquoted.
fn plain(b: u8) -> bool {
    b.is_ascii_graphic() && b != b'"' && b != b'=' && b != b'\\'
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::lifecycle::call::Retried;
    use crate::lifecycle::retry::RetryReason;

    fn record() -> AccessRecord<'static> {
        AccessRecord {
            time: Rfc3339(SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_486_109_123)),
            method: "GET",
            host: "shop.example",
            path: "/a b\"c",
            status: 200,
            duration_ms: 1.5,
            route: Some("default/shop"),
            upstream: Some("10.0.0.1:80".parse().unwrap()),
            bytes: 10,
            request_id: "r1",
            peer: "127.0.0.1:4000".parse().unwrap(),
            grpc_status: None,
            grpc_web: false,
            client_timeout: None,
            retried: &[],
            shadow_limited: &[],
            trace_id: None,
        }
    }

    fn line(r: &AccessRecord<'_>, format: Format, fields: Fields) -> String {
        let mut out = Vec::new();
        write_line(&mut out, r, format, fields);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn json_lines_parse_and_escape() {
        let retried = [Retried {
            upstream: "10.0.0.2:80".parse().unwrap(),
            reason: RetryReason::Reset,
        }];
        let shadow: [Arc<str>; 1] = [Arc::from("shop/tokens/\"per-user\"")];
        let mut r = record();
        r.retried = &retried;
        r.shadow_limited = &shadow;
        r.route = None;
        let text = line(&r, Format::Json, Fields::ALL);
        assert!(text.ends_with('\n'));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["time"], "2025-11-30T07:01:49.123Z");
        assert_eq!(v["path"], "/a b\"c");
        assert_eq!(v["duration_ms"], 1.5);
        assert_eq!(v["route"], serde_json::Value::Null);
        assert_eq!(v["retried"][0], "10.0.0.2:80 reset");
        assert_eq!(v["shadow_limited"][0], "shop/tokens/\"per-user\"");
        assert!(v.get("grpc_status").is_none());
    }

    #[test]
    fn logfmt_quotes_only_what_needs_it() {
        let text = line(&record(), Format::Logfmt, Fields::ALL);
        assert_eq!(
            text,
            "time=2025-11-30T07:01:49.123Z method=GET host=shop.example path=\"/a b\\\"c\" \
             status=200 duration_ms=1.5 route=default/shop upstream=10.0.0.1:80 bytes=10 \
             request_id=r1 peer=127.0.0.1:4000\n"
        );
    }

    #[test]
    fn only_the_chosen_fields_are_written() {
        let fields = Fields::parse("status, path,time").unwrap();
        let text = line(&record(), Format::Json, fields);
        assert_eq!(
            text,
            "{\"time\":\"2025-11-30T07:01:49.123Z\",\"path\":\"/a b\\\"c\",\"status\":200}\n"
        );
        assert_eq!(
            Fields::parse("status,authorization").unwrap_err(),
            format!(
                "unknown access log field \"authorization\" (known: {})",
                FIELD_NAMES.join(", ")
            )
        );
        assert!(Fields::parse(" , ").is_err());
    }
}
