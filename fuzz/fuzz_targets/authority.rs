//! Authority parsing (`tollgate_proxy::normalize::parse_authority`) on arbitrary bytes.
//! Checks, besides not panicking: a host accepted is lower-case without a trailing dot,
//! holds no `:` outside IPv6 brackets, no `@`, space or `%`; its text form parses back to
//! the same host and port, unchanged; `unchanged` means the text form is the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_proxy::normalize::parse_authority;

fuzz_target!(|data: &[u8]| {
    let Ok(a) = parse_authority(data) else {
        return;
    };
    let host = &*a.host;
    assert_eq!(host, host.to_ascii_lowercase());
    assert!(!host.ends_with('.'), "{host:?}");
    assert!(!host.contains(['@', ' ', '%', '/', '\\']), "{host:?}");
    if !host.starts_with('[') {
        assert!(!host.contains(':'), "{host:?}");
    }
    let text = a.to_text();
    if a.unchanged {
        assert_eq!(text.as_bytes(), data);
    }
    let back = parse_authority(text.as_bytes()).expect("a normal form parses");
    assert_eq!((&*back.host, back.port), (host, a.port));
    assert!(back.unchanged, "{text:?}");
});
