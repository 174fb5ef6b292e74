//! The key a `ConsistentHash` balancer hashes (BackendPolicy `loadBalancer.consistentHash`).
//! In: the backend's [`HashOn`], the request's headers and the client's address. Out: the
//! key's hash, or none (the request is balanced least-request), and for a cookie key that
//! the request lacked, the `Set-Cookie` that keeps the client's next requests together.

use std::net::IpAddr;

use http::header::COOKIE;
use http::{HeaderMap, HeaderValue};
use tollgate_api::backend::HashOn;

use crate::upstream::hash::hash;

/// The hash of the request's key, and the cookie to set when the key is a cookie it lacked.
pub(crate) fn key(
    on: &HashOn,
    headers: &HeaderMap,
    source: IpAddr,
) -> (Option<u64>, Option<HeaderValue>) {
    match on {
        HashOn::Header(name) => (headers.get(name.as_str()).map(|v| hash(v.as_bytes())), None),
        HashOn::SourceIp => {
            let h = match source {
                IpAddr::V4(a) => hash(&a.octets()),
                IpAddr::V6(a) => hash(&a.octets()),
            };
            (Some(h), None)
        }
        HashOn::Cookie { name, ttl_secs } => match cookie(headers, name) {
            Some(v) => (Some(hash(v)), None),
            None => {
                let value = crate::lifecycle::forward::generate_request_id();
                let mut set = format!("{name}=");
                set.push_str(value.to_str().unwrap_or_default());
                set.push_str("; Path=/; HttpOnly");
                if let Some(ttl) = ttl_secs {
                    set.push_str(&format!("; Max-Age={ttl}"));
                }
                (
                    Some(hash(value.as_bytes())),
                    HeaderValue::from_str(&set).ok(),
                )
            }
        },
        // Refused by the compiler until the proxy evaluates it; never in a table.
        HashOn::Expression(_) => (None, None),
    }
}

/// The value of the first cookie named `name` in the request's `Cookie` fields.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h [u8]> {
    headers
        .get_all(COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|&b| b == b'=')?;
            (pair[..eq].trim_ascii() == name.as_bytes()).then(|| pair[eq + 1..].trim_ascii())
        })
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn a_header_key_is_its_value_and_a_missing_one_is_none() {
        let on = HashOn::Header("x-user-id".into());
        let (a, _) = key(&on, &headers(&[("x-user-id", "alice")]), IP);
        assert_eq!(a, Some(hash(b"alice")));
        assert_eq!(key(&on, &headers(&[]), IP), (None, None));
    }

    #[test]
    fn a_cookie_key_is_read_from_any_cookie_field_or_set_when_missing() {
        let on = HashOn::Cookie {
            name: "sid".into(),
            ttl_secs: Some(3600),
        };
        let h = headers(&[("cookie", "a=1"), ("cookie", "b=2; sid = s-42 ; c=3")]);
        assert_eq!(key(&on, &h, IP), (Some(hash(b"s-42")), None));
        let (k, set) = key(&on, &headers(&[("cookie", "sidx=1")]), IP);
        let set = set.unwrap();
        let set = set.to_str().unwrap();
        assert!(set.starts_with("sid=") && set.ends_with("; Path=/; HttpOnly; Max-Age=3600"));
        let value = &set[4..set.find(';').unwrap()];
        assert_eq!(
            k,
            Some(hash(value.as_bytes())),
            "the next request hashes the same"
        );
    }

    #[test]
    fn a_source_key_is_the_address() {
        let (a, _) = key(&HashOn::SourceIp, &headers(&[]), IP);
        assert_eq!(a, Some(hash(&[127, 0, 0, 1])));
    }
}
