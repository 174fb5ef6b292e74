//! HTTPRoute (and GRPCRoute) filters to route-table filters.
//!
//! In: a rule's (or a backendRef's) filters, whether every match of the rule is a PathPrefix,
//! and a backend [`Resolver`] for RequestMirror. GRPCRoute filters (a subset of HTTPRoute's,
//! same schema) arrive here converted by [`super::grpc`]. Out: [`Filter`]s with header names lower-case
//! and mirror shares in millionths, or an `UnsupportedValue` [`Problem`] naming the field when
//! the filter cannot be honoured (which rejects the route). An unresolvable mirror backend does
//! not reject: it is recorded as a ResolvedRefs problem and the mirror is skipped at runtime.
//!
//! ExternalAuth (GEP-1494) is converted by [`super::ext_auth_filter`]; its unresolvable
//! backend is a ResolvedRefs problem too, and the check then denies (fails closed).
//!
//! Rejected: ExtensionRef (we implement none), a filter type without its config, the same
//! filter type twice (except RequestMirror), RequestRedirect together with URLRewrite,
//! ReplacePrefixMatch in a rule with a non-PathPrefix match, blank or duplicate header names.

use std::collections::BTreeSet;

use gateway_types::experimental::httproutes::{
    HttpRouteRulesBackendRefsFilters, HttpRouteRulesFilters, HttpRouteRulesFiltersCors,
    HttpRouteRulesFiltersRequestMirror, HttpRouteRulesFiltersRequestRedirect,
    HttpRouteRulesFiltersRequestRedirectPathType, HttpRouteRulesFiltersRequestRedirectScheme,
    HttpRouteRulesFiltersType, HttpRouteRulesFiltersUrlRewrite,
    HttpRouteRulesFiltersUrlRewritePathType,
};
use tollgate_api::{Cors, Filter, HeaderModifier, Mirror, PathModifier, Redirect, UrlRewrite};

use super::backends::{RefSpec, Resolver};
use super::conditions::{Problem, reason};
use super::kinds::RouteKind;

/// Converts a RequestHeaderModifier or ResponseHeaderModifier: the generated gateway-api types
/// differ only in name, so one body serves both.
macro_rules! header_modifier {
    ($m:expr, $field:expr) => {{
        let m = $m;
        let set = m
            .set
            .iter()
            .flatten()
            .map(|h| (h.name.as_str(), h.value.as_str()))
            .collect();
        let add = m
            .add
            .iter()
            .flatten()
            .map(|h| (h.name.as_str(), h.value.as_str()))
            .collect();
        modifier(set, add, m.remove.as_deref().unwrap_or_default(), $field)
    }};
}

/// What converting a filter list needs.
pub struct FilterCtx<'r, 'i, 'a, 's> {
    /// Backend resolver (RequestMirror).
    pub resolver: &'r mut Resolver<'i, 'a>,
    /// Namespace of the route.
    pub route_ns: &'s str,
    /// Kind of the route (backend protocol, ReferenceGrant `from`).
    pub kind: RouteKind,
    /// Every match of the rule is a PathPrefix (ReplacePrefixMatch allowed).
    pub all_prefix: bool,
    /// ResolvedRefs problems found on the way (mirror backends).
    pub unresolved: &'r mut Vec<Problem>,
}

impl FilterCtx<'_, '_, '_, '_> {
    /// Resolves a backend reference of this route; an unresolvable one is recorded as a
    /// ResolvedRefs problem under `field` and gives `None` (its traffic share answers 500).
    pub fn resolve_backend(&mut self, spec: &RefSpec<'_>, field: &str) -> Option<String> {
        match self.resolver.resolve(self.route_ns, self.kind, spec) {
            Ok(k) => Some(k),
            Err(p) => {
                self.unresolved
                    .push(Problem::new(p.reason, format!("{field}: {}", p.message)));
                None
            }
        }
    }
}

fn unsupported(field: &str, what: impl std::fmt::Display) -> Problem {
    Problem::new(reason::UNSUPPORTED_VALUE, format!("{field}: {what}"))
}

/// Converts a rule's filters; `field` is e.g. `spec.rules[0].filters`.
pub fn convert_all(
    filters: &[HttpRouteRulesFilters],
    field: &str,
    ctx: &mut FilterCtx<'_, '_, '_, '_>,
) -> Result<Vec<Filter>, Problem> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(filters.len());
    for (i, f) in filters.iter().enumerate() {
        let field = format!("{field}[{i}]");
        let ty = type_name(&f.r#type);
        if f.r#type != HttpRouteRulesFiltersType::RequestMirror && !seen.insert(ty) {
            return Err(unsupported(
                &field,
                format!("filter type {ty} appears more than once"),
            ));
        }
        out.push(convert(f, &field, ctx)?);
    }
    if seen.contains("RequestRedirect") && seen.contains("URLRewrite") {
        return Err(unsupported(
            field,
            "RequestRedirect and URLRewrite cannot be used in the same rule",
        ));
    }
    Ok(out)
}

/// The filter type as written in YAML.
fn type_name(t: &HttpRouteRulesFiltersType) -> &'static str {
    use HttpRouteRulesFiltersType as T;
    match t {
        T::RequestHeaderModifier => "RequestHeaderModifier",
        T::ResponseHeaderModifier => "ResponseHeaderModifier",
        T::RequestMirror => "RequestMirror",
        T::RequestRedirect => "RequestRedirect",
        T::UrlRewrite => "URLRewrite",
        T::ExtensionRef => "ExtensionRef",
        T::Cors => "CORS",
        T::ExternalAuth => "ExternalAuth",
    }
}

/// Converts a backendRef's filters (same schema as rule filters, another generated type).
pub fn convert_backend_filters(
    filters: &[HttpRouteRulesBackendRefsFilters],
    field: &str,
    ctx: &mut FilterCtx<'_, '_, '_, '_>,
) -> Result<Vec<Filter>, Problem> {
    if filters.is_empty() {
        return Ok(Vec::new());
    }
    let as_rule: Vec<HttpRouteRulesFilters> = serde_json::to_value(filters)
        .and_then(serde_json::from_value)
        .map_err(|e| unsupported(field, e))?;
    // The proxy asks authorization services per rule, before any backend is picked: a
    // backendRef's ExternalAuth would never run, so it is refused rather than ignored.
    if let Some(i) = as_rule
        .iter()
        .position(|f| f.r#type == HttpRouteRulesFiltersType::ExternalAuth)
    {
        return Err(unsupported(
            &format!("{field}[{i}]"),
            "ExternalAuth filters are supported on rules, not on backendRefs",
        ));
    }
    convert_all(&as_rule, field, ctx)
}

fn convert(
    f: &HttpRouteRulesFilters,
    field: &str,
    ctx: &mut FilterCtx<'_, '_, '_, '_>,
) -> Result<Filter, Problem> {
    use HttpRouteRulesFiltersType as T;
    let missing =
        |name: &str| unsupported(field, format!("type {} needs {name}", type_name(&f.r#type)));
    match f.r#type {
        T::RequestHeaderModifier => {
            let m = f
                .request_header_modifier
                .as_ref()
                .ok_or_else(|| missing("requestHeaderModifier"))?;
            Ok(Filter::RequestHeaderModifier(header_modifier!(
                m,
                &format!("{field}.requestHeaderModifier")
            )?))
        }
        T::ResponseHeaderModifier => {
            let m = f
                .response_header_modifier
                .as_ref()
                .ok_or_else(|| missing("responseHeaderModifier"))?;
            Ok(Filter::ResponseHeaderModifier(header_modifier!(
                m,
                &format!("{field}.responseHeaderModifier")
            )?))
        }
        T::RequestRedirect => {
            let r = f
                .request_redirect
                .as_ref()
                .ok_or_else(|| missing("requestRedirect"))?;
            Ok(Filter::RequestRedirect(redirect(r, field, ctx.all_prefix)?))
        }
        T::UrlRewrite => {
            let r = f
                .url_rewrite
                .as_ref()
                .ok_or_else(|| missing("urlRewrite"))?;
            Ok(Filter::UrlRewrite(rewrite(r, field, ctx.all_prefix)?))
        }
        T::RequestMirror => {
            let m = f
                .request_mirror
                .as_ref()
                .ok_or_else(|| missing("requestMirror"))?;
            Ok(Filter::RequestMirror(mirror(m, field, ctx)?))
        }
        T::Cors => {
            let c = f.cors.as_ref().ok_or_else(|| missing("cors"))?;
            Ok(Filter::Cors(cors(c, field)?))
        }
        T::ExternalAuth => {
            let e = f
                .external_auth
                .as_ref()
                .ok_or_else(|| missing("externalAuth"))?;
            let id = format!("{}/{}", ctx.route_ns, field);
            Ok(Filter::ExternalAuth(super::ext_auth_filter::convert(
                e, field, id, ctx,
            )?))
        }
        T::ExtensionRef => Err(unsupported(
            field,
            format!(
                "{} filters are not supported by this implementation",
                type_name(&f.r#type)
            ),
        )),
    }
}

/// Lower-cases and checks one list of header names.
fn header_names<'h>(
    names: impl Iterator<Item = &'h str>,
    field: &str,
) -> Result<Vec<String>, Problem> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for n in names {
        let lower = n.trim().to_ascii_lowercase();
        if lower.is_empty() {
            return Err(unsupported(field, "header name is empty"));
        }
        if !is_header_name(&lower) {
            return Err(unsupported(
                field,
                format!("{lower:?} is not a valid header name"),
            ));
        }
        if !seen.insert(lower.clone()) {
            return Err(unsupported(
                field,
                format!("header {lower} appears more than once"),
            ));
        }
        out.push(lower);
    }
    Ok(out)
}

/// An RFC 9110 token: what `http::HeaderName` accepts (the proxy would drop anything else).
pub fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A header value `http::HeaderValue` accepts: no control characters but tab.
pub fn is_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

fn modifier(
    set: Vec<(&str, &str)>,
    add: Vec<(&str, &str)>,
    remove: &[String],
    field: &str,
) -> Result<HeaderModifier, Problem> {
    let set_names = header_names(set.iter().map(|p| p.0), &format!("{field}.set"))?;
    let add_names = header_names(add.iter().map(|p| p.0), &format!("{field}.add"))?;
    let remove = header_names(
        remove.iter().map(String::as_str),
        &format!("{field}.remove"),
    )?;
    if let Some((n, _)) = set.iter().chain(&add).find(|(_, v)| !is_header_value(v)) {
        return Err(unsupported(
            field,
            format!("value of header {n} has control characters"),
        ));
    }
    Ok(HeaderModifier {
        set: set_names
            .into_iter()
            .zip(set.iter().map(|p| p.1.to_owned()))
            .collect(),
        add: add_names
            .into_iter()
            .zip(add.iter().map(|p| p.1.to_owned()))
            .collect(),
        remove,
    })
}

/// A path modifier: `full` for ReplaceFullPath, `prefix` for ReplacePrefixMatch.
fn path_modifier(
    is_full: bool,
    full: Option<&String>,
    prefix: Option<&String>,
    field: &str,
    all_prefix: bool,
) -> Result<PathModifier, Problem> {
    let value = if is_full { full } else { prefix };
    let Some(value) = value else {
        let which = if is_full {
            "replaceFullPath"
        } else {
            "replacePrefixMatch"
        };
        return Err(unsupported(field, format!("{which} must be set")));
    };
    if !value.starts_with('/') {
        return Err(unsupported(
            field,
            format!("path {value:?} must start with '/'"),
        ));
    }
    if is_full {
        Ok(PathModifier::ReplaceFullPath(value.clone()))
    } else if all_prefix {
        Ok(PathModifier::ReplacePrefixMatch(value.clone()))
    } else {
        Err(unsupported(
            field,
            "ReplacePrefixMatch needs every match of the rule to be a PathPrefix match",
        ))
    }
}

fn redirect(
    r: &HttpRouteRulesFiltersRequestRedirect,
    field: &str,
    all_prefix: bool,
) -> Result<Redirect, Problem> {
    let field = format!("{field}.requestRedirect");
    let status_code = match r.status_code.unwrap_or(302) {
        c @ (301 | 302 | 303 | 307 | 308) => u16::try_from(c).unwrap_or(302),
        c => {
            return Err(unsupported(
                &field,
                format!("statusCode {c} is not supported"),
            ));
        }
    };
    let port = match r.port {
        None => None,
        Some(p) => Some(
            u16::try_from(p)
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| unsupported(&field, format!("port {p} is out of range")))?,
        ),
    };
    let path = match &r.path {
        None => None,
        Some(p) => Some(path_modifier(
            p.r#type == HttpRouteRulesFiltersRequestRedirectPathType::ReplaceFullPath,
            p.replace_full_path.as_ref(),
            p.replace_prefix_match.as_ref(),
            &format!("{field}.path"),
            all_prefix,
        )?),
    };
    Ok(Redirect {
        scheme: r.scheme.as_ref().map(|s| {
            match s {
                HttpRouteRulesFiltersRequestRedirectScheme::Http => "http",
                HttpRouteRulesFiltersRequestRedirectScheme::Https => "https",
            }
            .to_owned()
        }),
        hostname: hostname(r.hostname.as_deref(), &field)?,
        port,
        path,
        status_code,
    })
}

fn hostname(h: Option<&str>, field: &str) -> Result<Option<String>, Problem> {
    match h {
        None => Ok(None),
        Some(h) if h.trim().is_empty() || h.contains('*') => Err(unsupported(
            field,
            format!("hostname {h:?} is not a valid hostname"),
        )),
        Some(h) => Ok(Some(h.to_ascii_lowercase())),
    }
}

fn rewrite(
    r: &HttpRouteRulesFiltersUrlRewrite,
    field: &str,
    all_prefix: bool,
) -> Result<UrlRewrite, Problem> {
    let field = format!("{field}.urlRewrite");
    let path = match &r.path {
        None => None,
        Some(p) => Some(path_modifier(
            p.r#type == HttpRouteRulesFiltersUrlRewritePathType::ReplaceFullPath,
            p.replace_full_path.as_ref(),
            p.replace_prefix_match.as_ref(),
            &format!("{field}.path"),
            all_prefix,
        )?),
    };
    Ok(UrlRewrite {
        hostname: hostname(r.hostname.as_deref(), &field)?,
        path,
    })
}

fn mirror(
    m: &HttpRouteRulesFiltersRequestMirror,
    field: &str,
    ctx: &mut FilterCtx<'_, '_, '_, '_>,
) -> Result<Mirror, Problem> {
    let field = format!("{field}.requestMirror");
    let per_million: u32 = match (m.percent, &m.fraction) {
        (Some(_), Some(_)) => {
            return Err(unsupported(
                &field,
                "percent and fraction are mutually exclusive",
            ));
        }
        (Some(p), None) if (0..=100).contains(&p) => u32::try_from(p).unwrap_or(0) * 10_000,
        (Some(p), None) => {
            return Err(unsupported(
                &field,
                format!("percent {p} is not in 0..=100"),
            ));
        }
        (None, Some(f)) => {
            let den = i64::from(f.denominator.unwrap_or(100));
            let num = i64::from(f.numerator);
            if den <= 0 || num < 0 || num > den {
                return Err(unsupported(
                    &field,
                    format!(
                        "fraction {num}/{den} must satisfy 0 <= numerator <= denominator, denominator > 0"
                    ),
                ));
            }
            u32::try_from(num * 1_000_000 / den).unwrap_or(1_000_000)
        }
        (None, None) => 1_000_000,
    };
    let b = &m.backend_ref;
    let spec = RefSpec {
        group: b.group.as_deref(),
        kind: b.kind.as_deref(),
        name: &b.name,
        namespace: b.namespace.as_deref(),
        port: b.port,
    };
    let backend = ctx.resolve_backend(&spec, &format!("{field}.backendRef"));
    Ok(Mirror {
        backend,
        per_million,
        sampler: Default::default(),
    })
}

pub(super) fn cors(c: &HttpRouteRulesFiltersCors, field: &str) -> Result<Cors, Problem> {
    let field = format!("{field}.cors");
    let max_age = u32::try_from(c.max_age.unwrap_or(5))
        .map_err(|_| unsupported(&field, "maxAge must not be negative"))?;
    let list = |v: &Option<Vec<String>>| v.clone().unwrap_or_default();
    Ok(Cors {
        allow_origins: list(&c.allow_origins),
        allow_credentials: c.allow_credentials.unwrap_or(false),
        allow_methods: list(&c.allow_methods),
        allow_headers: list(&c.allow_headers),
        expose_headers: list(&c.expose_headers),
        max_age,
    })
}
