//! The request head parser (`tollgate_h1::request::parse_request`), on arbitrary bytes read
//! from a client (pipelined heads included). Every head httparse reads whole is either
//! parsed or refused (no third way). Checks, besides not panicking: a partial or refused
//! head leaves the buffer untouched; a parsed head is exactly the head httparse reads (its
//! length, method, field count), HTTP/1.0 or 1.1, and its body framing agrees with its
//! fields (chunked only with `Transfer-Encoding` and no `Content-Length`, a length only as
//! that field says); a shorter prefix of a parsed head is never decided.
#![no_main]

use bytes::BytesMut;
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use libfuzzer_sys::fuzz_target;
use tollgate_h1::body::Framing;
use tollgate_h1::request::parse_request;

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    // Each parsed head is taken off; at most as many heads as bytes.
    for _ in 0..=data.len() {
        let before = buf.clone();
        let head = match parse_request(&mut buf, 0) {
            Ok(None) => {
                assert_eq!(buf, before, "a partial head takes nothing");
                break;
            }
            Err(_) => {
                assert_eq!(buf, before, "a refused head is not taken");
                break;
            }
            Ok(Some(head)) => head,
        };
        let len = before.len() - buf.len();
        assert!(len > 0 && before.ends_with(&buf), "the rest stays");
        assert_eq!(&head.raw[..], &before[..len], "raw is the head's bytes");
        let mut fields = [httparse::EMPTY_HEADER; 100];
        let mut reference = httparse::Request::new(&mut fields);
        assert_eq!(
            reference.parse(&before).ok(),
            Some(httparse::Status::Complete(len)),
            "parsed a head httparse does not read whole"
        );
        let request = &head.request;
        assert_eq!(Some(request.method().as_str()), reference.method);
        assert_eq!(request.headers().len(), reference.headers.len());
        match reference.version {
            Some(1) => assert_eq!(request.version(), http::Version::HTTP_11),
            _ => {
                assert_eq!(request.version(), http::Version::HTTP_10);
                // RFC 9110 §10.1.1, §7.8: HTTP/1.0 neither expects 100-continue nor upgrades.
                assert!(!head.expect_continue && !head.upgrade);
            }
        }
        let headers = request.headers();
        match head.body {
            Framing::Chunked => {
                assert_eq!(request.version(), http::Version::HTTP_11);
                assert_eq!(headers.get_all(TRANSFER_ENCODING).iter().count(), 1);
                assert!(
                    !headers.contains_key(CONTENT_LENGTH),
                    "chunked beside a length"
                );
            }
            Framing::Length(n) => {
                assert!(
                    !headers.contains_key(TRANSFER_ENCODING),
                    "a length beside chunks"
                );
                let lengths: Vec<_> = headers.get_all(CONTENT_LENGTH).iter().collect();
                match lengths[..] {
                    [] => assert_eq!(n, 0, "a length without content-length"),
                    [v] => assert_eq!(v.as_bytes().trim_ascii(), n.to_string().as_bytes()),
                    _ => panic!("several content-length fields taken"),
                }
            }
            Framing::Close => panic!("a request body framed by the close"),
        }
        // Any shorter prefix of the head is still partial.
        for cut in [len / 2, len - 1] {
            let mut prefix = BytesMut::from(&before[..cut]);
            assert!(
                matches!(parse_request(&mut prefix, 0), Ok(None)),
                "a prefix of {cut} bytes of a parsed head was decided"
            );
            assert_eq!(&prefix[..], &before[..cut]);
        }
    }
});
