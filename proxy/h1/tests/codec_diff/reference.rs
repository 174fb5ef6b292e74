//! The reference the codec is compared with: httparse for the syntax, RFC 9112 §6 (and RFC
//! 9110 §7.6.1, §7.8, §10.1.1) for framing and what a head asks of the connection, written
//! apart from the codec from the same rules. In: raw head bytes. Out: what a strict
//! implementation must make of them, or `None` while the head is incomplete.

use tollgate_h1::body::Framing;

/// The comma-separated elements of every `name` field, trimmed of optional whitespace,
/// lower-cased, empty ones dropped (RFC 9110 §5.6.1), from the raw bytes.
pub fn elements(fields: &[httparse::Header<'_>], name: &str) -> Vec<Vec<u8>> {
    fields
        .iter()
        .filter(|f| f.name.eq_ignore_ascii_case(name))
        .flat_map(|f| f.value.split(|&b| b == b','))
        .map(|e| e.trim_ascii().to_ascii_lowercase())
        .filter(|e| !e.is_empty())
        .collect()
}

pub fn has(fields: &[httparse::Header<'_>], name: &str) -> bool {
    fields.iter().any(|f| f.name.eq_ignore_ascii_case(name))
}

/// Values the http crate can carry (no controls but HTAB, no DEL).
fn values_ok(fields: &[httparse::Header<'_>]) -> bool {
    fields.iter().all(|f| {
        !f.value
            .iter()
            .any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f)
    })
}

/// RFC 9112 §6.3 item 5: every Content-Length element a number, all the same (a list of
/// identical values may be taken as one). Lengths of 20 digits and more are refused, a limit
/// of the implementation (they do not fit a u64 anyway from 10^19 on).
pub fn content_length(fields: &[httparse::Header<'_>]) -> Result<Option<u64>, ()> {
    let mut length = None;
    for f in fields
        .iter()
        .filter(|f| f.name.eq_ignore_ascii_case("content-length"))
    {
        for e in f.value.split(|&b| b == b',') {
            let e = e.trim_ascii();
            if e.is_empty() || e.len() > 19 || !e.iter().all(u8::is_ascii_digit) {
                return Err(());
            }
            let n = std::str::from_utf8(e)
                .map_err(|_| ())?
                .parse::<u64>()
                .map_err(|_| ())?;
            if length.is_some_and(|l| l != n) {
                return Err(());
            }
            length = Some(n);
        }
    }
    Ok(length)
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Answer {
    /// A 1xx answer: skipped.
    Interim,
    /// The body's framing and whether the connection may be used again.
    Final(Framing, bool),
}

/// What a client must make of an answer head (RFC 9112 §6.3); `None` while incomplete.
pub fn response(raw: &[u8], head_request: bool) -> Option<Result<Answer, ()>> {
    let mut fields = [httparse::EMPTY_HEADER; 100];
    let mut resp = httparse::Response::new(&mut fields);
    match resp.parse(raw) {
        Ok(httparse::Status::Partial) => return None,
        Err(_) => return Some(Err(())),
        Ok(httparse::Status::Complete(_)) => {}
    }
    let code = resp.code.unwrap_or(0);
    let http11 = resp.version == Some(1);
    let fields = &*resp.headers;
    if !values_ok(fields) || !(100..=999).contains(&code) {
        return Some(Err(()));
    }
    let te = has(fields, "transfer-encoding");
    let cl = has(fields, "content-length");
    // §6.1: Transfer-Encoding in an HTTP/1.0 message is faulty framing.
    if te && !http11 {
        return Some(Err(()));
    }
    if (100..200).contains(&code) {
        return Some(Ok(Answer::Interim));
    }
    // §6.3 item 3: both framings "ought to be handled as an error"; a strict client refuses
    // the answer (two readers could frame its body two ways).
    if te && cl {
        return Some(Err(()));
    }
    let close = elements(fields, "connection").iter().any(|t| t == b"close");
    let mut keep = http11 && !close;
    // §6.3 items 1-2: no body, whatever the fields say.
    if head_request || code == 204 || code == 304 {
        return Some(Ok(Answer::Final(Framing::Length(0), keep)));
    }
    let framing = if te {
        // §6.3 item 3-4: Transfer-Encoding overrides Content-Length (and the pair is not
        // trusted again); chunked must be the final coding, else the body runs to close.
        keep &= !cl;
        if elements(fields, "transfer-encoding")
            .last()
            .map(Vec::as_slice)
            == Some(b"chunked")
        {
            Framing::Chunked
        } else {
            Framing::Close
        }
    } else {
        match content_length(fields) {
            Err(()) => return Some(Err(())),
            Ok(Some(n)) => Framing::Length(n),
            Ok(None) => Framing::Close,
        }
    };
    keep &= framing != Framing::Close;
    Some(Ok(Answer::Final(framing, keep)))
}

/// How a server must frame a request's body (RFC 9112 §6.3 items 3-6); `Err` for a request
/// it must refuse: a Transfer-Encoding not ending in chunked, Transfer-Encoding beside
/// Content-Length (refused, as the architecture's principle 9 says), a bad Content-Length.
pub fn request_framing(fields: &[httparse::Header<'_>]) -> Result<Framing, ()> {
    if has(fields, "transfer-encoding") {
        if has(fields, "content-length") {
            return Err(());
        }
        return match elements(fields, "transfer-encoding")
            .last()
            .map(Vec::as_slice)
        {
            Some(b"chunked") => Ok(Framing::Chunked),
            _ => Err(()),
        };
    }
    Ok(Framing::Length(content_length(fields)?.unwrap_or(0)))
}

/// What a server must make of a whole request head.
#[derive(Debug, PartialEq)]
pub struct Request {
    /// The head's length in bytes (through its empty line).
    pub len: usize,
    pub method: String,
    pub http11: bool,
    /// How many fields it has.
    pub fields: usize,
    pub body: Framing,
    /// The connection closes after the answer: `Connection: close`, or HTTP/1.0 without
    /// `keep-alive` (RFC 9112 §9.3).
    pub close: bool,
    /// `Expect: 100-continue`, ignored in HTTP/1.0 (RFC 9110 §10.1.1).
    pub expect_continue: bool,
    /// `Upgrade` with the `upgrade` connection option, ignored in HTTP/1.0 (RFC 9110 §7.8).
    pub upgrade: bool,
}

/// What a server must make of a request head: `None` while incomplete; else the request, or
/// `Err` when it must be refused: what httparse refuses, a framing [`refused`] names, a
/// Transfer-Encoding in HTTP/1.0 (RFC 9112 §6.1), a target or field value the `http` types
/// cannot carry, a body framing [`request_framing`] refuses.
pub fn request(raw: &[u8]) -> Option<Result<Request, ()>> {
    let mut fields = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut fields);
    let len = match req.parse(raw) {
        Ok(httparse::Status::Partial) => return None,
        Err(_) => return Some(Err(())),
        Ok(httparse::Status::Complete(len)) => len,
    };
    let fields = &*req.headers;
    let http11 = req.version == Some(1);
    let target_ok = req.path.is_some_and(|p| p.parse::<http::Uri>().is_ok());
    if refused(raw) || !target_ok || !values_ok(fields) {
        return Some(Err(()));
    }
    if !http11 && has(fields, "transfer-encoding") {
        return Some(Err(()));
    }
    let Ok(body) = request_framing(fields) else {
        return Some(Err(()));
    };
    let connection = elements(fields, "connection");
    let option = |o: &[u8]| connection.iter().any(|t| t == o);
    Some(Ok(Request {
        len,
        method: req.method.unwrap_or("").to_owned(),
        http11,
        fields: fields.len(),
        body,
        close: option(b"close") || (!http11 && !option(b"keep-alive")),
        expect_continue: http11
            && fields.iter().any(|f| {
                f.name.eq_ignore_ascii_case("expect")
                    && f.value.trim_ascii().eq_ignore_ascii_case(b"100-continue")
            }),
        upgrade: http11 && has(fields, "upgrade") && option(b"upgrade"),
    }))
}

/// RFC 9112 framing a strict front end refuses (400, connection closed) rather than guess
/// at: a line ending in LF alone, both `Content-Length` and `Transfer-Encoding`, a coding
/// other than one `chunked`, a length other than one plain number (no sign, list, space or
/// leading zero). Written apart from `proxy/h1/src/framing.rs`, from the same rules.
pub fn refused(raw: &[u8]) -> bool {
    let mut fields = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut fields);
    let Ok(httparse::Status::Complete(len)) = req.parse(raw) else {
        return false;
    };
    let head = &raw[..len];
    let bare_lf = head
        .iter()
        .enumerate()
        .any(|(i, &b)| b == b'\n' && (i == 0 || head[i - 1] != b'\r'));
    let values = |name: &str| -> Vec<&[u8]> {
        req.headers
            .iter()
            .filter(|f| f.name.eq_ignore_ascii_case(name))
            .map(|f| f.value.trim_ascii())
            .collect()
    };
    let lengths = values("content-length");
    let codings = values("transfer-encoding");
    let bad_length = lengths.len() > 1
        || lengths.iter().any(|v| {
            v.is_empty()
                || v.len() > 19
                || !v.iter().all(u8::is_ascii_digit)
                || (v.len() > 1 && v[0] == b'0')
        });
    let bad_coding =
        codings.len() > 1 || codings.iter().any(|v| !v.eq_ignore_ascii_case(b"chunked"));
    bare_lf || bad_length || bad_coding || (!lengths.is_empty() && !codings.is_empty())
}
