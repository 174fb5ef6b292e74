//! What a port does for its clients, from the ClientPolicies of its listeners: where the
//! client address comes from, how paths are normalized, and the request and connection
//! limits, and response compression ([`Compression`]). Per port, not per listener: a port's listeners share one socket, and these
//! settings act before the request names a host (PROXY protocol, head size) or while none is
//! known (connections per client).

use serde::{Deserialize, Serialize};

use crate::ObjectKey;

/// A port's client settings; the default is what a port without a ClientPolicy does.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientSettings {
    /// Read a PROXY protocol header (v1 or v2) at the start of each connection; its source
    /// address is the client's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocol>,
    /// Take the client address from `X-Forwarded-For`, written by trusted proxies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarded_for: Option<ForwardedFor>,
    /// Path normalization options.
    #[serde(default, skip_serializing_if = "PathOptions::is_default")]
    pub path: PathOptions,
    /// Request and connection limits (unset: the proxy's own settings).
    #[serde(default, skip_serializing_if = "ClientLimits::is_empty")]
    pub limits: ClientLimits,
    /// Compress upstream responses for clients that accept it; `None`: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
    /// ClientPolicies that are invalid and were never valid: what they would set is unknown
    /// (the client address above all, which authorization rules may read), so every request
    /// on the port answers 500 until they are fixed. Empty: the port serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub closed_by: Vec<ObjectKey>,
}

impl ClientSettings {
    /// True when the port behaves as one without a ClientPolicy.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// A content coding the proxy can apply to a response body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Encoding {
    /// Zstandard (RFC 8878), `zstd`.
    #[serde(rename = "zstd")]
    Zstd,
    /// Brotli (RFC 7932), `br`.
    #[serde(rename = "br")]
    Br,
    /// gzip (RFC 1952), `gzip`.
    #[serde(rename = "gzip")]
    Gzip,
}

impl Encoding {
    /// Every coding, for parsing and metrics.
    pub const ALL: [Encoding; 3] = [Encoding::Zstd, Encoding::Br, Encoding::Gzip];

    /// The content-coding token (`Content-Encoding`, `Accept-Encoding`).
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Zstd => "zstd",
            Encoding::Br => "br",
            Encoding::Gzip => "gzip",
        }
    }

    /// The coding named `token` (exact, lower case), if the proxy has it.
    pub fn from_token(token: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == token)
    }
}

/// Response compression of a port (ClientPolicy `compression`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Compression {
    /// The codings offered, the preferred first: a tie in the client's `Accept-Encoding`
    /// goes to the earlier one. Not empty, no repeats.
    pub algorithms: Vec<Encoding>,
    /// A response that declares a shorter `Content-Length` goes out as it came; one of
    /// unknown length is compressed.
    pub min_bytes: u64,
    /// Media types compressed, lower case, parameters left out: `type/subtype`, or `type/*`
    /// for every subtype. Not empty.
    pub content_types: Vec<String>,
    /// gzip's level, 1 (fastest) to 9 (smallest); `None`: the proxy's default, 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gzip_level: Option<u8>,
}

/// PROXY protocol on a port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyProtocol {
    /// A connection without the header is closed; `false` serves it with its own address.
    #[serde(default)]
    pub required: bool,
    /// Peers that may send the header (networks, as [`Cidr`] parses them); empty: any.
    /// Another peer is closed when the header is required, served as it is otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_cidrs: Vec<String>,
}

/// Which `X-Forwarded-For` entry is the client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ForwardedFor {
    /// This many proxies in front of the gateway each append their peer: the client is the
    /// entry this many places from the right (1: the last). With fewer entries, the peer.
    NumTrustedHops(u32),
    /// Peers and entries in these networks are trusted proxies: from the peer leftwards,
    /// the first address outside them is the client. An untrusted peer is the client.
    TrustedCidrs(Vec<String>),
}

/// How `%2F` and `%5C` in a path are treated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum EscapedSlashes {
    /// Kept encoded: matched as an opaque character, forwarded as sent.
    #[default]
    Keep,
    /// The request is refused (400), as is one with a raw `\`.
    Reject,
    /// `%2F` decoded to a separator before dot-segments are removed; `%5C` kept.
    Unescape,
}

/// Path normalization options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PathOptions {
    /// `//` becomes `/`.
    #[serde(default = "yes")]
    pub merge_slashes: bool,
    /// Encoded slashes and backslashes.
    #[serde(default)]
    pub escaped_slashes: EscapedSlashes,
}

fn yes() -> bool {
    true
}

impl Default for PathOptions {
    fn default() -> Self {
        Self {
            merge_slashes: true,
            escaped_slashes: EscapedSlashes::Keep,
        }
    }
}

impl PathOptions {
    /// True for the defaults.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Request and connection limits of a port; `None` leaves the proxy's own setting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientLimits {
    /// Most bytes of a request head (431 beyond).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_request_headers_bytes: Option<u32>,
    /// Most header fields of a request (431 beyond).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_request_headers: Option<u32>,
    /// Most bytes of a request body (413 beyond).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_request_body_bytes: Option<u64>,
    /// Most open connections from one client address; more are closed at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections_per_client: Option<u32>,
    /// Milliseconds a request head may take from its first byte (the connection is closed
    /// beyond).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_header_timeout_ms: Option<u64>,
    /// Milliseconds a connection may wait for a request (HTTP/1: its first byte; HTTP/2: a
    /// stream) before it is closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// Milliseconds a request body may take from its start (408 beyond).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_body_timeout_ms: Option<u64>,
    /// Milliseconds from a request's arrival to its answer's head (504 beyond); a route's
    /// own `timeouts.request` applies too, the shorter first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_ms: Option<u64>,
    /// Most open streams of an HTTP/2 connection (more are refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http2_max_concurrent_streams: Option<u32>,
}

impl ClientLimits {
    /// True when no limit is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Each limit `self` lacks taken from `below`.
    pub fn or(self, below: Self) -> Self {
        Self {
            max_request_headers_bytes: self
                .max_request_headers_bytes
                .or(below.max_request_headers_bytes),
            max_request_headers: self.max_request_headers.or(below.max_request_headers),
            max_request_body_bytes: self.max_request_body_bytes.or(below.max_request_body_bytes),
            max_connections_per_client: self
                .max_connections_per_client
                .or(below.max_connections_per_client),
            request_header_timeout_ms: self
                .request_header_timeout_ms
                .or(below.request_header_timeout_ms),
            idle_timeout_ms: self.idle_timeout_ms.or(below.idle_timeout_ms),
            request_body_timeout_ms: self
                .request_body_timeout_ms
                .or(below.request_body_timeout_ms),
            request_timeout_ms: self.request_timeout_ms.or(below.request_timeout_ms),
            http2_max_concurrent_streams: self
                .http2_max_concurrent_streams
                .or(below.http2_max_concurrent_streams),
        }
    }
}

/// A network: an address and a prefix length (`10.0.0.0/8`, `2001:db8::/32`; a bare
/// address is a network of one). Host bits are cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: std::net::IpAddr,
    len: u8,
}

/// Why a network does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// The address part is not an IPv4 or IPv6 address.
    #[error("{0:?} is not an IP address")]
    Address(String),
    /// The prefix length is not a number within the family's bits.
    #[error("{0:?} is not a prefix length of 0 to {1}")]
    Length(String, u8),
}

impl std::str::FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, CidrError> {
        use std::net::IpAddr;
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| CidrError::Address(addr.to_owned()))?;
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => bits,
            Some(l) => match l.parse::<u8>() {
                // Digits only: `+8` and ` 8` are not lengths.
                Ok(n) if n <= bits && l.bytes().all(|b| b.is_ascii_digit()) => n,
                _ => return Err(CidrError::Length(l.to_owned(), bits)),
            },
        };
        Ok(Self {
            addr: mask(addr, len),
            len,
        })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl Cidr {
    /// The prefix length (0: every address of the family).
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// True when `ip` is in the network. An IPv4 address written as IPv6 (`::ffff:a.b.c.d`,
    /// as dual-stack sockets report IPv4 peers) is the IPv4 address.
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.len) == self.addr
    }
}

fn mask(ip: std::net::IpAddr, len: u8) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    match ip {
        IpAddr::V4(a) => {
            let m = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & m))
        }
        IpAddr::V6(a) => {
            let m = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & m))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn a_network_contains_its_addresses_only() {
        let n = c("10.0.0.0/8");
        assert!(n.contains("10.255.1.2".parse().unwrap()));
        assert!(!n.contains("11.0.0.0".parse().unwrap()));
        assert!(
            n.contains("::ffff:10.1.2.3".parse().unwrap()),
            "IPv4 as IPv6"
        );
        assert!(!n.contains("::a01:203".parse().unwrap()), "not IPv4-mapped");
        let v6 = c("2001:db8::/32");
        assert!(v6.contains("2001:db8:ffff::1".parse().unwrap()));
        assert!(!v6.contains("2001:db9::1".parse().unwrap()));
        assert!(!v6.contains("10.0.0.1".parse().unwrap()));
    }

    #[test]
    fn edges_of_the_prefix_length() {
        assert!(c("0.0.0.0/0").contains("255.255.255.255".parse().unwrap()));
        assert!(c("::/0").contains("::1".parse().unwrap()));
        assert!(
            !c("::/0").contains("1.2.3.4".parse().unwrap()),
            "families apart"
        );
        let one = c("192.0.2.7");
        assert_eq!(one, c("192.0.2.7/32"));
        assert!(one.contains("192.0.2.7".parse().unwrap()));
        assert!(!one.contains("192.0.2.6".parse().unwrap()));
        assert_eq!(
            c("192.0.2.77/24").to_string(),
            "192.0.2.0/24",
            "host bits cleared"
        );
        assert_eq!(c("2001:db8::1/128").to_string(), "2001:db8::1/128");
    }

    #[test]
    fn malformed_networks_are_refused() {
        for bad in [
            "",
            "10.0.0.0/",
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/+8",
            "10.0.0.0/ 8",
            "10.0.0/8",
            "example.com/8",
            "10.0.0.0/8/8",
            "fe80::1%eth0/64",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?}");
        }
    }
}
