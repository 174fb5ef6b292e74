//! Header hygiene between client and upstream. In: the headers of a request or response as
//! received. Out: the same headers with hop-by-hop fields removed (RFC 9110 §7.6.1), a
//! request id chosen, and the `X-Forwarded-*` fields and request id to send upstream in place
//! of the client's own ([`Added`]).
//!
//! Hop-by-hop fields describe one connection, so they never cross the proxy in either
//! direction; the one exception is `Upgrade` (with `Connection: upgrade`) on an upgrade
//! request and its 101 answer, which the proxy forwards and then splices.

use http::header::{
    CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HOST, HeaderName, ORIGIN, TE, TRANSFER_ENCODING,
    UPGRADE,
};
use std::borrow::Cow;

use http::{HeaderMap, HeaderValue};

use tollgate_h1::field_name;
pub(crate) use tollgate_h1::{header_tokens, is_known_token};

/// `x-request-id`.
pub(crate) static X_REQUEST_ID: HeaderName = field_name::X_REQUEST_ID;
pub(crate) static X_FORWARDED_FOR: HeaderName = field_name::X_FORWARDED_FOR;
static TRACEPARENT: HeaderName = crate::otel::w3c::TRACEPARENT;
static TRACESTATE: HeaderName = crate::otel::w3c::TRACESTATE;
static X_FORWARDED_PROTO: HeaderName = field_name::X_FORWARDED_PROTO;
static X_FORWARDED_HOST: HeaderName = field_name::X_FORWARDED_HOST;
static KEEP_ALIVE: HeaderName = field_name::KEEP_ALIVE;
static PROXY_CONNECTION: HeaderName = field_name::PROXY_CONNECTION;

/// Longest client-supplied request id passed through.
const MAX_REQUEST_ID_LEN: usize = 128;

/// The fields of a client's header block the lifecycle reads before routing, found in one
/// pass over the block (which also sizes it) instead of one hashed lookup each.
#[derive(Debug, Default)]
pub(crate) struct Seen<'h> {
    /// Approximate size as HTTP/1 would send it (`name: value\r\n`).
    pub bytes: usize,
    /// First `Host`.
    pub host: Option<&'h HeaderValue>,
    /// First `X-Request-Id`.
    pub request_id: Option<&'h HeaderValue>,
    /// First `Content-Length`.
    pub content_length: Option<&'h HeaderValue>,
    /// First `Origin`.
    pub origin: Option<&'h HeaderValue>,
    /// First `Content-Type` (a gRPC request is answered the gRPC way: module `grpc`).
    pub content_type: Option<&'h HeaderValue>,
    /// How many `Host` fields (more than one is refused).
    pub hosts: u8,
    /// The last `X-Forwarded-For` field, and how many there are (saturating): read where a
    /// ClientPolicy trusts its entries.
    pub xff_last: Option<&'h HeaderValue>,
    pub xff_lines: u8,
    upgrade: bool,
    connection: bool,
    /// Some hop-by-hop field other than `Connection` and `Upgrade` (`Keep-Alive`, `TE`,
    /// `Transfer-Encoding`, `Proxy-Connection`).
    hop: bool,
    /// Some field name has an `_` (many backends read `X_User` as `X-User`).
    underscore: bool,
    /// A `traceparent` or `tracestate` field (W3C Trace Context; module `otel`).
    pub trace_fields: bool,
}

impl<'h> Seen<'h> {
    /// One pass over `headers`.
    pub fn scan(headers: &'h HeaderMap) -> Self {
        let mut s = Self::default();
        for (name, value) in headers {
            let n = name.as_str().as_bytes();
            s.bytes += n.len() + value.len() + 4;
            s.underscore |= n.contains(&b'_');
            // The name's length picks the one or two names it can be, then `HeaderName`
            // comparisons, not a `match` on the name's text: a standard name compares as one
            // byte, where the text match called `bcmp` for every arm of the same length.
            match name.as_str().len() {
                2 => s.hop |= *name == TE,
                4 if *name == HOST => {
                    s.host = s.host.or(Some(value));
                    s.hosts = s.hosts.saturating_add(1);
                }
                6 if *name == ORIGIN => s.origin = s.origin.or(Some(value)),
                7 => s.upgrade |= *name == UPGRADE,
                10 if *name == CONNECTION => s.connection = true,
                10 if *name == TRACESTATE => s.trace_fields = true,
                10 => s.hop |= *name == KEEP_ALIVE,
                11 => s.trace_fields |= *name == TRACEPARENT,
                12 if *name == X_REQUEST_ID => s.request_id = s.request_id.or(Some(value)),
                12 if *name == CONTENT_TYPE => s.content_type = s.content_type.or(Some(value)),
                14 if *name == CONTENT_LENGTH => {
                    s.content_length = s.content_length.or(Some(value));
                }
                15 if *name == X_FORWARDED_FOR => {
                    s.xff_last = Some(value);
                    s.xff_lines = s.xff_lines.saturating_add(1);
                }
                16 => s.hop |= *name == PROXY_CONNECTION,
                17 => s.hop |= *name == TRANSFER_ENCODING,
                _ => {}
            }
        }
        s
    }

    /// True when `Connection` lists `upgrade` and an `Upgrade` header is present.
    pub fn is_upgrade(&self, headers: &HeaderMap) -> bool {
        self.upgrade
            && self.connection
            && connection_tokens(headers).any(|t| t.eq_ignore_ascii_case("upgrade"))
    }

    /// True when [`strip_client`] has work to do: the client sent hop-by-hop fields or field
    /// names with `_` (most requests send neither).
    pub fn needs_strip(&self) -> bool {
        self.connection || self.upgrade || self.hop || self.underscore
    }

    /// The client's `X-Request-Id` when it is sane (1..=128 visible ASCII chars from a safe
    /// set), otherwise a fresh 128-bit hex id.
    pub fn request_id(&self) -> HeaderValue {
        match self.request_id {
            Some(v) if is_sane_id(v.as_bytes()) => v.clone(),
            _ => generate_request_id(),
        }
    }
}

fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    header_tokens(headers, CONNECTION)
}

/// Which hop-by-hop and forwarding fields a header block carries, found in one pass over its
/// names, so the edits that follow touch the map (and hash a name) only for fields that are
/// there: most requests carry none of them.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Present {
    connection: bool,
    /// Some Connection value is more than one known token (`keep-alive`, `close`,
    /// `upgrade`...), so it may name fields to remove.
    connection_names: bool,
    keep_alive: bool,
    proxy_connection: bool,
    transfer_encoding: bool,
    te: bool,
    upgrade: bool,
    xff: bool,
    xfp: bool,
    xfh: bool,
    request_id: bool,
    /// `Host`.
    pub host: bool,
}

impl Present {
    /// One pass over the names of `headers`.
    pub fn scan(headers: &HeaderMap) -> Self {
        let mut p = Self::default();
        for (name, value) in headers {
            // The name's length first: most fields (`server`, `content-type`, `accept`...)
            // have a length none of these has, and leave after one comparison instead of
            // eight (callgrind: the scan of a five-field answer went from ~470 instructions to
            // ~300).
            // Then `HeaderName` comparisons, cheaper than matching the text.
            match name.as_str().len() {
                2 => p.te |= *name == TE,
                4 => p.host |= *name == HOST,
                7 => p.upgrade |= *name == UPGRADE,
                10 if *name == CONNECTION => {
                    p.connection = true;
                    // The usual value is one known token: no need to parse a list.
                    p.connection_names |= !is_known_token(value.as_bytes());
                }
                10 => p.keep_alive |= *name == KEEP_ALIVE,
                12 => p.request_id |= *name == X_REQUEST_ID,
                15 => p.xff |= *name == X_FORWARDED_FOR,
                16 if *name == PROXY_CONNECTION => p.proxy_connection = true,
                16 => p.xfh |= *name == X_FORWARDED_HOST,
                17 if *name == TRANSFER_ENCODING => p.transfer_encoding = true,
                17 => p.xfp |= *name == X_FORWARDED_PROTO,
                _ => {}
            }
        }
        p
    }
}

/// Client hygiene on arrival, before routing, policies and filters: hop-by-hop fields go
/// (with every field `Connection` names), so what the gateway sets afterwards (identity
/// headers of a policy, filter edits) can never be named away by the client; and fields
/// whose name has an `_` go, so no backend that folds `_` into `-` (CGI, WSGI, Rack, PHP)
/// reads `X_User` as the gateway's `X-User`.
pub(crate) fn strip_client(headers: &mut HeaderMap, upgrade: bool) {
    strip_hop_by_hop(headers, upgrade);
    if headers.keys().any(|n| n.as_str().contains('_')) {
        let names: Vec<HeaderName> = headers
            .keys()
            .filter(|n| n.as_str().contains('_'))
            .cloned()
            .collect();
        for n in names {
            headers.remove(&n);
        }
    }
}

/// Removes hop-by-hop headers. With `upgrade`, keeps `Upgrade` and sets `Connection: upgrade`.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let mut present = Present::scan(headers);
    strip_present(headers, &mut present, upgrade);
}

/// [`strip_hop_by_hop`] after the scan; `p` follows the edits.
pub(crate) fn strip_present(headers: &mut HeaderMap, p: &mut Present, upgrade: bool) {
    if p.connection_names {
        // Fields the Connection header names; the usual tokens (keep-alive, close, upgrade)
        // need no name of their own, so this list is almost always empty (no allocation).
        let named: Vec<HeaderName> = connection_tokens(headers)
            .filter(|t| !is_known_token(t.as_bytes()))
            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
            .collect();
        // (A token naming a field the proxy sets, X-Request-Id or X-Forwarded-*, removes the
        // client's; the proxy's own is added after, `forwarded`.)
        for name in named {
            p.host &= name != HOST;
            headers.remove(&name);
        }
    }
    if p.connection && !upgrade {
        headers.remove(CONNECTION);
    }
    if p.keep_alive {
        headers.remove(&KEEP_ALIVE);
    }
    if p.proxy_connection {
        headers.remove(&PROXY_CONNECTION);
    }
    if p.transfer_encoding {
        headers.remove(TRANSFER_ENCODING);
    }
    if p.te {
        let te_trailers = headers.get_all(TE).iter().any(|v| {
            v.to_str().is_ok_and(|s| {
                s.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
            })
        });
        if te_trailers {
            headers.insert(TE, HeaderValue::from_static("trailers"));
        } else {
            headers.remove(TE);
        }
    }
    if upgrade {
        // Replaces every Connection line.
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    } else if p.upgrade {
        headers.remove(UPGRADE);
    }
}

/// The peer address as an `X-Forwarded-For` value (formatted once per connection; its text
/// is also `source.address` for policy expressions).
pub(crate) fn peer_value(peer: std::net::IpAddr) -> HeaderValue {
    HeaderValue::from_str(&peer.to_string()).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The fields the proxy adds to an upstream request: `X-Forwarded-For`, `-Proto`, `-Host`,
/// `X-Request-Id` and, traced, an attempt's `traceparent`, kept out of the request's header
/// map. Our HTTP/1 exchange writes them
/// after the map's fields (module `h1`); the other ways upstream (hyper's client for bodies,
/// h2c, mirrors) insert them first ([`Added::insert_into`]). A hashed insert into the map
/// cost ~255 instructions a field (callgrind), a sixth of the proxy's own work per request.
#[derive(Debug, Default, Clone)]
pub(crate) struct Added<'a> {
    xff: Option<Cow<'a, HeaderValue>>,
    proto: Option<HeaderValue>,
    host: Option<&'a HeaderValue>,
    request_id: Option<&'a HeaderValue>,
    traceparent: Option<HeaderValue>,
}

impl<'a> Added<'a> {
    /// These fields and an upstream attempt's `traceparent` (module `otel`).
    pub fn with_traceparent(&self, value: HeaderValue) -> Added<'a> {
        Added {
            traceparent: Some(value),
            ..self.clone()
        }
    }

    /// The fields, in the order they are sent.
    pub fn fields(&self) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
        [
            (&X_FORWARDED_FOR, self.xff.as_deref()),
            (&X_FORWARDED_PROTO, self.proto.as_ref()),
            (&X_FORWARDED_HOST, self.host),
            (&X_REQUEST_ID, self.request_id),
            (&TRACEPARENT, self.traceparent.as_ref()),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
    }

    /// Puts the fields into `headers`, replacing any of the same name.
    pub fn insert_into(&self, headers: &mut HeaderMap) {
        for (name, value) in self.fields() {
            headers.insert(name.clone(), value.clone());
        }
    }
}

/// The forwarding fields of an upstream request: the peer appended to `X-Forwarded-For`,
/// `X-Forwarded-Proto`, `X-Forwarded-Host` and `X-Request-Id`. `p` is the scan of `headers`
/// taken before any edit; the client's own fields of these names leave `headers` (their
/// values are replaced, `X-Forwarded-For`'s carried into the new one). Where the port
/// trusts `X-Forwarded-For` entries (`trusted`), only the trusted part goes on: the client,
/// the proxies after it, the peer.
pub(crate) fn forwarded<'a>(
    headers: &mut HeaderMap,
    p: &Present,
    peer: &'a HeaderValue,
    trusted: Option<&crate::lifecycle::client::Forwarded>,
    proto: &'static str,
    original_host: &'a HeaderValue,
    request_id: &'a HeaderValue,
) -> Added<'a> {
    let xff = if let Some(t) = trusted {
        if p.xff {
            headers.remove(&X_FORWARDED_FOR);
        }
        if t.sent.is_empty() {
            Some(Cow::Borrowed(peer))
        } else {
            let peer = peer.to_str().unwrap_or("");
            let mut xff = String::with_capacity(t.sent.len() + peer.len());
            xff.push_str(&t.sent);
            xff.push_str(peer);
            HeaderValue::from_str(&xff).ok().map(Cow::Owned)
        }
    } else if p.xff {
        // Every prior hop, across repeated header lines, then the peer.
        let mut xff = String::new();
        for prev in headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
        {
            xff.push_str(prev);
            xff.push_str(", ");
        }
        xff.push_str(peer.to_str().unwrap_or(""));
        headers.remove(&X_FORWARDED_FOR);
        HeaderValue::from_str(&xff).ok().map(Cow::Owned)
    } else {
        Some(Cow::Borrowed(peer))
    };
    // Most requests carry none of these: no hashed lookup for them then.
    if p.xfp {
        headers.remove(&X_FORWARDED_PROTO);
    }
    if p.xfh {
        headers.remove(&X_FORWARDED_HOST);
    }
    if p.request_id {
        headers.remove(&X_REQUEST_ID);
    }
    Added {
        xff,
        proto: Some(HeaderValue::from_static(proto)),
        host: Some(original_host),
        request_id: Some(request_id),
        traceparent: None,
    }
}

/// The client's `X-Request-Id` when it is sane, otherwise a fresh one (see [`Seen::request_id`]).
#[cfg(test)]
fn request_id(headers: &HeaderMap) -> HeaderValue {
    Seen::scan(headers).request_id()
}

fn is_sane_id(b: &[u8]) -> bool {
    !b.is_empty()
        && b.len() <= MAX_REQUEST_ID_LEN
        && b.iter().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b':' | b'/' | b'+' | b'=')
        })
}

/// A fresh 128-bit random id as 32 lower-case hex digits.
pub(crate) fn generate_request_id() -> HeaderValue {
    // Hex-encoded by hand into a stack buffer: `format!` here cost a heap string and the
    // formatting machinery on every request without a client id (measured with callgrind).
    // Each half from its own 64-bit word, last digit first: shifting a u128 by a variable
    // amount per digit cost about twice as much.
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 32];
    for half in buf.chunks_exact_mut(16) {
        let mut word = fastrand::u64(..);
        for b in half.iter_mut().rev() {
            *b = HEX[(word & 0xf) as usize];
            word >>= 4;
        }
    }
    HeaderValue::from_bytes(&buf).unwrap_or_else(|_| HeaderValue::from_static("0"))
}

/// Which request trailer fields a route that forwards trailers sends upstream. None the head
/// carries (so no trailer adds to or overrides a field the client sent or the gateway or a
/// policy set, such as an identity header), none whose name has an `_`, no hop-by-hop or
/// forwarding field, and none RFC 9110 §6.5.1 keeps out of trailers (framing, routing,
/// request modifiers, authentication, how to process the content).
#[derive(Debug)]
pub(crate) struct TrailerFilter {
    /// The head's field names (hashed in [`TrailerFilter::apply`], when trailers came).
    head: Vec<HeaderName>,
}

/// Fields never sent as trailers, besides `content-*`, `if-*` and `x-forwarded-*`.
const NOT_TRAILERS: &[&str] = &[
    "authorization",
    "cache-control",
    "connection",
    "cookie",
    "expect",
    "forwarded",
    "host",
    "keep-alive",
    "max-forwards",
    "pragma",
    "proxy-authorization",
    "proxy-connection",
    "range",
    "te",
    "traceparent",
    "tracestate",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "x-real-ip",
    "x-request-id",
];

impl TrailerFilter {
    /// For a request whose head, as it goes upstream, is `head`.
    pub fn new(head: &HeaderMap) -> Self {
        Self {
            head: head.keys().cloned().collect(),
        }
    }

    /// The fields of `trailers` that may go on; `None` when none may. The head's names are
    /// hashed only now (most requests end without trailers): a client may send thousands of
    /// trailer fields.
    pub fn apply(&self, trailers: HeaderMap) -> Option<HeaderMap> {
        if trailers.is_empty() {
            return None;
        }
        let mut head = HeaderMap::with_capacity(self.head.len());
        for name in &self.head {
            head.insert(name.clone(), ());
        }
        let mut out = HeaderMap::new();
        let mut name: Option<HeaderName> = None;
        for (n, value) in trailers {
            // `into_iter` names a field once, before all its values.
            if n.is_some() {
                name = n;
            }
            if let Some(n) = name.as_ref().filter(|n| allows(n, &head)) {
                out.append(n.clone(), value);
            }
        }
        (!out.is_empty()).then_some(out)
    }
}

/// A trailer field `name` may go on after a head with the field names `head`.
fn allows(name: &HeaderName, head: &HeaderMap<()>) -> bool {
    let s = name.as_str();
    !s.contains('_')
        && !s.starts_with("content-")
        && !s.starts_with("if-")
        && !s.starts_with("x-forwarded-")
        && !NOT_TRAILERS.contains(&s)
        && !head.contains_key(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailer_filter_keeps_only_fields_the_head_and_the_gateway_do_not_own() {
        let mut head = HeaderMap::new();
        head.insert("x-user", HeaderValue::from_static("alice"));
        head.insert(HOST, HeaderValue::from_static("a"));
        let filter = TrailerFilter::new(&head);
        let mut t = HeaderMap::new();
        for (n, v) in [
            ("x-checksum", "1"),
            ("grpc-status", "0"),
            ("x-user", "root"),
            ("x_user", "root"),
            ("authorization", "Bearer x"),
            ("content-length", "9"),
            ("transfer-encoding", "chunked"),
            ("host", "evil"),
            ("x-forwarded-for", "1.2.3.4"),
            ("x-request-id", "forged"),
            ("if-match", "*"),
            ("connection", "close"),
            // The gateway's trace fields: a trailer must not add a second parent.
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("tracestate", "congo=1"),
        ] {
            t.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        t.append("x-checksum", HeaderValue::from_static("2"));
        let kept = filter.apply(t).unwrap();
        let names: Vec<&str> = kept.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["x-checksum", "grpc-status"]);
        assert_eq!(kept.get_all("x-checksum").iter().count(), 2);
        let mut only_owned = HeaderMap::new();
        only_owned.insert("x-user", HeaderValue::from_static("root"));
        assert_eq!(filter.apply(only_owned), None);
    }

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn hop_by_hop_are_the_names_the_codec_classes_so() {
        use tollgate_h1::field_name::{self, Class};
        for text in [
            "te",
            "connection",
            "keep-alive",
            "proxy-connection",
            "transfer-encoding",
            "upgrade",
            "host",
            "content-length",
            "date",
            "trailer",
            "accept",
            "x-forwarded-for",
            "x-custom",
        ] {
            let (name, class) = field_name::parse(text.as_bytes()).unwrap();
            let mut map = HeaderMap::new();
            map.insert(name, HeaderValue::from_static("x"));
            strip_hop_by_hop(&mut map, false);
            assert_eq!(map.is_empty(), class == Class::HopByHop, "{text}");
        }
    }

    #[test]
    fn strips_connection_and_named_headers() {
        let mut h = map(&[
            ("connection", "keep-alive, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "gzip, trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("x-keep", "yes"),
        ]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h["te"], "trailers");
        assert_eq!(h["x-keep"], "yes");
    }

    #[test]
    fn a_single_known_connection_token_removes_only_connection() {
        let mut h = map(&[("connection", "Keep-Alive"), ("x-secret", "1")]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h["x-secret"], "1");
        let mut h = map(&[
            ("connection", "close"),
            ("connection", "x-secret"),
            ("x-secret", "1"),
        ]);
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
    }

    #[test]
    fn known_connection_tokens_match_in_any_case_and_nothing_else() {
        for t in [
            "close",
            "Keep-Alive",
            "UPGRADE",
            "transfer-encoding",
            "Proxy-Connection",
        ] {
            assert!(is_known_token(t.as_bytes()), "{t}");
        }
        for t in ["te", "keep-alive ", "keepalive", "x-secret", "", "closed"] {
            assert!(!is_known_token(t.as_bytes()), "{t}");
        }
    }

    #[test]
    fn scan_finds_each_hop_by_hop_field() {
        let h = map(&[
            ("Connection", "close"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "x"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("upgrade", "h2c"),
            ("x-forwarded-for", "10.0.0.1"),
            ("host", "a"),
        ]);
        let p = Present::scan(&h);
        assert!(p.connection && !p.connection_names);
        assert!(p.keep_alive && p.proxy_connection && p.transfer_encoding);
        assert!(p.te && p.upgrade && p.xff && p.host);
        let p = Present::scan(&map(&[("connection", "x-secret")]));
        assert!(p.connection_names && !p.host && !p.xff);
    }

    #[test]
    fn scan_follows_a_host_removed_by_connection() {
        let mut h = map(&[("host", "a"), ("connection", "host, keep-alive")]);
        let mut p = Present::scan(&h);
        assert!(p.host);
        strip_present(&mut h, &mut p, false);
        assert!(!p.host);
        assert!(h.is_empty(), "{h:?}");
    }

    #[test]
    fn forwarded_for_without_prior_hops_is_the_peer() {
        let mut h = map(&[("x-forwarded-host", "evil")]);
        let p = Present::scan(&h);
        let peer = peer_value("::1".parse().unwrap());
        let (host, id) = (
            HeaderValue::from_static("b"),
            HeaderValue::from_static("id"),
        );
        let added = forwarded(&mut h, &p, &peer, None, "http", &host, &id);
        assert!(h.is_empty(), "the client's own field stays: {h:?}");
        added.insert_into(&mut h);
        assert_eq!(h["x-forwarded-for"], "::1");
        assert_eq!(h.get_all("x-forwarded-host").iter().count(), 1);
        assert_eq!(h["x-forwarded-host"], "b");
        assert_eq!(h["x-request-id"], "id");
    }

    #[test]
    fn one_scan_finds_the_first_of_each_field_and_sizes_the_block() {
        let h = map(&[
            ("host", "a"),
            ("host", "b"),
            ("origin", "https://o"),
            ("content-length", "3"),
            ("x-other", "1"),
        ]);
        let s = Seen::scan(&h);
        assert_eq!(s.host.unwrap(), "a");
        assert_eq!(s.origin.unwrap(), "https://o");
        assert_eq!(s.content_length.unwrap(), "3");
        assert!(s.request_id.is_none());
        assert!(!s.is_upgrade(&h));
        let bytes: usize = h.iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum();
        assert_eq!(s.bytes, bytes);
    }

    #[test]
    fn upgrade_keeps_upgrade_header() {
        let mut h = map(&[("connection", "Upgrade"), ("upgrade", "websocket")]);
        assert!(Seen::scan(&h).is_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "upgrade");
    }

    #[test]
    fn forwarded_for_appends() {
        let mut h = map(&[
            ("x-forwarded-for", "10.0.0.1"),
            ("X-Request-Id", "theirs"),
            ("x-forwarded-host", "evil"),
            ("x-forwarded-for", "10.0.0.2"),
            ("x-forwarded-proto", "gopher"),
            ("accept", "*/*"),
        ]);
        let p = Present::scan(&h);
        let peer = peer_value("127.0.0.1".parse().unwrap());
        let (host, id) = (
            HeaderValue::from_static("a.example"),
            HeaderValue::from_static("ours"),
        );
        let added = forwarded(&mut h, &p, &peer, None, "https", &host, &id);
        assert_eq!(h.len(), 1, "only the client's own fields stay: {h:?}");
        let fields: Vec<(&str, &str)> = added
            .fields()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            fields,
            [
                ("x-forwarded-for", "10.0.0.1, 10.0.0.2, 127.0.0.1"),
                ("x-forwarded-proto", "https"),
                ("x-forwarded-host", "a.example"),
                ("x-request-id", "ours"),
            ]
        );
        added.insert_into(&mut h);
        assert_eq!(h.len(), 5);
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 10.0.0.2, 127.0.0.1");
    }

    #[test]
    fn request_id_passes_sane_and_replaces_insane() {
        let h = map(&[("x-request-id", "abc-123")]);
        assert_eq!(request_id(&h), "abc-123");
        let long = "a".repeat(200);
        let h = map(&[("x-request-id", &long)]);
        let id = request_id(&h);
        assert_eq!(id.len(), 32);
        let h = map(&[("x-request-id", "a b")]);
        assert_eq!(request_id(&h).len(), 32);
    }

    #[test]
    fn generated_ids_are_32_lower_hex_digits_and_differ() {
        let a = generate_request_id();
        let b = generate_request_id();
        assert_eq!(a.len(), 32);
        assert!(
            a.as_bytes()
                .iter()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
        );
        assert_ne!(a, b);
    }
}
