//! Reading the compiler's output: rejections and serialization.
//!
//! In: an [`Output`]. Out: the list of [`Rejection`]s (every negative Accepted, ResolvedRefs
//! or Programmed condition, with the object and listener/parent it belongs to; routes of every
//! kind) that
//! `tollgate validate` prints and exits non-zero on; and a serializer that writes maps keyed by
//! [`ObjectKey`] as `"namespace/name"` JSON keys.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::{Serialize, Serializer};
use tollgate_api::ObjectKey;

use super::Output;
use super::conditions::{ACCEPTED, PROGRAMMED, RESOLVED_REFS};
use super::kinds::{RouteKind, RouteParent};

/// One condition saying an object (or part of it) is rejected.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rejection {
    /// `GatewayClass`, `Gateway`, `HTTPRoute`, `GRPCRoute`, `RateLimitPolicy`, `AuthPolicy`,
    /// `ClientPolicy` or `BackendTLSPolicy`.
    pub kind: &'static str,
    /// The object (`namespace` empty for GatewayClass).
    pub key: ObjectKey,
    /// Listener name (Gateway) or parent Gateway `namespace/name[/section][:port]` (routes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub part: Option<String>,
    /// Condition type.
    pub condition: String,
    /// Reason.
    pub reason: String,
    /// Message.
    pub message: String,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind, self.key)?;
        if let Some(p) = &self.part {
            write!(f, " ({p})")?;
        }
        write!(
            f,
            ": {}=False {}: {}",
            self.condition, self.reason, self.message
        )
    }
}

fn is_rejection(c: &Condition) -> bool {
    c.status == "False" && [ACCEPTED, RESOLVED_REFS, PROGRAMMED].contains(&c.type_.as_str())
}

fn push(
    out: &mut Vec<Rejection>,
    kind: &'static str,
    key: &ObjectKey,
    part: Option<String>,
    conds: &[Condition],
) {
    for c in conds.iter().filter(|c| is_rejection(c)) {
        out.push(Rejection {
            kind,
            key: key.clone(),
            part: part.clone(),
            condition: c.type_.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
        });
    }
}

impl Output {
    /// Every rejected object, listener and route parent, sorted.
    pub fn rejections(&self) -> Vec<Rejection> {
        let mut out = Vec::new();
        for (name, s) in &self.gateway_classes {
            let key = ObjectKey::new("", name.as_str());
            push(
                &mut out,
                "GatewayClass",
                &key,
                None,
                s.conditions.as_deref().unwrap_or_default(),
            );
        }
        for (key, s) in &self.gateways {
            let listeners = s.listeners.iter().flatten();
            let listeners = listeners.map(|l| (l.name.as_str(), &l.conditions[..]));
            push_with_listeners(&mut out, "Gateway", key, s.conditions.as_deref(), listeners);
        }
        for (key, s) in &self.listener_sets {
            let listeners = s.listeners.iter().flatten();
            let listeners = listeners.map(|l| (l.name.as_str(), &l.conditions[..]));
            let conds = s.conditions.as_deref();
            push_with_listeners(&mut out, "ListenerSet", key, conds, listeners);
        }
        for (key, s) in &self.http_routes {
            push_route(&mut out, RouteKind::Http, key, &s.parents);
        }
        for (key, s) in &self.grpc_routes {
            push_route(&mut out, RouteKind::Grpc, key, &s.parents);
        }
        for (key, s) in &self.tls_routes {
            push_route(&mut out, RouteKind::Tls, key, &s.parents);
        }
        for (key, s) in &self.tcp_routes {
            push_route(&mut out, RouteKind::Tcp, key, &s.parents);
        }
        for (key, s) in &self.udp_routes {
            push_route(&mut out, RouteKind::Udp, key, &s.parents);
        }
        for (kind, statuses) in [
            ("RateLimitPolicy", &self.rate_limit_policies),
            ("AuthPolicy", &self.auth_policies),
            ("ClientPolicy", &self.client_policies),
            ("BackendPolicy", &self.backend_policies),
            ("CachePolicy", &self.cache_policies),
            ("XBackendTrafficPolicy", &self.backend_traffic_policies),
        ] {
            for (key, s) in statuses {
                push(&mut out, kind, key, None, &s.conditions);
            }
        }
        for (key, s) in &self.backend_tls_policies {
            for a in &s.ancestors {
                let gw = &a.ancestor_ref;
                let part = format!(
                    "ancestor {}/{}",
                    gw.namespace.as_deref().unwrap_or(&key.namespace),
                    gw.name
                );
                push(&mut out, "BackendTLSPolicy", key, Some(part), &a.conditions);
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

/// Pushes the rejections of one route's parent entries.
/// [`push`] for a Gateway or ListenerSet and each of its listeners (name, conditions).
fn push_with_listeners<'a>(
    out: &mut Vec<Rejection>,
    kind: &'static str,
    key: &ObjectKey,
    conds: Option<&[Condition]>,
    listeners: impl Iterator<Item = (&'a str, &'a [Condition])>,
) {
    push(out, kind, key, None, conds.unwrap_or_default());
    for (name, conds) in listeners {
        push(out, kind, key, Some(format!("listener {name}")), conds);
    }
}

fn push_route<P: RouteParent>(
    out: &mut Vec<Rejection>,
    kind: RouteKind,
    key: &ObjectKey,
    parents: &[P],
) {
    // Most parents have no rejection: their `part` is not formatted.
    for p in parents
        .iter()
        .filter(|p| p.conditions().iter().any(is_rejection))
    {
        let (ns, name, section, port) = p.parent();
        let ns = ns.unwrap_or(&key.namespace);
        let mut part = match p.parent_kind() {
            "Gateway" => format!("parent {ns}/{name}"),
            kind => format!("parent {kind} {ns}/{name}"),
        };
        if let Some(sn) = section {
            part.push('/');
            part.push_str(sn);
        }
        if let Some(port) = port {
            part.push_str(&format!(":{port}"));
        }
        push(out, kind.as_str(), key, Some(part), p.conditions());
    }
}

/// Serializes a map keyed by [`ObjectKey`] with `"namespace/name"` string keys.
pub fn keyed<V: Serialize, S: Serializer>(
    map: &BTreeMap<ObjectKey, V>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_map(map.iter().map(|(k, v)| (k.to_string(), v)))
}
