//! The PROXY protocol header reader (`tollgate_proxy::proxy_protocol::parse`), on arbitrary
//! first bytes of a connection. Checks, besides not panicking: a header is never longer than
//! the input and its own bytes parse to the same header; more bytes are asked for only below
//! the limit; what a prefix decides (not a header, a header, refused) the whole decides, as
//! the listener acts on the first decision (a refusal's reason may differ: a prefix is
//! refused at its first bad byte); a relayed client's addresses, written again as v1 and v2
//! headers, read back the same.
#![no_main]

use std::net::{IpAddr, SocketAddr};

use libfuzzer_sys::fuzz_target;
use tollgate_proxy::proxy_protocol::{Header, MAX_HEADER, Parse, parse};

fuzz_target!(|data: &[u8]| {
    let whole = parse(data);
    match whole {
        Parse::Done { len, header } => {
            assert!(len <= data.len());
            assert_eq!(parse(&data[..len]), whole);
            if let Header::Proxied {
                source,
                destination,
            } = header
            {
                for again in [v1(source, destination), v2(source, destination)] {
                    let len = again.len();
                    assert_eq!(parse(&again), Parse::Done { len, header });
                }
            }
        }
        Parse::Incomplete => assert!(data.len() < MAX_HEADER),
        Parse::NotProxy | Parse::Invalid(_) => {}
    }
    let cuts = (0..data.len().min(128)).chain([data.len() / 2, data.len().saturating_sub(1)]);
    for cut in cuts.filter(|&c| c < data.len()) {
        match (parse(&data[..cut]), whole) {
            (Parse::Incomplete, _) | (Parse::Invalid(_), Parse::Invalid(_)) => {}
            (early, _) => assert_eq!(early, whole, "the first {cut} bytes decided otherwise"),
        }
    }
});

/// The v1 header for a relayed client.
fn v1(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let family = if source.is_ipv4() { "TCP4" } else { "TCP6" };
    format!(
        "PROXY {family} {} {} {} {}\r\n",
        source.ip(),
        destination.ip(),
        source.port(),
        destination.port()
    )
    .into_bytes()
}

/// The v2 `PROXY` header (no TLVs) for a relayed client.
fn v2(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
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
        _ => panic!("a header with addresses of two families"),
    };
    body.extend_from_slice(&source.port().to_be_bytes());
    body.extend_from_slice(&destination.port().to_be_bytes());
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend_from_slice(&[0x21, family]);
    let len = u16::try_from(body.len()).expect("36 bytes at most");
    h.extend_from_slice(&len.to_be_bytes());
    h.extend_from_slice(&body);
    h
}
