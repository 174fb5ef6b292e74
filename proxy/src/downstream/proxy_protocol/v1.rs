//! The text form (version 1): `PROXY TCP4|TCP6|UNKNOWN src dst sport dport\r\n`, at most
//! [`V1_MAX`] bytes. In: a connection's first bytes, starting with `PROXY ` or a prefix of
//! it. Out: [`Parse`]. The fields are checked in order as they come, the last one possibly
//! cut short, so a line that can no longer become valid is refused before its CRLF.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::{Header, Parse, ProxyProtocolError, V1_MAX, V1Part};

/// The longest IPv4 text form (`255.255.255.255`).
const IPV4_TEXT_MAX: usize = 15;
/// The longest IPv6 text form (six groups of four and an IPv4 tail).
const IPV6_TEXT_MAX: usize = 45;

/// A v1 header's protocol.
#[derive(Clone, Copy)]
enum Family {
    Tcp4,
    Tcp6,
}

/// Parses a header starting with `PROXY ` (or a prefix of it).
pub(super) fn parse(buf: &[u8]) -> Parse {
    let window = &buf[..buf.len().min(V1_MAX)];
    if let Some(end) = window.windows(2).position(|w| w == b"\r\n") {
        return match fields(&window[..end], true) {
            Ok(Some(header)) => Parse::Done {
                len: end + 2,
                header,
            },
            // A whole line always yields a header or an error.
            Ok(None) => Parse::Invalid(ProxyProtocolError::V1(V1Part::Fields)),
            Err(part) => Parse::Invalid(ProxyProtocolError::V1(part)),
        };
    }
    if buf.len() >= V1_MAX {
        return Parse::Invalid(ProxyProtocolError::TooLong { max: V1_MAX });
    }
    // A last CR may begin the CRLF: then the line before it must be whole and valid.
    let checked = match window.split_last() {
        Some((b'\r', line)) => fields(line, true),
        _ => fields(window, false),
    };
    match checked {
        Ok(_) => Parse::Incomplete,
        Err(part) => Parse::Invalid(ProxyProtocolError::V1(part)),
    }
}

/// Checks the space-separated fields of a v1 line, in order: the whole line before the CRLF
/// (`whole`; then `Some` header), or the bytes so far, whose last field may be cut short.
fn fields(line: &[u8], whole: bool) -> Result<Option<Header>, V1Part> {
    let mut family = Family::Tcp4;
    let mut ips = [IpAddr::V4(Ipv4Addr::UNSPECIFIED); 2];
    let mut ports = [0u16; 2];
    let mut count = 0;
    let mut parts = line.split(|&b| b == b' ').peekable();
    while let Some(field) = parts.next() {
        let cut = !whole && parts.peek().is_none();
        if field.is_empty() && !cut {
            return Err(V1Part::Spacing);
        }
        match count {
            // `PROXY`, or a prefix of it: `parse` dispatched on it.
            0 => {}
            1 if cut => {
                let known = [b"TCP4".as_slice(), b"TCP6", b"UNKNOWN"];
                if !known.iter().any(|k| k.starts_with(field)) {
                    return Err(V1Part::Family);
                }
            }
            1 => match field {
                b"TCP4" => family = Family::Tcp4,
                b"TCP6" => family = Family::Tcp6,
                // Whatever follows is to be ignored (up to the CRLF).
                b"UNKNOWN" => return Ok(Some(Header::Local)),
                _ => return Err(V1Part::Family),
            },
            2 | 3 if cut => {
                let ok = match family {
                    Family::Tcp4 => ipv4_prefix(field),
                    Family::Tcp6 => ipv6_prefix(field),
                };
                if !ok {
                    return Err(V1Part::Address);
                }
            }
            2 | 3 => ips[count - 2] = address(family, field).ok_or(V1Part::Address)?,
            4 | 5 if cut => {
                if !field.is_empty() {
                    port(field).ok_or(V1Part::Port)?;
                }
            }
            4 | 5 => ports[count - 4] = port(field).ok_or(V1Part::Port)?,
            _ => return Err(V1Part::Fields),
        }
        count += 1;
    }
    if !whole {
        return Ok(None);
    }
    if count < 6 {
        return Err(V1Part::Fields);
    }
    Ok(Some(Header::Proxied {
        source: SocketAddr::new(ips[0], ports[0]),
        destination: SocketAddr::new(ips[1], ports[1]),
    }))
}

/// A whole address field of `family`.
fn address(family: Family, field: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(field).ok()?;
    // The standard parser refuses IPv4 octets with leading zeros, and zone ids.
    match family {
        Family::Tcp4 => text.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
        Family::Tcp6 => text.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
    }
}

/// A port: 1-5 decimal digits, no leading zero but `0` itself, at most 65535.
fn port(field: &[u8]) -> Option<u16> {
    if field.is_empty() || field.len() > 5 || (field.len() > 1 && field[0] == b'0') {
        return None;
    }
    let mut n: u32 = 0;
    for &b in field {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u32::from(b - b'0');
    }
    u16::try_from(n).ok()
}

/// An IPv4 octet as text: 1-3 digits, no leading zero but `0` itself, at most 255. Every
/// prefix of a valid octet is one too.
fn octet(part: &[u8]) -> bool {
    !part.is_empty()
        && part.len() <= 3
        && (part.len() == 1 || part[0] != b'0')
        && part.iter().all(u8::is_ascii_digit)
        && part.iter().fold(0u32, |n, &b| n * 10 + u32::from(b - b'0')) <= 255
}

/// True when `s` can begin a dotted-quad IPv4 address.
fn ipv4_prefix(s: &[u8]) -> bool {
    let mut parts = s.split(|&b| b == b'.').peekable();
    let mut n = 0;
    while let Some(part) = parts.next() {
        n += 1;
        let last = parts.peek().is_none();
        if n > 4 || !(octet(part) || (last && part.is_empty())) {
            return false;
        }
    }
    s.len() <= IPV4_TEXT_MAX
}

/// A whole IPv6 group: 1-4 hex digits.
fn hex_group(g: &[u8]) -> bool {
    (1..=4).contains(&g.len()) && g.iter().all(u8::is_ascii_hexdigit)
}

/// True when `s` can begin an IPv6 address (as `Ipv6Addr`'s parser reads them: groups of
/// 1-4 hex digits, at most one `::`, optionally a dotted-quad tail for the last 32 bits).
/// Loose only in ways that cannot hold a connection past [`V1_MAX`].
pub(super) fn ipv6_prefix(s: &[u8]) -> bool {
    if s.len() > IPV6_TEXT_MAX
        || !s
            .iter()
            .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
    {
        return false;
    }
    if s == b":" {
        return true; // the start of `::`
    }
    match s.windows(2).position(|w| w == b"::") {
        // No `::` (yet): 8 groups, or 6 and an IPv4 tail.
        None => match groups_so_far(s) {
            Some((n, false)) => n <= 8,
            Some((n, true)) => n == 8,
            None => false,
        },
        Some(at) => {
            let (head, tail) = (&s[..at], &s[at + 2..]);
            // One `::` only, not `:::`.
            if tail.first() == Some(&b':') || tail.windows(2).any(|w| w == b"::") {
                return false;
            }
            let head_groups = if head.is_empty() {
                0
            } else if head.split(|&b| b == b':').all(hex_group) {
                head.split(|&b| b == b':').count()
            } else {
                return false;
            };
            // `::` stands for at least one zero group.
            groups_so_far(tail).is_some_and(|(n, _)| head_groups + n <= 7)
        }
    }
}

/// Groups in `s` (colon-separated, no `::`), the last maybe cut short: how many groups they
/// make (an IPv4 tail counts two) and whether the last is an IPv4 tail; `None` if they
/// cannot begin a valid run.
fn groups_so_far(s: &[u8]) -> Option<(usize, bool)> {
    if s.is_empty() {
        return Some((0, false));
    }
    let mut groups = s.split(|&b| b == b':').peekable();
    let mut n = 0;
    while let Some(group) = groups.next() {
        if groups.peek().is_none() {
            if group.contains(&b'.') {
                return ipv4_prefix(group).then_some((n + 2, true));
            }
            return (group.len() <= 4).then_some((n + 1, false));
        }
        if !hex_group(group) {
            return None;
        }
        n += 1;
    }
    None
}
