//! Path normalization (`tollgate_proxy::normalize::normalize_path`) on arbitrary text.
//! Checks, besides not panicking: a normal form is idempotent (its own normal form), starts
//! with `/`, has no dot-segment, no `//` when slashes merge, no `%` escape of an unreserved
//! character and no lower-case hex digit in an escape; an input that is already normal is
//! borrowed unchanged.
#![no_main]

use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;
use tollgate_proxy::normalize::{PathOptions, normalize_path};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (merge, path) = match text.split_at_checked(1) {
        Some(("m", rest)) => (true, rest),
        _ => (false, text),
    };
    let opts = PathOptions {
        merge_slashes: merge,
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
