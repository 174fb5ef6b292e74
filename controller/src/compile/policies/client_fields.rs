//! One version of a ClientPolicy's spec, compiled and checked: [`Fields`], what the policy
//! sets (each unset field left to the policy below it, or the default). In: the spec. Out:
//! the fields, or the [`Problem`] that makes the policy `Invalid`. The schema says most of
//! this too, but `tollgate run` reads no schema.

use tollgate_api::client::{
    Cidr, ClientLimits, ClientSettings, Compression, Encoding, EscapedSlashes, ForwardedFor,
    PathOptions, ProxyProtocol,
};

use super::invalid;
use crate::compile::conditions::Problem;
use crate::compile::grants::GATEWAY_GROUP;
use crate::compile::rules::parse_duration_ms;
use crate::crds::client::{ClientPolicySpec, CompressionSpec, EscapedSlashesSpec, LimitsSpec};

/// Most of `compression.minBytes`.
const MAX_MIN_BYTES: u64 = 16 * 1024 * 1024;

/// The media types compressed when `compression.contentTypes` is unset: text formats that
/// shrink, none already compressed.
pub const DEFAULT_CONTENT_TYPES: &[&str] = &[
    "text/html",
    "text/plain",
    "text/css",
    "text/javascript",
    "text/xml",
    "text/markdown",
    "text/csv",
    "application/javascript",
    "application/json",
    "application/xml",
    "application/xhtml+xml",
    "application/rss+xml",
    "application/atom+xml",
    "application/ld+json",
    "application/manifest+json",
    "application/problem+json",
    "image/svg+xml",
];

/// `compression.minBytes` when unset.
pub const DEFAULT_MIN_BYTES: u64 = 1024;

/// What one policy sets; `None` leaves the field to the policy below (or the default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Fields {
    proxy_protocol: Option<ProxyProtocol>,
    forwarded_for: Option<ForwardedFor>,
    merge_slashes: Option<bool>,
    escaped_slashes: Option<EscapedSlashes>,
    pub(super) limits: ClientLimits,
    /// `Some(None)`: compression turned off here (`disabled: true`).
    pub(super) compression: Option<Option<Compression>>,
}

impl Fields {
    /// `self`'s fields, each it lacks taken from `below`.
    pub(super) fn over(&self, below: &Self) -> Self {
        Self {
            proxy_protocol: self
                .proxy_protocol
                .clone()
                .or_else(|| below.proxy_protocol.clone()),
            forwarded_for: self
                .forwarded_for
                .clone()
                .or_else(|| below.forwarded_for.clone()),
            merge_slashes: self.merge_slashes.or(below.merge_slashes),
            escaped_slashes: self.escaped_slashes.or(below.escaped_slashes),
            limits: self.limits.or(below.limits),
            // A section replaces the one below whole: a listener's algorithms do not mix
            // with its Gateway's content types.
            compression: self
                .compression
                .clone()
                .or_else(|| below.compression.clone()),
        }
    }

    pub(super) fn settings(&self) -> ClientSettings {
        let defaults = PathOptions::default();
        ClientSettings {
            proxy_protocol: self.proxy_protocol.clone(),
            forwarded_for: self.forwarded_for.clone(),
            path: PathOptions {
                merge_slashes: self.merge_slashes.unwrap_or(defaults.merge_slashes),
                escaped_slashes: self.escaped_slashes.unwrap_or(defaults.escaped_slashes),
            },
            limits: self.limits,
            compression: self.compression.clone().flatten(),
            ..ClientSettings::default()
        }
    }
}

/// Compiles one version of a policy's spec.
pub(super) fn fields(spec: &ClientPolicySpec) -> Result<Fields, Problem> {
    for t in &spec.target_refs {
        if t.group != GATEWAY_GROUP || !matches!(t.kind.as_str(), "Gateway" | "HTTPRoute") {
            return Err(invalid(format!(
                "targetRef {} {}: a ClientPolicy targets Gateways (group {GATEWAY_GROUP}) or \
                 one listener of one by sectionName, or HTTPRoutes (or one rule) for \
                 limits.maxRequestBodyBytes and compression.disabled",
                t.kind, t.name
            )));
        }
    }
    let route_only = spec.client_ip.is_none()
        && spec.path.is_none()
        && spec.limits.as_ref().is_none_or(|l| {
            *l == LimitsSpec {
                max_request_body_bytes: l.max_request_body_bytes,
                ..LimitsSpec::default()
            }
        })
        && spec.compression.as_ref().is_none_or(|c| {
            *c == CompressionSpec {
                disabled: Some(true),
                ..CompressionSpec::default()
            }
        });
    if !route_only && spec.target_refs.iter().any(|t| t.kind == "HTTPRoute") {
        return Err(invalid(
            "on an HTTPRoute only limits.maxRequestBodyBytes and compression: {disabled: \
             true} apply: put the other settings in a ClientPolicy on the Gateway",
        ));
    }
    let mut f = Fields::default();
    if let Some(ip) = &spec.client_ip {
        if let Some(pp) = &ip.proxy_protocol {
            let trusted = pp.trusted_cidrs.clone().unwrap_or_default();
            if pp.trusted_cidrs.is_some() && !(1..=64).contains(&trusted.len()) {
                return Err(invalid(
                    "clientIP.proxyProtocol.trustedCIDRs must list 1 to 64 networks",
                ));
            }
            networks("clientIP.proxyProtocol.trustedCIDRs", &trusted)?;
            f.proxy_protocol = Some(ProxyProtocol {
                required: pp.required.unwrap_or(true),
                trusted_cidrs: trusted,
            });
        }
        if let Some(x) = &ip.x_forwarded_for {
            f.forwarded_for = Some(match (x.num_trusted_hops, &x.trusted_cidrs) {
                (Some(n), None) if (1..=64).contains(&n) => ForwardedFor::NumTrustedHops(n),
                (Some(n), None) => {
                    return Err(invalid(format!(
                        "clientIP.xForwardedFor.numTrustedHops must be 1 to 64, not {n}"
                    )));
                }
                (None, Some(cidrs)) if !cidrs.is_empty() && cidrs.len() <= 64 => {
                    networks("clientIP.xForwardedFor.trustedCIDRs", cidrs)?;
                    ForwardedFor::TrustedCidrs(cidrs.clone())
                }
                (None, Some(_)) => {
                    return Err(invalid(
                        "clientIP.xForwardedFor.trustedCIDRs must list 1 to 64 networks",
                    ));
                }
                _ => {
                    return Err(invalid(
                        "clientIP.xForwardedFor needs exactly one of numTrustedHops and \
                         trustedCIDRs",
                    ));
                }
            });
        }
    }
    if let Some(l) = &spec.limits {
        f.limits = limits(l)?;
    }
    if let Some(c) = &spec.compression {
        f.compression = Some(compression(c)?);
    }
    if let Some(p) = &spec.path {
        f.merge_slashes = p.merge_slashes;
        f.escaped_slashes = p.escaped_slashes.map(|e| match e {
            EscapedSlashesSpec::Keep => EscapedSlashes::Keep,
            EscapedSlashesSpec::Reject => EscapedSlashes::Reject,
            EscapedSlashesSpec::Unescape => EscapedSlashes::Unescape,
        });
    }
    Ok(f)
}

/// Checks a list of trusted networks: each parses, and none is every address (`/0` would
/// let any client name its own address).
fn networks(field: &str, cidrs: &[String]) -> Result<(), Problem> {
    for c in cidrs {
        let n: Cidr = c.parse().map_err(|e| invalid(format!("{field}: {e}")))?;
        if n.prefix_len() == 0 {
            return Err(invalid(format!(
                "{field}: {c:?} trusts every address, so any client could name its own; \
                 list the proxies' networks"
            )));
        }
    }
    Ok(())
}

/// Compiles `limits`, checking what the schema says (`tollgate run` reads no schema).
fn limits(l: &LimitsSpec) -> Result<ClientLimits, Problem> {
    let range = |field: &str, v: Option<u32>, min: u32, max: u32| match v {
        Some(n) if !(min..=max).contains(&n) => Err(invalid(format!(
            "limits.{field} must be {min} to {max}, not {n}"
        ))),
        _ => Ok(v),
    };
    let duration = |field: &str, v: &Option<String>| -> Result<Option<u64>, Problem> {
        let Some(s) = v else { return Ok(None) };
        match parse_duration_ms(s) {
            Ok(Some(ms)) => Ok(Some(ms)),
            Ok(None) => Err(invalid(format!("limits.{field} must be more than 0s"))),
            Err(e) => Err(invalid(format!("limits.{field}: {s:?}: {e}"))),
        }
    };
    Ok(ClientLimits {
        max_request_headers_bytes: range(
            "maxRequestHeadersBytes",
            l.max_request_headers_bytes,
            1024,
            1_048_576,
        )?,
        max_request_headers: range("maxRequestHeaders", l.max_request_headers, 1, 100)?,
        max_request_body_bytes: l.max_request_body_bytes,
        max_connections_per_client: range(
            "maxConnectionsPerClient",
            l.max_connections_per_client,
            1,
            u32::MAX,
        )?,
        request_header_timeout_ms: duration("requestHeaderTimeout", &l.request_header_timeout)?,
        idle_timeout_ms: duration("idleTimeout", &l.idle_timeout)?,
        request_body_timeout_ms: duration("requestBodyTimeout", &l.request_body_timeout)?,
        request_timeout_ms: duration("requestTimeout", &l.request_timeout)?,
        http2_max_concurrent_streams: range(
            "http2MaxConcurrentStreams",
            l.http2_max_concurrent_streams,
            1,
            10_000,
        )?,
    })
}

/// Compiles `compression`: `None` when it turns compression off.
fn compression(c: &CompressionSpec) -> Result<Option<Compression>, Problem> {
    if c.disabled == Some(true) {
        if *c
            != (CompressionSpec {
                disabled: Some(true),
                ..CompressionSpec::default()
            })
        {
            return Err(invalid(
                "compression.disabled: true takes no other field: remove algorithms, minBytes, \
                 contentTypes and gzipLevel, or the disabled field",
            ));
        }
        return Ok(None);
    }
    let algorithms = match &c.algorithms {
        None => Encoding::ALL.to_vec(),
        Some(list) if list.is_empty() || list.len() > Encoding::ALL.len() => {
            return Err(invalid(
                "compression.algorithms must list 1 to 3 of zstd, br and gzip",
            ));
        }
        Some(list) => {
            let mut out = Vec::with_capacity(list.len());
            for name in list {
                let e = Encoding::from_token(name).ok_or_else(|| {
                    invalid(format!(
                        "compression.algorithms: {name:?} is not one of zstd, br and gzip"
                    ))
                })?;
                if out.contains(&e) {
                    return Err(invalid(format!(
                        "compression.algorithms: {name:?} is listed twice"
                    )));
                }
                out.push(e);
            }
            out
        }
    };
    let min_bytes = c.min_bytes.unwrap_or(DEFAULT_MIN_BYTES);
    if min_bytes > MAX_MIN_BYTES {
        return Err(invalid(format!(
            "compression.minBytes must be 0 to {MAX_MIN_BYTES}, not {min_bytes}"
        )));
    }
    let content_types = match &c.content_types {
        None => DEFAULT_CONTENT_TYPES
            .iter()
            .map(|t| (*t).to_owned())
            .collect(),
        Some(list) if list.is_empty() || list.len() > 64 => {
            return Err(invalid(
                "compression.contentTypes must list 1 to 64 media types",
            ));
        }
        Some(list) => {
            let mut out: Vec<String> = Vec::with_capacity(list.len());
            for t in list {
                let t = media_type(t)?;
                if !out.contains(&t) {
                    out.push(t);
                }
            }
            out
        }
    };
    let gzip_level = match c.gzip_level {
        Some(l) if !(1..=9).contains(&l) => {
            return Err(invalid(format!(
                "compression.gzipLevel must be 1 to 9, not {l}"
            )));
        }
        l => l,
    };
    Ok(Some(Compression {
        algorithms,
        min_bytes,
        content_types,
        gzip_level,
    }))
}

/// One entry of `compression.contentTypes`, lower-cased: `type/subtype` or `type/*`, without
/// parameters; gRPC refused (its messages carry their own compression).
fn media_type(t: &str) -> Result<String, Problem> {
    let bad = |why: &str| invalid(format!("compression.contentTypes: {t:?} {why}"));
    let lower = t.to_ascii_lowercase();
    let Some((ty, sub)) = lower.split_once('/') else {
        return Err(bad("is not a media type (type/subtype, or type/*)"));
    };
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    if !token(ty) || !(sub == "*" || token(sub)) {
        return Err(bad(
            "is not a media type (type/subtype, or type/*; no parameters)",
        ));
    }
    if ty == "application" && sub.starts_with("grpc") {
        return Err(bad(
            "is gRPC, whose messages carry their own compression (never compressed)",
        ));
    }
    Ok(lower)
}
