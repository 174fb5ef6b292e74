//! The generators of the differential test: request and answer heads, valid and subtly
//! invalid (repeated or obfuscated Content-Length and Transfer-Encoding, odd whitespace, bare
//! CR or LF, NUL and other controls, obs-text, long values), with what may follow them.
//!
//! Half the heads are noisy (any line end, separator, name or value; most are refused for
//! their syntax), half clean in syntax (CRLF, `name: value`, visible text), so that framing
//! and connection fields reach the comparison of parsed heads often, not once in ten.

use proptest::prelude::*;
use proptest::strategy::BoxedStrategy;

const NAMES: &[&str] = &[
    "Host",
    "Content-Length",
    "content-length",
    "CONTENT-LENGTH",
    "Transfer-Encoding",
    "transfer-encoding",
    "Transfer_Encoding",
    "Connection",
    "Upgrade",
    "Expect",
    "TE",
    "X-A",
    "Date",
];

/// Names with whitespace around them, which httparse refuses.
const BAD_NAMES: &[&str] = &[
    "Transfer-Encoding ",
    " Transfer-Encoding",
    "Content-Length\t",
];

/// Values of visible text (and whitespace): lengths, codings, connection options.
const TEXT: &[&str] = &[
    "0",
    "5",
    "00",
    "05",
    "0, 0",
    "5,5",
    "5, 6",
    "0,",
    ",0",
    " 0 ",
    "+5",
    "-1",
    "0x5",
    "5 5",
    "1e3",
    "18446744073709551615",
    "9999999999999999999",
    "10000000000000000000",
    "chunked",
    "Chunked",
    " chunked ",
    "gzip, chunked",
    "chunked, gzip",
    "chunked,",
    "chunked, chunked",
    "identity",
    "chunk",
    "chunked;q=1",
    "keep-alive",
    "close",
    "Close",
    "close, x-a",
    "upgrade",
    "keep-alive, Upgrade",
    "websocket",
    "100-continue",
    "100-Continue",
    "",
    "\t",
];

/// Whole fields that mean something alone, so the framing and connection decisions of
/// clean heads are not mostly "no body, keep".
const MEANT: &[&str] = &[
    "Transfer-Encoding: chunked\r\n",
    "Content-Length: 5\r\n",
    "Content-Length: 0\r\n",
    "Connection: close\r\n",
    "Connection: keep-alive\r\n",
    "Connection: Upgrade\r\n",
    "Upgrade: websocket\r\n",
    "Expect: 100-continue\r\n",
];

/// Values with controls, DEL or obs-text.
const ODD: &[&[u8]] = &[
    b"x\0y",
    b"a\rb",
    b"a\nb",
    b"\x7f",
    b"\x80\xff",
    b"chunked\x80",
    b"\x85chunked",
    b"5\x00",
    b"close\x0b",
];

fn value(clean: bool) -> BoxedStrategy<Vec<u8>> {
    let text = prop::sample::select(TEXT).prop_map(|s| s.as_bytes().to_vec());
    if clean {
        return text.boxed();
    }
    prop_oneof![
        6 => text,
        1 => prop::sample::select(ODD).prop_map(<[u8]>::to_vec),
        1 => (1usize..400).prop_map(|n| vec![b'a'; n]),
    ]
    .boxed()
}

/// `usual` when `clean`; else `usual` three times in four, or one of `odd`.
fn pick(clean: bool, usual: &'static str, odd: &[&'static str]) -> BoxedStrategy<&'static str> {
    if clean {
        return Just(usual).boxed();
    }
    prop_oneof![3 => Just(usual), 1 => prop::sample::select(odd.to_vec())].boxed()
}

fn field(clean: bool) -> impl Strategy<Value = Vec<u8>> {
    let name = if clean {
        prop::sample::select(NAMES).boxed()
    } else {
        prop_oneof![6 => prop::sample::select(NAMES), 1 => prop::sample::select(BAD_NAMES)].boxed()
    };
    (
        name,
        pick(clean, ": ", &[":", ":\t", " : "]),
        value(clean),
        pick(clean, "\r\n", &["\n", "\r", "\r\n "]),
    )
        .prop_map(|(n, sep, v, end)| [n.as_bytes(), sep.as_bytes(), &v, end.as_bytes()].concat())
}

fn fields(clean: bool) -> impl Strategy<Value = Vec<u8>> {
    let field = if clean {
        prop_oneof![
            field(true).boxed(),
            prop::sample::select(MEANT).prop_map(|f| f.as_bytes().to_vec()),
        ]
        .boxed()
    } else {
        field(false).boxed()
    };
    prop::collection::vec(field, 0..6).prop_map(|f| f.concat())
}

fn body() -> impl Strategy<Value = &'static [u8]> {
    prop::sample::select(vec![
        &b""[..],
        b"hello",
        b"5\r\nhello\r\n0\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",
    ])
}

fn request_with(clean: bool) -> impl Strategy<Value = Vec<u8>> {
    let (methods, targets): (&[_], &[_]) = if clean {
        (
            &["GET", "HEAD", "POST"],
            &["/", "/a?b=1", "*", "http://a.test/"],
        )
    } else {
        (
            &["GET", "HEAD", "POST", "CONNECT", "connect", "PRI", "G T"],
            &[
                "/",
                "/a?b=1",
                "*",
                "http://a.test/",
                "a.test:443",
                "/%00",
                "/a\x01b",
                "//x",
            ],
        )
    };
    let versions: &[_] = if clean {
        &["HTTP/1.1", "HTTP/1.1", "HTTP/1.0"]
    } else {
        &["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "http/1.1", "HTTP/1.1 "]
    };
    (
        prop::sample::select(methods),
        prop::sample::select(targets),
        prop::sample::select(versions),
        pick(clean, "\r\n", &["\n"]),
        fields(clean),
        pick(clean, "\r\n", &["\n", ""]),
        body(),
    )
        .prop_map(|(m, t, v, eol, f, end, b)| {
            [
                format!("{m} {t} {v}{eol}").as_bytes(),
                &f,
                end.as_bytes(),
                b,
            ]
            .concat()
        })
}

pub fn request() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![request_with(false), request_with(true)]
}

fn response_with(clean: bool) -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(vec![
            "HTTP/1.1 200 OK",
            "HTTP/1.0 200 OK",
            "HTTP/1.1 204 No Content",
            "HTTP/1.1 304 Not Modified",
            "HTTP/1.1 100 Continue",
            "HTTP/1.1 103 Early Hints",
            "HTTP/1.1 200",
            "HTTP/1.1 200 ",
            "HTTP/1.1 099 Low",
            "HTTP/1.1 999 High",
            "HTTP/1.1 20 Short",
            "HTTP/1.2 200 OK",
            "HTTP/1.1 404 Not\x01Found",
        ]),
        pick(clean, "\r\n", &["\n"]),
        fields(clean),
        pick(clean, "\r\n", &["\n", ""]),
        body(),
    )
        .prop_map(|(s, eol, f, end, b)| {
            [format!("{s}{eol}").as_bytes(), &f, end.as_bytes(), b].concat()
        })
}

pub fn response() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![response_with(false), response_with(true)]
}
