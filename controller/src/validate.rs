//! `tollgate validate DIR`: print the status every object would get, and say whether any is
//! rejected.
//!
//! In: a directory of manifests. Out: a human-readable report (one block per object, one line
//! per condition) and the list of rejections; the command exits non-zero when that list, or the
//! list of files that did not parse, is not empty.

use std::fmt::Write as _;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use tollgate_api::ObjectKey;

use crate::compile::kinds::{RouteKind, RouteParent};
use crate::compile::{Output, Rejection, compile};
use crate::manifests::{ManifestDir, ManifestError};

/// What `validate` found.
pub struct Report {
    /// The printable report.
    pub text: String,
    /// Rejected objects.
    pub rejections: Vec<Rejection>,
    /// Files that did not parse.
    pub errors: Vec<ManifestError>,
}

impl Report {
    /// True when nothing was rejected and every file parsed.
    pub fn ok(&self) -> bool {
        self.rejections.is_empty() && self.errors.is_empty()
    }
}

/// Validates the manifests under `dir`.
pub fn validate(dir: &std::path::Path, now: Time) -> Result<Report, ManifestError> {
    let mut manifests = ManifestDir::new(dir);
    let scan = manifests.scan(&now)?;
    let out = compile(scan.inputs);
    let mut text = render(&out);
    let rejections = out.rejections();
    for e in &scan.errors {
        let _ = writeln!(text, "error: {e}");
    }
    if !rejections.is_empty() {
        let _ = writeln!(text, "\n{} rejected:", rejections.len());
        for r in &rejections {
            let _ = writeln!(text, "  {r}");
        }
    }
    Ok(Report {
        text,
        rejections,
        errors: scan.errors,
    })
}

/// A Gateway's or ListenerSet's block: its conditions, then each listener's (name,
/// attachedRoutes, conditions).
fn with_listeners<'a>(
    text: &mut String,
    kind: &str,
    key: &ObjectKey,
    conds: Option<&[Condition]>,
    listeners: impl Iterator<Item = (&'a str, i32, &'a [Condition])>,
) {
    let _ = writeln!(text, "{kind} {key}");
    conditions(text, "  ", conds.unwrap_or_default());
    for (name, attached, conds) in listeners {
        let _ = writeln!(text, "  listener {name} (attachedRoutes {attached})");
        conditions(text, "    ", conds);
    }
}

fn conditions(text: &mut String, indent: &str, conds: &[Condition]) {
    for c in conds {
        let _ = writeln!(
            text,
            "{indent}{}={} {}: {}",
            c.type_, c.status, c.reason, c.message
        );
    }
}

/// Renders every status of a compile output.
pub fn render(out: &Output) -> String {
    let mut text = String::new();
    for (name, st) in &out.gateway_classes {
        let _ = writeln!(text, "GatewayClass {name}");
        conditions(
            &mut text,
            "  ",
            st.conditions.as_deref().unwrap_or_default(),
        );
    }
    for (key, st) in &out.gateways {
        let listeners = st.listeners.iter().flatten();
        let listeners = listeners.map(|l| (l.name.as_str(), l.attached_routes, &l.conditions[..]));
        with_listeners(
            &mut text,
            "Gateway",
            key,
            st.conditions.as_deref(),
            listeners,
        );
    }
    for (key, st) in &out.listener_sets {
        let listeners = st.listeners.iter().flatten();
        let listeners = listeners.map(|l| (l.name.as_str(), l.attached_routes, &l.conditions[..]));
        with_listeners(
            &mut text,
            "ListenerSet",
            key,
            st.conditions.as_deref(),
            listeners,
        );
    }
    for (key, st) in &out.http_routes {
        route(&mut text, RouteKind::Http, key, &st.parents);
    }
    for (key, st) in &out.grpc_routes {
        route(&mut text, RouteKind::Grpc, key, &st.parents);
    }
    for (key, st) in &out.tls_routes {
        route(&mut text, RouteKind::Tls, key, &st.parents);
    }
    for (key, st) in &out.tcp_routes {
        route(&mut text, RouteKind::Tcp, key, &st.parents);
    }
    for (key, st) in &out.udp_routes {
        route(&mut text, RouteKind::Udp, key, &st.parents);
    }
    for (kind, statuses) in [
        ("RateLimitPolicy", &out.rate_limit_policies),
        ("AuthPolicy", &out.auth_policies),
        ("ClientPolicy", &out.client_policies),
        ("BackendPolicy", &out.backend_policies),
        ("CachePolicy", &out.cache_policies),
        ("XBackendTrafficPolicy", &out.backend_traffic_policies),
    ] {
        for (key, st) in statuses {
            let _ = writeln!(text, "{kind} {key}");
            conditions(&mut text, "  ", &st.conditions);
            for a in &st.ancestors {
                let r = &a.ancestor_ref;
                let _ = writeln!(text, "  Gateway {}/{}", r.namespace, r.name);
                conditions(&mut text, "    ", &a.conditions);
            }
        }
    }
    for (key, st) in &out.backend_tls_policies {
        let _ = writeln!(text, "BackendTLSPolicy {key}");
        for a in &st.ancestors {
            let r = &a.ancestor_ref;
            let ns = r.namespace.as_deref().unwrap_or(&key.namespace);
            let _ = writeln!(text, "  Gateway {ns}/{}", r.name);
            conditions(&mut text, "    ", &a.conditions);
        }
    }
    text
}

/// Renders one route's parent entries.
fn route<P: RouteParent>(text: &mut String, kind: RouteKind, key: &ObjectKey, parents: &[P]) {
    let _ = writeln!(text, "{kind} {key}");
    if parents.is_empty() {
        let _ = writeln!(text, "  not attached to any Tollgate Gateway");
    }
    for p in parents {
        let (ns, name, section, _) = p.parent();
        let ns = ns.unwrap_or(&key.namespace);
        let section = section.map(|s| format!(" section {s}")).unwrap_or_default();
        let parent = p.parent_kind();
        let _ = writeln!(text, "  parent {parent} {ns}/{name}{section}");
        conditions(text, "    ", p.conditions());
    }
}
