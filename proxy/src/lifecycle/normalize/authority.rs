//! The request's authority. In: a Host value or `:authority` (`Example.COM.:8080`,
//! `[::1]:80`). Out: [`Authority`]: the host lower-cased without its trailing dot, and the
//! port, or [`BadAuthority`].

use std::borrow::Cow;

/// A normalized authority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority<'a> {
    /// Lower case, no trailing dot, no port; IPv6 literals keep their brackets. Empty when the
    /// client sent an empty Host (allowed by RFC 9112 §3.2 for a target without authority).
    pub host: Cow<'a, str>,
    /// The port, when one was given (an empty port, `host:`, is none).
    pub port: Option<u16>,
    /// True when `host[:port]` is, byte for byte, what the client sent: the client's value
    /// can be forwarded as it is.
    pub unchanged: bool,
}

impl Authority<'_> {
    /// `host[:port]`, as it is forwarded upstream (Host, `X-Forwarded-Host`).
    pub fn to_text(&self) -> String {
        match self.port {
            Some(p) => format!("{}:{p}", self.host),
            None => self.host.to_string(),
        }
    }
}

/// Why an authority is refused (400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadAuthority {
    /// The port is not 1 to 5 digits naming a value up to 65535.
    #[error("the port is not a number from 0 to 65535")]
    Port,
    /// A character no host name, IPv4 or bracketed IPv6 literal may contain (userinfo `@`,
    /// white space, a bare IPv6 literal, `%`...).
    #[error("the host has a character no host name may contain")]
    Character,
    /// An empty label (`a..b`, `.a`, `a..`).
    #[error("the host has an empty label")]
    EmptyLabel,
    /// `[` without its `]`, or something other than a port after it.
    #[error("the IPv6 literal is not closed")]
    Bracket,
}

/// Parses and normalizes an authority (see [`Authority`]).
pub fn parse_authority(raw: &[u8]) -> Result<Authority<'_>, BadAuthority> {
    if raw.first() == Some(&b'[') {
        return parse_ipv6(raw);
    }
    // A registered name or IPv4 address, read in one pass (this runs on every request): the
    // port's colon, and what the name holds. Errors keep their order: a second colon, then
    // the port, then the name's characters, then its labels.
    let scan = scan_name(raw);
    let (host, port_text) = match scan.colon {
        Some(i) => (&raw[..i], Some(&raw[i + 1..])),
        None => (raw, None),
    };
    if port_text.is_some_and(|p| p.contains(&b':')) {
        // A second colon: a bare IPv6 literal or garbage, never a host and a port.
        return Err(BadAuthority::Character);
    }
    let port = parse_port_text(port_text)?;
    // An empty host (allowed) scans as neither bad nor with an empty label.
    if scan.bad {
        return Err(BadAuthority::Character);
    }
    if scan.empty_label {
        return Err(BadAuthority::EmptyLabel);
    }
    let (name, dot) = match host.strip_suffix(b".") {
        Some(n) => (n, true),
        None => (host, false),
    };
    normal(name, scan.upper, dot, port, port_text)
}

/// A bracketed IPv6 literal and its port.
fn parse_ipv6(raw: &[u8]) -> Result<Authority<'_>, BadAuthority> {
    let end = raw
        .iter()
        .position(|&c| c == b']')
        .ok_or(BadAuthority::Bracket)?;
    let (host, port_text) = match &raw[end + 1..] {
        [] => (raw, None),
        [b':', port @ ..] => (&raw[..=end], Some(port)),
        _ => return Err(BadAuthority::Bracket),
    };
    let port = parse_port_text(port_text)?;
    check_ipv6(host)?;
    let upper = host.iter().any(u8::is_ascii_uppercase);
    normal(host, upper, false, port, port_text)
}

/// The authority of a checked host: lower-cased when it has upper case.
fn normal<'a>(
    host: &'a [u8],
    upper: bool,
    dot: bool,
    port: Option<u16>,
    port_text: Option<&[u8]>,
) -> Result<Authority<'a>, BadAuthority> {
    // Checked by the caller: every byte is ASCII.
    let text = std::str::from_utf8(host).map_err(|_| BadAuthority::Character)?;
    let host = if upper {
        Cow::Owned(text.to_ascii_lowercase())
    } else {
        Cow::Borrowed(text)
    };
    Ok(Authority {
        host,
        port,
        unchanged: !upper && !dot && canonical_port(port_text),
    })
}

/// What one pass over a registered name (and what follows it) found.
struct NameScan {
    /// Where the first `:` is.
    colon: Option<usize>,
    /// A byte before it that no name may hold.
    bad: bool,
    /// An upper-case letter before it.
    upper: bool,
    /// An empty label before it (`.a`, `a..b`, `.`), a single trailing dot aside.
    empty_label: bool,
}

// The classes of [`CLASS`], and the flag a dot after a dot sets.
const BAD: u8 = 1;
const UPPER: u8 = 2;
const DOT: u8 = 4;
const EMPTY: u8 = DOT << 3;

fn scan_name(raw: &[u8]) -> NameScan {
    let colon = raw.iter().position(|&c| c == b':');
    let name = colon.map_or(raw, |i| &raw[..i]);
    // One table load a byte, its classes gathered in `seen`. A leading dot ends an empty
    // label, as a dot after a dot does.
    let (mut seen, mut prev) = (0u8, DOT);
    for &c in name {
        let class = CLASS[usize::from(c)];
        seen |= class | ((class & prev) << 3);
        prev = class;
    }
    NameScan {
        colon,
        bad: seen & BAD != 0,
        upper: seen & UPPER != 0,
        empty_label: seen & EMPTY != 0,
    }
}

/// The port after the colon: none when there is no colon or nothing after it.
fn parse_port_text(text: Option<&[u8]>) -> Result<Option<u16>, BadAuthority> {
    match text {
        None | Some(b"") => Ok(None),
        Some(p) => parse_port(p).map(Some),
    }
}

/// A port is written back without leading zeros (`:080` becomes `:80`) and `host:` without
/// its colon.
fn canonical_port(text: Option<&[u8]>) -> bool {
    match text {
        None => true,
        Some(p) => !p.is_empty() && (p.len() == 1 || p[0] != b'0'),
    }
}

fn parse_port(p: &[u8]) -> Result<u16, BadAuthority> {
    if p.len() > 5 || !p.iter().all(u8::is_ascii_digit) {
        return Err(BadAuthority::Port);
    }
    p.iter()
        .try_fold(0u32, |n, d| Some(n * 10 + u32::from(d - b'0')))
        .and_then(|n| u16::try_from(n).ok())
        .ok_or(BadAuthority::Port)
}

/// Each byte's classes: [`BAD`] when [`is_name_byte`] refuses it, [`UPPER`], [`DOT`].
static CLASS: [u8; 256] = {
    let mut t = [0; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        t[i] = if !is_name_byte(c) {
            BAD
        } else if c.is_ascii_uppercase() {
            UPPER
        } else if c == b'.' {
            DOT
        } else {
            0
        };
        i += 1;
    }
    t
};

/// RFC 3986 unreserved and sub-delims, less `.`'s special role: the bytes a reg-name may hold
/// unescaped.
const fn is_name_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(
            c,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
        )
}

/// `[` IPv6 (hex digits, `:` and a dotted IPv4 tail) `]`; no zone identifier.
fn check_ipv6(host: &[u8]) -> Result<(), BadAuthority> {
    let inner = &host[1..host.len() - 1];
    if inner.is_empty()
        || !inner
            .iter()
            .all(|&c| c.is_ascii_hexdigit() || c == b':' || c == b'.')
    {
        return Err(BadAuthority::Character);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &str) -> (String, Option<u16>, bool) {
        let a = parse_authority(raw.as_bytes()).unwrap_or_else(|e| panic!("{raw}: {e}"));
        (a.host.into_owned(), a.port, a.unchanged)
    }

    #[test]
    fn normalizes_case_trailing_dot_and_port() {
        assert_eq!(ok("example.com"), ("example.com".into(), None, true));
        assert_eq!(ok("Internal.TEST."), ("internal.test".into(), None, false));
        assert_eq!(
            ok("internal.test.:20080"),
            ("internal.test".into(), Some(20080), false)
        );
        assert_eq!(ok("a.b:80"), ("a.b".into(), Some(80), true));
        assert_eq!(ok("a.b:"), ("a.b".into(), None, false));
        assert_eq!(ok("127.0.0.1:8080"), ("127.0.0.1".into(), Some(8080), true));
        assert_eq!(ok("[::1]:80"), ("[::1]".into(), Some(80), true));
        assert_eq!(ok("[FE80::1]"), ("[fe80::1]".into(), None, false));
        assert_eq!(ok(""), ("".into(), None, true));
        assert_eq!(ok("a:00080"), ("a".into(), Some(80), false));
        assert_eq!(ok("a:0"), ("a".into(), Some(0), true));
    }

    #[test]
    fn refuses_what_is_ambiguous() {
        for (raw, why) in [
            ("internal.test:abc", BadAuthority::Port),
            ("a:65536", BadAuthority::Port),
            ("a:123456", BadAuthority::Port),
            ("a:+80", BadAuthority::Port),
            ("a: 80", BadAuthority::Port),
            ("a:8o", BadAuthority::Port),
            ("::1", BadAuthority::Character),
            ("a:1:2", BadAuthority::Character),
            ("user@internal.test", BadAuthority::Character),
            ("a b", BadAuthority::Character),
            ("a%2eb", BadAuthority::Character),
            ("a/b", BadAuthority::Character),
            ("a..", BadAuthority::EmptyLabel),
            ("a..b", BadAuthority::EmptyLabel),
            (".a", BadAuthority::EmptyLabel),
            (".", BadAuthority::EmptyLabel),
            ("[::1", BadAuthority::Bracket),
            ("[::1]x", BadAuthority::Bracket),
            ("[::1]:x", BadAuthority::Port),
            ("[]", BadAuthority::Character),
            ("[::1%25eth0]", BadAuthority::Character),
            ("é.test", BadAuthority::Character),
        ] {
            assert_eq!(parse_authority(raw.as_bytes()), Err(why), "{raw}");
        }
    }

    /// Found by the `authority` fuzz target: a port with a leading zero was called
    /// unchanged, so the client's `:00` was forwarded where the normal form says `:0`.
    #[test]
    fn a_port_with_leading_zeros_is_rewritten() {
        let a = parse_authority(b"1-7)0=.0.1:00").unwrap();
        assert!(!a.unchanged);
        assert_eq!(a.to_text(), "1-7)0=.0.1:0");
    }

    #[test]
    fn text_is_host_and_port() {
        let a = parse_authority(b"A.b.:81").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.to_text(), "a.b:81");
        let a = parse_authority(b"[::1]").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.to_text(), "[::1]");
    }
}
