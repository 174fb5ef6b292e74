//! Hostname intersection and ordering.
//!
//! In: listener and route hostnames (exact `foo.example.com` or wildcard `*.example.com`).
//! Out: the hostnames a route serves on a listener, and the order virtual hosts are emitted in.
//! A wildcard stands for one or more labels: `*.example.com` matches `a.b.example.com` but not
//! `example.com`.

use std::cmp::Ordering;

/// Any host.
pub const ANY: &str = "*";

/// Whether the wildcard pattern `*.suffix` matches `host` (exact or a more specific wildcard).
fn wildcard_covers(pattern: &str, host: &str) -> bool {
    let Some(suffix) = pattern.strip_prefix('*') else {
        return false;
    };
    // `suffix` is `.example.com`; host must have at least one label before it.
    let host_labels = host.strip_prefix("*").unwrap_or(host);
    host.len() > suffix.len()
        && host.ends_with(suffix)
        && !host_labels.is_empty()
        && host_labels != suffix
}

/// The hostname both a listener (None = any) and a route hostname accept, if any.
pub fn intersect(listener: Option<&str>, route: &str) -> Option<String> {
    let route = route.to_ascii_lowercase();
    let Some(listener) = listener else {
        return Some(route);
    };
    let listener = listener.to_ascii_lowercase();
    if listener == route {
        return Some(route);
    }
    if wildcard_covers(&listener, &route) {
        return Some(route);
    }
    if wildcard_covers(&route, &listener) {
        return Some(listener);
    }
    None
}

/// Effective hostnames of a route on a listener: the intersections, or the listener's own
/// hostname (`*` when it has none) for a route without hostnames. Empty = no match.
pub fn effective(listener: Option<&str>, route_hostnames: &[String]) -> Vec<String> {
    if route_hostnames.is_empty() {
        return vec![listener.map_or_else(|| ANY.to_owned(), str::to_ascii_lowercase)];
    }
    let mut out: Vec<String> = route_hostnames
        .iter()
        .filter_map(|h| intersect(listener, h))
        .collect();
    out.sort_by(|a, b| vhost_order(a, b));
    out.dedup();
    out
}

/// Virtual-host order: exact hostnames first (longer first, then alphabetical), then
/// wildcards by length descending (then alphabetical), then `*`.
pub fn vhost_order(a: &str, b: &str) -> Ordering {
    fn class(h: &str) -> u8 {
        if h == ANY {
            2
        } else if h.starts_with('*') {
            1
        } else {
            0
        }
    }
    class(a)
        .cmp(&class(b))
        .then_with(|| b.len().cmp(&a.len()))
        .then_with(|| a.cmp(b))
}

/// Listener order on a port: most specific hostname first, no hostname last.
pub fn listener_order(a: Option<&str>, b: Option<&str>) -> Ordering {
    vhost_order(a.unwrap_or(ANY), b.unwrap_or(ANY))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_equal() {
        assert_eq!(
            intersect(Some("foo.example.com"), "FOO.example.com").as_deref(),
            Some("foo.example.com")
        );
        assert_eq!(intersect(Some("foo.example.com"), "bar.example.com"), None);
    }

    #[test]
    fn listener_wildcard_route_exact() {
        assert_eq!(
            intersect(Some("*.example.com"), "foo.example.com").as_deref(),
            Some("foo.example.com")
        );
        assert_eq!(
            intersect(Some("*.example.com"), "a.b.example.com").as_deref(),
            Some("a.b.example.com")
        );
        assert_eq!(intersect(Some("*.example.com"), "example.com"), None);
    }

    #[test]
    fn route_wildcard_listener_exact() {
        assert_eq!(
            intersect(Some("foo.example.com"), "*.example.com").as_deref(),
            Some("foo.example.com")
        );
        assert_eq!(intersect(Some("example.com"), "*.example.com"), None);
    }

    #[test]
    fn both_wildcards_pick_the_narrower() {
        assert_eq!(
            intersect(Some("*.example.com"), "*.foo.example.com").as_deref(),
            Some("*.foo.example.com")
        );
        assert_eq!(
            intersect(Some("*.foo.example.com"), "*.example.com").as_deref(),
            Some("*.foo.example.com")
        );
        assert_eq!(intersect(Some("*.example.com"), "*.example.org"), None);
    }

    #[test]
    fn no_listener_hostname_takes_route() {
        assert_eq!(intersect(None, "*.x.io").as_deref(), Some("*.x.io"));
        assert_eq!(effective(None, &[]), vec!["*".to_owned()]);
        assert_eq!(effective(Some("A.io"), &[]), vec!["a.io".to_owned()]);
    }

    #[test]
    fn vhost_order_exact_then_wildcards_then_any() {
        let mut v = vec!["*", "*.a.io", "b.io", "*.long.a.io", "longer.b.io"];
        v.sort_by(|a, b| vhost_order(a, b));
        assert_eq!(v, vec!["longer.b.io", "b.io", "*.long.a.io", "*.a.io", "*"]);
    }
}
