//! The request's path. In: the path of an origin-form target (`/a/%2e%2e/b`, no query).
//! Out: its normal form (`/b`), or [`BadPath`].
//!
//! RFC 3986 §6.2.2: percent-encoded unreserved characters are decoded (`%61` → `a`, `%2e` →
//! `.`), other escapes upper-cased (`%2f` → `%2F`) and kept: `%2F` and `%5C` are opaque
//! characters of a segment, never separators. A raw `\` becomes `%5C`, so a backend that
//! reads it as a separator sees what the router matched. Dot-segments are then removed
//! (§5.2.4); one that would climb above `/` is refused, as are a fragment and an invalid
//! escape. With [`PathOptions::merge_slashes`] (the default) runs of `/` become one. A
//! ClientPolicy may refuse `%2F` and `%5C` instead, or decode `%2F` to a separator before
//! dot-segments are removed ([`PathOptions::escaped_slashes`]).

use std::borrow::Cow;

pub use tollgate_api::client::EscapedSlashes;

/// How paths are normalized (ClientPolicy may change these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathOptions {
    /// `//` → `/` (Envoy's edge-proxy guidance: where routing or RBAC depends on the path).
    pub merge_slashes: bool,
    /// `%2F` and `%5C`: kept encoded (opaque), refused, or `%2F` decoded to a separator.
    pub escaped_slashes: EscapedSlashes,
}

impl Default for PathOptions {
    fn default() -> Self {
        Self {
            merge_slashes: true,
            escaped_slashes: EscapedSlashes::Keep,
        }
    }
}

/// Why a path is refused (400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadPath {
    /// `%` not followed by two hex digits.
    #[error("invalid percent-encoding")]
    Escape,
    /// A `#` in the request target.
    #[error("a fragment in the request target")]
    Fragment,
    /// `..` climbing above `/`.
    #[error("the path climbs above /")]
    AboveRoot,
    /// `%2F`, `%5C` or a raw `\` where the port refuses them.
    #[error("an encoded slash or a backslash")]
    EscapedSlash,
}

/// Normalizes `path`; borrows it when it is already normal. A path that does not start with
/// `/` (`*`, an authority-form CONNECT target's empty path) is returned as it is.
pub fn normalize_path(path: &str, opts: PathOptions) -> Result<Cow<'_, str>, BadPath> {
    let b = path.as_bytes();
    if b.first() != Some(&b'/') || !needs_work(b, opts) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode(b, opts.escaped_slashes)?;
    let out = remove_dot_segments(&decoded, opts)?;
    Ok(if out == path {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(out)
    })
}

/// True when `b` may change: an escape, a `\` or `#`, a segment starting with `.`, or `//`.
/// One pass with no early exit, which the compiler vectorises.
fn needs_work(b: &[u8], opts: PathOptions) -> bool {
    let special = b
        .iter()
        .fold(false, |s, &c| s | (c == b'%') | (c == b'\\') | (c == b'#'));
    special
        || b.windows(2)
            .any(|w| w[0] == b'/' && (w[1] == b'.' || (opts.merge_slashes && w[1] == b'/')))
}

fn is_unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Unreserved escapes decoded, others upper-cased, `\` encoded, `#` refused; `%2F` and
/// `%5C` as `slashes` says (`Unescape` decodes `%2F` only: a `\` is never a separator).
fn decode(b: &[u8], slashes: EscapedSlashes) -> Result<String, BadPath> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(b.len() + 4);
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let (Some(hi), Some(lo)) = (
                    b.get(i + 1).copied().and_then(hex),
                    b.get(i + 2).copied().and_then(hex),
                ) else {
                    return Err(BadPath::Escape);
                };
                let v = hi << 4 | lo;
                if v == b'/' || v == b'\\' {
                    match slashes {
                        EscapedSlashes::Reject => return Err(BadPath::EscapedSlash),
                        EscapedSlashes::Unescape if v == b'/' => {
                            out.push(v);
                            i += 3;
                            continue;
                        }
                        _ => {}
                    }
                }
                if is_unreserved(v) {
                    out.push(v);
                } else {
                    out.extend_from_slice(&[b'%', HEX[usize::from(hi)], HEX[usize::from(lo)]]);
                }
                i += 3;
            }
            // Refusing ports refuse a raw one too: it is what `%5C` stands for, and the
            // normal form (`%5C`) must be normal again.
            b'\\' if slashes == EscapedSlashes::Reject => return Err(BadPath::EscapedSlash),
            b'\\' => {
                out.extend_from_slice(b"%5C");
                i += 1;
            }
            b'#' => return Err(BadPath::Fragment),
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    // Only ASCII unreserved bytes were added to what was a `str`.
    String::from_utf8(out).map_err(|_| BadPath::Escape)
}

/// RFC 3986 §5.2.4 on an absolute path, refusing a climb above `/`; merges empty segments
/// when asked.
fn remove_dot_segments(path: &str, opts: PathOptions) -> Result<String, BadPath> {
    let segments: Vec<&str> = path[1..].split('/').collect();
    let last = segments.len() - 1;
    let mut stack: Vec<&str> = Vec::with_capacity(segments.len());
    // The path ends in `/` (its last segment is empty, `.` or `..`).
    let mut trailing = false;
    for (i, seg) in segments.iter().enumerate() {
        match *seg {
            "." => trailing = i == last,
            ".." => {
                stack.pop().ok_or(BadPath::AboveRoot)?;
                trailing = i == last;
            }
            "" if i == last => trailing = true,
            "" if opts.merge_slashes => {}
            s => stack.push(s),
        }
    }
    let mut out = String::with_capacity(path.len());
    for s in &stack {
        out.push('/');
        out.push_str(s);
    }
    if trailing || out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(p: &str) -> Result<String, BadPath> {
        normalize_path(p, PathOptions::default()).map(Cow::into_owned)
    }

    #[test]
    fn normal_paths_are_borrowed() {
        for p in [
            "/",
            "/a",
            "/a/b/",
            "/a.b/c..d",
            "/a-b_c~d",
            "/a;b=c",
            "*",
            "",
        ] {
            let n = normalize_path(p, PathOptions::default()).unwrap();
            assert!(matches!(n, Cow::Borrowed(_)), "{p}");
            assert_eq!(n, p);
        }
    }

    #[test]
    fn rfc3986_normal_form() {
        for (raw, want) in [
            ("/%61dmin", "/admin"),
            ("//admin", "/admin"),
            ("/./admin", "/admin"),
            ("/x/../admin", "/admin"),
            ("/public/%2e%2e/admin", "/admin"),
            ("/public/%2E%2E/admin", "/admin"),
            ("/a/../b", "/b"),
            ("/a/%2e%2e/b", "/b"),
            ("/a/./b", "/a/b"),
            ("/a/.", "/a/"),
            ("/a/b/..", "/a/"),
            ("/a/..", "/"),
            ("/.", "/"),
            ("/a//b//", "/a/b/"),
            ("/a/.b", "/a/.b"),
            ("/a/..b", "/a/..b"),
            ("/.well-known/x", "/.well-known/x"),
            ("/%2561", "/%2561"),
            ("/a%2fb", "/a%2Fb"),
            ("/a%2Fb/..", "/"),
            ("/a%5c..%5cb", "/a%5C..%5Cb"),
            ("/a\\b", "/a%5Cb"),
            ("/a\\..\\b", "/a%5C..%5Cb"),
            ("/%7e%41%2D", "/~A-"),
            ("/%e2%82%ac", "/%E2%82%AC"),
        ] {
            assert_eq!(norm(raw).as_deref(), Ok(want), "{raw}");
            // Idempotent: the normal form is its own normal form.
            assert_eq!(norm(want).as_deref(), Ok(want), "{want}");
        }
    }

    #[test]
    fn refuses_what_is_ambiguous() {
        for (raw, why) in [
            ("/..", BadPath::AboveRoot),
            ("/../a", BadPath::AboveRoot),
            ("/a/../..", BadPath::AboveRoot),
            ("/%2e%2e/a", BadPath::AboveRoot),
            ("/a/%2E%2e/%2e./x/../..", BadPath::AboveRoot),
            ("/a%", BadPath::Escape),
            ("/a%2", BadPath::Escape),
            ("/a%zz", BadPath::Escape),
            ("/a%%30", BadPath::Escape),
            ("/a#frag", BadPath::Fragment),
        ] {
            assert_eq!(norm(raw), Err(why), "{raw}");
        }
    }

    #[test]
    fn slashes_kept_when_merging_is_off() {
        let keep = PathOptions {
            merge_slashes: false,
            ..PathOptions::default()
        };
        let n = |p| normalize_path(p, keep).map(Cow::into_owned);
        assert_eq!(n("//admin").as_deref(), Ok("//admin"));
        assert_eq!(n("/a//../b").as_deref(), Ok("/a/b"));
        assert_eq!(n("/a/./b").as_deref(), Ok("/a/b"));
    }

    #[test]
    fn escaped_slashes_refused_when_the_port_says_so() {
        let reject = PathOptions {
            escaped_slashes: EscapedSlashes::Reject,
            ..PathOptions::default()
        };
        let n = |p| normalize_path(p, reject).map(Cow::into_owned);
        for p in ["/a%2Fb", "/a%2fb", "/a%5Cb", "/a%5c..%5cb", "/%2F"] {
            assert_eq!(n(p), Err(BadPath::EscapedSlash), "{p}");
        }
        // A raw backslash too: its normal form would be `%5C`, refused in turn.
        assert_eq!(n("/a\\b"), Err(BadPath::EscapedSlash));
        // Found by the path fuzz target: the normal form of what is accepted is accepted.
        assert_eq!(n("/DDDDadmi/a\\m`in"), Err(BadPath::EscapedSlash));
        assert_eq!(n("/a/%2e%2e/b").as_deref(), Ok("/b"));
    }

    #[test]
    fn unescaped_slashes_are_separators_before_dot_segments_go() {
        let unescape = PathOptions {
            escaped_slashes: EscapedSlashes::Unescape,
            ..PathOptions::default()
        };
        let n = |p| normalize_path(p, unescape).map(Cow::into_owned);
        for (raw, want) in [
            ("/a%2Fb", "/a/b"),
            ("/public%2F..%2Fadmin", "/admin"),
            ("/a%2F%2Fb", "/a/b"),
            ("/a%5Cb", "/a%5Cb"),
        ] {
            assert_eq!(n(raw).as_deref(), Ok(want), "{raw}");
        }
        assert_eq!(n("/a/b%2F..%2F..%2F..%2Fadmin"), Err(BadPath::AboveRoot));
        assert_eq!(n("/..%2F"), Err(BadPath::AboveRoot));
    }
}
