//! Path normalization (`tollgate_proxy::normalize::normalize_path`) on arbitrary text.
//! Checks, besides not panicking: a normal form is idempotent (its own normal form), starts
//! with `/`, has no dot-segment, no `//` when slashes merge, no `%` escape of an unreserved
//! character and no lower-case hex digit in an escape; an input that is already normal is
//! borrowed unchanged. The first character may pick the options: `m` merges slashes, `r`
//! and `u` merge and refuse (`Reject`) or decode (`Unescape`) `%2F`, `U` decodes without
//! merging; then no `%2F` survives, and a refusing port never accepts `%2F`, `%5C` or `\`.
#![no_main]

use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;
use tollgate_proxy::normalize::{EscapedSlashes, PathOptions, normalize_path};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (merge, escaped, path) = match text.split_at_checked(1) {
        Some(("m", rest)) => (true, EscapedSlashes::Keep, rest),
        Some(("r", rest)) => (true, EscapedSlashes::Reject, rest),
        Some(("u", rest)) => (true, EscapedSlashes::Unescape, rest),
        Some(("U", rest)) => (false, EscapedSlashes::Unescape, rest),
        _ => (false, EscapedSlashes::Keep, text),
    };
    let opts = PathOptions {
        merge_slashes: merge,
        escaped_slashes: escaped,
    };
    let Ok(norm) = normalize_path(path, opts) else {
        return;
    };
    if !path.starts_with('/') {
        assert_eq!(norm, path);
        return;
    }
    assert!(norm.starts_with('/'), "{path:?} -> {norm:?}");
    let again = normalize_path(&norm, opts).expect("a normal form is valid");
    assert!(matches!(again, Cow::Borrowed(_)), "{path:?} -> {norm:?} -> {again:?}");
    for seg in norm.split('/') {
        assert!(seg != "." && seg != "..", "{path:?} -> {norm:?}");
    }
    if merge {
        assert!(!norm.contains("//"), "{path:?} -> {norm:?}");
    }
    assert!(!norm.contains('\\') && !norm.contains('#'), "{norm:?}");
    if escaped != EscapedSlashes::Keep {
        assert!(!norm.contains("%2F"), "{path:?} -> {norm:?}");
    }
    if escaped == EscapedSlashes::Reject {
        let sent = path.to_ascii_uppercase();
        assert!(
            !sent.contains("%2F") && !sent.contains("%5C") && !sent.contains('\\'),
            "{path:?} -> {norm:?}"
        );
    }
    let b = norm.as_bytes();
    for (i, _) in norm.match_indices('%') {
        let (hi, lo) = (b[i + 1], b[i + 2]);
        assert!(hi.is_ascii_hexdigit() && lo.is_ascii_hexdigit(), "{norm:?}");
        assert!(!hi.is_ascii_lowercase() && !lo.is_ascii_lowercase(), "{norm:?}");
        let v = u8::from_str_radix(&norm[i + 1..i + 3], 16).expect("hex");
        assert!(
            !(v.is_ascii_alphanumeric() || matches!(v, b'-' | b'.' | b'_' | b'~')),
            "an unreserved escape survived: {norm:?}"
        );
    }
});
