//! The PROXY protocol (HAProxy, versions 1 and 2), server side: the header an L4 load
//! balancer writes at the start of a TCP connection to say whom it carries it for.
//!
//! In: the first bytes of an accepted connection. Out: [`Parse`] from the pure [`parse`]
//! (need more bytes, not a PROXY header, a whole [`Header`] of `len` bytes, or malformed),
//! and from [`read_header`] the header plus the bytes read past it, which the caller
//! replays to the HTTP/TLS code by wrapping the socket in `crate::upgrade::Upgraded::new(io,
//! leftover)`. The caller then takes [`Header::Proxied`]'s `source` as the peer address;
//! [`Header::Local`] keeps the connection's own.
//!
//! Bounded: [`parse`] answers [`Parse::Incomplete`] only for bytes that can still begin a
//! valid header and only below that header's limit ([`V1_MAX`] for the text form, the
//! declared length, capped at [`V2_MAX`], for the binary one), so a client dribbling bytes
//! cannot hold a connection past [`MAX_HEADER`] bytes, and [`read_header`] runs under one
//! deadline for the whole header.
//!
//! Choices where the specification leaves one:
//! - v1 `PROXY UNKNOWN` is [`Header::Local`], whatever follows it up to the CRLF (the
//!   specification says to ignore it). `TCP4` takes dotted-quad IPv4 only, without leading
//!   zeros (`01.2.3.4` could be read as octal); `TCP6` any IPv6 text form, IPv4-mapped
//!   included; ports are decimal without leading zeros (but `0`).
//! - v2 `LOCAL` is [`Header::Local`] whatever its family, its address block skipped; `PROXY`
//!   with `AF_UNSPEC` (family byte `0x00`) too. `PROXY` over `AF_UNIX` or a datagram
//!   transport is refused, although the specification lets a receiver fall back to the
//!   connection's own address: that address is the load balancer's, and crediting the
//!   client with it could pass an IP allow-list meant for the balancer. Family bytes the
//!   specification leaves unassigned are refused, as it says.
//! - v2 TLVs are skipped, unparsed, within the declared length; nothing here needs them.
//! - A v2 header is capped at [`V2_MAX`] bytes although its length field allows 16 + 65535:
//!   the addresses take at most 52 and the TLVs balancers send (ALPN, authority, TLS
//!   summary, cloud endpoint ids) a few hundred, while every byte allowed is buffered per
//!   connection before anything is known of the client.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{BufMut as _, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt as _};

mod v1;
mod v2;

/// The longest v1 (text) header, `\r\n` included, as the specification sets it.
pub const V1_MAX: usize = 107;
/// The longest v2 (binary) header accepted: 16 fixed bytes, addresses and TLVs.
pub const V2_MAX: usize = 4096;
/// The most bytes [`read_header`] buffers before [`parse`] must decide.
pub const MAX_HEADER: usize = if V1_MAX > V2_MAX { V1_MAX } else { V2_MAX };

/// How a v1 header starts.
const V1_PREFIX: &[u8] = b"PROXY ";
/// How a v2 header starts.
const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";

/// The addresses a header carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// The balancer relays a client: `source` is the client, `destination` the address it
    /// connected to.
    Proxied {
        /// The client's address and port.
        source: SocketAddr,
        /// The address and port the client connected to.
        destination: SocketAddr,
    },
    /// No client to credit (v2 `LOCAL`, such as a balancer's health check; v1 `UNKNOWN`; v2
    /// `AF_UNSPEC`): the connection's own address stays.
    Local,
}

/// What the first bytes of a connection are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parse {
    /// A prefix of a header that can still be valid: read more.
    Incomplete,
    /// Not the start of a PROXY header (neither `PROXY ` nor the v2 signature): where the
    /// header is optional, the connection is served as it is.
    NotProxy,
    /// A whole, valid header of `len` bytes; the bytes after it are the connection's own.
    Done {
        /// The header's length in bytes.
        len: usize,
        /// What it says.
        header: Header,
    },
    /// A header was started and is malformed (or too long): the connection is closed.
    Invalid(ProxyProtocolError),
}

/// Why no usable PROXY header came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProxyProtocolError {
    /// The port requires a header and the connection started with something else.
    #[error("the connection did not start with a PROXY protocol header")]
    Missing,
    /// No decision before the deadline.
    #[error("no whole PROXY protocol header before the timeout")]
    Timeout,
    /// The client closed before a decision.
    #[error("the connection closed before a whole PROXY protocol header")]
    Closed,
    /// Reading failed.
    #[error("reading the PROXY protocol header: {0}")]
    Io(io::ErrorKind),
    /// A malformed v1 (text) header.
    #[error("malformed PROXY protocol v1 header: {0}")]
    V1(V1Part),
    /// A malformed v2 (binary) header.
    #[error("malformed PROXY protocol v2 header: {0}")]
    V2(V2Part),
    /// A header longer than `max` bytes (v1: no CRLF within them).
    #[error("PROXY protocol header longer than {max} bytes")]
    TooLong {
        /// The limit.
        max: usize,
    },
}

impl ProxyProtocolError {
    /// A short fixed label for metrics (low cardinality: one per variant and part).
    pub fn reason(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Timeout => "timeout",
            Self::Closed => "closed",
            Self::Io(_) => "io",
            Self::V1(V1Part::Family) => "v1_family",
            Self::V1(V1Part::Address) => "v1_address",
            Self::V1(V1Part::Port) => "v1_port",
            Self::V1(V1Part::Spacing) => "v1_spacing",
            Self::V1(V1Part::Fields) => "v1_fields",
            Self::V2(V2Part::Version) => "v2_version",
            Self::V2(V2Part::Command) => "v2_command",
            Self::V2(V2Part::Family) => "v2_family",
            Self::V2(V2Part::Unsupported) => "v2_unsupported",
            Self::V2(V2Part::Length) => "v2_length",
            Self::TooLong { .. } => "too_long",
        }
    }
}

/// The part of a v1 header that is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V1Part {
    /// The protocol is not `TCP4`, `TCP6` or `UNKNOWN`.
    Family,
    /// An address is not one of the family's (IPv4 dotted quad for `TCP4`, IPv6 for `TCP6`).
    Address,
    /// A port is not decimal 0-65535 without leading zeros.
    Port,
    /// Fields not separated by single spaces.
    Spacing,
    /// Too few or too many fields, or a byte other than CRLF after the last.
    Fields,
}

impl std::fmt::Display for V1Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Family => "protocol not TCP4, TCP6 or UNKNOWN",
            Self::Address => "address not of the protocol's family",
            Self::Port => "port not decimal 0-65535 without leading zeros",
            Self::Spacing => "fields not separated by single spaces",
            Self::Fields => "wrong number of fields",
        })
    }
}

/// The part of a v2 header that is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V2Part {
    /// The version nibble is not 2.
    Version,
    /// The command is neither `LOCAL` (0) nor `PROXY` (1).
    Command,
    /// A family and transport byte the specification does not assign.
    Family,
    /// `PROXY` over `AF_UNIX` or a datagram transport: not a TCP client to credit.
    Unsupported,
    /// The length does not cover the family's address block.
    Length,
}

impl std::fmt::Display for V2Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Version => "version is not 2",
            Self::Command => "command is neither LOCAL nor PROXY",
            Self::Family => "unassigned address family or transport",
            Self::Unsupported => "PROXY command for a unix socket or datagram transport",
            Self::Length => "length shorter than the address block",
        })
    }
}

/// Reads a PROXY header from the start of `buf` (the first bytes of a connection).
pub fn parse(buf: &[u8]) -> Parse {
    if starts_like(buf, V1_PREFIX) {
        v1::parse(buf)
    } else if starts_like(buf, V2_SIGNATURE) {
        v2::parse(buf)
    } else {
        Parse::NotProxy
    }
}

/// True when `buf` and `magic` agree as far as both go.
fn starts_like(buf: &[u8], magic: &[u8]) -> bool {
    let n = buf.len().min(magic.len());
    buf[..n] == magic[..n]
}

/// Reads the PROXY header at the start of `io` under one `timeout` for the whole header,
/// buffering at most [`MAX_HEADER`] bytes. Returns the header (`None` when `required` is
/// false and the connection does not start with one) and the bytes read past it, which
/// belong to the connection: replay them before reading `io` again (`Upgraded::new`).
pub async fn read_header<S: AsyncRead + Unpin>(
    io: &mut S,
    required: bool,
    timeout: Duration,
) -> Result<(Option<Header>, Bytes), ProxyProtocolError> {
    tokio::time::timeout(timeout, read_until_decided(io, required))
        .await
        .unwrap_or(Err(ProxyProtocolError::Timeout))
}

/// [`read_header`] without its deadline.
async fn read_until_decided<S: AsyncRead + Unpin>(
    io: &mut S,
    required: bool,
) -> Result<(Option<Header>, Bytes), ProxyProtocolError> {
    // Room for a v1 header, or the fixed part and addresses of a v2 one, in one read.
    let mut buf = BytesMut::with_capacity(256);
    loop {
        let room = MAX_HEADER.saturating_sub(buf.len());
        if room == 0 {
            // Unreachable: `parse` decides by MAX_HEADER bytes.
            return Err(ProxyProtocolError::TooLong { max: MAX_HEADER });
        }
        let n = io
            .read_buf(&mut (&mut buf).limit(room))
            .await
            .map_err(|e| ProxyProtocolError::Io(e.kind()))?;
        if n == 0 {
            return Err(ProxyProtocolError::Closed);
        }
        match parse(&buf) {
            Parse::Incomplete => {}
            Parse::NotProxy if required => return Err(ProxyProtocolError::Missing),
            Parse::NotProxy => return Ok((None, buf.freeze())),
            Parse::Done { len, header } => return Ok((Some(header), buf.split_off(len).freeze())),
            Parse::Invalid(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests;
