//! The upstream exchange's answer parsing (`h1`): heads (interim ones skipped), the framing
//! decision, then the body by that framing, on arbitrary bytes an upstream sent. Checks,
//! besides not panicking: the framing agrees with the fields the client will be sent, and a
//! connection is reusable only after an exactly framed HTTP/1.1 answer.
#![no_main]

use bytes::BytesMut;
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use libfuzzer_sys::fuzz_target;
use tollgate_proxy::fuzzing::{BodyFraming, ChunkDecoder, ChunkPiece, parse_response};

fuzz_target!(|data: &[u8]| {
    // The first byte: whether this answers a HEAD request.
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut buf = BytesMut::from(rest);
    let mut interim = 0;
    let (framing, keep) = loop {
        match parse_response(&mut buf, flags & 1 == 1) {
            Ok(Some(head)) => match head.plan {
                None => {
                    assert!(head.status.is_informational());
                    interim += 1;
                    if interim > 100 {
                        return;
                    }
                }
                Some((framing, keep)) => {
                    if framing == BodyFraming::Chunked {
                        assert!(head.headers.contains_key(TRANSFER_ENCODING));
                        assert!(
                            !head.headers.contains_key(CONTENT_LENGTH),
                            "a content-length beside chunks reaches the client"
                        );
                    }
                    if keep {
                        assert_eq!(head.version, http::Version::HTTP_11);
                        assert_ne!(framing, BodyFraming::Close, "reusing a close-delimited");
                    }
                    break (framing, keep);
                }
            },
            Ok(None) | Err(_) => return,
        }
    };
    match framing {
        BodyFraming::Length(n) => {
            let _ = buf.split_to(usize::try_from(n).unwrap_or(usize::MAX).min(buf.len()));
        }
        BodyFraming::Close => buf.clear(),
        BodyFraming::Chunked => {
            let mut decoder = ChunkDecoder::default();
            let mut total = 0;
            loop {
                match decoder.step(&mut buf) {
                    Ok(Some(ChunkPiece::Data(d))) => total += d.len(),
                    Ok(Some(ChunkPiece::Trailers(_) | ChunkPiece::End)) | Ok(None) | Err(_) => {
                        break;
                    }
                }
            }
            assert!(total <= rest.len());
        }
    }
    let _ = keep;
});
