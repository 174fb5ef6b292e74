//! Hostname matching. In: the request's Host header (or `:authority`) and the hostname
//! patterns of listeners or virtual hosts. Out: the index of the most specific pattern.
//!
//! Specificity, as Gateway API defines it: an exact hostname beats any wildcard, a longer
//! wildcard suffix beats a shorter one, and a catch-all (`*`, or no hostname) comes last.
//! A wildcard `*.example.com` needs at least one label in place of the `*`: it matches
//! `a.example.com` and `a.b.example.com`, never `example.com`.
//!
//! Lookups are hash probes, one for the exact name and one per `.` in the host for
//! wildcards (bounded by the longest wildcard suffix), so their cost does not grow with the
//! number of hostnames.

use std::borrow::Cow;

use crate::FastMap;

/// Strips the `:port` suffix of a Host header value, keeping IPv6 brackets
/// (`[::1]:8080` → `[::1]`). A bare IPv6 literal without brackets is returned whole.
pub fn host_without_port(host: &str) -> &str {
    let b = host.as_bytes();
    if b.first() == Some(&b'[') {
        return match b.iter().position(|&c| c == b']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    // By byte: `str::rfind(char)` cost ~240 instructions per request on a typical host
    // (callgrind). A `:` is ASCII, so `i` is a char boundary.
    match b.iter().rposition(|&c| c == b':') {
        Some(i) if !b[..i].contains(&b':') => &host[..i],
        _ => host,
    }
}

/// Normalises a Host header value for matching: no port, no trailing dot, lower-case.
/// Borrows unless the host has upper-case letters.
pub(crate) fn normalize_host(host: &str) -> Cow<'_, str> {
    // `trim` walks Unicode whitespace from both ends; a host that starts and ends with a
    // visible ASCII character (the usual case) has none to trim.
    let b = host.as_bytes();
    let trimmed =
        b.first().is_some_and(u8::is_ascii_graphic) && b.last().is_some_and(u8::is_ascii_graphic);
    if trimmed && b[0] != b'[' {
        return normalize_name(host);
    }
    let h = host_without_port(if trimmed { host } else { host.trim() });
    let h = h.strip_suffix('.').unwrap_or(h);
    if h.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(h.to_ascii_lowercase())
    } else {
        Cow::Borrowed(h)
    }
}

/// [`normalize_host`] of a trimmed host that is not a bracketed IPv6 literal. Upper-case
/// letters are looked for in one pass without an early exit, which the compiler vectorises,
/// and a port only when the host has a `:` (callgrind: ~280 instructions per request for the
/// three passes `host_without_port`, `strip_suffix` and `any` took).
fn normalize_name(host: &str) -> Cow<'_, str> {
    let b = host.as_bytes();
    let upper = b.iter().fold(false, |u, c| u | c.is_ascii_uppercase());
    let h = if b.contains(&b':') {
        host_without_port(host)
    } else {
        host
    };
    let h = h.strip_suffix('.').unwrap_or(h);
    if upper {
        Cow::Owned(h.to_ascii_lowercase())
    } else {
        Cow::Borrowed(h)
    }
}

/// Index of hostname patterns to values (listener or virtual host positions).
#[derive(Debug, Default)]
pub(crate) struct HostIndex {
    /// Exact hostnames.
    exact: FastMap<Box<str>, usize>,
    /// Wildcards by suffix, leading dot included (`*.example.com` → `.example.com`).
    wildcard: FastMap<Box<str>, usize>,
    /// Length of the longest wildcard suffix: longer host suffixes need no probe.
    max_wildcard_len: usize,
    /// The catch-all (`*`, empty, or no hostname).
    any: Option<usize>,
}

impl HostIndex {
    /// Adds a pattern. `None`, `""` and `"*"` are the catch-all. When two entries have the
    /// same pattern the first one wins (the compiler never emits that; be deterministic).
    pub(crate) fn insert(&mut self, pattern: Option<&str>, value: usize) {
        let pattern = pattern.map(|p| {
            let p = p.trim();
            p.strip_suffix('.').unwrap_or(p).to_ascii_lowercase()
        });
        match pattern.as_deref() {
            None | Some("") | Some("*") => {
                self.any.get_or_insert(value);
            }
            Some(p) => {
                if let Some(suffix) = p.strip_prefix('*') {
                    self.max_wildcard_len = self.max_wildcard_len.max(suffix.len());
                    self.wildcard.entry(suffix.into()).or_insert(value);
                } else {
                    self.exact.entry(p.into()).or_insert(value);
                }
            }
        }
    }

    /// Finds the value of the most specific pattern matching `host`, which must already be
    /// normalised (see [`normalize_host`]).
    pub(crate) fn lookup(&self, host: &str) -> Option<usize> {
        // An empty map still hashes the key: skip it (catch-all listeners have no names).
        if !self.exact.is_empty()
            && let Some(&v) = self.exact.get(host)
        {
            return Some(v);
        }
        if !self.wildcard.is_empty() {
            // Scan left to right so the first hit is the longest suffix. Position 0 is
            // skipped: the `*` must stand for at least one character.
            let start = host.len().saturating_sub(self.max_wildcard_len).max(1);
            let bytes = host.as_bytes();
            for i in start..bytes.len() {
                // A `.` is ASCII, so `i` is a char boundary.
                if bytes[i] == b'.'
                    && let Some(&v) = self.wildcard.get(&host[i..])
                {
                    return Some(v);
                }
            }
        }
        self.any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(patterns: &[Option<&str>]) -> HostIndex {
        let mut h = HostIndex::default();
        for (i, p) in patterns.iter().enumerate() {
            h.insert(*p, i);
        }
        h
    }

    #[test]
    fn port_is_stripped() {
        assert_eq!(host_without_port("a.example.com:8080"), "a.example.com");
        assert_eq!(host_without_port("a.example.com"), "a.example.com");
        assert_eq!(host_without_port(""), "");
        assert_eq!(host_without_port("a.example.com:"), "a.example.com");
    }

    #[test]
    fn ipv6_port_is_stripped_keeping_brackets() {
        assert_eq!(host_without_port("[::1]:80"), "[::1]");
        assert_eq!(host_without_port("[::1]"), "[::1]");
        assert_eq!(host_without_port("::1"), "::1");
        assert_eq!(host_without_port("[::1"), "[::1");
    }

    #[test]
    fn host_is_lowercased_and_trailing_dot_ignored() {
        assert_eq!(normalize_host("Foo.Example.COM.:443"), "foo.example.com");
        assert!(matches!(
            normalize_host("foo.example.com"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn normalisation_agrees_with_its_definition() {
        // The definition: trim, drop the port, drop one trailing dot, lower-case.
        fn definition(host: &str) -> String {
            let h = host_without_port(host.trim());
            h.strip_suffix('.').unwrap_or(h).to_ascii_lowercase()
        }
        for host in [
            "a.example.com",
            "A.Example.COM",
            "a.example.com:8080",
            "A.EXAMPLE.COM.:443",
            "a.example.com.",
            "a.example.com..",
            "host:",
            ":80",
            ":",
            "::1",
            "FE80::1",
            "fe80::1:80",
            "a:b:c",
            "[::1]:80",
            "[FE80::1]",
            "a.example.com:ABC",
            "x",
            ".",
            "\u{e9}.example.com:80",
            "\u{c9}XAMPLE.com",
        ] {
            assert_eq!(normalize_host(host), definition(host), "{host:?}");
        }
    }

    #[test]
    fn surrounding_whitespace_is_trimmed() {
        assert_eq!(normalize_host(" a.example.com:80 "), "a.example.com");
        assert_eq!(normalize_host("\ta.example.com"), "a.example.com");
        assert_eq!(normalize_host("a.example.com\u{a0}"), "a.example.com");
        assert_eq!(normalize_host("a"), "a");
        assert_eq!(normalize_host(""), "");
    }

    #[test]
    fn exact_beats_wildcard_beats_any() {
        let h = idx(&[None, Some("*.example.com"), Some("a.example.com")]);
        assert_eq!(h.lookup("a.example.com"), Some(2));
        assert_eq!(h.lookup("b.example.com"), Some(1));
        assert_eq!(h.lookup("other.org"), Some(0));
    }

    #[test]
    fn longest_wildcard_suffix_wins() {
        let h = idx(&[Some("*.example.com"), Some("*.b.example.com")]);
        assert_eq!(h.lookup("a.b.example.com"), Some(1));
        assert_eq!(h.lookup("a.c.example.com"), Some(0));
    }

    #[test]
    fn wildcard_needs_a_label() {
        let h = idx(&[Some("*.example.com")]);
        assert_eq!(h.lookup("example.com"), None);
        assert_eq!(h.lookup(".example.com"), None);
        assert_eq!(h.lookup("a.example.com"), Some(0));
        assert_eq!(h.lookup("a.b.example.com"), Some(0));
    }

    #[test]
    fn patterns_are_case_insensitive() {
        let h = idx(&[Some("Foo.Example.com"), Some("*.Bar.com.")]);
        assert_eq!(h.lookup("foo.example.com"), Some(0));
        assert_eq!(h.lookup("x.bar.com"), Some(1));
    }

    #[test]
    fn star_and_empty_are_catch_all() {
        assert_eq!(idx(&[Some("*")]).lookup("anything"), Some(0));
        assert_eq!(idx(&[Some("")]).lookup("anything"), Some(0));
        assert_eq!(idx(&[]).lookup("anything"), None);
    }

    #[test]
    fn duplicate_pattern_first_wins() {
        let h = idx(&[Some("a.com"), Some("a.com"), None, None]);
        assert_eq!(h.lookup("a.com"), Some(0));
        assert_eq!(h.lookup("b.com"), Some(2));
    }

    #[test]
    fn odd_hosts_do_not_panic() {
        let h = idx(&[Some("*.é.com"), Some("*.x")]);
        for host in ["", ".", "..", "é", "aé.é.com", "\u{1F600}.x", "a.x"] {
            let _ = h.lookup(&normalize_host(host));
        }
        assert_eq!(h.lookup("aé.é.com"), Some(0));
        assert_eq!(h.lookup("\u{1F600}.x"), Some(1));
    }
}
