//! The parser's tests: the specification's examples, every prefix, what is not a header,
//! what is refused, and seeded random inputs (the crate has no proptest: `fastrand` with a
//! fixed seed, so a failure reproduces). The reader's are in `reader_tests`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV6};

use super::*;

mod reader_tests;

fn proxied(source: &str, destination: &str) -> Header {
    Header::Proxied {
        source: source.parse().unwrap(),
        destination: destination.parse().unwrap(),
    }
}

/// A v2 header: version and command byte, family byte, then the body (its length computed).
pub(super) fn v2(ver_cmd: u8, family: u8, body: &[u8]) -> Vec<u8> {
    let mut h = V2_SIGNATURE.to_vec();
    h.extend_from_slice(&[ver_cmd, family]);
    h.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
    h.extend_from_slice(body);
    h
}

/// The v2 `PROXY` header for `source` and `destination` (same family), then `tlvs`.
pub(super) fn v2_proxy(source: SocketAddr, destination: SocketAddr, tlvs: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    let family = match (source.ip(), destination.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            body.extend_from_slice(&s.octets());
            body.extend_from_slice(&d.octets());
            0x11
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            body.extend_from_slice(&s.octets());
            body.extend_from_slice(&d.octets());
            0x21
        }
        _ => panic!("mixed families"),
    };
    body.extend_from_slice(&source.port().to_be_bytes());
    body.extend_from_slice(&destination.port().to_be_bytes());
    body.extend_from_slice(tlvs);
    v2(0x21, family, &body)
}

/// A TLV: type, big-endian length, value.
fn tlv(kind: u8, value: &[u8]) -> Vec<u8> {
    let mut t = vec![kind];
    t.extend_from_slice(&u16::try_from(value.len()).unwrap().to_be_bytes());
    t.extend_from_slice(value);
    t
}

/// Checks a valid header: every strict prefix is Incomplete, the whole is `header`, and
/// with bytes after it, it is still `header` of the same length.
#[track_caller]
fn assert_header(bytes: &[u8], header: Header) {
    for n in 0..bytes.len() {
        assert_eq!(parse(&bytes[..n]), Parse::Incomplete, "prefix of {n} bytes");
    }
    let done = Parse::Done {
        len: bytes.len(),
        header,
    };
    assert_eq!(parse(bytes), done);
    let mut more = bytes.to_vec();
    more.extend_from_slice(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(parse(&more), done);
}

#[track_caller]
fn assert_invalid(bytes: &[u8], error: ProxyProtocolError) {
    assert_eq!(
        parse(bytes),
        Parse::Invalid(error),
        "{:?}",
        String::from_utf8_lossy(bytes)
    );
}

const FFFF6: &str = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff";

#[test]
fn v1_tcp4_spec_examples() {
    assert_header(
        b"PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n",
        proxied("255.255.255.255:65535", "255.255.255.255:65535"),
    );
    assert_header(
        b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n",
        proxied("192.168.0.1:56324", "192.168.0.11:443"),
    );
    assert_header(
        b"PROXY TCP4 0.0.0.0 10.0.0.1 0 80\r\n",
        proxied("0.0.0.0:0", "10.0.0.1:80"),
    );
}

#[test]
fn v1_tcp6_spec_examples() {
    let line = format!("PROXY TCP6 {FFFF6} {FFFF6} 65535 65535\r\n");
    assert_eq!(line.len(), 104);
    let all = format!("[{FFFF6}]:65535");
    assert_header(line.as_bytes(), proxied(&all, &all));
    assert_header(
        b"PROXY TCP6 2001:db8::1 ::1 4242 8443\r\n",
        proxied("[2001:db8::1]:4242", "[::1]:8443"),
    );
    // IPv4-mapped, upper-case, and leading zeros in groups are IPv6 text forms too.
    assert_header(
        b"PROXY TCP6 ::ffff:192.0.2.1 0DB8:0000::00A 1 2\r\n",
        proxied("[::ffff:192.0.2.1]:1", "[db8::a]:2"),
    );
}

#[test]
fn v1_unknown_is_local_whatever_follows() {
    assert_header(b"PROXY UNKNOWN\r\n", Header::Local);
    // The longest header the specification allows: 107 bytes.
    let long = format!("PROXY UNKNOWN {FFFF6} {FFFF6} 65535 65535\r\n");
    assert_eq!(long.len(), V1_MAX);
    assert_header(long.as_bytes(), Header::Local);
    assert_header(b"PROXY UNKNOWN anything at all\r\n", Header::Local);
}

#[test]
fn v2_proxy_ipv4_with_and_without_tlvs() {
    let (s, d) = ("192.0.2.1:56324", "198.51.100.7:443");
    let bare = v2_proxy(s.parse().unwrap(), d.parse().unwrap(), &[]);
    assert_eq!(bare.len(), 16 + 12);
    assert_header(&bare, proxied(s, d));
    // ALPN, authority, a NOOP: skipped.
    let tlvs = [
        tlv(0x01, b"h2"),
        tlv(0x02, b"example.com"),
        tlv(0x04, &[0; 5]),
    ]
    .concat();
    assert_header(
        &v2_proxy(s.parse().unwrap(), d.parse().unwrap(), &tlvs),
        proxied(s, d),
    );
}

#[test]
fn v2_proxy_ipv6_with_and_without_tlvs() {
    let (s, d) = ("[2001:db8::1]:40000", "[2001:db8::2]:8443");
    let bare = v2_proxy(s.parse().unwrap(), d.parse().unwrap(), &[]);
    assert_eq!(bare.len(), 16 + 36);
    assert_header(&bare, proxied(s, d));
    let tlvs = [tlv(0x05, b"unique-id"), tlv(0x20, &[1, 0, 0, 0, 0])].concat();
    assert_header(
        &v2_proxy(s.parse().unwrap(), d.parse().unwrap(), &tlvs),
        proxied(s, d),
    );
}

#[test]
fn v2_local_is_local_whatever_its_family_and_block() {
    assert_header(&v2(0x20, 0x00, &[]), Header::Local);
    // A health check may still send addresses (or garbage in the family): ignored.
    assert_header(&v2(0x20, 0x11, &[7; 12]), Header::Local);
    assert_header(&v2(0x20, 0x31, &[0; 3]), Header::Local);
    assert_header(&v2(0x20, 0xff, &[]), Header::Local);
}

#[test]
fn v2_proxy_with_unspec_family_is_local() {
    assert_header(&v2(0x21, 0x00, &[]), Header::Local);
    assert_header(&v2(0x21, 0x00, &tlv(0x04, b"pad")), Header::Local);
}

#[test]
fn v2_at_the_cap_is_accepted() {
    let body = vec![0; V2_MAX - 16];
    let at_cap = v2(0x20, 0x00, &body);
    assert_eq!(at_cap.len(), V2_MAX);
    assert_eq!(
        parse(&at_cap),
        Parse::Done {
            len: V2_MAX,
            header: Header::Local
        }
    );
}

#[test]
fn not_a_proxy_header() {
    let not: [&[u8]; 7] = [
        b"GET / HTTP/1.1\r\n",
        &[
            0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
        ],
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"\r\nGET / HTTP/1.1\r\n",
        b"PROXYX",
        b"P\0",
        b"\r\n\r\n\0\r\nQUIX",
    ];
    for bytes in not {
        assert_eq!(parse(bytes), Parse::NotProxy, "{bytes:?}");
        // Incomplete while both forms may still begin so, then NotProxy for good.
        let first = (0..=bytes.len())
            .find(|&n| parse(&bytes[..n]) == Parse::NotProxy)
            .unwrap();
        assert!((0..first).all(|n| parse(&bytes[..n]) == Parse::Incomplete));
        assert!((first..=bytes.len()).all(|n| parse(&bytes[..n]) == Parse::NotProxy));
    }
    assert_eq!(parse(b"G"), Parse::NotProxy);
    assert_eq!(parse(&[0x16]), Parse::NotProxy);
    assert_eq!(parse(b""), Parse::Incomplete);
    assert_eq!(parse(b"PROXY"), Parse::Incomplete);
    assert_eq!(parse(b"\r\n"), Parse::Incomplete);
}

#[test]
fn v1_spacing_must_be_single_spaces() {
    let e = ProxyProtocolError::V1(V1Part::Spacing);
    assert_invalid(b"PROXY  TCP4 1.2.3.4 5.6.7.8 1 2\r\n", e);
    assert_invalid(b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n", e);
    assert_invalid(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n", e);
    // Decided as soon as the second space comes.
    assert_invalid(b"PROXY TCP4  ", e);
    assert_eq!(parse(b"PROXY\tTCP4"), Parse::NotProxy);
}

#[test]
fn v1_without_crlf_within_107_bytes_is_too_long() {
    let e = ProxyProtocolError::TooLong { max: V1_MAX };
    let unknown = format!("PROXY UNKNOWN {}", "x".repeat(200));
    assert_eq!(parse(&unknown.as_bytes()[..V1_MAX - 1]), Parse::Incomplete);
    assert_invalid(&unknown.as_bytes()[..V1_MAX], e);
    assert_invalid(unknown.as_bytes(), e);
    // The CRLF ending at byte 108 is one too far.
    let line = format!("PROXY UNKNOWN {}\r\n", "x".repeat(V1_MAX + 1 - 14 - 2));
    assert_eq!(line.len(), V1_MAX + 1);
    assert_invalid(line.as_bytes(), e);
}

#[test]
fn v1_line_ends_with_crlf_only() {
    assert_invalid(
        b"PROXY TCP4 1.2.3.4 5.6.7.8 80 443\n",
        ProxyProtocolError::V1(V1Part::Port),
    );
    assert_invalid(
        b"PROXY TCP4 1.2.3.4 5.6.7.8 80 443\rX",
        ProxyProtocolError::V1(V1Part::Port),
    );
    assert_eq!(
        parse(b"PROXY TCP4 1.2.3.4 5.6.7.8 80 443\r"),
        Parse::Incomplete
    );
    // A CR after too few fields can end nothing valid.
    assert_invalid(
        b"PROXY TCP4 1.2.3.4 5.6.7.8 80\r",
        ProxyProtocolError::V1(V1Part::Fields),
    );
}

#[test]
fn v1_bad_family() {
    let e = ProxyProtocolError::V1(V1Part::Family);
    for line in [
        "PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n",
        "PROXY tcp4 1.2.3.4 5.6.7.8 1 2\r\n",
        "PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
        "PROXY UNKNOWNX\r\n",
    ] {
        assert_invalid(line.as_bytes(), e);
    }
    // Decided at the first byte no family starts with.
    assert_invalid(b"PROXY TCP5", e);
    assert_invalid(b"PROXY X", e);
    assert_eq!(parse(b"PROXY UNKN"), Parse::Incomplete);
}

#[test]
fn v1_address_must_be_of_the_family() {
    let e = ProxyProtocolError::V1(V1Part::Address);
    for line in [
        "PROXY TCP4 ::1 5.6.7.8 1 2\r\n",
        "PROXY TCP4 1.2.3.4 ::ffff:5.6.7.8 1 2\r\n",
        "PROXY TCP6 1.2.3.4 ::1 1 2\r\n",
        "PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n",
        "PROXY TCP4 1.2.3.4 5.6.7.08 1 2\r\n",
        "PROXY TCP4 1.2.3 5.6.7.8 1 2\r\n",
        "PROXY TCP4 256.2.3.4 5.6.7.8 1 2\r\n",
        "PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n",
        "PROXY TCP6 1::2::3 ::1 1 2\r\n",
    ] {
        assert_invalid(line.as_bytes(), e);
    }
    // Decided before the line ends.
    for prefix in [
        "PROXY TCP4 01",
        "PROXY TCP4 1.2.3.4.",
        "PROXY TCP4 1.2.3.256",
        "PROXY TCP4 1.2.3.4x",
        "PROXY TCP4 ::",
        "PROXY TCP6 1.",
        "PROXY TCP6 :1",
        "PROXY TCP6 1::2::",
        "PROXY TCP6 :::",
        "PROXY TCP6 12345",
        "PROXY TCP6 1:2:3:4:5:6:7:8:9",
        "PROXY TCP6 1:2:3:4:5:6:7::1.",
        "PROXY TCP6 ::ffff:01.",
        "PROXY TCP6 g",
    ] {
        assert_invalid(prefix.as_bytes(), e);
    }
}

#[test]
fn v1_port_is_decimal_up_to_65535_without_leading_zeros() {
    let e = ProxyProtocolError::V1(V1Part::Port);
    for port in ["65536", "080", "00", "-1", "+1", "1a", "99999", "123456"] {
        assert_invalid(
            format!("PROXY TCP4 1.2.3.4 5.6.7.8 {port} 80\r\n").as_bytes(),
            e,
        );
        assert_invalid(
            format!("PROXY TCP4 1.2.3.4 5.6.7.8 80 {port}\r\n").as_bytes(),
            e,
        );
    }
    assert_invalid(b"PROXY TCP4 1.2.3.4 5.6.7.8 65536", e);
    assert_invalid(b"PROXY TCP4 1.2.3.4 5.6.7.8 01", e);
}

#[test]
fn v1_field_count() {
    let e = ProxyProtocolError::V1(V1Part::Fields);
    assert_invalid(b"PROXY TCP4 1.2.3.4 5.6.7.8 80\r\n", e);
    assert_invalid(b"PROXY TCP4 1.2.3.4 5.6.7.8 80 443 1\r\n", e);
    assert_invalid(b"PROXY TCP4\r\n", e);
    // Nothing but the CRLF may follow the destination port.
    assert_invalid(b"PROXY TCP4 1.2.3.4 5.6.7.8 80 443 ", e);
}

#[test]
fn v2_version_must_be_2() {
    let e = ProxyProtocolError::V2(V2Part::Version);
    for ver_cmd in [0x11, 0x31, 0x01, 0xf1] {
        let h = v2(ver_cmd, 0x11, &[0; 12]);
        assert_invalid(&h, e);
        assert_invalid(&h[..13], e);
    }
}

#[test]
fn v2_command_must_be_local_or_proxy() {
    let e = ProxyProtocolError::V2(V2Part::Command);
    for ver_cmd in [0x22, 0x2f] {
        assert_invalid(&v2(ver_cmd, 0x11, &[0; 12]), e);
        assert_invalid(&v2(ver_cmd, 0x11, &[0; 12])[..13], e);
    }
}

#[test]
fn v2_proxy_family_must_be_tcp_or_unspec() {
    let unassigned = ProxyProtocolError::V2(V2Part::Family);
    for family in [0x01, 0x13, 0x41, 0x10, 0xff] {
        assert_invalid(&v2(0x21, family, &[0; 216])[..14], unassigned);
    }
    let unsupported = ProxyProtocolError::V2(V2Part::Unsupported);
    for family in [0x12, 0x22, 0x31, 0x32] {
        assert_invalid(&v2(0x21, family, &[0; 216]), unsupported);
    }
}

#[test]
fn v2_length_must_cover_the_address_block() {
    let e = ProxyProtocolError::V2(V2Part::Length);
    assert_invalid(&v2(0x21, 0x11, &[0; 11]), e);
    assert_invalid(&v2(0x21, 0x21, &[0; 35]), e);
    assert_invalid(&v2(0x21, 0x21, &[0; 12]), e);
    // Decided from the length field, before the body comes.
    assert_invalid(&v2(0x21, 0x11, &[0; 11])[..16], e);
}

#[test]
fn v2_over_the_cap_is_too_long_at_once() {
    let e = ProxyProtocolError::TooLong { max: V2_MAX };
    let h = v2(0x21, 0x11, &vec![0; V2_MAX - 16 + 1]);
    assert_invalid(&h[..16], e);
    assert_invalid(&h, e);
    assert_invalid(&v2(0x20, 0x00, &vec![0; 65535])[..16], e);
}

#[test]
fn reasons_are_short_and_fixed() {
    let errors = [
        ProxyProtocolError::Missing,
        ProxyProtocolError::Timeout,
        ProxyProtocolError::Closed,
        ProxyProtocolError::Io(io::ErrorKind::ConnectionReset),
        ProxyProtocolError::V1(V1Part::Address),
        ProxyProtocolError::V2(V2Part::Length),
        ProxyProtocolError::TooLong { max: V1_MAX },
    ];
    for e in errors {
        let r = e.reason();
        assert!(
            r.len() <= 16
                && r.bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'_' || b.is_ascii_digit()),
            "{r}"
        );
        assert!(!e.to_string().is_empty());
    }
}

/// A random socket address, IPv4 or IPv6 (`v6`), biased towards edge values.
fn random_addr(rng: &mut fastrand::Rng, v6: bool) -> SocketAddr {
    let port = match rng.u8(0..4) {
        0 => 0,
        1 => u16::MAX,
        _ => rng.u16(..),
    };
    if v6 {
        // Runs of zero groups so that `::` appears in the text form at any place.
        let mut groups = [0u16; 8];
        for g in &mut groups {
            *g = if rng.bool() { 0 } else { rng.u16(..) };
        }
        let ip = if rng.u8(0..8) == 0 {
            Ipv4Addr::from(rng.u32(..)).to_ipv6_mapped()
        } else {
            Ipv6Addr::from(groups)
        };
        SocketAddr::V6(SocketAddrV6::new(ip, port, 0, 0))
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::from(rng.u32(..))), port)
    }
}

#[test]
fn random_addresses_round_trip_through_v1_and_v2() {
    let mut rng = fastrand::Rng::with_seed(0x5052_4f58_5931);
    for _ in 0..2000 {
        let v6 = rng.bool();
        let (s, d) = (random_addr(&mut rng, v6), random_addr(&mut rng, v6));
        let header = Header::Proxied {
            source: s,
            destination: d,
        };
        let family = if v6 { "TCP6" } else { "TCP4" };
        let line = format!(
            "PROXY {family} {} {} {} {}\r\n",
            s.ip(),
            d.ip(),
            s.port(),
            d.port()
        );
        assert_header(line.as_bytes(), header);
        let tlvs = vec![rng.u8(..); rng.usize(0..64)];
        assert_header(&v2_proxy(s, d, &tlvs), header);
    }
}

#[test]
fn ipv6_text_forms_are_prefixes_of_themselves() {
    // Forms `Ipv6Addr`'s Display never writes, every prefix still accepted.
    for text in [
        "::",
        "::1",
        "1::",
        "1:2:3:4:5:6:7::",
        "::2:3:4:5:6:7:8",
        "1:2:3:4:5:6:7:8",
        "0001:0002:0003:0004:0005:0006:0007:0008",
        "1:2:3:4:5:6:255.255.255.255",
        "1:2:3:4:5::1.2.3.4",
        "::1.2.3.4",
        "ABCD:ef01::",
    ] {
        assert!(text.parse::<Ipv6Addr>().is_ok(), "{text}");
        for n in 0..=text.len() {
            assert!(v1::ipv6_prefix(&text.as_bytes()[..n]), "{:?}", &text[..n]);
        }
    }
}

/// Random bytes starting like a header more often than not (else nearly all is NotProxy).
fn random_input(rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut buf = match rng.u8(0..4) {
        0 => V1_PREFIX.to_vec(),
        1 => [V1_PREFIX, b"TCP4 1.2.3.4 "].concat(),
        2 => [V2_SIGNATURE, &[0x21, 0x11, 0x00]].concat(),
        _ => Vec::new(),
    };
    let alphabet = b"0123456789abcdefTCPUNKOWX:. \r\n\0\x21\x11\xff";
    for _ in 0..rng.usize(0..130) {
        buf.push(if rng.bool() {
            alphabet[rng.usize(..alphabet.len())]
        } else {
            rng.u8(..)
        });
    }
    buf
}

#[test]
fn random_bytes_are_decided_consistently() {
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..20_000 {
        let buf = random_input(&mut rng);
        let whole = parse(&buf);
        if let Parse::Done { len, header } = whole {
            assert!(len <= buf.len());
            assert_eq!(parse(&buf[..len]), Parse::Done { len, header });
        }
        if whole == Parse::Incomplete {
            assert!(buf.len() < MAX_HEADER);
        }
        // What a prefix decides, the whole decides (the reason may differ).
        for n in 0..buf.len() {
            let early = parse(&buf[..n]);
            match (early, whole) {
                (Parse::Incomplete, _) => {}
                (Parse::Invalid(_), Parse::Invalid(_)) => {}
                (early, whole) => assert_eq!(early, whole, "{buf:?} at {n}"),
            }
        }
    }
}
