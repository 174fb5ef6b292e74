//! One health check of one endpoint. In: the probe a BackendPolicy sets, the backend's
//! protocol and the endpoint's address. Out: pass, or a [`ProbeError`] saying why not.
//!
//! Every probe opens a connection of its own and closes it when done: a probe never takes a
//! connection from the request pools nor leaves one there, so request traffic is never sent
//! on a connection a probe left in an unknown state, and a probe that passes proves that a
//! new connection can be made. HTTP/1.1 goes through the proxy's own client (module `h1`),
//! HTTP/2 (h2c HTTP probes, gRPC) through hyper's, as requests do. A gRPC probe always speaks
//! HTTP/2, whatever the backend's protocol, as gRPC needs it.
//!
//! A TLS backend (BackendTLSPolicy) is probed over TLS made as its requests' connections are
//! (module `tls`: the policy's CAs, name and client certificate): an HTTP probe speaks HTTP/2
//! when the backend picks it by ALPN, HTTP/1.1 otherwise; a certificate the policy would
//! refuse fails the check, as it would fail every request. A TCP probe is a connect alone,
//! on any backend.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_TYPE, HOST, HeaderValue, USER_AGENT};
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Body;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tollgate_api::BackendProtocol;
use tollgate_api::backend::Probe;

use crate::lifecycle::body::BoxError;
use crate::lifecycle::forward::Added;
use crate::upstream::h1::{self, H1Error};
use crate::upstream::io::UpstreamIo;
use crate::upstream::pool::{CONNECT_TIMEOUT, UpstreamError};
use crate::upstream::tls::TlsClient;

/// Most of an answer's body a probe reads (then stops: the connection is closed anyway).
const MAX_BODY: usize = 64 * 1024;
/// What probes call themselves, so a backend can tell them from traffic in its logs.
const AGENT: &str = "tollgate-health-check";
/// The gRPC health checking protocol's method.
const GRPC_HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";
/// `HealthCheckResponse.ServingStatus.SERVING`.
const SERVING: u64 = 1;

/// Why a check failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    /// No answer within the check's timeout.
    #[error("timed out")]
    Timeout,
    /// The TCP connect failed.
    #[error("connect: {0}")]
    Connect(std::io::Error),
    /// The TLS handshake failed (or the backend's TLS settings could not be built).
    #[error("TLS handshake: {0}")]
    Tls(std::io::Error),
    /// The probe's request could not be built (its path or host is not valid).
    #[error("invalid probe request: {0}")]
    Request(#[from] http::Error),
    /// The probe's path does not start with `/` (it would not be sent as it is written).
    #[error("invalid probe path {0:?}")]
    Path(String),
    /// The HTTP/2 connection ended before the answer did.
    #[error("connection closed before the answer")]
    Closed,
    /// The HTTP/1.1 exchange failed.
    #[error(transparent)]
    H1(#[from] H1Error),
    /// The HTTP/2 connection or stream failed.
    #[error("http/2: {0}")]
    H2(#[from] hyper::Error),
    /// The answer's body failed.
    #[error("answer body: {0}")]
    Body(BoxError),
    /// An HTTP status the check does not expect.
    #[error("status {0}")]
    Status(u16),
    /// The gRPC call ended with a non-zero (or no) `grpc-status`.
    #[error("grpc-status {0}")]
    GrpcStatus(String),
    /// The gRPC answer's message is missing or malformed.
    #[error("gRPC answer: {0}")]
    Grpc(&'static str),
    /// The server answered, but not SERVING.
    #[error("serving status {0}")]
    NotServing(u64),
}

/// A drop-in for the endpoint pool: a probe's connection is never reused.
#[derive(Debug)]
struct Discard;

impl h1::Reuse for Discard {
    fn reuse(&self, _conn: h1::Conn) {}
}

/// Runs `probe` once against `addr`, over TLS when `tls` is set; the caller bounds it with
/// the check's timeout.
pub(crate) async fn check(
    probe: &Probe,
    protocol: BackendProtocol,
    addr: SocketAddr,
    tls: Option<&TlsClient>,
) -> Result<(), ProbeError> {
    if let Probe::Http { path, .. } = probe
        && !path.starts_with('/')
    {
        return Err(ProbeError::Path(path.clone()));
    }
    let tls = match (tls, probe) {
        (Some(tls), Probe::Http { .. } | Probe::Grpc { .. }) => Some(tls),
        _ => None,
    };
    if let Some(tls) = tls {
        tls.usable().map_err(tls_error)?;
    }
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(ProbeError::Connect)?;
    let _ = tcp.set_nodelay(true);
    if let Some(tls) = tls {
        // The check's own timeout (the caller's) is usually the shorter.
        let (stream, h2) = tls
            .handshake_negotiated(tcp, CONNECT_TIMEOUT)
            .await
            .map_err(tls_error)?;
        // The name the policy verifies, as a request to the backend would carry it.
        let authority = &tls.settings.server_name;
        return speak(
            probe,
            authority,
            UpstreamIo::Tls(Box::new(stream)),
            h2,
            "https",
        )
        .await;
    }
    let h2 = protocol == BackendProtocol::H2c;
    speak(probe, &addr.to_string(), UpstreamIo::Plain(tcp), h2, "http").await
}

fn tls_error(e: UpstreamError) -> ProbeError {
    match e {
        UpstreamError::Tls(e) => ProbeError::Tls(e),
        other => ProbeError::Tls(std::io::Error::other(other.to_string())),
    }
}

/// The probe's exchange on a connection made for it: `h2` when HTTP/2 is spoken on it;
/// `authority` is the Host (`:authority`) unless the probe names one.
async fn speak(
    probe: &Probe,
    authority: &str,
    io: UpstreamIo,
    h2: bool,
    scheme: &str,
) -> Result<(), ProbeError> {
    match probe {
        Probe::Tcp => Ok(()),
        Probe::Http {
            path,
            host,
            expected_statuses,
        } => {
            let host = host.as_deref().unwrap_or(authority);
            let status = if h2 {
                let req = Request::get(format!("{scheme}://{host}{path}"))
                    .header(USER_AGENT, AGENT)
                    .body(Full::new(Bytes::new()))?;
                h2_call(io, req).await?.0
            } else {
                h1_get(io, path, host).await?
            };
            if expected_statuses.contains(&status) {
                Ok(())
            } else {
                Err(ProbeError::Status(status))
            }
        }
        Probe::Grpc { service } => grpc_check(io, authority, service, scheme).await,
    }
}

/// `grpc.health.v1.Health/Check` of `service` on a fresh h2c connection on `tcp`: passes on
/// `grpc-status: 0` with a SERVING answer.
async fn grpc_check(
    io: UpstreamIo,
    authority: &str,
    service: &str,
    scheme: &str,
) -> Result<(), ProbeError> {
    let req = Request::post(format!("{scheme}://{authority}{GRPC_HEALTH_CHECK}"))
        .header(CONTENT_TYPE, "application/grpc")
        .header("te", "trailers")
        .header(USER_AGENT, AGENT)
        .body(Full::new(grpc_request(service)))?;
    let (status, headers, body, trailers) = h2_call(io, req).await?;
    if status != 200 {
        return Err(ProbeError::Status(status));
    }
    // A Trailers-Only answer (an error, such as NOT_FOUND for a service the server does not
    // know) carries its grpc-status in the headers.
    let code = trailers
        .as_ref()
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| headers.get("grpc-status"));
    match code.map(HeaderValue::as_bytes) {
        Some(b"0") => {}
        Some(other) => {
            return Err(ProbeError::GrpcStatus(
                String::from_utf8_lossy(other).into_owned(),
            ));
        }
        None => return Err(ProbeError::GrpcStatus("missing".into())),
    }
    match grpc_serving_status(&body)? {
        SERVING => Ok(()),
        other => Err(ProbeError::NotServing(other)),
    }
}

/// GET `path` over HTTP/1.1 on `io`, asking the server to close; the status.
async fn h1_get(io: UpstreamIo, path: &str, host: &str) -> Result<u16, ProbeError> {
    let (mut parts, ()) = Request::get(path)
        .header(HOST, host)
        .header(USER_AGENT, AGENT)
        .header(CONNECTION, "close")
        .body(())?
        .into_parts();
    let resp = h1::Conn::new(io)
        .exchange(&mut parts, &Added::default(), &Arc::new(Discard))
        .await?;
    let status = resp.status().as_u16();
    // Read (a bounded part of) the body so the server finishes its answer before the close.
    read_body(resp).await?;
    Ok(status)
}

/// One HTTP/2 exchange on a fresh connection `io` (h2c, or HTTP/2 over TLS): the status,
/// headers, the body (up to [`MAX_BODY`]) and trailers. The connection is driven here and
/// closed on return.
async fn h2_call<T>(
    io: T,
    req: Request<Full<Bytes>>,
) -> Result<(u16, HeaderMap, Bytes, Option<HeaderMap>), ProbeError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .handshake(TokioIo::new(io))
        .await?;
    let exchange = async {
        let resp = send.send_request(req).await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let (body, trailers) = read_body(resp).await?;
        Ok((status, headers, body, trailers))
    };
    tokio::select! {
        biased;
        r = exchange => r,
        // The connection ended before the exchange did.
        r = conn => Err(r.err().map_or(ProbeError::Closed, ProbeError::H2)),
    }
}

/// Reads up to [`MAX_BODY`] bytes of `resp`'s body and its trailers.
async fn read_body<B>(resp: Response<B>) -> Result<(Bytes, Option<HeaderMap>), ProbeError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut body = resp.into_body();
    let mut data = BytesMut::new();
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ProbeError::Body(e.into()))?;
        match frame.into_data() {
            Ok(chunk) => {
                data.extend_from_slice(&chunk);
                if data.len() >= MAX_BODY {
                    break;
                }
            }
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
    }
    Ok((data.freeze(), trailers))
}

/// A gRPC message (uncompressed) holding a `HealthCheckRequest { service }`: field 1, a
/// string, left out when empty as proto3 does.
pub(crate) fn grpc_request(service: &str) -> Bytes {
    let mut msg = Vec::with_capacity(service.len() + 6);
    if !service.is_empty() {
        msg.push(0x0a);
        put_varint(&mut msg, service.len() as u64);
        msg.extend_from_slice(service.as_bytes());
    }
    let mut framed = Vec::with_capacity(msg.len() + 5);
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(msg.len()).unwrap_or(u32::MAX).to_be_bytes());
    framed.extend_from_slice(&msg);
    Bytes::from(framed)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(buf: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.first()?;
        buf.advance(1);
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The `status` (field 1) of the first gRPC message in `body`, a `HealthCheckResponse`;
/// 0 (UNKNOWN) when the message leaves it out. Fields it does not know are skipped.
pub(crate) fn grpc_serving_status(body: &[u8]) -> Result<u64, ProbeError> {
    let malformed = || ProbeError::Grpc("malformed message");
    let (&[flag, a, b, c, d], rest) = body
        .split_first_chunk::<5>()
        .ok_or(ProbeError::Grpc("no message"))?;
    if flag != 0 {
        // The request offered no compression (no grpc-accept-encoding).
        return Err(ProbeError::Grpc("compressed message"));
    }
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    let mut msg = rest
        .get(..len)
        .ok_or(ProbeError::Grpc("message cut short"))?;
    let mut status = 0;
    while !msg.is_empty() {
        let key = get_varint(&mut msg).ok_or_else(malformed)?;
        let skip = match key & 7 {
            0 => {
                let v = get_varint(&mut msg).ok_or_else(malformed)?;
                if key >> 3 == 1 {
                    status = v;
                }
                0
            }
            1 => 8,
            2 => get_varint(&mut msg).ok_or_else(malformed)?,
            5 => 4,
            _ => return Err(malformed()),
        };
        match usize::try_from(skip) {
            Ok(n) if n <= msg.len() => msg.advance(n),
            _ => return Err(malformed()),
        }
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_health_check_request_names_its_service_in_field_one() {
        assert_eq!(&grpc_request("")[..], [0, 0, 0, 0, 0]);
        assert_eq!(
            &grpc_request("shop.Cart")[..],
            b"\0\0\0\0\x0b\x0a\x09shop.Cart"
        );
        let long = "s".repeat(200);
        let framed = grpc_request(&long);
        // 200 takes two varint bytes: 0xc8 0x01.
        assert_eq!(&framed[..8], [0, 0, 0, 0, 203, 0x0a, 0xc8, 0x01]);
        assert_eq!(framed.len(), 5 + 203);
    }

    #[test]
    fn the_serving_status_is_read_from_field_one_past_unknown_fields() {
        let frame = |msg: &[u8]| {
            let mut f = vec![0];
            f.extend_from_slice(&(msg.len() as u32).to_be_bytes());
            f.extend_from_slice(msg);
            f
        };
        assert_eq!(grpc_serving_status(&frame(&[0x08, 0x01])).unwrap(), 1);
        assert_eq!(grpc_serving_status(&frame(&[0x08, 0x02])).unwrap(), 2);
        // No field: the proto3 default, UNKNOWN.
        assert_eq!(grpc_serving_status(&frame(&[])).unwrap(), 0);
        // A string field 2, a fixed64 field 3 and a fixed32 field 4 before the status.
        let mut msg = vec![0x12, 0x02, b'h', b'i', 0x19];
        msg.extend_from_slice(&[0; 8]);
        msg.push(0x25);
        msg.extend_from_slice(&[0; 4]);
        msg.extend_from_slice(&[0x08, 0x01]);
        assert_eq!(grpc_serving_status(&frame(&msg)).unwrap(), 1);
        for bad in [
            vec![],
            vec![0, 0, 0],
            vec![1, 0, 0, 0, 2, 0x08, 0x01],
            frame(&[0x08]),
            frame(&[0x12, 0x05, b'h']),
            frame(&[0x0b]),
            vec![0, 0, 0, 0, 9, 0x08, 0x01],
        ] {
            assert!(grpc_serving_status(&bad).is_err(), "{bad:?}");
        }
    }
}
