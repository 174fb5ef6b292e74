//! HTTPRoute `rules[].sessionPersistence` (GEP-1619) into the route table. In: the rule's
//! stanza. Out: the table's [`Session`], or the problem that rejects the route
//! (`UnsupportedValue` naming the field).

use gateway_types::experimental::httproutes::{
    HttpRouteRulesSessionPersistence, HttpRouteRulesSessionPersistenceCookieConfigLifetimeType,
    HttpRouteRulesSessionPersistenceType,
};
use tollgate_api::backend::{Session, SessionCarrier};

use super::conditions::Problem;
use super::rules::{parse_duration_ms, unsupported};

/// The cookie a session travels in when the rule names none.
pub const DEFAULT_COOKIE: &str = "tollgate-session";
/// The header a session travels in when the rule names none.
pub const DEFAULT_HEADER: &str = "x-tollgate-session";

/// Compiles a rule's `sessionPersistence`.
pub fn compile(
    sp: Option<&HttpRouteRulesSessionPersistence>,
    field: &str,
) -> Result<Option<Session>, Problem> {
    let Some(sp) = sp else {
        return Ok(None);
    };
    let carrier = match sp.r#type {
        None | Some(HttpRouteRulesSessionPersistenceType::Cookie) => SessionCarrier::Cookie,
        Some(HttpRouteRulesSessionPersistenceType::Header) => SessionCarrier::Header,
    };
    let name = match (&sp.session_name, carrier) {
        (Some(n), _) => n.clone(),
        (None, SessionCarrier::Cookie) => DEFAULT_COOKIE.to_owned(),
        (None, SessionCarrier::Header) => DEFAULT_HEADER.to_owned(),
    };
    let token = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !token {
        return Err(unsupported(
            &format!("{field}.sessionName"),
            format!("{name:?} is not a cookie or header name"),
        ));
    }
    let secs = |v: Option<&String>, what: &str| -> Result<Option<u64>, Problem> {
        match v {
            None => Ok(None),
            Some(s) => match parse_duration_ms(s) {
                Ok(Some(ms)) if ms >= 1000 => Ok(Some(ms / 1000)),
                Ok(_) => Err(unsupported(
                    &format!("{field}.{what}"),
                    format!("{s:?}: at least 1s"),
                )),
                Err(e) => Err(unsupported(
                    &format!("{field}.{what}"),
                    format!("{s:?}: {e}"),
                )),
            },
        }
    };
    let absolute_secs = secs(sp.absolute_timeout.as_ref(), "absoluteTimeout")?;
    // Gateway API v1.6 dropped `idleTimeout`: the table's idle expiry stays unset.
    let idle_secs = None;
    let permanent = matches!(
        sp.cookie_config
            .as_ref()
            .and_then(|c| c.lifetime_type.as_ref()),
        Some(HttpRouteRulesSessionPersistenceCookieConfigLifetimeType::Permanent)
    );
    if permanent && absolute_secs.is_none() {
        return Err(unsupported(
            &format!("{field}.cookieConfig.lifetimeType"),
            "Permanent needs absoluteTimeout (the cookie's Max-Age)",
        ));
    }
    Ok(Some(Session {
        name: if carrier == SessionCarrier::Header {
            name.to_ascii_lowercase()
        } else {
            name
        },
        carrier,
        absolute_secs,
        idle_secs,
        permanent,
    }))
}
