//! One request's context. In: a request as its connection delivered it ([`ConnCtx`]). Out:
//! [`RequestCtx`], the one value the phases of module `service` read and fill, from the
//! arrival of the head to the last byte of the answer:
//!
//! - arrival (phases 0 and 1, [`RequestCtx::arrive`]): the normalized authority, the verdict
//!   of the front door and the limits, the request id, `Origin`, whether the client speaks
//!   gRPC or asks to upgrade;
//! - routing and filters (phases 2 to 4): the [`Plan`], what the route's filters leave for the
//!   way out (response edits, CORS, mirrors) and the rewrites for the upstream request, the
//!   rate-limit decision whose headers the answer carries, and the identity authentication
//!   found (`auth.identity`, for a backend hashing on an expression);
//! - upstream (phase 5): [`RequestCtx::upstream_head`] edits the head the upstream receives
//!   and returns the forwarding fields it adds; phase 6: [`RequestCtx::answer`];
//! - the end ([`RequestCtx::finish`]): [`Completion`], the part of the context that outlives
//!   the handler, rides in the answer's body and counts and logs the request when that body
//!   ends.
//!
//! `'s` is the request's snapshot: the plan keeps the table's own filters, not copies. The
//! one-pass scan of the client's fields ([`forward::Seen`]) is read by `arrive` and not kept.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use http::header::HOST;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use tollgate_api::{BackendProtocol, Cors, HeaderModifier};

use crate::access_log::{AccessRecord, Rfc3339};
use crate::downstream::client_body::ClientBody;
use crate::downstream::conn::ConnCtx;
use crate::downstream::pace::Cut;
use crate::lifecycle::body::{BodyFault, OnComplete, ProxyBody, TrackedBody};
use crate::lifecycle::call::Retried;
use crate::lifecycle::call::response_filters;
use crate::lifecycle::client::{Forwarded, PortClient};
use crate::lifecycle::compress;
use crate::lifecycle::forward::{self, Added, X_REQUEST_ID};
use crate::lifecycle::grpc;
use crate::lifecycle::grpc_web;
use crate::lifecycle::intake;
use crate::lifecycle::normalize::PathOptions;
use crate::lifecycle::policy::ratelimit::{Decision, Pending};
use crate::limits::Limits;
use crate::metrics::RouteMetrics;
use crate::state::Shared;
use crate::upgrade::OnUpgrade;
use crate::upstream::pool::PooledBody;
use crate::upstream::{EndpointGuard, request_uri};

/// The response type of the service.
pub(crate) type ProxyResponse = Response<TrackedBody<Completion>>;

/// One request's state, read and filled by the lifecycle's phases in order.
pub(crate) struct RequestCtx<'s> {
    pub shared: &'s Arc<Shared>,
    pub conn: &'s ConnCtx,
    /// What trusted `X-Forwarded-For` entries say (ClientPolicy): the client when they name
    /// one other than the peer (what policies, rate-limit counters and the access log use,
    /// [`RequestCtx::source`]), and the chain the upstream's `X-Forwarded-For` carries.
    /// `None` where the port trusts no entry.
    forwarded: Option<Forwarded>,
    /// The normalized authority, `host[:port]` (module `intake`); empty when the client named
    /// no host (HTTP/1.0).
    pub host: HeaderValue,
    /// Phases 0 and 1: `Err` answers the request before routing.
    pub verdict: Result<(), StatusCode>,
    /// The body length the client declared (`Content-Length`), checked against the route's
    /// or the port's limit once the route is known.
    pub declared_len: Option<u64>,
    /// `Origin`, for CORS decoration of the answer.
    pub origin: Option<HeaderValue>,
    /// A gRPC call: the gateway's own error answers go out as gRPC statuses.
    pub grpc: bool,
    /// A gRPC-Web call: the gateway's own error answers go out as gRPC statuses in its form;
    /// translated to gRPC and back when its route is a GRPCRoute's (`web_translated`).
    pub web: Option<grpc_web::Web>,
    /// The call went to the backend as gRPC: its answer goes back as gRPC-Web.
    pub web_translated: bool,
    /// The client's side of an HTTP/1 upgrade, put there by our HTTP/1 server.
    pub client_upgrade: Option<OnUpgrade>,
    /// What the route's filters decided (phases 3 and 4).
    pub plan: Plan<'s>,
    /// The rate limit that counted the request: its headers go on the answer.
    pub rate_limit: Option<Decision>,
    /// Rate-limit costs read from the answer (`cost.response`), counted before it leaves.
    pub rate_pending: Vec<Pending<'s>>,
    /// `auth.identity` of a request an AuthPolicy admitted, shared with the authenticator (not
    /// copied): a consistent-hash expression of its backend may read it (phase 4).
    pub identity: Option<Arc<serde_json::Value>>,
    /// The route's ExternalAuth filter admitted the request: its answer may be made for the
    /// caller alone, as with `Authorization` (module `cache`).
    pub credentialed: bool,
    /// A background revalidation the cache asked for (module `refresh`), started once the
    /// stale answer is made.
    pub refresh: Option<Box<crate::lifecycle::refresh::Job>>,
    /// `Set-Cookie` values authentication adds to the answer (a refreshed OIDC session).
    pub auth_cookies: Vec<HeaderValue>,
    /// Headers an external authorization service added to the answer.
    pub auth_response_headers: Vec<(http::HeaderName, HeaderValue)>,
    /// Response compression on the port: the coding the client accepts. Cleared for a
    /// route that opts out.
    pub compress: Option<compress::Offer>,
    /// Reported when the answer's body ends.
    pub done: Completion,
}

/// Filters collected on the way in that act on the way out, and rewrites to apply.
#[derive(Debug, Default)]
pub(crate) struct Plan<'s> {
    pub response_mods: Vec<&'s HeaderModifier>,
    pub cors: Vec<&'s Cors>,
    pub mirrors: Vec<&'s str>,
    /// Host set by a URLRewrite.
    pub host: Option<String>,
    /// Path and query set by a URLRewrite.
    pub path_and_query: Option<String>,
}

/// The part of a request's context that outlives the handler: reported when the response
/// body ends.
#[derive(Debug)]
pub(crate) struct Completion {
    shared: Arc<Shared>,
    pub start: Instant,
    status: u16,
    pub route: Option<Arc<str>>,
    pub metrics: Arc<RouteMetrics>,
    pub request_id: HeaderValue,
    pub guard: Option<EndpointGuard>,
    /// The request's place under its backend's circuit breaker, held to the answer's end
    /// (its connection is in use until then).
    pub admission: Option<crate::upstream::breaker::Admission>,
    /// The attempts made again under the route's retry rule (empty, unallocated, without).
    pub retried: Vec<Retried>,
    /// The answer is the upstream's (every other one is the gateway's own).
    pub upstream_answered: bool,
    /// Ids of the `mode: Shadow` rate limits that would have refused the request.
    pub shadow_limited: Vec<Arc<str>>,
    /// What only the access log needs; `None` (nothing copied, no clock read) when it is off.
    log: Option<Box<LogFields>>,
    /// The request's trace (module `otel`); `None` when tracing is off.
    pub trace: Option<crate::otel::RequestTrace>,
}

/// The request as the access log reports it.
#[derive(Debug)]
struct LogFields {
    started_at: SystemTime,
    method: Method,
    uri: Uri,
    host: String,
    peer: SocketAddr,
    /// A gRPC (or gRPC-Web) call: its status is read from the answer's head or trailers.
    grpc: bool,
    grpc_status: Option<u32>,
    /// A gRPC-Web call.
    grpc_web: bool,
    /// Where a translated gRPC-Web answer leaves its trailers' status (module `grpc_web`).
    web_status: Option<Arc<grpc_web::StatusSlot>>,
    /// The request body's fault, read when the answer ends: why a slow body was cut.
    fault: Option<Arc<BodyFault>>,
}

impl<'s> RequestCtx<'s> {
    /// Phases 0 and 1: one authority and one path in `req` (or a 400 verdict), the client's
    /// hop-by-hop fields and field names with `_` gone before anything the gateway sets, and
    /// the header and declared body sizes checked (431, 413).
    pub fn arrive(
        shared: &'s Arc<Shared>,
        conn: &'s ConnCtx,
        port: Option<&PortClient>,
        req: &mut Request<ClientBody>,
    ) -> Self {
        let start = Instant::now();
        let seen = forward::Seen::scan(req.headers());
        let request_id = seen.request_id();
        // A gRPC call is a POST (a CONNECT must keep its non-2xx answer: a 2xx opens a tunnel).
        let grpc = req.method() == Method::POST && seen.content_type.is_some_and(grpc::is_grpc);
        let web = (!grpc)
            .then(|| grpc_web::Web::of(req.method(), seen.content_type))
            .flatten();
        let paths = port.map_or_else(PathOptions::default, |p| p.paths);
        let front = intake::front_door(&seen, req.uri(), req.version(), paths);
        // Read before `strip_client`, which leaves the forwarding fields to phase 5.
        let forwarded =
            port.and_then(|p| p.resolve(conn.peer, req.headers(), seen.xff_last, seen.xff_lines));
        let client = forwarded.as_ref().and_then(|f| f.client);
        let upgrade = req.version() <= Version::HTTP_11 && seen.is_upgrade(req.headers());
        let strip = seen.needs_strip();
        let trace_fields = seen.trace_fields;
        let (mut verdict, declared_len) =
            match check_limits(&conn.limits, req.headers().len(), &seen) {
                Ok(len) => (Ok(()), len),
                Err(code) => (Err(code), None),
            };
        if let Some(p) = port.filter(|p| !p.closed_by.is_empty()) {
            tracing::debug!(port = conn.table_port, closed_by = ?p.closed_by, "port closed by an invalid ClientPolicy");
            verdict = verdict.and(Err(StatusCode::INTERNAL_SERVER_ERROR));
        }
        let origin = seen.origin.cloned();
        let host = match front {
            Ok(front) => {
                let host = front.authority.clone();
                front.apply(req);
                host
            }
            Err(code) => {
                verdict = verdict.and(Err(code));
                HeaderValue::from_static("")
            }
        };
        if strip {
            forward::strip_client(req.headers_mut(), upgrade);
        }
        let log = shared.access_log.enabled().then(|| {
            Box::new(LogFields {
                started_at: SystemTime::now(),
                method: req.method().clone(),
                uri: req.uri().clone(),
                host: host.to_str().unwrap_or("").to_owned(),
                peer: client.unwrap_or(conn.peer),
                grpc: grpc || web.is_some(),
                grpc_status: None,
                grpc_web: web.is_some(),
                web_status: None,
                fault: None,
            })
        });
        let trace = shared.tracer.as_ref().map(|t| {
            // Most requests carry no trace fields: their map is not searched for them.
            let fields = trace_fields.then(|| req.headers());
            t.begin(fields, req.method(), req.uri(), &host)
        });
        let client_upgrade = upgrade
            .then(|| req.extensions_mut().remove::<OnUpgrade>())
            .flatten();
        let compress = port
            .and_then(|p| p.compression.as_ref())
            .and_then(|c| compress::Offer::new(c, req, upgrade, grpc || web.is_some()));
        Self {
            shared,
            conn,
            forwarded,
            host,
            verdict,
            declared_len,
            origin,
            grpc,
            web,
            web_translated: false,
            client_upgrade,
            plan: Plan::default(),
            rate_limit: None,
            rate_pending: Vec::new(),
            identity: None,
            credentialed: false,
            refresh: None,
            auth_cookies: Vec::new(),
            auth_response_headers: Vec::new(),
            compress,
            done: Completion {
                shared: shared.clone(),
                start,
                status: 0,
                route: None,
                metrics: shared.metrics.no_route().clone(),
                request_id,
                guard: None,
                admission: None,
                retried: Vec::new(),
                upstream_answered: false,
                shadow_limited: Vec::new(),
                log,
                trace,
            },
        }
    }

    /// The client's address (`source.address`), with its text when formatted already: from
    /// trusted `X-Forwarded-For` entries when the port's ClientPolicy says so (the text then
    /// made only if an expression reads it), else the peer (the PROXY protocol's source when
    /// the port reads one).
    pub fn source(&self) -> (SocketAddr, Option<&'s HeaderValue>) {
        match self.forwarded.as_ref().and_then(|f| f.client) {
            Some(a) => (a, None),
            None => (self.conn.peer, Some(&self.conn.peer_value)),
        }
    }

    /// The request body's fault, for the access log to say why a slow body was cut.
    pub fn note_body_fault(&mut self, fault: Option<&Arc<BodyFault>>) {
        if let Some(log) = self.done.log.as_mut() {
            log.fault = fault.cloned();
        }
    }

    /// Phase 5, head: header hygiene, Host, URI and version of the upstream request; the
    /// forwarding fields and request id are returned, for the exchange to send after the
    /// request's own fields.
    pub fn upstream_head(
        &self,
        parts: &mut Parts,
        endpoint: &EndpointGuard,
        protocol: BackendProtocol,
        path_and_query: &str,
    ) -> Result<Added<'_>, StatusCode> {
        let upgrade = self.client_upgrade.is_some();
        let headers = &mut parts.headers;
        let mut present = forward::Present::scan(headers);
        forward::strip_present(headers, &mut present, upgrade);
        let added = forward::forwarded(
            headers,
            &present,
            &self.conn.peer_value,
            self.forwarded.as_ref(),
            self.conn.scheme,
            &self.host,
            &self.done.request_id,
        );
        let endpoint = endpoint.endpoint();
        if let Some(h) = self
            .plan
            .host
            .as_deref()
            .and_then(|h| HeaderValue::from_str(h).ok())
        {
            headers.insert(HOST, h);
        } else if !present.host {
            // HTTP/2 clients send :authority only; upstreams get it as Host. With neither
            // (HTTP/1.0), the endpoint's address, as a client library would send.
            let h = if self.host.is_empty() {
                HeaderValue::from_str(endpoint.authority.as_str()).ok()
            } else {
                Some(self.host.clone())
            };
            if let Some(h) = h {
                headers.insert(HOST, h);
            }
        }
        parts.uri = request_uri(protocol, &endpoint.authority, path_and_query, &parts.uri)
            .map_err(|_| StatusCode::BAD_REQUEST)?;
        parts.version = match protocol {
            // Tcp and Udp backends are only on stream and datagram ports, never reached from HTTP.
            BackendProtocol::Http1 | BackendProtocol::Tcp | BackendProtocol::Udp => {
                Version::HTTP_11
            }
            BackendProtocol::H2c => Version::HTTP_2,
        };
        Ok(added)
    }

    /// Phase 6 on the upstream's answer: hop-by-hop removal, the plan's response edits and
    /// CORS, the upgrade spliced.
    pub fn answer(&mut self, resp: Response<PooledBody>) -> Response<ProxyBody> {
        // An upgraded connection holds its upstream connection as long as the splice lasts:
        // its place under the backend's circuit breaker goes with it.
        let held = if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS {
            self.done.admission.take()
        } else {
            None
        };
        response_filters(
            resp,
            &self.plan.response_mods,
            &self.plan.cors,
            self.origin.as_ref(),
            self.client_upgrade.take(),
            held,
        )
    }

    /// The answer as it leaves: the upstream's compressed when the port and the client say so
    /// (after any costs read from its body, which read it as the upstream sent it), counted
    /// by what it means, in gRPC form for a gRPC client when it is the gateway's own (in
    /// gRPC-Web form for a gRPC-Web client, whose translated calls get their answer translated
    /// back here), with `X-Request-Id`, and its body reporting the request when it ends.
    pub fn finish(self, mut resp: Response<ProxyBody>) -> ProxyResponse {
        if let Some(offer) = self.compress
            && self.done.upstream_answered
        {
            resp = offer.apply(resp, &self.shared.metrics);
        }
        let mut done = self.done;
        // Metrics and the access log count the answer by what it means (a gRPC client's 404
        // is a 404, though it goes out as 200 with `grpc-status: 12`).
        done.status = resp.status().as_u16();
        if self.grpc && !done.upstream_answered {
            resp = grpc::trailers_only(resp);
        }
        if let Some(web) = &self.web {
            if !done.upstream_answered {
                resp = web.local(resp);
            } else if self.web_translated {
                let slot = done
                    .log
                    .as_mut()
                    .map(|log| log.web_status.get_or_insert_with(Default::default).clone());
                resp = web.answer(resp, slot);
            }
        }
        if (self.grpc || self.web.is_some())
            && let Some(log) = done.log.as_mut()
        {
            // Trailers-Only (the gateway's own answer, or an upstream's); else the trailers say.
            log.grpc_status = grpc::status_of(resp.headers());
        }
        resp.headers_mut()
            .insert(X_REQUEST_ID.clone(), done.request_id.clone());
        let (parts, body) = resp.into_parts();
        Response::from_parts(parts, TrackedBody::new(body, done))
    }
}

/// Phase 1.
fn check_limits(
    limits: &Limits,
    fields: usize,
    seen: &forward::Seen<'_>,
) -> Result<Option<u64>, StatusCode> {
    if seen.bytes > limits.max_header_bytes || fields > limits.max_header_count {
        return Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    }
    seen.content_length
        .map(|cl| {
            cl.to_str()
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .ok_or(StatusCode::BAD_REQUEST)
        })
        .transpose()
}

impl OnComplete for Completion {
    fn complete(self, bytes: u64) {
        let elapsed = self.start.elapsed();
        self.metrics.observe(self.status, elapsed.as_secs_f64());
        let trace_id = self.trace.as_ref().and_then(|t| t.sampled_id());
        if let Some(log) = self.log {
            let request_id = String::from_utf8_lossy(self.request_id.as_bytes());
            self.shared.access_log.log(&AccessRecord {
                time: Rfc3339(log.started_at),
                method: log.method.as_str(),
                host: &log.host,
                path: log.uri.path(),
                status: self.status,
                duration_ms: elapsed.as_secs_f64() * 1000.0,
                route: self.route.as_deref(),
                upstream: self.guard.as_ref().map(|g| g.endpoint().addr),
                bytes,
                request_id: &request_id,
                peer: log.peer,
                grpc_status: log.grpc_status.or_else(|| {
                    log.web_status
                        .as_deref()
                        .and_then(grpc_web::StatusSlot::get)
                }),
                grpc_web: log.grpc_web,
                client_timeout: log
                    .fault
                    .as_deref()
                    .and_then(BodyFault::cut)
                    .map(Cut::as_str),
                retried: &self.retried,
                shadow_limited: &self.shadow_limited,
                trace_id,
            });
        }
        if let Some(t) = self.trace {
            t.finish(self.status, self.route.as_deref(), bytes);
        }
    }

    fn trailers(&mut self, trailers: &HeaderMap) {
        if let Some(log) = self.log.as_mut()
            && log.grpc
            && log.grpc_status.is_none()
        {
            log.grpc_status = grpc::status_of(trailers);
        }
    }
}
