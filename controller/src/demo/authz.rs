//! A DEMO external authorization service (the HTTP form of AuthPolicy `external`) for
//! examples/ext-authz. It is not an authorization service and must never stand in for one:
//! its tokens are fixed strings published in this file and in the example's README.
//!
//! In: any request under [`PREFIX`] (the gateway's check: the original method, path, and the
//! headers the policy forwards). Out:
//! - `Authorization: Bearer demo-token-alice` (or `-admin`): 200 with `X-Auth-User: alice`
//!   (or `admin`) and `X-Auth-Plan: free` (or `team`);
//! - alice under `/authz/admin`: 403 with `alice may not call /admin` as the body;
//! - anything else: 401 with `WWW-Authenticate: Bearer realm="demo-authz"` and a body.

use http::StatusCode;

/// The paths the demo backend answers as the authorization service.
pub const PREFIX: &str = "/authz/";
/// A demo token for `alice`.
pub const ALICE_TOKEN: &str = "demo-token-alice";
/// A demo token for `admin`.
pub const ADMIN_TOKEN: &str = "demo-token-admin";

/// The decision: status, headers, body.
pub fn answer(
    path: &str,
    authorization: Option<&[u8]>,
) -> (StatusCode, Vec<(&'static str, &'static str)>, &'static str) {
    let token = authorization.and_then(|a| a.strip_prefix(b"Bearer "));
    let who = match token {
        Some(t) if t == ALICE_TOKEN.as_bytes() => Some(("alice", "free")),
        Some(t) if t == ADMIN_TOKEN.as_bytes() => Some(("admin", "team")),
        _ => None,
    };
    match who {
        None => (
            StatusCode::UNAUTHORIZED,
            vec![
                ("www-authenticate", "Bearer realm=\"demo-authz\""),
                ("content-type", "text/plain"),
            ],
            "who are you? (the demo tokens are in examples/ext-authz/README.md)\n",
        ),
        Some(("alice", _)) if path.starts_with("/authz/admin") => (
            StatusCode::FORBIDDEN,
            vec![("content-type", "text/plain")],
            "alice may not call /admin\n",
        ),
        Some((user, plan)) => (
            StatusCode::OK,
            vec![("x-auth-user", user), ("x-auth-plan", plan)],
            "",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions() {
        let bearer = |t: &str| format!("Bearer {t}").into_bytes();
        let (s, h, _) = answer("/authz/orders", Some(&bearer(ALICE_TOKEN)));
        assert_eq!(s, StatusCode::OK);
        assert!(h.contains(&("x-auth-user", "alice")));
        let (s, _, b) = answer("/authz/admin/users", Some(&bearer(ALICE_TOKEN)));
        assert_eq!(
            (s, b),
            (StatusCode::FORBIDDEN, "alice may not call /admin\n")
        );
        let (s, h, _) = answer("/authz/admin/users", Some(&bearer(ADMIN_TOKEN)));
        assert_eq!(s, StatusCode::OK);
        assert!(h.contains(&("x-auth-plan", "team")));
        let (s, h, _) = answer("/authz/orders", Some(b"Bearer nope"));
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        assert!(h.contains(&("www-authenticate", "Bearer realm=\"demo-authz\"")));
        assert_eq!(answer("/authz/orders", None).0, StatusCode::UNAUTHORIZED);
    }
}
