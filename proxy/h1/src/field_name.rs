//! Header field names of HTTP/1 heads. In: a field name as httparse found it (a token: it
//! validates the name's characters). Out: its `HeaderName`.
//!
//! `HeaderName::from_bytes` lower-cases the name byte by byte through a table into a scratch
//! buffer, then matches it against every standard name: ~117 instructions per field
//! (callgrind), nine fields per proxied request. The names most heads carry are looked up
//! here instead by their length, then compared a word at a time ignoring case: ~20. Any other
//! name goes to `from_bytes`, so the result is the same either way.

use http::HeaderName;
use http::header::{
    ACCEPT, ACCEPT_CHARSET, ACCEPT_ENCODING, ACCEPT_LANGUAGE, ACCEPT_RANGES,
    ACCESS_CONTROL_ALLOW_ORIGIN, AGE, ALLOW, AUTHORIZATION, CACHE_CONTROL, CONNECTION,
    CONTENT_ENCODING, CONTENT_LANGUAGE, CONTENT_LENGTH, CONTENT_LOCATION, CONTENT_RANGE,
    CONTENT_TYPE, COOKIE, DATE, ETAG, EXPECT, EXPIRES, HOST, IF_MODIFIED_SINCE, IF_NONE_MATCH,
    InvalidHeaderName, LAST_MODIFIED, LOCATION, ORIGIN, PRAGMA, RANGE, REFERER, SERVER, SET_COOKIE,
    STRICT_TRANSPORT_SECURITY, TE, TRAILER, TRANSFER_ENCODING, UPGRADE, USER_AGENT, VARY, VIA,
};

// The names outside the standard set that the proxy reads or writes (`forward` keeps statics
// of them for lookups and references).
pub const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
pub const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// What the proxy does with a field of this name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Hop-by-hop (RFC 9110 §7.6.1): `Connection`, `Keep-Alive`, `Proxy-Connection`, `TE`,
    /// `Transfer-Encoding`, `Upgrade` (the names `forward::strip_hop_by_hop` removes).
    HopByHop,
    /// Any other.
    EndToEnd,
}

const HOP: Class = Class::HopByHop;
const ANY: Class = Class::EndToEnd;

/// One known name: its lower-case text, the `HeaderName` it parses to, and its class.
type Known = (&'static [u8], HeaderName, Class);

// By length. Lower-case text only, of `a`-`z`, `0`-`9` and `-` (see `eq_lower`).
static LEN2: [Known; 1] = [(b"te", TE, HOP)];
static LEN3: [Known; 2] = [(b"age", AGE, ANY), (b"via", VIA, ANY)];
static LEN4: [Known; 4] = [
    (b"host", HOST, ANY),
    (b"date", DATE, ANY),
    (b"etag", ETAG, ANY),
    (b"vary", VARY, ANY),
];
static LEN5: [Known; 2] = [(b"allow", ALLOW, ANY), (b"range", RANGE, ANY)];
static LEN6: [Known; 6] = [
    (b"accept", ACCEPT, ANY),
    (b"server", SERVER, ANY),
    (b"cookie", COOKIE, ANY),
    (b"origin", ORIGIN, ANY),
    (b"expect", EXPECT, ANY),
    (b"pragma", PRAGMA, ANY),
];
static LEN7: [Known; 4] = [
    (b"upgrade", UPGRADE, HOP),
    (b"expires", EXPIRES, ANY),
    (b"referer", REFERER, ANY),
    (b"trailer", TRAILER, ANY),
];
static LEN8: [Known; 1] = [(b"location", LOCATION, ANY)];
static LEN10: [Known; 4] = [
    (b"connection", CONNECTION, HOP),
    (b"user-agent", USER_AGENT, ANY),
    (b"set-cookie", SET_COOKIE, ANY),
    (b"keep-alive", KEEP_ALIVE, HOP),
];
static LEN12: [Known; 2] = [
    (b"content-type", CONTENT_TYPE, ANY),
    (b"x-request-id", X_REQUEST_ID, ANY),
];
static LEN13: [Known; 6] = [
    (b"cache-control", CACHE_CONTROL, ANY),
    (b"authorization", AUTHORIZATION, ANY),
    (b"last-modified", LAST_MODIFIED, ANY),
    (b"accept-ranges", ACCEPT_RANGES, ANY),
    (b"if-none-match", IF_NONE_MATCH, ANY),
    (b"content-range", CONTENT_RANGE, ANY),
];
static LEN14: [Known; 2] = [
    (b"content-length", CONTENT_LENGTH, ANY),
    (b"accept-charset", ACCEPT_CHARSET, ANY),
];
static LEN15: [Known; 3] = [
    (b"accept-encoding", ACCEPT_ENCODING, ANY),
    (b"accept-language", ACCEPT_LANGUAGE, ANY),
    (b"x-forwarded-for", X_FORWARDED_FOR, ANY),
];
static LEN16: [Known; 5] = [
    (b"content-encoding", CONTENT_ENCODING, ANY),
    (b"content-language", CONTENT_LANGUAGE, ANY),
    (b"content-location", CONTENT_LOCATION, ANY),
    (b"x-forwarded-host", X_FORWARDED_HOST, ANY),
    (b"proxy-connection", PROXY_CONNECTION, HOP),
];
static LEN17: [Known; 3] = [
    (b"transfer-encoding", TRANSFER_ENCODING, HOP),
    (b"if-modified-since", IF_MODIFIED_SINCE, ANY),
    (b"x-forwarded-proto", X_FORWARDED_PROTO, ANY),
];
static LEN25: [Known; 1] = [(b"strict-transport-security", STRICT_TRANSPORT_SECURITY, ANY)];
static LEN27: [Known; 1] = [(
    b"access-control-allow-origin",
    ACCESS_CONTROL_ALLOW_ORIGIN,
    ANY,
)];

/// The `HeaderName` of a field name httparse accepted (a token), and its class. Every
/// hop-by-hop name is in the table, so a name parsed by `from_bytes` is end to end.
pub fn parse(name: &[u8]) -> Result<(HeaderName, Class), InvalidHeaderName> {
    match known(name) {
        Some((_, n, class)) => Ok((n.clone(), *class)),
        None => Ok((HeaderName::from_bytes(name)?, Class::EndToEnd)),
    }
}

fn known(name: &[u8]) -> Option<&'static Known> {
    let candidates: &[Known] = match name.len() {
        2 => &LEN2,
        3 => &LEN3,
        4 => &LEN4,
        5 => &LEN5,
        6 => &LEN6,
        7 => &LEN7,
        8 => &LEN8,
        10 => &LEN10,
        12 => &LEN12,
        13 => &LEN13,
        14 => &LEN14,
        15 => &LEN15,
        16 => &LEN16,
        17 => &LEN17,
        25 => &LEN25,
        27 => &LEN27,
        _ => return None,
    };
    candidates.iter().find(|(text, ..)| eq_lower(name, text))
}

/// Every byte with its 0x20 bit set: upper-case ASCII letters become lower-case.
const CASE: u64 = 0x2020_2020_2020_2020;

/// `name` equals `lower` ignoring ASCII case, for `name` of token characters and `lower` of
/// `a`-`z`, `0`-`9` and `-` of the same length. Setting a byte's 0x20 bit maps only `A`-`Z`
/// onto those characters among token characters (`-` and the digits have it already, and the
/// bytes it would map onto them, 0x0D and 0x10-0x19, are not token characters), so one
/// comparison of a word with the bit set in each byte compares eight characters.
fn eq_lower(name: &[u8], lower: &[u8]) -> bool {
    let n = lower.len();
    if name.len() != n {
        return false;
    }
    if n < 8 {
        return name.iter().zip(lower).all(|(&a, &b)| a | 0x20 == b);
    }
    // Whole words, then the last eight bytes (overlapping the previous word).
    let mut i = 0;
    while i + 8 < n {
        if word(name, i) | CASE != word(lower, i) {
            return false;
        }
        i += 8;
    }
    word(name, n - 8) | CASE == word(lower, n - 8)
}

/// Eight bytes of `s` from `at` (`at + 8 <= s.len()`), as one word.
fn word(s: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&s[at..at + 8]);
    u64::from_le_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_known() -> Vec<&'static Known> {
        [
            &LEN2[..],
            &LEN3,
            &LEN4,
            &LEN5,
            &LEN6,
            &LEN7,
            &LEN8,
            &LEN10,
            &LEN12,
            &LEN13,
            &LEN14,
            &LEN15,
            &LEN16,
            &LEN17,
            &LEN25,
            &LEN27,
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    #[test]
    fn every_known_name_is_its_own_text_in_any_case() {
        for (text, name, class) in all_known() {
            assert_eq!(name.as_str().as_bytes(), *text, "table entry");
            let upper = text.to_ascii_uppercase();
            // Title case, as wrk and nginx write names (`Content-Length`).
            let mut title = text.to_vec();
            let mut start = true;
            for c in &mut title {
                if start {
                    c.make_ascii_uppercase();
                }
                start = *c == b'-';
            }
            for variant in [text.to_vec(), upper, title] {
                let v = String::from_utf8_lossy(&variant);
                assert_eq!(known(&variant).map(|k| &k.1), Some(name), "{v:?}");
                assert_eq!(parse(&variant).ok(), Some((name.clone(), *class)), "{v:?}");
            }
        }
    }

    #[test]
    fn other_names_and_near_misses_parse_as_http_parses_them() {
        let mut cases: Vec<Vec<u8>> = vec![
            b"x-custom".to_vec(),
            b"X-Api-Key".to_vec(),
            b"content-lengtx".to_vec(),
            b"contentxlength".to_vec(),
            b"content_length".to_vec(),
            b"hosts".to_vec(),
            b"hos".to_vec(),
            b"t".to_vec(),
            b"x".repeat(27),
            b"ho\xffst".to_vec(),
            b"ho st".to_vec(),
            b"".to_vec(),
        ];
        // Every known name with one character changed at each position, to one a case
        // change or the 0x20 bit could confuse with it.
        for (text, ..) in all_known() {
            for i in 0..text.len() {
                for c in [b'_', b'^', b'~', b'.', b'!', b'0', b'a', b'Z'] {
                    let mut v = text.to_vec();
                    if !v[i].eq_ignore_ascii_case(&c) {
                        v[i] = c;
                        cases.push(v);
                    }
                }
            }
        }
        for case in cases {
            let ours = parse(&case).map(|(n, _)| n).map_err(|_| ());
            let theirs = HeaderName::from_bytes(&case).map_err(|_| ());
            assert_eq!(ours, theirs, "{:?}", String::from_utf8_lossy(&case));
            if let Ok(n) = &theirs {
                let standard = all_known().iter().any(|(_, k, _)| k == n);
                assert_eq!(known(&case).is_some(), standard, "{n}");
            }
        }
    }
}
