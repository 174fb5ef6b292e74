//! Cache keys. In: the request as routing matched it (method, scheme, the normalized host
//! and path with query, module `intake`), the rule's key settings and the values of its key
//! expressions. Out: the primary key, `METHOD scheme://host/path?query`, readable so a purge
//! can name a prefix of it, and for an answer with `Vary` the secondary key of one variant.
//!
//! Never a raw header: the host is the one routing used (lower case, no port), so two
//! spellings of one name share entries and no unrouted spelling can plant one.

use http::{HeaderMap, HeaderName};
use tollgate_api::cache::QueryKey;

/// `METHOD scheme://host` + path + the query parameters the rule keys on, then one
/// ` #hash` per key expression (`-` when it has no value).
pub(crate) fn primary(
    method: &str,
    scheme: &str,
    host: &str,
    path: &str,
    query: Option<&str>,
    rule: &QueryKey,
) -> String {
    let mut key = String::with_capacity(method.len() + host.len() + path.len() + 16);
    key.push_str(method);
    key.push(' ');
    key.push_str(scheme);
    key.push_str("://");
    key.push_str(&host.to_ascii_lowercase());
    key.push_str(path);
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        let kept: Vec<&str> = match rule {
            QueryKey::All => vec![q],
            // A pair goes in when any parameter a backend may read in it is listed...
            QueryKey::Include(names) => q
                .split('&')
                .filter(|p| pieces(p).any(|piece| listed(names, piece)))
                .collect(),
            // ...and stays out only when every one is.
            QueryKey::Exclude(names) => q
                .split('&')
                .filter(|p| !p.is_empty() && !pieces(p).all(|piece| listed(names, piece)))
                .collect(),
        };
        if !kept.is_empty() {
            key.push('?');
            key.push_str(&kept.join("&"));
        }
    }
    key
}

/// `key` (from [`primary`]) scoped to the route and rule that matched (`namespace/name#rule`)
/// and the key expressions' values.
pub(crate) fn scoped(mut key: String, scope: &str, expression_values: &[Option<String>]) -> String {
    // The route and rule that matched: rules on one path that differ by a header, a method
    // or a rewrite send different requests upstream, so they never share an entry.
    key.push_str(" @");
    key.push_str(scope);
    // The values themselves, length-prefixed so that no value can forge a neighbour: a hash
    // here could be collided on purpose to reach another identity's entry.
    for v in expression_values {
        match v {
            Some(v) => {
                key.push_str(&format!(" #{}:", v.len()));
                key.push_str(v);
            }
            None => key.push_str(" #-"),
        }
    }
    key
}

/// The parameters of one `&`-separated pair as a backend may read them: some (older Python,
/// Java servlet containers) split on `;` too, so `utm_source=x;id=2` is two parameters to
/// them. Deciding on the first name alone let an excluded name carry a parameter that
/// changes the answer past the key: the answer for `id=2` stored under the key without it.
fn pieces(pair: &str) -> impl Iterator<Item = &str> {
    pair.split(';').filter(|piece| !piece.is_empty())
}

fn listed(names: &[String], piece: &str) -> bool {
    names.iter().any(|n| names_equal(n, param_name(piece)))
}

/// A query parameter's name (before `=`), as sent.
fn param_name(p: &str) -> &str {
    p.split_once('=').map_or(p, |(n, _)| n)
}

/// `sent` names the parameter `listed` once percent-decoded (`%61` is `a`; a backend
/// decodes it so). `+` is kept as it is, as routing's query matching keeps it; an invalid
/// escape is its own bytes. The decision reads the decoded name, but the key keeps the
/// pair as sent: spellings a backend may read differently stay apart.
fn names_equal(listed: &str, sent: &str) -> bool {
    if !sent.contains('%') {
        return listed == sent;
    }
    let (mut want, mut got) = (listed.bytes(), sent.as_bytes());
    loop {
        let (byte, rest) = match got {
            [] => return want.next().is_none(),
            [b'%', h, l, rest @ ..] if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => {
                (hex(*h) << 4 | hex(*l), rest)
            }
            [b, rest @ ..] => (*b, rest),
        };
        if want.next() != Some(byte) {
            return false;
        }
        got = rest;
    }
}

fn hex(d: u8) -> u8 {
    match d {
        b'0'..=b'9' => d - b'0',
        b'a'..=b'f' => d - b'a' + 10,
        _ => d - b'A' + 10,
    }
}

/// The names an answer's `Vary` lists (lower case); `None` for `Vary: *` (never stored).
pub(crate) fn vary_names(headers: &HeaderMap) -> Option<Vec<HeaderName>> {
    let mut names = Vec::new();
    for v in headers.get_all(http::header::VARY) {
        let text = v.to_str().ok()?;
        for n in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if n == "*" {
                return None;
            }
            let name = HeaderName::from_bytes(n.as_bytes()).ok()?;
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    Some(names)
}

/// The variant of `primary` a request selects: the values of the `Vary` fields it sent,
/// combined as RFC 9111 §4.1 compares them (several lines joined by `, `, surrounding
/// whitespace dropped; an absent field differs from an empty one).
pub(crate) fn secondary(primary: &str, names: &[HeaderName], request: &HeaderMap) -> String {
    let mut key = String::from(primary);
    for n in names {
        key.push('\u{1e}');
        key.push_str(n.as_str());
        let values: Vec<&str> = request
            .get_all(n)
            .iter()
            .map(|v| v.to_str().map_or("\u{1f}", str::trim))
            .collect();
        if values.is_empty() {
            key.push('\u{0}');
        } else {
            key.push('=');
            key.push_str(&values.join(", "));
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_include_and_exclude() {
        let k = |q: &QueryKey| {
            primary(
                "GET",
                "http",
                "A.example",
                "/p",
                Some("b=2&utm_source=x&a=1"),
                q,
            )
        };
        assert_eq!(
            k(&QueryKey::All),
            "GET http://a.example/p?b=2&utm_source=x&a=1"
        );
        assert_eq!(
            k(&QueryKey::Exclude(vec!["utm_source".into()])),
            "GET http://a.example/p?b=2&a=1"
        );
        assert_eq!(
            k(&QueryKey::Include(vec!["a".into()])),
            "GET http://a.example/p?a=1"
        );
        assert_eq!(
            k(&QueryKey::Include(vec!["z".into()])),
            "GET http://a.example/p"
        );
        // A percent-encoded name is the name it decodes to, kept as sent.
        let enc = |q: &QueryKey, query| primary("GET", "http", "h", "/p", Some(query), q);
        assert_eq!(
            enc(&QueryKey::Include(vec!["a".into()]), "a=1&%61=evil&%6=x"),
            "GET http://h/p?a=1&%61=evil"
        );
        assert_eq!(
            enc(
                &QueryKey::Exclude(vec!["utm_source".into()]),
                "x=1&%75tm%5Fsource=y&a+b=2"
            ),
            "GET http://h/p?x=1&a+b=2"
        );
        assert!(!names_equal("a b", "a+b") && names_equal("a b", "a%20b"));
        // A parameter behind `;` (a separator to some backends) decides as one of its own:
        // an excluded name does not hide it, an unlisted one does not keep it out.
        assert_eq!(
            enc(
                &QueryKey::Exclude(vec!["utm_source".into()]),
                "utm_source=x;id=2&utm_source=y;&b=1"
            ),
            "GET http://h/p?utm_source=x;id=2&b=1"
        );
        assert_eq!(
            enc(&QueryKey::Include(vec!["id".into()]), "x=1;id=2&y=3"),
            "GET http://h/p?x=1;id=2"
        );
        assert_eq!(
            scoped(
                primary("HEAD", "https", "h", "/", None, &QueryKey::All),
                "ns/r#1",
                &[Some("alice #3:bob".to_owned()), None]
            ),
            "HEAD https://h/ @ns/r#1 #12:alice #3:bob #-"
        );
        // Two rules of one route, one path: two keys.
        let rule = |scope| {
            scoped(
                primary("GET", "http", "h", "/", None, &QueryKey::All),
                scope,
                &[],
            )
        };
        assert_ne!(rule("ns/r#0"), rule("ns/r#1"));
        // A value cannot forge a neighbouring one.
        let two = |a: &str, b: &str| {
            scoped(
                primary("GET", "http", "h", "/", None, &QueryKey::All),
                "ns/r#0",
                &[Some(a.to_owned()), Some(b.to_owned())],
            )
        };
        assert_ne!(two("a #1:b", "c"), two("a", "b #1:c"));
    }

    #[test]
    fn vary_star_is_none_and_names_sort() {
        let mut h = HeaderMap::new();
        h.append("vary", "Accept-Language, accept".parse().unwrap());
        let names = vary_names(&h).unwrap();
        assert_eq!(
            names,
            vec![
                HeaderName::from_static("accept"),
                HeaderName::from_static("accept-language")
            ]
        );
        h.append("vary", "*".parse().unwrap());
        assert!(vary_names(&h).is_none());
        let mut req = HeaderMap::new();
        req.append("accept", "text/html".parse().unwrap());
        let a = secondary("k", &names, &req);
        req.append("accept-language", "".parse().unwrap());
        assert_ne!(a, secondary("k", &names, &req));
    }
}
