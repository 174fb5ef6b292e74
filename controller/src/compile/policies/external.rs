//! AuthPolicy `external` authorization rules to table [`ExternalAuthz`] checks.
//!
//! In: one rule's [`ExternalAuthSpec`], the policy's key, and [`ExternalBackends`] (the
//! Services, EndpointSlices, ReferenceGrants and BackendTLSPolicies through the index). Out:
//! the [`ExternalAuthz`] the proxy runs, its backend resolved as a route's backendRef is (so
//! TLS through a BackendTLSPolicy on the Service port comes with it), or the `Invalid`
//! problem: neither or both of `grpc` and `http`, a duration that does not parse, a header
//! name that is none, a path that is not absolute, or a backendRef that does not resolve.
//! An invalid rule makes the policy invalid, which closes its targets (fail closed).
//!
//! A backendRef to another namespace needs a ReferenceGrant there from
//! `tollgate.dev/AuthPolicy` in the policy's namespace. gRPC services are spoken to over
//! HTTP/2 (h2c, or TLS with ALPN h2), under the key a GRPCRoute's backend gets.

use std::cell::RefCell;

use tollgate_api::external::{AllowStatus, ExternalAuthz, ExternalProtocol, HttpCheck};
use tollgate_api::{Backend, BackendKey, ObjectKey, RouteTable};

use super::ratelimit::parse_window;
use super::{Problem, invalid};
use crate::compile::backends::{RefSpec, Resolver};
use crate::compile::grants::{CrossRef, permitted};
use crate::compile::index::{Index, LookupMap};
use crate::compile::kinds::RouteKind;
use crate::crds::external::{ExternalAuthSpec, ExternalBackendRef};

/// Default check timeout: 200 ms.
pub const DEFAULT_TIMEOUT_MS: u64 = 200;

/// The group and kind a ReferenceGrant names to let AuthPolicies reach a Service.
const FROM_GROUP: &str = "tollgate.dev";
const FROM_KIND: &str = "AuthPolicy";

/// Resolves the backendRefs of external rules and remembers the backends for the tables.
pub struct ExternalBackends<'i, 'a> {
    idx: &'i Index<'a>,
    resolver: RefCell<Resolver<'i, 'a>>,
}

impl<'i, 'a> ExternalBackends<'i, 'a> {
    /// Over `idx`.
    pub fn new(idx: &'i Index<'a>) -> Self {
        Self {
            idx,
            resolver: RefCell::new(Resolver::new(idx)),
        }
    }

    /// The backend key of `r`, referred to from a policy in `policy_ns`.
    fn resolve(
        &self,
        policy_ns: &str,
        r: &ExternalBackendRef,
        grpc: bool,
        field: &str,
    ) -> Result<String, Problem> {
        let ns = r.namespace.as_deref().unwrap_or(policy_ns);
        let cross = CrossRef {
            from_group: FROM_GROUP,
            from_kind: FROM_KIND,
            from_namespace: policy_ns,
            to_group: "",
            to_kind: "Service",
            to_namespace: ns,
            to_name: &r.name,
        };
        if !permitted(self.idx, &cross) {
            return Err(invalid(format!(
                "{field}: Service {ns}/{} is not permitted by any ReferenceGrant in {ns} (from {FROM_GROUP}/{FROM_KIND})",
                r.name
            )));
        }
        let spec = RefSpec {
            group: r.group.as_deref(),
            kind: r.kind.as_deref(),
            name: &r.name,
            // The grant was checked above for an AuthPolicy: resolve as from the Service's
            // own namespace.
            namespace: Some(ns),
            port: r.port,
        };
        let kind = if grpc {
            RouteKind::Grpc
        } else {
            RouteKind::Http
        };
        self.resolver
            .borrow_mut()
            .resolve(ns, kind, &spec)
            .map_err(|p| invalid(format!("{field}: {}", p.message)))
    }

    /// Every backend resolved so far, by key.
    pub fn into_backends(self) -> LookupMap<String, Backend> {
        self.resolver.into_inner().backends
    }
}

/// Compiles `rules.authorization.<name>.external` of the policy `key`.
pub fn compile(
    name: &str,
    spec: &ExternalAuthSpec,
    key: &ObjectKey,
    backends: &ExternalBackends<'_, '_>,
) -> Result<ExternalAuthz, Problem> {
    let field = format!("authorization.{name}.external");
    let duration = |v: &Option<String>, what: &str| -> Result<Option<u64>, Problem> {
        v.as_deref()
            .map(|s| {
                parse_window(s).filter(|ms| *ms > 0).ok_or_else(|| {
                    invalid(format!(
                        "{field}.{what}: {s:?} is not a duration like 200ms, 1s, 30s, 5m"
                    ))
                })
            })
            .transpose()
    };
    let timeout_ms = duration(&spec.timeout, "timeout")?.unwrap_or(DEFAULT_TIMEOUT_MS);
    let cache_ttl_ms = duration(&spec.cache_ttl, "cacheTTL")?;
    let id = format!("{}/{}/{name}", key.namespace, key.name);
    match (&spec.grpc, &spec.http) {
        (Some(g), None) => {
            let f = format!("{field}.grpc");
            Ok(ExternalAuthz {
                id,
                backend: backends.resolve(
                    &key.namespace,
                    &g.backend_ref,
                    true,
                    &format!("{f}.backendRef"),
                )?,
                protocol: ExternalProtocol::Grpc,
                forward_headers: header_names(&g.forward_headers, &format!("{f}.forwardHeaders"))?,
                max_body_bytes: g.forward_body.as_ref().map(|b| u64::from(b.max_bytes)),
                timeout_ms,
                fail_open: spec.fail_open,
                cache_ttl_ms,
            })
        }
        (None, Some(h)) => {
            let f = format!("{field}.http");
            let path_prefix = h.path.clone().unwrap_or_default();
            let valid = path_prefix.is_empty()
                || (path_prefix.starts_with('/')
                    && !path_prefix.contains(['?', '#'])
                    && path_prefix.parse::<http::uri::PathAndQuery>().is_ok());
            if !valid {
                return Err(invalid(format!(
                    "{f}.path: {path_prefix:?} is not an absolute path without a query"
                )));
            }
            Ok(ExternalAuthz {
                id,
                backend: backends.resolve(
                    &key.namespace,
                    &h.backend_ref,
                    false,
                    &format!("{f}.backendRef"),
                )?,
                protocol: ExternalProtocol::Http(HttpCheck {
                    path_prefix: path_prefix.trim_end_matches('/').to_owned(),
                    headers_to_upstream: header_names(
                        &h.headers_to_upstream,
                        &format!("{f}.headersToUpstream"),
                    )?,
                    headers_to_client: header_names(
                        &h.headers_to_client,
                        &format!("{f}.headersToClient"),
                    )?,
                    all_headers_to_upstream: false,
                    // nginx's auth_request and Traefik's ForwardAuth: any 2xx allows.
                    allow: AllowStatus::Any2xx,
                }),
                forward_headers: header_names(&h.forward_headers, &format!("{f}.forwardHeaders"))?,
                max_body_bytes: h.forward_body.as_ref().map(|b| u64::from(b.max_bytes)),
                timeout_ms,
                fail_open: spec.fail_open,
                cache_ttl_ms,
            })
        }
        _ => Err(invalid(format!("{field}: set exactly one of grpc, http"))),
    }
}

/// Lower-cased, checked, sorted and deduplicated header names.
pub fn header_names(names: &[String], field: &str) -> Result<Vec<String>, Problem> {
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        let lower = n.to_ascii_lowercase();
        if http::HeaderName::from_bytes(lower.as_bytes()).is_err() {
            return Err(invalid(format!("{field}: {n:?} is not a header name")));
        }
        out.push(lower);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Adds to each table the backends its external authorization rules name (the tables hold
/// only the backends their routes name).
pub fn add_backends(
    tables: &mut std::collections::BTreeMap<ObjectKey, RouteTable>,
    backends: &LookupMap<String, Backend>,
) {
    if backends.is_empty() {
        return;
    }
    for table in tables.values_mut() {
        let keys: Vec<&String> = table
            .policies
            .values()
            .filter_map(|s| s.auth.as_ref())
            .flat_map(|a| &a.authorization)
            .filter_map(|r| r.external.as_ref().map(|e| &e.backend))
            .collect();
        let mut add = Vec::new();
        for k in keys {
            if !table.backends.contains_key(k)
                && let Some(b) = backends.get(k)
            {
                add.push((k.clone(), b.clone()));
            }
        }
        table.backends.extend(add);
    }
}

/// The key a gRPC authorization service's Service port gets (for tests and docs).
pub fn grpc_key(ns: &str, name: &str, port: u16) -> String {
    BackendKey::h2c(ns, name, port)
}
