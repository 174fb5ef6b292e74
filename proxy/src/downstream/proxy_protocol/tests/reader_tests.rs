//! [`read_header`] over in-memory pipes and a loopback socket, the bytes past the header
//! replayed with `Upgraded`, as the listener does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use super::super::*;
use super::v2_proxy;
use crate::upgrade::Upgraded;

const TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n";

fn client() -> Header {
    Header::Proxied {
        source: "192.0.2.1:56324".parse().unwrap(),
        destination: "198.51.100.7:443".parse().unwrap(),
    }
}

/// Everything `io` yields after `leftover`, until the peer closes.
async fn rest(io: impl crate::upgrade::Io, leftover: Bytes) -> Vec<u8> {
    let mut all = Vec::new();
    Upgraded::new(io, leftover)
        .read_to_end(&mut all)
        .await
        .unwrap();
    all
}

#[tokio::test]
async fn a_header_sent_a_byte_at_a_time_still_parses() {
    let v1 = b"PROXY TCP4 192.0.2.1 198.51.100.7 56324 443\r\n".to_vec();
    let Header::Proxied {
        source,
        destination,
    } = client()
    else {
        unreachable!()
    };
    let v2 = v2_proxy(source, destination, &[0x04, 0x00, 0x02, 0, 0]);
    for header in [v1, v2] {
        // A pipe of one byte: each read gets one byte.
        let (mut tx, mut rx) = tokio::io::duplex(1);
        let sent = [header.as_slice(), REQUEST].concat();
        let writer = tokio::spawn(async move { tx.write_all(&sent).await.unwrap() });
        let (got, leftover) = read_header(&mut rx, true, TIMEOUT).await.unwrap();
        assert_eq!(got, Some(client()));
        assert!(leftover.len() <= 1);
        let rest = tokio::join!(rest(rx, leftover), writer).0;
        assert_eq!(rest, REQUEST);
    }
}

#[tokio::test]
async fn bytes_after_the_header_are_returned() {
    let (mut tx, mut rx) = tokio::io::duplex(4096);
    tx.write_all(b"PROXY UNKNOWN\r\n").await.unwrap();
    tx.write_all(REQUEST).await.unwrap();
    let (got, leftover) = read_header(&mut rx, true, TIMEOUT).await.unwrap();
    assert_eq!(got, Some(Header::Local));
    assert_eq!(leftover, REQUEST);
}

#[tokio::test]
async fn optional_mode_serves_plain_http_as_it_came() {
    let (mut tx, mut rx) = tokio::io::duplex(4096);
    tx.write_all(REQUEST).await.unwrap();
    let (got, leftover) = read_header(&mut rx, false, TIMEOUT).await.unwrap();
    assert_eq!(got, None);
    assert_eq!(leftover, REQUEST);
    drop(tx);
    assert_eq!(rest(rx, leftover).await, REQUEST);
}

#[tokio::test]
async fn required_mode_refuses_plain_http() {
    let (mut tx, mut rx) = tokio::io::duplex(4096);
    tx.write_all(REQUEST).await.unwrap();
    let err = read_header(&mut rx, true, TIMEOUT).await.unwrap_err();
    assert_eq!(err, ProxyProtocolError::Missing);
    assert_eq!(err.reason(), "missing");
}

#[tokio::test]
async fn optional_mode_still_refuses_a_malformed_header() {
    let (mut tx, mut rx) = tokio::io::duplex(4096);
    tx.write_all(b"PROXY TCP4 ::1 ::1 1 2\r\n").await.unwrap();
    let err = read_header(&mut rx, false, TIMEOUT).await.unwrap_err();
    assert_eq!(err, ProxyProtocolError::V1(V1Part::Address));
}

#[tokio::test(start_paused = true)]
async fn a_silent_client_times_out() {
    let (_tx, mut rx) = tokio::io::duplex(4096);
    let err = read_header(&mut rx, false, TIMEOUT).await.unwrap_err();
    assert_eq!(err, ProxyProtocolError::Timeout);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_is_for_the_whole_header() {
    // A byte every second, each well within the timeout: the header as a whole is not.
    let (mut tx, mut rx) = tokio::io::duplex(4096);
    let writer = tokio::spawn(async move {
        for &b in b"PROXY TCP4 192.0.2.1 198.51.100.7 56324 443\r\n" {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if tx.write_all(&[b]).await.is_err() {
                return;
            }
        }
    });
    let err = read_header(&mut rx, true, TIMEOUT).await.unwrap_err();
    assert_eq!(err, ProxyProtocolError::Timeout);
    drop(rx);
    writer.await.unwrap();
}

#[tokio::test]
async fn a_client_closing_before_a_decision_is_an_error() {
    for sent in [&b""[..], b"PROXY TCP4 1.2.3.4", b"\r\n\r\n\0\r\nQUIT\n\x21"] {
        let (mut tx, mut rx) = tokio::io::duplex(4096);
        tx.write_all(sent).await.unwrap();
        drop(tx);
        let err = read_header(&mut rx, false, TIMEOUT).await.unwrap_err();
        assert_eq!(err, ProxyProtocolError::Closed, "{sent:?}");
    }
}

#[tokio::test]
async fn an_endless_header_stops_at_its_limit() {
    let (mut tx, mut rx) = tokio::io::duplex(64 * 1024);
    tx.write_all(b"PROXY UNKNOWN ").await.unwrap();
    tx.write_all(&[b'x'; 32 * 1024]).await.unwrap();
    let err = read_header(&mut rx, true, TIMEOUT).await.unwrap_err();
    assert_eq!(err, ProxyProtocolError::TooLong { max: V1_MAX });
    // At most MAX_HEADER bytes were taken from the pipe.
    let mut left = Vec::new();
    drop(tx);
    rx.read_to_end(&mut left).await.unwrap();
    assert!(14 + 32 * 1024 - left.len() <= MAX_HEADER);
}

#[tokio::test]
async fn over_a_loopback_socket() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let Header::Proxied {
        source,
        destination,
    } = client()
    else {
        unreachable!()
    };
    let mut sent = v2_proxy(source, destination, b"\x01\x00\x02h2");
    sent.extend_from_slice(REQUEST);
    let client_task = tokio::spawn(async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&sent).await.unwrap();
        s.shutdown().await.unwrap();
    });
    let (mut stream, _) = listener.accept().await.unwrap();
    let (got, leftover) = read_header(&mut stream, true, TIMEOUT).await.unwrap();
    assert_eq!(got, Some(client()));
    client_task.await.unwrap();
    assert_eq!(rest(stream, leftover).await, REQUEST);
}
