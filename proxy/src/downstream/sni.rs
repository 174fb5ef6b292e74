//! The SNI hostname of a TLS ClientHello, read without terminating TLS (for passthrough).
//!
//! In: the bytes a client sent so far. Out: [`Sni`]: the server name, that more bytes are
//! needed, or why there will never be one. Pure and bounded: the caller reads into a buffer
//! of at most [`MAX_CLIENT_HELLO`] bytes under a timeout and replays the same bytes upstream,
//! so nothing here consumes or changes them.
//!
//! Only what routing needs is parsed: the TLS record layer (handshake records, concatenated,
//! since a ClientHello may span several), the ClientHello's fixed fields, and the
//! `server_name` extension (RFC 6066 §3), whose first `host_name` entry is returned lower-cased.
//! Anything malformed is [`Sni::Invalid`]; the connection is then closed, never guessed at.

/// The most ClientHello bytes buffered before giving up (records of 16 KiB plus headers; a
/// ClientHello with post-quantum key shares is well under this).
pub const MAX_CLIENT_HELLO: usize = 16 * 1024 + 5;

/// What the buffered bytes tell about the server name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sni {
    /// The `host_name` in the server_name extension, lower-cased.
    Found(String),
    /// A ClientHello so far: read more.
    Incomplete,
    /// A whole ClientHello without a server_name (e.g. a client connecting by IP).
    Missing,
    /// Not a TLS ClientHello, or a malformed one.
    Invalid,
}

const RECORD_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST: u8 = 0;

/// Parses the SNI out of the first bytes of a connection.
pub fn parse(buf: &[u8]) -> Sni {
    // Reassemble the handshake payload from consecutive handshake records.
    let mut payload = Vec::new();
    let mut rest = buf;
    loop {
        if rest.len() < 5 {
            break;
        }
        if rest[0] != RECORD_HANDSHAKE || rest[1] != 3 {
            return Sni::Invalid;
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 || len > 16 * 1024 + 256 {
            return Sni::Invalid;
        }
        let Some(fragment) = rest.get(5..5 + len) else {
            payload.extend_from_slice(&rest[5..]);
            break;
        };
        payload.extend_from_slice(fragment);
        rest = &rest[5 + len..];
        if hello_len(&payload).is_some_and(|n| payload.len() >= n) {
            break;
        }
    }
    if buf.first().is_some_and(|&b| b != RECORD_HANDSHAKE) {
        return Sni::Invalid;
    }
    let Some(total) = hello_len(&payload) else {
        return match payload.first() {
            Some(&t) if t != HANDSHAKE_CLIENT_HELLO => Sni::Invalid,
            _ => Sni::Incomplete,
        };
    };
    if payload[0] != HANDSHAKE_CLIENT_HELLO {
        return Sni::Invalid;
    }
    let Some(body) = payload.get(4..total) else {
        return Sni::Incomplete;
    };
    client_hello_sni(body).unwrap_or(Sni::Invalid)
}

/// Length of the handshake message (header included), once its header is buffered.
fn hello_len(payload: &[u8]) -> Option<usize> {
    let h = payload.get(..4)?;
    Some(4 + (usize::from(h[1]) << 16 | usize::from(h[2]) << 8 | usize::from(h[3])))
}

/// A cursor over a byte slice; every read is bounds-checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_be_bytes([b[0], b[1]]))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = usize::from(self.u8()?);
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = usize::from(self.u16()?);
        self.take(n)
    }
}

/// The SNI of a whole ClientHello body; `None` when malformed.
fn client_hello_sni(body: &[u8]) -> Option<Sni> {
    let mut r = Reader(body);
    r.take(2 + 32)?; // legacy_version, random
    r.vec8()?; // legacy_session_id
    r.vec16()?; // cipher_suites
    r.vec8()?; // legacy_compression_methods
    if r.0.is_empty() {
        return Some(Sni::Missing); // no extensions at all
    }
    let mut exts = Reader(r.vec16()?);
    while !exts.0.is_empty() {
        let ty = exts.u16()?;
        let data = exts.vec16()?;
        if ty != EXT_SERVER_NAME {
            continue;
        }
        let mut list = Reader(Reader(data).vec16()?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec16()?;
            if name_type == NAME_TYPE_HOST {
                let name = std::str::from_utf8(name).ok()?;
                if name.is_empty() || !name.is_ascii() {
                    return None;
                }
                return Some(Sni::Found(name.trim_end_matches('.').to_ascii_lowercase()));
            }
        }
        return Some(Sni::Missing);
    }
    Some(Sni::Missing)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;

    use rustls::pki_types::ServerName;

    use super::*;

    /// A real ClientHello, as rustls sends it, for `name`.
    fn client_hello(name: &str) -> Vec<u8> {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let server = ServerName::try_from(name.to_owned()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), server).unwrap();
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).unwrap();
        }
        out
    }

    #[test]
    fn finds_the_server_name_lower_cased() {
        let hello = client_hello("ABC.example.com");
        assert_eq!(parse(&hello), Sni::Found("abc.example.com".into()));
    }

    #[test]
    fn every_prefix_is_incomplete() {
        let hello = client_hello("abc.example.com");
        for n in 0..hello.len() {
            assert_eq!(parse(&hello[..n]), Sni::Incomplete, "prefix of {n} bytes");
        }
    }

    #[test]
    fn an_ip_address_sends_no_server_name() {
        assert_eq!(parse(&client_hello("127.0.0.1")), Sni::Missing);
    }

    #[test]
    fn a_hello_split_over_records_is_reassembled() {
        let hello = client_hello("split.example.com");
        let body = &hello[5..];
        let (a, b) = body.split_at(40);
        let mut split = Vec::new();
        for part in [a, b] {
            split.extend_from_slice(&[22, 3, 1]);
            split.extend_from_slice(&u16::try_from(part.len()).unwrap().to_be_bytes());
            split.extend_from_slice(part);
        }
        assert_eq!(parse(&split), Sni::Found("split.example.com".into()));
        assert_eq!(parse(&split[..50]), Sni::Incomplete);
    }

    #[test]
    fn not_tls_is_invalid() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), Sni::Invalid);
        // A handshake record holding something other than a ClientHello.
        assert_eq!(parse(&[22, 3, 1, 0, 4, 2, 0, 0, 0]), Sni::Invalid);
        // A ClientHello whose fields run past its declared length (40 bytes: version,
        // random, then a session id that does not fit).
        let mut hello = client_hello("abc.example.com");
        hello[6..9].copy_from_slice(&[0, 0, 40]);
        assert_eq!(parse(&hello), Sni::Invalid);
    }
}
