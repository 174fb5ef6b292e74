//! The answer side of the codec (`tollgate_h1::response`): heads (interim ones skipped), the
//! framing decision (`body_plan`), then the body by that framing (`body::Decoder`), on
//! arbitrary bytes an upstream sent. Checks, besides not panicking: the framing agrees with
//! the fields the client will be sent, and a connection is reusable only after an exactly
//! framed HTTP/1.1 answer.
#![no_main]

use bytes::BytesMut;
use http::HeaderMap;
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use libfuzzer_sys::fuzz_target;
use tollgate_h1::body::{Decoder, Framing, Step};
use tollgate_h1::response::{body_plan, parse_response};

fuzz_target!(|data: &[u8]| {
    // The first byte: whether this answers a HEAD request.
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut buf = BytesMut::from(rest);
    let mut map = HeaderMap::new();
    let mut interim = 0;
    let (framing, keep) = loop {
        let Ok(Some(head)) = parse_response(&mut buf, &mut map) else {
            return;
        };
        if head.status.is_informational() {
            // The exchange skips interim answers (and refuses a 101).
            interim += 1;
            if interim > 100 {
                return;
            }
            continue;
        }
        let Ok((framing, keep)) = body_plan(
            head.status,
            head.version,
            &head.headers,
            head.seen,
            flags & 1 == 1,
        ) else {
            return;
        };
        if framing == Framing::Chunked {
            assert!(head.headers.contains_key(TRANSFER_ENCODING));
            assert!(
                !head.headers.contains_key(CONTENT_LENGTH),
                "a content-length beside chunks reaches the client"
            );
        }
        if keep {
            assert_eq!(head.version, http::Version::HTTP_11);
            assert_ne!(framing, Framing::Close, "reusing a close-delimited");
        }
        break (framing, keep);
    };
    let mut decoder = Decoder::new(framing);
    let mut total = 0;
    // Each step takes bytes or ends; a frame without bytes can come only as the last one.
    for _ in 0..=rest.len() + 1 {
        match decoder.decode(&mut buf) {
            Ok(Step::Frame(f)) => match f.into_data() {
                Ok(d) => total += d.len(),
                Err(_) => break, // trailers: the body ended
            },
            Ok(Step::End | Step::More) | Err(_) => break,
        }
    }
    assert!(total <= rest.len());
    if let Framing::Length(n) = framing {
        assert!(total as u64 <= n, "more than the length taken");
    }
    let _ = keep;
});
