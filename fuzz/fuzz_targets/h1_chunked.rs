//! The chunked-body decoder (`tollgate_h1::body::Decoder`), on arbitrary body bytes, whole
//! and in pieces. Checks, besides not panicking: reading the same bytes in pieces of any
//! size gives the same data, trailers and outcome as reading them at once (the decoder keeps
//! its state right across reads), except for the line and trailer size limits, which are
//! checked only while a line is incomplete.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use tollgate_h1::body::{Decoder, Framing, Step};

#[derive(Debug, PartialEq)]
enum Outcome {
    /// The body ended (with trailers or not).
    Ended {
        trailers: bool,
    },
    /// All bytes read, the body not ended.
    Incomplete,
    Refused(String),
}

/// Decodes `body` fed `piece` bytes at a time: the data and how it ended.
fn decode(body: &[u8], piece: usize) -> (Vec<u8>, Outcome) {
    let mut decoder = Decoder::new(Framing::Chunked);
    let mut pieces = body.chunks(piece);
    let mut buf = BytesMut::new();
    let mut data = Vec::new();
    loop {
        match decoder.decode(&mut buf) {
            Ok(Step::Frame(f)) => match f.into_data() {
                Ok(d) => {
                    assert!(!d.is_empty(), "an empty data frame");
                    data.extend_from_slice(&d);
                }
                Err(_) => return (data, Outcome::Ended { trailers: true }),
            },
            Ok(Step::End) => return (data, Outcome::Ended { trailers: false }),
            Ok(Step::More) => match pieces.next() {
                Some(p) => buf.extend_from_slice(p),
                None => return (data, Outcome::Incomplete),
            },
            Err(e) => return (data, Outcome::Refused(e.to_string())),
        }
    }
}

fn is_limit(o: &Outcome) -> bool {
    matches!(o, Outcome::Refused(e) if e.contains("too long") || e.contains("too large"))
}

fuzz_target!(|data: &[u8]| {
    // The first byte: the size of the pieces.
    let Some((&piece, body)) = data.split_first() else {
        return;
    };
    let whole = decode(body, body.len().max(1));
    let split = decode(body, usize::from(piece).max(1));
    assert!(whole.0.len() <= body.len());
    if !is_limit(&whole.1) && !is_limit(&split.1) {
        assert_eq!(whole, split, "pieces of {piece} bytes decode differently");
    }
});
