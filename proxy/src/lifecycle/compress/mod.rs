//! Response compression (ClientPolicy `compression`). In: a port's [`Compression`]
//! settings (at table build, [`Settings`]), the request (at arrival, [`Offer::new`]: its
//! method and `Accept-Encoding`), then the upstream's response. Out: the response as it
//! leaves ([`Offer::apply`]): untouched, or with `Vary: Accept-Encoding`, or compressed.
//!
//! A response is compressible (and so gets `Vary: Accept-Encoding`, merged into any `Vary`
//! it has) when its status carries a representation (not 1xx, 204, 206 or 304), it has no
//! `Content-Range`, no `Content-Encoding` (even `identity`: the upstream chose its form),
//! no `Cache-Control: no-transform`, a media type in the list (never gRPC), and no declared
//! `Content-Length` under `minBytes` (one of unknown length is compressed). It is then
//! compressed when the client accepts a coding ([`accept::choose`]): `Content-Encoding` is
//! set, `Content-Length` and `Accept-Ranges` go (the encoded body's length and ranges are
//! not the upstream's), and a strong `ETag` becomes weak, as nginx's gzip filter does. A
//! HEAD response gets the same header fields as GET would, with no body. Requests that
//! upgrade or CONNECT, and gRPC calls, are never offered compression.

pub(crate) mod accept;
pub(crate) mod body;

use std::sync::Arc;

use http::header::{
    ACCEPT_ENCODING, ACCEPT_RANGES, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE,
    CONTENT_TYPE, ETAG, VARY,
};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Body as _;
use tollgate_api::client::{Compression, Encoding};

use crate::lifecycle::body::ProxyBody;
use crate::metrics::Metrics;

use self::body::CompressBody;

/// A port's compression settings, ready for requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    algorithms: Vec<Encoding>,
    min_bytes: u64,
    /// gzip's level (see [`body::Levels`]).
    levels: body::Levels,
    /// Lower-case media types; `type/*` entries as the type and `/`.
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl Settings {
    pub(crate) fn new(c: &Compression) -> Self {
        let (mut exact, mut prefixes) = (Vec::new(), Vec::new());
        for t in &c.content_types {
            let t = t.to_ascii_lowercase();
            match t.strip_suffix('*') {
                Some(prefix) if prefix.ends_with('/') => prefixes.push(prefix.to_owned()),
                _ => exact.push(t),
            }
        }
        Self {
            algorithms: c.algorithms.clone(),
            min_bytes: c.min_bytes,
            levels: body::Levels::new(c.gzip_level),
            exact,
            prefixes,
        }
    }

    /// True when the media type of `content_type` (parameters and case aside) is listed;
    /// gRPC never is.
    fn compresses(&self, content_type: &HeaderValue) -> bool {
        let Ok(v) = content_type.to_str() else {
            return false;
        };
        let media = v.split(';').next().unwrap_or_default().trim();
        if starts_with_ci(media, "application/grpc") {
            return false;
        }
        self.exact.iter().any(|t| media.eq_ignore_ascii_case(t))
            || self
                .prefixes
                .iter()
                .any(|p| starts_with_ci(media, p) && media.len() > p.len())
    }
}

fn starts_with_ci(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

/// What a request was offered: the port's settings and the coding its client accepts.
#[derive(Debug)]
pub(crate) struct Offer {
    settings: Arc<Settings>,
    choice: Option<Encoding>,
    head: bool,
}

impl Offer {
    /// The offer for `req` on a port with `settings`; `None` for a request whose answer is
    /// never compressed (an upgrade, a CONNECT, a gRPC call).
    pub(crate) fn new<B>(
        settings: &Arc<Settings>,
        req: &Request<B>,
        upgrade: bool,
        grpc: bool,
    ) -> Option<Self> {
        if upgrade || grpc || req.method() == Method::CONNECT {
            return None;
        }
        let choice = accept::choose(
            req.headers().get_all(ACCEPT_ENCODING).iter(),
            &settings.algorithms,
        );
        Some(Self {
            settings: settings.clone(),
            choice,
            head: req.method() == Method::HEAD,
        })
    }

    /// The upstream's response as it leaves (see the module doc).
    pub(crate) fn apply(
        self,
        mut resp: Response<ProxyBody>,
        metrics: &Metrics,
    ) -> Response<ProxyBody> {
        if !self.compressible(&resp) {
            return resp;
        }
        let headers = resp.headers_mut();
        add_vary(headers);
        let Some(e) = self.choice else {
            return resp;
        };
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static(e.as_str()));
        headers.remove(CONTENT_LENGTH);
        headers.remove(ACCEPT_RANGES);
        weaken_etag(headers);
        if self.head {
            return resp;
        }
        let counters = metrics.compression(e);
        resp.map(|b| {
            http_body_util::BodyExt::boxed(CompressBody::new(b, e, self.settings.levels, counters))
        })
    }

    fn compressible(&self, resp: &Response<ProxyBody>) -> bool {
        let status = resp.status();
        if status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::PARTIAL_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            return false;
        }
        let h = resp.headers();
        if h.contains_key(CONTENT_RANGE) || h.contains_key(CONTENT_ENCODING) || no_transform(h) {
            return false;
        }
        if !h
            .get(CONTENT_TYPE)
            .is_some_and(|t| self.settings.compresses(t))
        {
            return false;
        }
        // A body declared shorter than the threshold (or empty) goes as it is; one of
        // unknown length is compressed.
        let declared = h
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n == 0 || n < self.settings.min_bytes) {
            return false;
        }
        // Without a length, an empty body (not a HEAD's) has nothing to compress.
        self.head || declared.is_some() || !resp.body().is_end_stream()
    }
}

/// `Cache-Control: no-transform` on any field line.
fn no_transform(h: &HeaderMap) -> bool {
    h.get_all(CACHE_CONTROL).iter().any(|v| {
        v.as_bytes().split(|&b| b == b',').any(|d| {
            let d = d.trim_ascii();
            d.eq_ignore_ascii_case(b"no-transform")
        })
    })
}

/// `Accept-Encoding` joins the `Vary` of the response, unless it is there or `Vary: *`.
fn add_vary(h: &mut HeaderMap) {
    let mut lines = h.get_all(VARY).iter().peekable();
    if lines.peek().is_none() {
        h.insert(VARY, HeaderValue::from_static("Accept-Encoding"));
        return;
    }
    let covered = h.get_all(VARY).iter().any(|v| {
        v.as_bytes().split(|&b| b == b',').any(|f| {
            let f = f.trim_ascii();
            f == b"*" || f.eq_ignore_ascii_case(b"accept-encoding")
        })
    });
    if covered {
        return;
    }
    let mut joined = Vec::new();
    for v in h.get_all(VARY) {
        let v = v.as_bytes().trim_ascii();
        if v.is_empty() {
            continue;
        }
        joined.extend_from_slice(v);
        joined.extend_from_slice(b", ");
    }
    joined.extend_from_slice(b"Accept-Encoding");
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        h.insert(VARY, v);
    }
}

/// A strong `ETag` becomes weak: the encoded bytes differ from the upstream's, so they must
/// not match a strong comparison (ranges, `If-Match`), but are the same representation for
/// caches revalidating with `If-None-Match`.
fn weaken_etag(h: &mut HeaderMap) {
    let Some(tag) = h.get(ETAG) else { return };
    if tag.as_bytes().first() != Some(&b'"') {
        return;
    }
    let mut weak = b"W/".to_vec();
    weak.extend_from_slice(tag.as_bytes());
    if let Ok(v) = HeaderValue::from_bytes(&weak) {
        h.insert(ETAG, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(types: &[&str]) -> Settings {
        Settings::new(&Compression {
            algorithms: vec![Encoding::Gzip],
            min_bytes: 10,
            content_types: types.iter().map(|t| (*t).to_owned()).collect(),
            gzip_level: None,
        })
    }

    #[test]
    fn media_types_match_without_parameters_or_case() {
        let s = settings(&["application/json", "text/*"]);
        let ct = |v: &'static str| s.compresses(&HeaderValue::from_static(v));
        assert!(ct("application/json"));
        assert!(ct("Application/JSON; charset=utf-8"));
        assert!(ct("text/html"));
        assert!(ct("TEXT/event-stream"));
        assert!(!ct("text/"));
        assert!(!ct("application/jsonx"));
        assert!(!ct("image/png"));
        let grpc = settings(&["application/*"]);
        assert!(!grpc.compresses(&HeaderValue::from_static("application/grpc+proto")));
        assert!(grpc.compresses(&HeaderValue::from_static("application/xml")));
    }

    #[test]
    fn vary_merges() {
        let mut h = HeaderMap::new();
        add_vary(&mut h);
        assert_eq!(h[VARY], "Accept-Encoding");
        let mut h = HeaderMap::new();
        h.append(VARY, HeaderValue::from_static("Origin"));
        h.append(VARY, HeaderValue::from_static("Cookie"));
        add_vary(&mut h);
        assert_eq!(h.get_all(VARY).iter().count(), 1);
        assert_eq!(h[VARY], "Origin, Cookie, Accept-Encoding");
        for kept in ["*", "origin, accept-encoding"] {
            let mut h = HeaderMap::new();
            h.insert(VARY, HeaderValue::from_static(kept));
            add_vary(&mut h);
            assert_eq!(h[VARY], kept);
        }
    }

    #[test]
    fn strong_etags_become_weak() {
        let mut h = HeaderMap::new();
        h.insert(ETAG, HeaderValue::from_static("\"v1\""));
        weaken_etag(&mut h);
        assert_eq!(h[ETAG], "W/\"v1\"");
        weaken_etag(&mut h);
        assert_eq!(h[ETAG], "W/\"v1\"");
    }
}
