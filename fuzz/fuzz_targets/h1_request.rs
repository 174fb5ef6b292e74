//! The server side's HTTP/1 request parser (`h1serve`), on arbitrary bytes read from a
//! client (pipelined heads included). Checks, besides not panicking: bytes left to hyper are
//! untouched; a request served here is exactly the head httparse reads, is HTTP/1.1 in
//! origin form and has no body; a shorter prefix of a served head is never decided.
#![no_main]

use bytes::BytesMut;
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use libfuzzer_sys::fuzz_target;
use tollgate_proxy::fuzzing::{Request, parse_request};

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    // Each served head is taken off; at most as many heads as bytes.
    for _ in 0..=data.len() {
        let before = buf.clone();
        match parse_request(&mut buf) {
            Request::Partial => {
                assert_eq!(buf, before, "a partial head takes nothing");
                break;
            }
            Request::Hyper => {
                assert_eq!(buf, before, "bytes handed to hyper are untouched");
                break;
            }
            Request::Refused(_) => {
                assert_eq!(buf, before, "a refused head is not taken");
                break;
            }
            Request::Served { request, .. } => {
                let len = before.len() - buf.len();
                assert!(len > 0 && before.ends_with(&buf), "the rest stays");
                let mut fields = [httparse::EMPTY_HEADER; 100];
                let mut reference = httparse::Request::new(&mut fields);
                assert_eq!(
                    reference.parse(&before).ok(),
                    Some(httparse::Status::Complete(len)),
                    "served a head httparse does not read whole"
                );
                assert_eq!(request.version(), http::Version::HTTP_11);
                assert!(request.uri().path().starts_with('/'));
                assert_eq!(request.headers().len(), reference.headers.len());
                assert!(!request.headers().contains_key(TRANSFER_ENCODING));
                assert!(
                    request
                        .headers()
                        .get_all(CONTENT_LENGTH)
                        .iter()
                        .all(|v| v == "0"),
                    "served a request with a body"
                );
                // Any shorter prefix of the head is still partial.
                for cut in [len / 2, len - 1] {
                    let mut prefix = BytesMut::from(&before[..cut]);
                    assert!(
                        matches!(parse_request(&mut prefix), Request::Partial),
                        "a prefix of {cut} bytes of a served head was decided"
                    );
                }
            }
        }
    }
});
