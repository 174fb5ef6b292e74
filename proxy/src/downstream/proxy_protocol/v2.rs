//! The binary form (version 2): a 12-byte signature, version and command, family and
//! transport, a big-endian length, then the address block and TLVs. In: a connection's first
//! bytes, starting with the signature or a prefix of it. Out: [`Parse`]. Each byte is judged
//! as soon as it is there, so a bad header is refused without waiting for the rest.

use std::net::{IpAddr, SocketAddr};

use super::{Header, Parse, ProxyProtocolError, V2_MAX, V2_SIGNATURE, V2Part};

/// The fixed part: signature, version and command, family, length.
const V2_FIXED: usize = 16;
// The 14th byte: address family (high nibble), transport (low nibble).
/// `AF_UNSPEC`, unspecified transport: no addresses.
const AF_UNSPEC: u8 = 0x00;
/// `AF_INET`, `STREAM`.
const TCP_OVER_IPV4: u8 = 0x11;
/// `AF_INET6`, `STREAM`.
const TCP_OVER_IPV6: u8 = 0x21;
/// UDP over IPv4 and IPv6, unix stream and datagram: assigned, but not a TCP client.
const NOT_TCP: [u8; 4] = [0x12, 0x22, 0x31, 0x32];
/// IPv4 address block: source and destination addresses, then ports.
const IPV4_BLOCK: usize = 4 + 4 + 2 + 2;
/// IPv6 address block: source and destination addresses, then ports.
const IPV6_BLOCK: usize = 16 + 16 + 2 + 2;

/// Parses a header starting with the signature (or a prefix of it).
pub(super) fn parse(buf: &[u8]) -> Parse {
    let invalid = |part| Parse::Invalid(ProxyProtocolError::V2(part));
    let Some(&ver_cmd) = buf.get(V2_SIGNATURE.len()) else {
        return Parse::Incomplete;
    };
    if ver_cmd >> 4 != 2 {
        return invalid(V2Part::Version);
    }
    let local = match ver_cmd & 0x0f {
        0 => true,
        1 => false,
        _ => return invalid(V2Part::Command),
    };
    let Some(&family) = buf.get(13) else {
        return Parse::Incomplete;
    };
    // LOCAL ignores the family and its block.
    let block = match family {
        _ if local => 0,
        AF_UNSPEC => 0,
        TCP_OVER_IPV4 => IPV4_BLOCK,
        TCP_OVER_IPV6 => IPV6_BLOCK,
        f if NOT_TCP.contains(&f) => return invalid(V2Part::Unsupported),
        _ => return invalid(V2Part::Family),
    };
    let Some(&[hi, lo]) = buf.get(14..V2_FIXED) else {
        return Parse::Incomplete;
    };
    let len = usize::from(u16::from_be_bytes([hi, lo]));
    if len < block {
        return invalid(V2Part::Length);
    }
    let total = V2_FIXED + len;
    if total > V2_MAX {
        return Parse::Invalid(ProxyProtocolError::TooLong { max: V2_MAX });
    }
    let Some(body) = buf.get(V2_FIXED..total) else {
        return Parse::Incomplete;
    };
    let header = match block {
        IPV4_BLOCK => proxied::<4>(body),
        IPV6_BLOCK => proxied::<16>(body),
        // TLVs (and LOCAL's ignored block) are skipped: `len` covers them.
        _ => Some(Header::Local),
    };
    match header {
        Some(header) => Parse::Done { len: total, header },
        // Unreachable: `len` covers the block.
        None => invalid(V2Part::Length),
    }
}

/// A `Proxied` header from an address block of `N`-byte addresses: source, destination,
/// then their ports.
fn proxied<const N: usize>(body: &[u8]) -> Option<Header>
where
    IpAddr: From<[u8; N]>,
{
    let source = IpAddr::from(array::<N>(body, 0)?);
    let destination = IpAddr::from(array::<N>(body, N)?);
    let source_port = u16::from_be_bytes(array(body, 2 * N)?);
    let destination_port = u16::from_be_bytes(array(body, 2 * N + 2)?);
    Some(Header::Proxied {
        source: SocketAddr::new(source, source_port),
        destination: SocketAddr::new(destination, destination_port),
    })
}

/// The `N` bytes of `b` at `at`, if there.
fn array<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}
