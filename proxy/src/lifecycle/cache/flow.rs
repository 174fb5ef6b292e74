//! The cache's decisions for one request. In: the request as routing and the policies left
//! it ([`Request`]), its rule's [`CacheRule`]. Out: [`Look::Answer`], an answer from the
//! store, or [`Look::Fetch`], a [`Fill`] that goes with the request upstream and, given the
//! answer (or the gateway's own error), stores it, refreshes the entry it revalidated, or
//! answers with a stale entry when the upstream failed.
//!
//! Bypassed (never looked up, never stored, `X-Cache: BYPASS`): methods the rule does not
//! list, `Range` requests, upgrades, a request's `no-store`, a key expression that does not
//! compile. A request with `Authorization` (or a credential the policies or an ExternalAuth
//! filter accepted) is answered only from entries that allow it
//! (RFC 9111 §3.5: `public`, `s-maxage`, `must-revalidate`) unless the key holds the
//! identity (an expression reading `auth.identity`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::header::{AUTHORIZATION, CONTENT_LENGTH, RANGE, SET_COOKIE, UPGRADE};
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode};
use tollgate_api::cache::CacheRule;

use super::control::{Directives, lifetime, understood};
use super::entry::{Entry, Fresh, Freshness, X_CACHE};
use super::fill::{Pending, StoreBody};
use super::flight::{Lead, lead_or_wait};
use super::ticket::{Place, Refresh};
use super::{HttpCache, Slot, key};
use crate::lifecycle::body::ProxyBody;
use crate::lifecycle::ctx::Plan;
use crate::lifecycle::filters;
use crate::lifecycle::policy::cel::Attrs;

/// How long a coalesced request waits for the lead (as nginx's `proxy_cache_lock_timeout`);
/// then it goes upstream itself and its answer is not stored (a slow lead holds no one for
/// longer, and turns no waiter into a timeout).
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// The request as the cache reads it.
pub(crate) struct Request<'a> {
    pub method: &'a Method,
    /// Its headers (the revalidation's conditional fields are set here).
    pub headers: &'a mut HeaderMap,
    pub scheme: &'a str,
    /// The host routing matched, without port.
    pub host: &'a str,
    /// The path and query routing matched.
    pub target: &'a str,
    pub identity: Option<&'a Arc<serde_json::Value>>,
    /// An ExternalAuth filter admitted it (a credential the gateway cannot see, such as a
    /// session cookie, made the decision).
    pub credentialed: bool,
    pub source: SocketAddr,
    pub route: Option<Arc<str>>,
    /// The index of the route's rule that matched (part of the key).
    pub rule_index: u32,
    pub deadline: Option<tokio::time::Instant>,
}

/// What the cache did with a request.
pub(crate) enum Look {
    /// Answered from the store.
    Answer(Response<ProxyBody>),
    /// Answered from a stale entry within `staleWhileRevalidate`; the refresh to run in the
    /// background (module `lifecycle::refresh`).
    Refresh(Response<ProxyBody>, Box<Refresh>),
    /// Its deadline passed while it waited for the lead of its key.
    Expired,
    /// Goes upstream, with what stores the answer.
    Fetch(Box<Fill>),
}

/// A request on its way upstream, and what its answer does to the store.
pub(crate) struct Fill {
    cache: Arc<HttpCache>,
    /// `None`: bypassed, nothing stored.
    key: Option<String>,
    method: Method,
    /// The request's fields (for the Vary variant and the client's own conditions).
    request: HeaderMap,
    authorization: bool,
    identity_keyed: bool,
    no_store: bool,
    /// The entry being revalidated or kept for `staleIfError`.
    stale: Option<Arc<Entry>>,
    revalidating: bool,
    lead: Option<Lead>,
    asked: SystemTime,
    rule: Rule,
    host: Arc<str>,
    route: Option<Arc<str>>,
    /// The upstream's status and fields, before the route's response filters.
    head: Option<(StatusCode, HeaderMap)>,
    /// A background revalidation: an error stores nothing (the stale entry stays).
    refresh: bool,
    /// The store's generation when the request looked (see `HttpCache::insert`).
    generation: u64,
}

/// The rule's numbers.
#[derive(Clone, Copy)]
struct Rule {
    default_ttl: Option<Duration>,
    max_ttl: Option<Duration>,
    swr: Duration,
    sie: Duration,
    max_entry: usize,
    store_set_cookie: bool,
}

/// Looks `req` up; see the module docs.
pub(crate) async fn look(cache: &Arc<HttpCache>, rule: &CacheRule, req: Request<'_>) -> Look {
    let metrics = &cache.metrics;
    let numbers = Rule {
        default_ttl: rule.default_ttl_ms.map(Duration::from_millis),
        max_ttl: rule.max_ttl_ms.map(Duration::from_millis),
        swr: Duration::from_millis(rule.stale_while_revalidate_ms),
        sie: Duration::from_millis(rule.stale_if_error_ms),
        max_entry: usize::try_from(rule.max_entry_bytes).unwrap_or(usize::MAX),
        store_set_cookie: rule.store_set_cookie,
    };
    let request_cc = Directives::parse(req.headers);
    let mut fill = Fill {
        cache: cache.clone(),
        key: None,
        method: req.method.clone(),
        request: HeaderMap::new(),
        // A credential in any form (a header, a query parameter, a cookie, a certificate,
        // whatever an ExternalAuth service read) makes the answer the user's own, not only
        // `Authorization`.
        authorization: req.headers.contains_key(AUTHORIZATION)
            || req.identity.is_some()
            || req.credentialed,
        // Keyed on the identity only when the policies established one: without it every
        // expression reads null and all credentials would share one entry.
        identity_keyed: req.identity.is_some()
            && rule.expressions.iter().any(|e| e.contains("auth.identity")),
        no_store: request_cc.no_store,
        stale: None,
        revalidating: false,
        lead: None,
        asked: SystemTime::now(),
        rule: numbers,
        host: req.host.to_ascii_lowercase().into(),
        route: req.route.clone(),
        head: None,
        refresh: false,
        generation: cache.generation(),
    };
    let bypass = !rule.methods.iter().any(|m| m == req.method.as_str())
        || req.headers.contains_key(RANGE)
        || req.headers.contains_key(UPGRADE)
        || request_cc.no_store;
    let Some(primary) = (!bypass).then(|| primary_key(cache, rule, &req)).flatten() else {
        metrics.bypass.inc();
        return Look::Fetch(Box::new(fill));
    };
    // A shared answer may serve this request; one made for it alone may not be shared.
    let shareable = !fill.authorization || fill.identity_keyed;
    let revalidate_asked = request_cc.no_cache || request_cc.max_age == Some(0);
    for round in 0..2 {
        let found = find(cache, &primary, req.headers);
        if let Some(entry) = &found
            && (shareable || entry.authorized_ok)
            && !revalidate_asked
        {
            match entry.freshness() {
                Freshness::Fresh => {
                    metrics.hits.inc();
                    return Look::Answer(entry.answer(req.method, req.headers, "HIT"));
                }
                // Answered now; the first to see it refreshes it in the background.
                Freshness::StaleRevalidate if shareable || cache.flights.busy(&primary) => {
                    metrics.stale.inc();
                    let answer = entry.answer(req.method, req.headers, "STALE");
                    if !shareable || cache.flights.busy(&primary) {
                        return Look::Answer(answer);
                    }
                    let Ok(lead) = lead_or_wait(cache, &primary) else {
                        return Look::Answer(answer);
                    };
                    // No place free: the window's next request tries again.
                    let Some(place) = Place::take(cache) else {
                        return Look::Answer(answer);
                    };
                    metrics.refreshes.inc();
                    fill.lead = Some(lead);
                    fill.key = Some(primary);
                    fill.request = req.headers.clone();
                    fill.revalidating = entry.validators();
                    fill.stale = Some(entry.clone());
                    fill.refresh = true;
                    let stale = entry.clone();
                    return Look::Refresh(
                        answer,
                        Box::new(Refresh::new(Box::new(fill), stale, place)),
                    );
                }
                _ => {}
            }
        }
        if !shareable {
            break;
        }
        match lead_or_wait(cache, &primary) {
            Ok(lead) => {
                fill.lead = Some(lead);
                fill.stale = found;
                break;
            }
            Err(_) if round > 0 => {
                fill.stale = found;
                break;
            }
            Err(wait) => {
                metrics.coalesced.inc();
                let lock = tokio::time::Instant::now() + LOCK_WAIT;
                let until = req.deadline.map_or(lock, |d| d.min(lock));
                if tokio::time::timeout_at(until, wait.done()).await.is_err() {
                    if req
                        .deadline
                        .is_some_and(|d| tokio::time::Instant::now() >= d)
                    {
                        return Look::Expired;
                    }
                    // The lead is slow: upstream on its own, its answer not stored (the
                    // lead's will be).
                    fill.no_store = true;
                    fill.stale = find(cache, &primary, req.headers);
                    break;
                }
            }
        }
    }
    metrics.misses.inc();
    fill.key = Some(primary);
    fill.request = req.headers.clone();
    if let Some(entry) = &fill.stale
        && entry.validators()
        && (shareable || entry.authorized_ok)
    {
        entry.revalidate(req.headers);
        fill.revalidating = true;
    }
    Look::Fetch(Box::new(fill))
}

/// The primary key, `None` when a key expression does not compile (bypass).
fn primary_key(cache: &HttpCache, rule: &CacheRule, req: &Request<'_>) -> Option<String> {
    let (path, query) = crate::lifecycle::router::split_path_and_query(req.target);
    let mut values = Vec::with_capacity(rule.expressions.len());
    if !rule.expressions.is_empty() {
        let attrs = Attrs {
            method: req.method.as_str(),
            host: req.host,
            path: req.target,
            scheme: req.scheme,
            headers: req.headers,
            source: req.source,
        };
        for source in &rule.expressions {
            values.push(cache.expr(source)?.value(&attrs, req.identity));
        }
    }
    let request = key::primary(
        req.method.as_str(),
        req.scheme,
        req.host,
        path,
        query,
        &rule.query,
    );
    let scope = format!("{}#{}", req.route.as_deref().unwrap_or(""), req.rule_index);
    Some(key::scoped(request, &scope, &values))
}

/// The stored answer `headers` select under `primary`.
fn find(cache: &HttpCache, primary: &str, headers: &HeaderMap) -> Option<Arc<Entry>> {
    match cache.get(primary)? {
        Slot::Entry(e) => Some(e),
        Slot::Vary(names) => match cache.get(&key::secondary(primary, &names, headers))? {
            Slot::Entry(e) => Some(e),
            Slot::Vary(_) => None,
        },
    }
}

/// The route's response filters on an answer the store gave (module `call` runs them on
/// the upstream's): header edits and CORS for this request's `Origin`.
pub(crate) fn response_filters(plan: &Plan<'_>, origin: Option<&HeaderValue>, h: &mut HeaderMap) {
    for m in &plan.response_mods {
        filters::modify_headers(m, h);
    }
    for c in &plan.cors {
        filters::cors_decorate(c, origin, h);
    }
}

impl Fill {
    /// The upstream's answer head, before the route's filters edit it.
    pub(crate) fn observe(&mut self, status: StatusCode, headers: &HeaderMap) {
        if self.key.is_some() {
            self.head = Some((status, headers.clone()));
        }
    }

    /// The answer that leaves, given the one phases 5 and 6 made (the upstream's, or the
    /// gateway's own error when no upstream answered).
    pub(crate) fn finish(
        mut self,
        resp: Response<ProxyBody>,
        plan: &Plan<'_>,
        origin: Option<&HeaderValue>,
    ) -> Response<ProxyBody> {
        let Some(key) = self.key.take() else {
            return tag(resp, "BYPASS");
        };
        let from_stale = |e: &Entry, outcome| {
            let mut r = e.answer(&self.method, &self.request, outcome);
            response_filters(plan, origin, r.headers_mut());
            r
        };
        let Some((status, head)) = self.head.take() else {
            // No upstream answer: connection failure, timeout, no endpoint.
            if let Some(e) = self.stale.as_deref().filter(|e| e.serves_on_error()) {
                self.cache.metrics.stale.inc();
                return from_stale(e, "STALE");
            }
            return tag(resp, "MISS");
        };
        if self.refresh && status.is_server_error() {
            // The stale entry stays until its window ends.
            return tag(resp, "MISS");
        }
        if status.is_server_error()
            && let Some(e) = self.stale.as_deref().filter(|e| e.serves_on_error())
        {
            self.cache.metrics.stale.inc();
            return from_stale(e, "STALE");
        }
        if status == StatusCode::NOT_MODIFIED
            && self.revalidating
            && let Some(old) = self.stale.clone()
        {
            let mut head = head;
            strip_hop_by_hop(&mut head);
            // The 304 answers one client: its cookies are that client's, never the entry's
            // (unless the rule stores cookies), so they go to it alone.
            let cookies: Vec<HeaderValue> = if self.rule.store_set_cookie {
                Vec::new()
            } else {
                match head.entry(SET_COOKIE) {
                    http::header::Entry::Occupied(e) => e.remove_entry_mult().1.collect(),
                    http::header::Entry::Vacant(_) => Vec::new(),
                }
            };
            let d = Directives::parse(&head);
            let merged_lifetime = lifetime(
                old.status,
                &merge(&old.headers, &head),
                &d,
                self.rule.default_ttl,
            )
            .unwrap_or(Duration::ZERO);
            let fresh = Fresh::new(&head, merged_lifetime, self.rule.max_ttl, self.asked);
            let entry = Arc::new(old.refreshed(&head, fresh));
            let merged = Directives::parse(&entry.headers);
            // The refreshed answer must still be storable as a whole (RFC 9111 §3, §4.3.4):
            // a 304 saying no-store or private, or `Vary: *`, refreshes nothing.
            let slot_key = match super::key::vary_names(&entry.headers) {
                _ if merged.no_store || merged.private => None,
                Some(names) if !names.is_empty() => {
                    Some(key::secondary(&key, &names, &self.request))
                }
                Some(_) => Some(key.clone()),
                None => None,
            };
            // A waiter that went on without the lead stores nothing, a refresh included.
            if !self.no_store
                && let Some(slot_key) = slot_key
            {
                self.cache
                    .insert(self.generation, slot_key, Slot::Entry(entry.clone()));
            }
            let mut r = from_stale(&entry, "HIT");
            for c in cookies {
                r.headers_mut().append(SET_COOKIE, c);
            }
            return r;
        }
        let (parts, body) = resp.into_parts();
        let mut resp = Response::from_parts(parts, body);
        if let Some(pending) = self.storable(key, status, head) {
            let (parts, body) = resp.into_parts();
            resp = Response::from_parts(
                parts,
                http_body_util::BodyExt::boxed(StoreBody::new(body, pending)),
            );
        }
        tag(resp, "MISS")
    }

    /// What storing this answer takes, when RFC 9111 and the rule allow it.
    fn storable(
        &mut self,
        key: String,
        status: StatusCode,
        mut head: HeaderMap,
    ) -> Option<Pending> {
        let d = Directives::parse(&head);
        if self.no_store || !understood(status) || d.no_store || d.private {
            return None;
        }
        if head.contains_key(SET_COOKIE) && !self.rule.store_set_cookie {
            return None;
        }
        let authorized_ok = self.identity_keyed || d.allows_authorized();
        if self.authorization && !authorized_ok {
            return None;
        }
        let vary = key::vary_names(&head)?;
        let lifetime = lifetime(status, &head, &d, self.rule.default_ttl)?;
        let validators =
            head.contains_key(http::header::ETAG) || head.contains_key(http::header::LAST_MODIFIED);
        if lifetime.is_zero() && !validators {
            return None;
        }
        let declared = head
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.rule.max_entry as u64) {
            return None;
        }
        let fresh = Fresh::new(&head, lifetime, self.rule.max_ttl, self.asked);
        strip_hop_by_hop(&mut head);
        let (slot_key, marker) = if vary.is_empty() {
            (key, None)
        } else {
            let secondary = key::secondary(&key, &vary, &self.request);
            (secondary, Some((key, Slot::Vary(vary.into()))))
        };
        Some(Pending {
            cache: self.cache.clone(),
            key: slot_key,
            entry: Entry {
                status,
                headers: super::entry::compact(&head),
                body: bytes::Bytes::new(),
                directives: d,
                initial_age: fresh.initial_age,
                stored: std::time::Instant::now(),
                lifetime: fresh.lifetime,
                stale_while_revalidate: self.rule.swr,
                stale_if_error: self.rule.sie,
                host: self.host.clone(),
                route: self.route.clone(),
                authorized_ok,
                weight: 0,
            },
            vary: marker,
            lead: self.lead.take(),
            max: self.rule.max_entry,
            generation: self.generation,
            declared,
        })
    }
}

/// The gateway's answer to a request whose fetch never got an upstream answer, through
/// the cache (a stale entry within `staleIfError` answers instead).
pub(crate) fn finish_failed(
    fill: Option<Box<Fill>>,
    resp: Response<ProxyBody>,
    plan: &Plan<'_>,
    origin: Option<&HeaderValue>,
) -> Response<ProxyBody> {
    match fill {
        Some(f) => f.finish(resp, plan, origin),
        None => resp,
    }
}

fn tag(mut resp: Response<ProxyBody>, outcome: &'static str) -> Response<ProxyBody> {
    resp.headers_mut()
        .insert(X_CACHE.clone(), HeaderValue::from_static(outcome));
    resp
}

/// `old` with the fields of `new` replacing its own.
fn merge(old: &HeaderMap, new: &HeaderMap) -> HeaderMap {
    let mut h = old.clone();
    for name in new.keys() {
        h.remove(name);
        for v in new.get_all(name) {
            h.append(name.clone(), v.clone());
        }
    }
    h
}

/// Fields about the connection, not the answer (RFC 9110 §7.6.1, as the proxy removes them
/// from every answer), `Trailer` (trailers are never stored), and `Age` and `X-Cache`
/// (computed when served).
fn strip_hop_by_hop(h: &mut HeaderMap) {
    crate::lifecycle::forward::strip_hop_by_hop(h, false);
    h.remove(http::header::TRAILER);
    h.remove(http::header::AGE);
    h.remove(&X_CACHE);
}
