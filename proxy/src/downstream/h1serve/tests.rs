//! Unit tests of the head parsing and request preparation of our HTTP/1 server.

use super::*;

fn parse(raw: &str) -> Parsed {
    parse_request(&mut BytesMut::from(raw))
}

fn served(raw: &str) -> RequestHead {
    match parse(raw) {
        Parsed::Serve(head) => head,
        other => panic!("not served: {other:?}"),
    }
}

#[test]
fn a_bodiless_http11_request_is_served_without_body_machinery() {
    let mut buf =
        BytesMut::from("GET /a?b=1 HTTP/1.1\r\nHost: x.test\r\nX-A: 1\r\nx-a: 2\r\n\r\nGET /next");
    let Parsed::Serve(head) = parse_request(&mut buf) else {
        panic!("not served");
    };
    let (req, shape, reader, pending) = prepare(head);
    assert_eq!(req.uri().path_and_query().unwrap().as_str(), "/a?b=1");
    assert_eq!(req.headers()["host"], "x.test");
    let xa: Vec<_> = req.headers().get_all("x-a").iter().collect();
    assert_eq!(xa, ["1", "2"]);
    assert!(!shape.head && !shape.close && !shape.http10 && !shape.connect);
    assert!(matches!(req.body(), ClientBody::Empty));
    assert!(reader.is_none() && pending.is_none());
    // The pipelined rest stays.
    assert_eq!(&buf[..], b"GET /next");
    assert!(matches!(parse_request(&mut buf), Parsed::Partial));
}

#[test]
fn close_head_and_http10_are_noted() {
    let (req, shape, ..) = prepare(served("HEAD / HTTP/1.1\r\nConnection: Close\r\n\r\n"));
    assert_eq!(req.method(), Method::HEAD);
    assert!(shape.head && shape.close);
    let (_, shape, ..) = prepare(served("GET / HTTP/1.0\r\n\r\n"));
    assert!(shape.http10 && shape.close);
    let (_, shape, ..) = prepare(served("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    assert!(shape.http10 && !shape.close);
}

#[test]
fn every_http1_request_is_served_here() {
    for raw in [
        "POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        "GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        "PUT / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
        "GET / HTTP/1.1\r\nTE: trailers\r\n\r\n",
        "CONNECT a.test:443 HTTP/1.1\r\n\r\n",
        "OPTIONS * HTTP/1.1\r\n\r\n",
        "GET http://a.test/ HTTP/1.1\r\n\r\n",
    ] {
        assert!(matches!(parse(raw), Parsed::Serve(_)), "{raw}");
    }
}

#[test]
fn bodies_get_a_reader_and_upgrades_an_on_upgrade() {
    let (req, _, reader, pending) = prepare(served("POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\n"));
    assert!(matches!(req.body(), ClientBody::H1(_)));
    assert!(reader.is_some() && pending.is_none());
    assert_eq!(
        hyper::body::Body::size_hint(req.body()).exact(),
        Some(3),
        "a length is told upstream"
    );
    let (mut req, _, reader, pending) = prepare(served(
        "GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
    ));
    assert!(reader.is_none() && pending.is_some());
    assert!(
        req.extensions_mut()
            .remove::<upgrade::OnUpgrade>()
            .is_some()
    );
    let (_, shape, _, pending) = prepare(served("CONNECT a.test:443 HTTP/1.1\r\n\r\n"));
    assert!(shape.connect && pending.is_some());
}

#[test]
fn broken_heads_are_refused_with_their_status() {
    for raw in [
        "GET / HTTP/1.1\r\nBad Header: x\r\n\r\n",
        "GET / HTTP/1.1\nHost: a\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
    ] {
        assert!(
            matches!(parse(raw), Parsed::Refuse(StatusCode::BAD_REQUEST)),
            "{raw}"
        );
    }
    let many = format!(
        "GET / HTTP/1.1\r\n{}\r\n",
        "a: b\r\n".repeat(tollgate_h1::MAX_HEADERS + 1)
    );
    assert!(matches!(
        parse(&many),
        Parsed::Refuse(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
    ));
    assert!(matches!(
        parse("GET / HTTP/1.1\r\nHost: a"),
        Parsed::Partial
    ));
}

/// Backpressure: nothing of a body is read off the connection until the body waits for
/// it, then one read gives one frame, and nothing more is read until it waits again.
#[tokio::test]
async fn a_body_is_read_only_while_wanted_one_read_at_a_time() {
    use hyper::body::Body as _;
    use std::task::Waker;
    use tokio::io::AsyncWriteExt as _;

    const SIZE: usize = 1 << 20;
    let (mut client, mut server) = tokio::io::duplex(2 * SIZE);
    client.write_all(&vec![7u8; SIZE]).await.unwrap();
    let (mut reader, mut body) = Reader::new(Framing::Length(SIZE as u64), false);
    let mut rbuf = BytesMut::new();
    let mut cx = Context::from_waker(Waker::noop());
    reader.drive(&mut cx, &mut server, &mut rbuf, false);
    assert!(rbuf.is_empty(), "read before the body was wanted");

    assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
    reader.drive(&mut cx, &mut server, &mut rbuf, false);
    let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut body).poll_frame(&mut cx) else {
        panic!("no frame after one drive");
    };
    let taken = frame.into_data().unwrap().len();
    assert!(taken > 0 && taken + rbuf.len() <= 64 * 1024, "{taken}");
    let read = taken + rbuf.len();
    reader.drive(&mut cx, &mut server, &mut rbuf, false);
    assert_eq!(
        taken + rbuf.len(),
        read,
        "read again before the body waited"
    );
    assert!(!reader.is_done());
    assert_eq!(body.size_hint().exact(), Some((SIZE - taken) as u64));
}
