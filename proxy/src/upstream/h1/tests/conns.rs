//! Connections: reuse, replay, tunnels, broken answers.

use super::*;

#[tokio::test]
async fn the_answer_fills_the_request_map_and_leaves_out_a_lone_connection_token() {
    let be = backend(vec![
        answer(&[b"HTTP/1.1 200 OK\r\nServer: be\r\nConnection: Keep-Alive\r\ncontent-length: 2\r\n\r\nok"]),
        answer(&[b"HTTP/1.1 200 OK\r\nconnection: x-hop\r\nx-hop: 1\r\ncontent-length: 2\r\n\r\nok"]),
        answer(&[b"HTTP/1.1 200 OK\r\nConnection: CLOSE\r\ncontent-length: 2\r\n\r\nok"]),
    ])
    .await;
    let pool = Pools::default().pool_for(be.addr, &Default::default());
    let fields = |resp: &Response<PooledBody>| -> Vec<(String, String)> {
        resp.headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect()
    };
    let owned = |f: &[(&str, &str)]| -> Vec<(String, String)> {
        f.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };

    // The request's map, with room to spare, takes the answer's fields and nothing of
    // the request's; `Connection: Keep-Alive` is read, not passed on.
    let mut req = request(Method::GET);
    req.headers_mut().reserve(20);
    let room = req.headers().capacity();
    let resp = pool.send(req, &Added::default()).await.unwrap();
    assert_eq!(
        fields(&resp),
        owned(&[("server", "be"), ("content-length", "2")])
    );
    assert!(resp.headers().capacity() >= room);
    resp.into_body().collect().await.unwrap();
    assert_eq!(pool.idle_len(), 1);

    // A token that names a field stays, for the service to remove both.
    let resp = pool
        .send(request(Method::GET), &Added::default())
        .await
        .unwrap();
    assert_eq!(
        fields(&resp),
        owned(&[
            ("connection", "x-hop"),
            ("x-hop", "1"),
            ("content-length", "2")
        ])
    );
    resp.into_body().collect().await.unwrap();
    assert_eq!(pool.idle_len(), 1);

    // A lone `close`, in any case, is left out too, and still ends the connection.
    let resp = pool
        .send(request(Method::GET), &Added::default())
        .await
        .unwrap();
    assert_eq!(fields(&resp), owned(&[("content-length", "2")]));
    resp.into_body().collect().await.unwrap();
    assert_eq!(pool.idle_len(), 0);
    assert_eq!(be.conns.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_connect_tunnel_never_goes_back_to_a_pool() {
    // A 2xx to CONNECT makes the connection a tunnel whatever its length says (RFC 9112
    // §6.3); module `pool` leaves CONNECT to hyper, which treats it as an upgrade.
    let be = backend(vec![answer(&[
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
    ])])
    .await;
    let pool = Pools::default().pool_for(be.addr, &Default::default());
    let req = Request::builder()
        .method(Method::CONNECT)
        .uri("example.test:443")
        .header("host", "example.test:443")
        .body(empty())
        .unwrap();
    let resp = pool.send(req, &Added::default()).await.unwrap();
    assert_eq!(resp.status(), 200);
    drop(resp);
    assert_eq!(pool.idle_len(), 0);
}

#[tokio::test]
async fn a_body_until_close_ends_at_the_close() {
    let be = backend(vec![Answer {
        pieces: vec![b"HTTP/1.1 200 OK\r\n\r\nuntil ", b"close"],
        close: true,
    }])
    .await;
    let pool = Pools::default().pool_for(be.addr, &Default::default());
    let (status, body, _) = exchange(&pool, Method::GET).await.unwrap();
    assert_eq!((status.as_u16(), &body[..]), (200, &b"until close"[..]));
    assert_eq!(pool.idle_len(), 0);
}

#[tokio::test]
async fn broken_answers_are_errors() {
    let cases: Vec<(&str, Answer, &str)> = vec![
        (
            "chunked HTTP/1.0",
            answer(&[b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"]),
            "send: invalid answer from upstream: transfer-encoding in an HTTP/1.0 answer",
        ),
        (
            "malformed status line",
            answer(&[b"HTTP/1.1 OK\r\n\r\n"]),
            "send: invalid answer from upstream: malformed head",
        ),
        (
            "101 without an upgrade",
            answer(&[b"HTTP/1.1 101 Switching Protocols\r\n\r\n"]),
            "send: invalid answer from upstream: 101 to a request without an upgrade",
        ),
        (
            "chunked and content-length",
            answer(&[b"HTTP/1.1 200 OK\r\ncontent-length: 99\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"]),
            "send: invalid answer from upstream: content-length with transfer-encoding",
        ),
        (
            "first chunk size not hex, with the head",
            answer(&[b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"]),
            "send: invalid answer from upstream: chunk size",
        ),
        (
            "interim answers without end",
            answer(&[b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n"]),
            "send: invalid answer from upstream: too many interim answers",
        ),
        (
            "lengths differ",
            answer(&[b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok"]),
            "send: invalid answer from upstream: content-length values differ",
        ),
        (
            "length not a number",
            answer(&[b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n"]),
            "send: invalid answer from upstream: content-length",
        ),
        (
            "chunk size not hex",
            answer(&[
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                b"zz\r\n",
            ]),
            "body: invalid answer from upstream: chunk size",
        ),
        (
            "chunk without its CRLF",
            answer(&[
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhiXX0\r\n\r\n",
            ]),
            "body: invalid answer from upstream: chunk not followed by CRLF",
        ),
        (
            "closed before the head",
            Answer {
                pieces: vec![b"HTTP/1.1 200"],
                close: true,
            },
            "send: upstream closed the connection before the answer was complete",
        ),
        (
            "closed mid-body",
            Answer {
                pieces: vec![b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"],
                close: true,
            },
            "body: upstream closed the connection before the answer was complete",
        ),
        (
            "closed mid-chunk",
            Answer {
                pieces: vec![b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\na\r\nabc"],
                close: true,
            },
            "body: upstream closed the connection before the answer was complete",
        ),
    ];
    for (name, a, want) in cases {
        let be = backend(vec![a]).await;
        let pool = Pools::default().pool_for(be.addr, &Default::default());
        let got = exchange(&pool, Method::GET).await.expect_err(name);
        assert_eq!(got, want, "{name}");
        assert_eq!(pool.idle_len(), 0, "{name}");
    }
}

#[tokio::test]
async fn a_head_over_the_limit_is_an_error() {
    let big: &'static [u8] = Box::leak(
        [
            &b"HTTP/1.1 200 OK\r\nx-big: "[..],
            &vec![b'a'; MAX_HEAD][..],
        ]
        .concat()
        .into_boxed_slice(),
    );
    let be = backend(vec![answer(&[big])]).await;
    let pool = Pools::default().pool_for(be.addr, &Default::default());
    let got = exchange(&pool, Method::GET).await.unwrap_err();
    assert_eq!(
        got,
        format!("send: answer head larger than {MAX_HEAD} bytes")
    );
}

#[tokio::test]
async fn the_request_head_is_the_request_line_and_fields() {
    let ok: &'static [u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
    let be = backend(vec![answer(&[ok]), answer(&[ok]), answer(&[ok])]).await;
    let pool = Pools::default().pool_for(be.addr, &Default::default());
    for m in [Method::GET, Method::POST, Method::DELETE] {
        exchange(&pool, m).await.unwrap();
    }
    assert_eq!(
        *be.heads.lock().unwrap(),
        [
            "GET /p?q=1 HTTP/1.1\r\nhost: example.test\r\nx-a: 1\r\n\r\n",
            "POST /p?q=1 HTTP/1.1\r\nhost: example.test\r\nx-a: 1\r\ncontent-length: 0\r\n\r\n",
            "DELETE /p?q=1 HTTP/1.1\r\nhost: example.test\r\nx-a: 1\r\n\r\n",
        ]
    );
    // All three on one connection.
    assert_eq!(be.conns.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_connection_the_upstream_closed_while_idle_is_not_used() {
    let ok: &'static [u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    let be = backend(vec![
        Answer {
            pieces: vec![ok],
            close: true,
        },
        answer(&[ok]),
    ])
    .await;
    let pool = Pools::default().pool_for(be.addr, &Default::default());
    exchange(&pool, Method::GET).await.unwrap();
    // The answer was complete, so the connection went back before the close came.
    assert_eq!(pool.idle_len(), 1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (status, body, _) = exchange(&pool, Method::GET).await.unwrap();
    assert_eq!((status.as_u16(), &body[..]), (200, &b"ok"[..]));
    assert_eq!(be.conns.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// The backend closes a reused connection on reading the next request, without a byte of
/// answer (its keep-alive timeout racing the request): an idempotent request goes once
/// more, the same, on a fresh connection; a POST or PATCH does not. A fresh connection
/// closed so is not tried again.
#[tokio::test]
async fn an_idempotent_request_a_reused_connection_dropped_is_sent_again_on_a_fresh_one() {
    let ok: &'static [u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    let dropped = || Answer {
        pieces: Vec::new(),
        close: true,
    };
    let conns = |be: &Backend| be.conns.load(std::sync::atomic::Ordering::SeqCst);
    for (m, again) in [
        (Method::GET, true),
        (Method::PUT, true),
        (Method::DELETE, true),
        (Method::POST, false),
        (Method::PATCH, false),
    ] {
        let be = backend(vec![answer(&[ok]), dropped(), answer(&[ok])]).await;
        let pool = Pools::default().pool_for(be.addr, &Default::default());
        exchange(&pool, Method::GET).await.unwrap();
        assert_eq!(pool.idle_len(), 1, "{m}");
        let got = exchange(&pool, m.clone()).await;
        let heads = be.heads.lock().unwrap().clone();
        if again {
            let (status, body, _) = got.unwrap_or_else(|e| panic!("{m}: {e}"));
            assert_eq!((status.as_u16(), &body[..]), (200, &b"ok"[..]), "{m}");
            assert_eq!(conns(&be), 2, "{m}");
            assert_eq!(heads.len(), 3, "{m}");
            assert_eq!(heads[1], heads[2], "{m}: sent again, the same");
            assert!(heads[2].contains("\r\nx-a: 1\r\n"), "{m}: {}", heads[2]);
        } else {
            let e = got.expect_err(m.as_str());
            assert!(
                e.starts_with("send: upstream closed the connection without answering"),
                "{m}: {e}"
            );
            assert_eq!(conns(&be), 1, "{m}");
            assert_eq!(heads.len(), 2, "{m}");
        }
    }
    let be = backend(vec![dropped(), answer(&[ok])]).await;
    let pool = Pools::default().pool_for(be.addr, &Default::default());
    let e = exchange(&pool, Method::GET).await.unwrap_err();
    assert!(
        e.starts_with("send: upstream closed the connection without answering"),
        "{e}"
    );
    assert_eq!((conns(&be), be.heads.lock().unwrap().len()), (1, 1));
    // An interim answer is a byte of answer: closed after it, the request is not sent
    // again (its field map by then holds the interim answer's fields).
    let be = backend(vec![
        answer(&[ok]),
        Answer {
            pieces: vec![b"HTTP/1.1 100 Continue\r\n\r\n"],
            close: true,
        },
        answer(&[ok]),
    ])
    .await;
    let pool = Pools::default().pool_for(be.addr, &Default::default());
    exchange(&pool, Method::GET).await.unwrap();
    let e = exchange(&pool, Method::GET).await.unwrap_err();
    assert_eq!(
        e,
        "send: upstream closed the connection before the answer was complete"
    );
    assert_eq!((conns(&be), be.heads.lock().unwrap().len()), (1, 2));
}

#[tokio::test]
async fn a_chunked_body_ends_with_its_last_data_when_the_last_chunk_came_along() {
    let be = backend(vec![answer(&[
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    ])])
    .await;
    let pool = Pools::default().pool_for(be.addr, &Default::default());
    let mut body = pool
        .send(request(Method::GET), &Added::default())
        .await
        .unwrap()
        .into_body();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "abc");
    // Known without another poll: the connection is back already.
    assert!(body.is_end_stream());
    assert_eq!(pool.idle_len(), 1);
}
