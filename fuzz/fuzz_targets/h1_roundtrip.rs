//! Answer heads through the codec and back: an upstream's head parsed
//! (`tollgate_h1::response::parse_response`, `body_plan`), written for the client
//! (`tollgate_h1::encode::response_head`), and parsed again as the client would. Checks,
//! besides not panicking: the written head parses, whole (when the answer leaves room under
//! the field limit for the fields the encoder adds), with the same status and phrase;
//! every field but the framing ones and `date` comes back as it was; `date` is the
//! upstream's or exactly one; the framing the encoder said is the framing the client reads
//! (and whether it may reuse the connection); a body framed by length keeps that length.
#![no_main]

use bytes::BytesMut;
use http::header::{CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
use http::{HeaderMap, Version};
use libfuzzer_sys::fuzz_target;
use tollgate_h1::MAX_HEADERS;
use tollgate_h1::body::Framing;
use tollgate_h1::encode::{BodyShape, RequestShape, response_head};
use tollgate_h1::response::{body_plan, parse_response};

fuzz_target!(|data: &[u8]| {
    // The first byte: a HEAD request (bit 0), an HTTP/1.0 client (bit 1), the proxy closes
    // the client's connection after this answer (bit 2).
    let Some((&flags, raw)) = data.split_first() else {
        return;
    };
    let request = RequestShape {
        head: flags & 1 != 0,
        http10: flags & 2 != 0,
    };
    let close_in = flags & 4 != 0;
    let Ok(Some(first)) = parse_response(&mut BytesMut::from(raw), &mut HeaderMap::new()) else {
        return;
    };
    // The encoder adds up to three fields (framing, `connection`, `date`): an answer near
    // the reading limit is written with more fields than the codec (and hyper, whose limit
    // it shares) reads back. The limit bounds what a peer sends, not what the proxy writes
    // (found by this target; such heads are left out of the check).
    if first.headers.len() + 3 > MAX_HEADERS {
        return;
    }
    let interim = first.status.is_informational();
    let plan = if interim {
        None
    } else {
        let Ok(plan) = body_plan(
            first.status,
            first.version,
            &first.headers,
            first.seen,
            request.head,
        ) else {
            return; // refused: never sent on
        };
        Some(plan.0)
    };
    // The body as the proxy hands it on: its size when framed by length, else unknown.
    let shape = match plan {
        None => BodyShape {
            end: true,
            exact: Some(0),
        },
        Some(Framing::Length(n)) => BodyShape {
            end: n == 0,
            exact: Some(n),
        },
        Some(Framing::Chunked | Framing::Close) => BodyShape {
            end: false,
            exact: None,
        },
    };
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status = first.status;
    parts.headers = first.headers.clone();
    let mut out = Vec::new();
    let (framing, close) = response_head(
        &parts,
        first.reason.as_deref(),
        shape,
        request,
        close_in,
        &mut out,
    );
    let mut wire = BytesMut::from(&out[..]);
    let second = match parse_response(&mut wire, &mut HeaderMap::new()) {
        Ok(Some(head)) => head,
        Ok(None) => panic!("an encoded head is partial: {}", out.escape_ascii()),
        Err(e) => panic!("an encoded head is refused ({e}): {}", out.escape_ascii()),
    };
    assert!(
        wire.is_empty(),
        "more than one head: {}",
        out.escape_ascii()
    );
    assert_eq!(second.status, first.status);
    assert_eq!(second.version, Version::HTTP_11);
    assert_eq!(second.reason, first.reason, "the phrase");
    assert!(close || !close_in, "a close asked for was dropped");
    for name in first.headers.keys().chain(second.headers.keys()) {
        if name == CONTENT_LENGTH || name == TRANSFER_ENCODING || name == DATE {
            continue;
        }
        let sent: Vec<_> = first.headers.get_all(name).iter().collect();
        let read: Vec<_> = second.headers.get_all(name).iter().collect();
        assert_eq!(sent, read, "field {name}");
    }
    let dates: Vec<_> = second.headers.get_all(DATE).iter().collect();
    if first.headers.contains_key(DATE) {
        assert_eq!(
            dates,
            first.headers.get_all(DATE).iter().collect::<Vec<_>>()
        );
    } else {
        assert_eq!(dates.len(), 1, "one date added");
    }
    let Some(plan) = plan else {
        assert_eq!(framing, Framing::Length(0), "an interim answer has no body");
        return;
    };
    // What the encoder said is what the client reads.
    let read = body_plan(
        second.status,
        second.version,
        &second.headers,
        second.seen,
        request.head,
    );
    assert_eq!(
        read.ok(),
        Some((framing, !close)),
        "framing said and read differ: {}",
        out.escape_ascii()
    );
    // The body's bytes pass unchanged: a length stays that length, anything else is
    // chunked (or runs to the close for an HTTP/1.0 client).
    let want = match plan {
        Framing::Length(n) => Framing::Length(n),
        _ if request.http10 => Framing::Close,
        _ => Framing::Chunked,
    };
    assert_eq!(framing, want, "{}", out.escape_ascii());
});
