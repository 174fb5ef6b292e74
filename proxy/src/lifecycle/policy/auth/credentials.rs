//! Where a credential is read from. In: a [`tollgate_api::policy::Credentials`] and the
//! request head. Out: the presented credential (a borrowed or percent-decoded string), or
//! `None` when the request does not carry one there.
//!
//! Only the first occurrence counts (first `Authorization` header with the scheme, first
//! header of the name, first query parameter of the name, first cookie of the name), so a
//! request cannot make two readers disagree about which value was verified.

use std::borrow::Cow;

use http::HeaderMap;
use http::header::{AUTHORIZATION, COOKIE, HeaderName};
use tollgate_api::policy::Credentials;

use super::AuthBuildError;

/// Longest credential accepted (tokens beyond this are refused before any parsing).
pub(crate) const MAX_CREDENTIAL_LEN: usize = 16 * 1024;

/// A compiled credential source.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// `Authorization: <scheme> <credential>`; scheme compared case-insensitively. An empty
    /// scheme takes the whole header value.
    Authorization { scheme: String },
    /// A header carrying the bare credential.
    Header(HeaderName),
    /// A query parameter (percent-decoded).
    Query(String),
    /// A cookie.
    Cookie(String),
}

impl Source {
    /// Compiles a table entry.
    pub fn compile(c: &Credentials, method: &str) -> Result<Self, AuthBuildError> {
        Ok(match c {
            Credentials::AuthorizationHeader { prefix } => Self::Authorization {
                scheme: prefix.trim().to_owned(),
            },
            Credentials::CustomHeader { name } => Self::Header(
                HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()).map_err(|_| {
                    AuthBuildError::HeaderName {
                        method: method.to_owned(),
                        name: name.clone(),
                    }
                })?,
            ),
            Credentials::QueryString { name } => Self::Query(name.clone()),
            Credentials::Cookie { name } => Self::Cookie(name.clone()),
        })
    }

    /// The `Authorization` scheme, when the credential is read from that header.
    pub fn scheme(&self) -> Option<&str> {
        match self {
            Self::Authorization { scheme } if !scheme.is_empty() => Some(scheme),
            _ => None,
        }
    }

    /// Reads the credential; `None` when absent, empty or longer than [`MAX_CREDENTIAL_LEN`].
    pub fn extract<'r>(
        &self,
        headers: &'r HeaderMap,
        query: Option<&'r str>,
    ) -> Option<Cow<'r, str>> {
        // Header text is visible ASCII, spaces and tabs (`to_str`), so trimming ASCII
        // whitespace is `str::trim`, without its Unicode tables.
        let found = match self {
            Self::Authorization { scheme } => {
                let value = headers.get(AUTHORIZATION)?.to_str().ok()?.trim_ascii();
                if scheme.is_empty() {
                    Cow::Borrowed(value)
                } else {
                    // The first space ends the scheme (a byte search: the scheme is short).
                    let space = value.bytes().position(|b| b == b' ')?;
                    let got = value.get(..space)?;
                    if !got.eq_ignore_ascii_case(scheme) {
                        return None;
                    }
                    Cow::Borrowed(value.get(space + 1..)?.trim_ascii())
                }
            }
            Self::Header(name) => Cow::Borrowed(headers.get(name)?.to_str().ok()?.trim_ascii()),
            Self::Query(name) => form_urlencoded::parse(query?.as_bytes())
                .find(|(k, _)| k == name.as_str())
                .map(|(_, v)| v)?,
            Self::Cookie(name) => Cow::Borrowed(cookie(headers, name)?),
        };
        (!found.is_empty() && found.len() <= MAX_CREDENTIAL_LEN).then_some(found)
    }
}

/// The first cookie called `name` across every `Cookie` header (RFC 6265 §5.4 pairs separated
/// by `;`), its value without surrounding double quotes.
fn cookie<'r>(headers: &'r HeaderMap, name: &str) -> Option<&'r str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| k.trim() == name)
        .map(|(_, v)| {
            let v = v.trim();
            v.strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(c: Credentials) -> Source {
        Source::compile(&c, "m").unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn authorization_prefix_is_case_insensitive_and_required() {
        let s = src(Credentials::AuthorizationHeader {
            prefix: "Bearer".into(),
        });
        let h = headers(&[("authorization", "bearer  abc.def ")]);
        assert_eq!(s.extract(&h, None).as_deref(), Some("abc.def"));
        let h = headers(&[("authorization", "APIKEY abc")]);
        assert_eq!(s.extract(&h, None), None);
        let h = headers(&[("authorization", "Bearer")]);
        assert_eq!(s.extract(&h, None), None, "a scheme alone carries nothing");
        assert_eq!(s.extract(&HeaderMap::new(), None), None);
        assert_eq!(s.scheme(), Some("Bearer"));
    }

    #[test]
    fn custom_header_takes_the_first_value() {
        let s = src(Credentials::CustomHeader {
            name: "X-Api-Key".into(),
        });
        let h = headers(&[("x-api-key", "one"), ("x-api-key", "two")]);
        assert_eq!(s.extract(&h, None).as_deref(), Some("one"));
        assert_eq!(s.scheme(), None);
    }

    #[test]
    fn query_parameter_is_percent_decoded() {
        let s = src(Credentials::QueryString {
            name: "api_key".into(),
        });
        let h = HeaderMap::new();
        assert_eq!(
            s.extract(&h, Some("a=1&api_key=s%2Fx%2By&api_key=second"))
                .as_deref(),
            Some("s/x+y")
        );
        assert_eq!(s.extract(&h, Some("a=1")), None);
        assert_eq!(s.extract(&h, None), None);
        assert_eq!(s.extract(&h, Some("api_key=")), None, "empty is absent");
    }

    #[test]
    fn cookie_is_found_across_headers_and_unquoted() {
        let s = src(Credentials::Cookie {
            name: "session".into(),
        });
        let h = headers(&[("cookie", "a=1; b=2"), ("cookie", "x=y; session=\"tok\"")]);
        assert_eq!(s.extract(&h, None).as_deref(), Some("tok"));
        let h = headers(&[("cookie", "sessionx=1; xsession=2")]);
        assert_eq!(s.extract(&h, None), None, "names match exactly");
    }

    #[test]
    fn oversized_credentials_are_absent() {
        let s = src(Credentials::CustomHeader { name: "x-k".into() });
        let big = "a".repeat(MAX_CREDENTIAL_LEN + 1);
        let h = headers(&[("x-k", big.as_str())]);
        assert_eq!(s.extract(&h, None), None);
    }

    #[test]
    fn invalid_header_names_are_refused() {
        assert!(matches!(
            Source::compile(
                &Credentials::CustomHeader {
                    name: "bad name".into()
                },
                "m"
            ),
            Err(AuthBuildError::HeaderName { .. })
        ));
    }
}
