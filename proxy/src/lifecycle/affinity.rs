//! What keeps a client's requests together. In: the backend's [`HashOn`] (BackendPolicy
//! `loadBalancer.consistentHash`) or the route's [`Session`] (`sessionPersistence`), the
//! request's headers and the client's address, and for an expression key ([`KeyExpr`],
//! compiled with the backend's balancer) the request as policies see it and its
//! `auth.identity`. Out: the key's hash, or none (the request is balanced least-request), and
//! for a cookie key that the request lacked, the `Set-Cookie` that keeps the client's next
//! requests together; for a session, the endpoint it names while it lasts, and the cookie or
//! header that starts or renews it.
//!
//! A session token is `ENDPOINT.BEGAN.SEEN`: a hash of the endpoint's address (as every
//! proxy replica computes it, so any replica honours it) and two Unix times in hex. It names
//! an endpoint and nothing more: a client that forges one picks among the backend's own
//! endpoints, as it could by retrying.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::header::COOKIE;
use http::{HeaderMap, HeaderValue};
use tollgate_api::backend::{HashOn, Session, SessionCarrier};

use crate::lifecycle::policy::cel::{Activation, Attrs, CelError, Expr, Needs};
use crate::upstream::hash::hash;

/// Who sent a request, as an expression key reads it (`source`, `auth.identity`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller<'a> {
    /// The client (`source`): the peer, or what the port's ClientPolicy resolves.
    pub addr: SocketAddr,
    /// `auth.identity`, shared with the authenticator; `None` on a route without AuthPolicy.
    pub identity: Option<&'a Arc<serde_json::Value>>,
}

/// A [`HashOn::Expression`] key, compiled once with its backend's balancer.
///
/// Its value is hashed as a header's value is: a string as it is; an int, uint, double or
/// bool printed (`42`, `true`), as for a success header's expression. A request whose
/// expression fails (a missing field, no identity) or gives anything else (null, a list, a
/// map) has no key: it is balanced least-request, as one without a `header` key is.
#[derive(Debug, Clone)]
pub(crate) struct KeyExpr {
    expr: Expr,
    /// What it reads of a request: its activation copies only that.
    needs: Needs,
}

impl KeyExpr {
    /// Compiles `source` (the compiler checked it with [`crate::lifecycle::policy::cel::check`]).
    pub fn compile(source: &str) -> Result<Self, CelError> {
        let expr = Expr::compile(source)?;
        let needs = std::iter::once(&expr).collect();
        Ok(Self { expr, needs })
    }

    /// The source text.
    pub fn source(&self) -> &str {
        self.expr.source()
    }

    /// The hash of the request's key, if it has one; `identity` is `auth.identity` (null
    /// when `None`).
    pub fn hash(
        &self,
        attrs: &Attrs<'_>,
        identity: Option<&Arc<serde_json::Value>>,
    ) -> Option<u64> {
        self.eval(attrs, identity, |v| v.map(|s| hash(s.as_bytes())))
    }

    /// The expression's value for the request, as a string (`None`: it does not evaluate to
    /// one).
    pub fn value(
        &self,
        attrs: &Attrs<'_>,
        identity: Option<&Arc<serde_json::Value>>,
    ) -> Option<String> {
        self.eval(attrs, identity, |v| v.map(str::to_owned))
    }

    fn eval<T>(
        &self,
        attrs: &Attrs<'_>,
        identity: Option<&Arc<serde_json::Value>>,
        with: impl FnOnce(Option<&str>) -> Option<T>,
    ) -> Option<T> {
        let mut act = Activation::with_needs(attrs, &self.needs);
        if let Some(identity) = identity {
            act.set_identity(identity);
        }
        self.expr.eval_str_with(&act, with)
    }
}

/// The hash of the request's key, and the cookie to set when the key is a cookie it lacked.
pub(crate) fn key(
    on: &HashOn,
    headers: &HeaderMap,
    source: IpAddr,
    secure: bool,
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
                set.push_str(cookie_attributes(secure));
                if let Some(ttl) = ttl_secs {
                    set.push_str(&format!("; Max-Age={ttl}"));
                }
                (
                    Some(hash(value.as_bytes())),
                    HeaderValue::from_str(&set).ok(),
                )
            }
        },
        // Evaluated over the whole request by the balancer's [`KeyExpr`], not here.
        HashOn::Expression(_) => (None, None),
    }
}

/// The endpoint hash and start time a request's session token names, when it has one that
/// has not timed out at `now` (Unix seconds).
pub(crate) fn session(s: &Session, headers: &HeaderMap, now: u64) -> Option<(u64, u64)> {
    let token = match s.carrier {
        SessionCarrier::Cookie => cookie(headers, &s.name)?,
        SessionCarrier::Header => headers.get(s.name.as_str())?.as_bytes(),
    };
    let mut parts = std::str::from_utf8(token).ok()?.split('.');
    let mut hex = || u64::from_str_radix(parts.next()?, 16).ok();
    let (endpoint, began, seen) = (hex()?, hex()?, hex()?);
    let live = |since: u64, limit: Option<u64>| limit.is_none_or(|l| now.saturating_sub(since) < l);
    (began <= now && live(began, s.absolute_secs) && live(seen, s.idle_secs))
        .then_some((endpoint, began))
}

/// The cookie or header that starts or renews a session on `endpoint` (its hash) begun at
/// `began`, seen now.
pub(crate) fn session_field(
    s: &Session,
    endpoint: u64,
    began: u64,
    now: u64,
    secure: bool,
) -> Option<(http::HeaderName, HeaderValue)> {
    let token = format!("{endpoint:016x}.{began:x}.{now:x}");
    match s.carrier {
        SessionCarrier::Header => Some((
            http::HeaderName::from_bytes(s.name.as_bytes()).ok()?,
            HeaderValue::from_str(&token).ok()?,
        )),
        SessionCarrier::Cookie => {
            let mut v = format!("{}={token}{}", s.name, cookie_attributes(secure));
            if s.permanent
                && let Some(max) = s.absolute_secs
            {
                v.push_str(&format!("; Max-Age={}", max.saturating_sub(now - began)));
            }
            Some((http::header::SET_COOKIE, HeaderValue::from_str(&v).ok()?))
        }
    }
}

/// The attributes of a cookie the gateway sets: for every path, out of scripts' reach, not
/// sent on other sites' requests, and only over TLS when it came over TLS.
fn cookie_attributes(secure: bool) -> &'static str {
    if secure {
        "; Path=/; HttpOnly; SameSite=Lax; Secure"
    } else {
        "; Path=/; HttpOnly; SameSite=Lax"
    }
}

/// Unix seconds now.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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
        let (a, _) = key(&on, &headers(&[("x-user-id", "alice")]), IP, false);
        assert_eq!(a, Some(hash(b"alice")));
        assert_eq!(key(&on, &headers(&[]), IP, false), (None, None));
    }

    #[test]
    fn a_cookie_key_is_read_from_any_cookie_field_or_set_when_missing() {
        let on = HashOn::Cookie {
            name: "sid".into(),
            ttl_secs: Some(3600),
        };
        let h = headers(&[("cookie", "a=1"), ("cookie", "b=2; sid = s-42 ; c=3")]);
        assert_eq!(key(&on, &h, IP, false), (Some(hash(b"s-42")), None));
        let (k, set) = key(&on, &headers(&[("cookie", "sidx=1")]), IP, true);
        let set = set.unwrap();
        let set = set.to_str().unwrap();
        assert!(
            set.starts_with("sid=")
                && set.ends_with("; Path=/; HttpOnly; SameSite=Lax; Secure; Max-Age=3600"),
            "{set}"
        );
        let value = &set[4..set.find(';').unwrap()];
        assert_eq!(
            k,
            Some(hash(value.as_bytes())),
            "the next request hashes the same"
        );
    }

    fn attrs<'a>(headers: &'a HeaderMap, path: &'a str) -> Attrs<'a> {
        Attrs {
            method: "GET",
            host: "shop.example",
            path,
            scheme: "https",
            headers,
            source: "10.0.0.7:40000".parse().unwrap(),
        }
    }

    #[test]
    fn an_expression_key_is_its_value_printed_and_none_without_one() {
        let none = headers(&[]);
        let a = attrs(&none, "/orders");
        let alice = Arc::new(serde_json::json!({
            "sub": "alice", "n": 42, "admin": true, "groups": ["a"], "gone": null
        }));
        let sub = KeyExpr::compile("auth.identity.sub").unwrap();
        assert_eq!(sub.hash(&a, Some(&alice)), Some(hash(b"alice")));
        assert_eq!(sub.hash(&a, None), None, "no identity (no AuthPolicy)");
        let bob = Arc::new(serde_json::json!({"name": "bob"}));
        assert_eq!(sub.hash(&a, Some(&bob)), None, "no such field");
        for (src, want) in [
            ("auth.identity.n", Some(hash(b"42"))),
            ("auth.identity.admin", Some(hash(b"true"))),
            ("auth.identity.groups", None),
            ("auth.identity.gone", None),
            ("auth.identity", None),
            ("source.address", Some(hash(b"10.0.0.7"))),
        ] {
            let e = KeyExpr::compile(src).unwrap();
            assert_eq!(e.hash(&a, Some(&alice)), want, "{src}");
        }
        let tenant = KeyExpr::compile("request.headers['x-tenant'] + '/' + request.path").unwrap();
        let acme = headers(&[("x-tenant", "acme")]);
        assert_eq!(
            tenant.hash(&attrs(&acme, "/orders?page=2"), None),
            Some(hash(b"acme//orders?page=2"))
        );
        assert_eq!(tenant.hash(&a, None), None, "no header: no key");
        assert!(KeyExpr::compile("auth.identity.sub ==").is_err());
    }

    fn sess(carrier: SessionCarrier, absolute: Option<u64>, idle: Option<u64>) -> Session {
        Session {
            name: "s".into(),
            carrier,
            absolute_secs: absolute,
            idle_secs: idle,
            permanent: absolute.is_some(),
        }
    }

    #[test]
    fn a_session_token_round_trips_until_it_times_out() {
        let s = sess(SessionCarrier::Cookie, Some(100), Some(10));
        let (name, value) = session_field(&s, 0xabc, 1_000, 1_005, false).unwrap();
        assert_eq!(name, http::header::SET_COOKIE);
        let v = value.to_str().unwrap();
        assert_eq!(
            v,
            "s=0000000000000abc.3e8.3ed; Path=/; HttpOnly; SameSite=Lax; Max-Age=95"
        );
        let h = headers(&[("cookie", "s=0000000000000abc.3e8.3ed")]);
        assert_eq!(session(&s, &h, 1_010), Some((0xabc, 1_000)));
        assert_eq!(session(&s, &h, 1_015), None, "idle for 10s");
        let late = headers(&[("cookie", "s=0000000000000abc.3e8.44c")]);
        assert_eq!(session(&s, &late, 1_099), Some((0xabc, 1_000)));
        assert_eq!(session(&s, &late, 1_100), None, "100s since it began");
        for junk in ["s=abc", "s=x.y.z", "s=1.2", "s=1.ffffffff.1", ""] {
            assert_eq!(
                session(&s, &headers(&[("cookie", junk)]), 1_010),
                None,
                "{junk}"
            );
        }
        let h = sess(SessionCarrier::Header, None, None);
        let (name, value) = session_field(&h, 7, 1, 2, false).unwrap();
        assert_eq!(
            (name.as_str(), value.to_str().unwrap()),
            ("s", "0000000000000007.1.2")
        );
        assert_eq!(session(&h, &headers(&[("s", "7.1.2")]), 5), Some((7, 1)));
    }

    #[test]
    fn a_source_key_is_the_address() {
        let (a, _) = key(&HashOn::SourceIp, &headers(&[]), IP, false);
        assert_eq!(a, Some(hash(&[127, 0, 0, 1])));
    }
}
