//! BackendTLSPolicy: which Service ports the proxy speaks TLS to, and how.
//!
//! In: BackendTLSPolicies and the ConfigMaps their `caCertificateRefs` name (through the
//! [`Index`], which evaluates them once per compile into [`Targets`]); after routes are
//! compiled, which Gateways' routes use which Service ports. Out: per Service port the
//! [`BackendTls`] settings of the policy that applies (or the [`Problem`] that closes it),
//! read by the backend resolver; per policy its status, one ancestor entry per Gateway whose
//! routes use a Service port it targets.
//!
//! The rules (Gateway API v1.5.1, `BackendTLSPolicySpec`, `BackendTLSPolicyValidation`):
//! - A targetRef names a core Service, optionally one port of it by `sectionName` (the port
//!   name). A policy naming the port applies there before one naming the whole Service.
//! - Two policies on the same Service and sectionName conflict: the older (creation time),
//!   then the first by `namespace/name`, wins; the other is `Accepted=False Conflicted` (when
//!   it lost every target it has).
//! - `caCertificateRefs` (core ConfigMaps with `ca.crt`; the policy's namespace only) or
//!   `wellKnownCACertificates: System`. A ref of another kind is `ResolvedRefs=False
//!   InvalidKind`; one that is missing, has no `ca.crt`, or holds no usable certificate is
//!   `ResolvedRefs=False InvalidCACertificateRef`; when no ref is usable the policy is also
//!   `Accepted=False NoValidCACertificate`. Any other well-known set, an option (none is
//!   recognised) or a malformed subjectAltName is `Accepted=False Invalid`.
//! - Fail closed: a Service port whose winning policy is not fully valid (any problem above)
//!   is never spoken to in plaintext nor with part of its CAs. Its backendRefs do not resolve
//!   (the route's `ResolvedRefs=False`, reason [`INVALID_BACKEND_TLS_POLICY`]) and the
//!   requests they would get are answered 500.
//! - `hostname` is the SNI; the backend's certificate must match it unless
//!   `subjectAltNames` is set, in which case it must carry one of those instead.

use std::collections::{BTreeMap, BTreeSet};

use gateway_types::backendtlspolicies::{
    BackendTlsPolicy, BackendTlsPolicyStatus, BackendTlsPolicyStatusAncestors,
    BackendTlsPolicyStatusAncestorsAncestorRef, BackendTlsPolicyValidationSubjectAltNamesType,
};
use gateway_types::gateways::{Gateway, GatewayListenersTlsCertificateRefs};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use tollgate_api::backend_tls::{ALPN_H2, ALPN_HTTP11, SubjectAltName, Trust};
use tollgate_api::{BackendTls, Certificate, ObjectKey};

use super::CONTROLLER_NAME;
use super::backends::RefSpec;
use super::conditions::{ACCEPTED, Conds, Problem, RESOLVED_REFS, reason};
use super::index::{Index, Ref, key_of, name_of, ns_of};
use crate::compile::Objects;

/// Route `ResolvedRefs=False` reason for a backendRef to a Service port whose
/// BackendTLSPolicy is not valid: the Service requires TLS the Gateway cannot set up, so the
/// ref is treated as unresolved (the spec's "a BackendTLSPolicy is present that refers to the
/// Service, and the implementation is unable to meet the requirement").
pub const INVALID_BACKEND_TLS_POLICY: &str = "InvalidBackendTLSPolicy";
/// Policy `Accepted=False` reason for a policy another takes precedence over.
pub const CONFLICTED: &str = "Conflicted";
/// Policy `Accepted=False` reason when no CA certificate ref is usable.
pub const NO_VALID_CA_CERTIFICATE: &str = "NoValidCACertificate";
/// Policy `ResolvedRefs=False` reason for a caCertificateRef of a kind we do not read.
pub const INVALID_KIND: &str = "InvalidKind";

/// A Service (namespace, name) and the sectionName (port name) a policy targets.
pub type TargetKey = (String, String, Option<String>);

/// What applies to one target: the winning policy and its settings, or why it is closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The winning policy.
    pub policy: ObjectKey,
    /// Its settings (ALPN and client certificate left for the backend and Gateway to fill
    /// in), or the problem that closes the target.
    pub outcome: Result<BackendTls, Problem>,
}

/// One policy as evaluated, before its ancestors are known.
#[derive(Debug, Clone)]
struct Evaluated {
    key: ObjectKey,
    generation: Option<i64>,
    /// Service targets (namespace, name, sectionName).
    targets: Vec<TargetKey>,
    /// `Accepted=False` problem, if any (Conflicted is decided later).
    accepted: Option<Problem>,
    /// `ResolvedRefs=False` problem, if any.
    resolved: Option<Problem>,
    /// Lost every target it has to an older policy.
    conflicted: bool,
}

/// Every BackendTLSPolicy evaluated: what applies to each target, and each policy's verdict.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    /// By target.
    pub by_target: BTreeMap<TargetKey, Target>,
    policies: Vec<Evaluated>,
}

impl Targets {
    /// Evaluates `policies` against the ConfigMaps in `config_maps`.
    pub fn new(
        policies: &Objects<BackendTlsPolicy>,
        config_maps: &BTreeMap<Ref<'_>, &ConfigMap>,
    ) -> Self {
        // One object per namespace/name (the same policy in two files: the first by key and
        // JSON, as the index keeps other kinds), then precedence: older first, then by
        // namespace/name.
        let mut sorted: Vec<&BackendTlsPolicy> = policies.iter().collect();
        sorted.sort_by_cached_key(|p| {
            (
                key_of(&p.metadata),
                serde_json::to_string(p).unwrap_or_default(),
            )
        });
        sorted.dedup_by(|b, a| key_of(&a.metadata) == key_of(&b.metadata));
        sorted.sort_by(|a, b| {
            let created = |p: &BackendTlsPolicy| p.metadata.creation_timestamp.clone().map(|t| t.0);
            created(a)
                .cmp(&created(b))
                .then_with(|| key_of(&a.metadata).cmp(&key_of(&b.metadata)))
        });
        let mut out = Targets::default();
        for p in sorted {
            let key = key_of(&p.metadata);
            let (settings, accepted, resolved) = evaluate(p, config_maps);
            let outcome = match (&accepted, &resolved) {
                (Some(problem), _) | (None, Some(problem)) => Err(problem.clone()),
                (None, None) => Ok(settings),
            };
            let mut targets = Vec::new();
            let mut won = 0;
            let mut non_service = Vec::new();
            for t in &p.spec.target_refs {
                if !(t.group.is_empty() || t.group == "core") || t.kind != "Service" {
                    non_service.push(format!("{}/{}", t.group, t.kind));
                    continue;
                }
                let tk: TargetKey = (
                    key.namespace.clone(),
                    t.name.clone(),
                    t.section_name.clone(),
                );
                if !out.by_target.contains_key(&tk) {
                    won += 1;
                    out.by_target.insert(
                        tk.clone(),
                        Target {
                            policy: key.clone(),
                            outcome: outcome.clone(),
                        },
                    );
                }
                targets.push(tk);
            }
            let accepted = accepted.or_else(|| {
                (!non_service.is_empty()).then(|| {
                    Problem::new(
                        reason::INVALID,
                        format!(
                            "targetRefs of kind {} are not supported (core Service only)",
                            non_service.join(", ")
                        ),
                    )
                })
            });
            out.policies.push(Evaluated {
                key,
                generation: p.metadata.generation,
                conflicted: !targets.is_empty() && won == 0,
                targets,
                accepted,
                resolved,
            });
        }
        out
    }

    /// The policy applying to port `port_name` of Service `ns/svc`: the one naming the port,
    /// else the one naming the whole Service.
    pub fn for_port(&self, ns: &str, svc: &str, port_name: Option<&str>) -> Option<&Target> {
        let mut key: TargetKey = (ns.to_owned(), svc.to_owned(), port_name.map(str::to_owned));
        if port_name.is_some()
            && let Some(t) = self.by_target.get(&key)
        {
            return Some(t);
        }
        key.2 = None;
        self.by_target.get(&key)
    }

    /// Statuses of the policies, given which Gateways' routes use which ports of which
    /// Services (`usage`: (namespace, Service) → port name → Gateways). A policy with no
    /// ancestor gets no status: no Gateway of ours uses what it targets.
    pub fn statuses(
        &self,
        usage: &BTreeMap<(String, String), BTreeMap<String, BTreeSet<ObjectKey>>>,
        now: &Time,
    ) -> BTreeMap<ObjectKey, BackendTlsPolicyStatus> {
        let mut out = BTreeMap::new();
        for p in &self.policies {
            let mut gateways = BTreeSet::new();
            for (ns, svc, section) in &p.targets {
                let Some(ports) = usage.get(&(ns.clone(), svc.clone())) else {
                    continue;
                };
                for (port, gws) in ports {
                    if section.as_deref().is_none_or(|s| s == port) {
                        gateways.extend(gws.iter().cloned());
                    }
                }
            }
            if gateways.is_empty() {
                continue;
            }
            let conditions = p.conditions(now);
            let ancestors = gateways
                .into_iter()
                .map(|gw| BackendTlsPolicyStatusAncestors {
                    ancestor_ref: BackendTlsPolicyStatusAncestorsAncestorRef {
                        group: Some(super::grants::GATEWAY_GROUP.to_owned()),
                        kind: Some("Gateway".to_owned()),
                        name: gw.name,
                        namespace: Some(gw.namespace),
                        port: None,
                        section_name: None,
                    },
                    conditions: conditions.clone(),
                    controller_name: CONTROLLER_NAME.to_owned(),
                })
                .collect();
            out.insert(p.key.clone(), BackendTlsPolicyStatus { ancestors });
        }
        out
    }
}

impl Evaluated {
    fn conditions(&self, now: &Time) -> Vec<Condition> {
        let conds = Conds::new(self.generation, now);
        let accepted = if self.conflicted {
            conds.no(
                ACCEPTED,
                CONFLICTED,
                "an older BackendTLSPolicy (or the first by namespace/name) targets the same Service and sectionName",
            )
        } else if let Some(p) = &self.accepted {
            conds.no(ACCEPTED, p.reason, p.message.clone())
        } else {
            conds.yes(ACCEPTED, reason::ACCEPTED, "BackendTLSPolicy is accepted")
        };
        let resolved = match &self.resolved {
            Some(p) => conds.no(RESOLVED_REFS, p.reason, p.message.clone()),
            None => conds.yes(
                RESOLVED_REFS,
                reason::RESOLVED_REFS,
                "every caCertificateRef resolved",
            ),
        };
        vec![accepted, resolved]
    }
}

/// The settings of `p` and its `Accepted` and `ResolvedRefs` problems (Conflicted aside).
fn evaluate(
    p: &BackendTlsPolicy,
    config_maps: &BTreeMap<Ref<'_>, &ConfigMap>,
) -> (BackendTls, Option<Problem>, Option<Problem>) {
    let ns = ns_of(&p.metadata);
    let v = &p.spec.validation;
    let mut accepted = None;
    let mut resolved = None;
    let invalid = |m: String| Some(Problem::new(reason::INVALID, m));
    let refs = v.ca_certificate_refs.as_deref().unwrap_or_default();
    let trust = match (refs.is_empty(), v.well_known_ca_certificates.as_deref()) {
        (true, Some("System")) => Trust::System,
        (true, Some(other)) => {
            accepted = invalid(format!(
                "wellKnownCACertificates {other:?} is not supported (System only)"
            ));
            Trust::System
        }
        (true, None) => {
            accepted = invalid(
                "one of caCertificateRefs and wellKnownCACertificates is required".to_owned(),
            );
            Trust::System
        }
        (false, Some(_)) => {
            accepted =
                invalid("caCertificateRefs and wellKnownCACertificates are exclusive".to_owned());
            Trust::System
        }
        (false, None) => {
            let mut bundle = String::new();
            let mut problems: Vec<Problem> = Vec::new();
            for r in refs {
                match ca_of(ns, &r.group, &r.kind, &r.name, config_maps) {
                    Ok(pem) => bundle.push_str(&pem),
                    Err(p) => problems.push(p),
                }
            }
            if let Some(first) = problems.first() {
                let message = problems
                    .iter()
                    .map(|p| p.message.as_str())
                    .collect::<Vec<_>>()
                    .join("; ");
                resolved = Some(Problem::new(first.reason, message.clone()));
                if bundle.is_empty() {
                    accepted = Some(Problem::new(NO_VALID_CA_CERTIFICATE, message));
                }
            }
            Trust::Pem(bundle)
        }
    };
    if accepted.is_none()
        && let Some(options) = p.spec.options.as_ref().filter(|o| !o.is_empty())
    {
        let keys: Vec<&str> = options.keys().map(String::as_str).collect();
        accepted = invalid(format!(
            "options {} not supported (Tollgate recognises no BackendTLSPolicy options)",
            keys.join(", ")
        ));
    }
    let mut sans = Vec::new();
    for san in v.subject_alt_names.iter().flatten() {
        let got = match san.r#type {
            BackendTlsPolicyValidationSubjectAltNamesType::Hostname => san
                .hostname
                .as_deref()
                .filter(|h| !h.is_empty())
                .map(|h| SubjectAltName::Hostname(h.to_ascii_lowercase())),
            BackendTlsPolicyValidationSubjectAltNamesType::Uri => san
                .uri
                .as_deref()
                .filter(|u| u.contains(':'))
                .map(|u| SubjectAltName::Uri(u.to_owned())),
        };
        match got {
            Some(s) => sans.push(s),
            None if accepted.is_none() => {
                accepted = invalid(format!(
                    "subjectAltNames: a {:?} entry without its value",
                    san.r#type
                ));
            }
            None => {}
        }
    }
    if accepted.is_none() && rustls_pki_types::ServerName::try_from(v.hostname.as_str()).is_err() {
        accepted = invalid(format!("hostname {:?} is not a valid SNI name", v.hostname));
    }
    let settings = BackendTls {
        source: format!("{ns}/{}", name_of(&p.metadata)),
        server_name: v.hostname.to_ascii_lowercase(),
        subject_alt_names: sans,
        trust,
        alpn: Vec::new(),
        client_certificate: None,
    };
    (settings, accepted, resolved)
}

/// The `ca.crt` of a caCertificateRef (core ConfigMap, the policy's namespace).
fn ca_of(
    ns: &str,
    group: &str,
    kind: &str,
    name: &str,
    config_maps: &BTreeMap<Ref<'_>, &ConfigMap>,
) -> Result<String, Problem> {
    if !(group.is_empty() || group == "core") || kind != "ConfigMap" {
        return Err(Problem::new(
            INVALID_KIND,
            format!("caCertificateRef {group}/{kind} {name}: only core ConfigMaps are supported"),
        ));
    }
    let what = format!("caCertificateRef ConfigMap {ns}/{name}");
    let Some(cm) = config_maps.get(&(ns, name)) else {
        return Err(Problem::new(
            reason::INVALID_CA_CERTIFICATE_REF,
            format!("{what} does not exist"),
        ));
    };
    let Some(pem) = cm.data.as_ref().and_then(|d| d.get(super::tls::CA_KEY)) else {
        return Err(Problem::new(
            reason::INVALID_CA_CERTIFICATE_REF,
            format!("{what} has no key {}", super::tls::CA_KEY),
        ));
    };
    super::tls::check_ca_pem(pem, &what)
}

/// The ALPN protocols offered to a backend: `h2` alone when it must be spoken to over HTTP/2
/// (gRPC, `kubernetes.io/h2c`), `http/1.1` alone for a WebSocket port, both otherwise (the
/// backend picks; an upgrade always goes over HTTP/1.1).
pub fn alpn(h2_only: bool, app_protocol: Option<&str>) -> Vec<String> {
    if h2_only {
        vec![ALPN_H2.to_owned()]
    } else if matches!(app_protocol, Some("kubernetes.io/ws" | "kubernetes.io/wss")) {
        vec![ALPN_HTTP11.to_owned()]
    } else {
        vec![ALPN_H2.to_owned(), ALPN_HTTP11.to_owned()]
    }
}

/// The certificate Gateway `gw` presents to TLS backends (`spec.tls.backend
/// .clientCertificateRef`): `None` when unset, else the certificate or why it is unusable
/// (reason `InvalidClientCertificateRef` or `RefNotPermitted`).
pub fn client_certificate(gw: &Gateway, idx: &Index<'_>) -> Option<Result<Certificate, Problem>> {
    let r = gw
        .spec
        .tls
        .as_ref()
        .and_then(|t| t.backend.as_ref())
        .and_then(|b| b.client_certificate_ref.as_ref())?;
    // The listener certificate resolver checks a Secret the way the proxy loads it.
    let as_listener_ref = GatewayListenersTlsCertificateRefs {
        group: r.group.clone(),
        kind: r.kind.clone(),
        name: r.name.clone(),
        namespace: r.namespace.clone(),
    };
    let mut resolved = super::certs::resolve(idx, ns_of(&gw.metadata), &[as_listener_ref]);
    Some(match resolved.certificates.pop() {
        Some(c) => Ok(c),
        None => {
            let p = resolved.problems.pop().unwrap_or_else(|| {
                Problem::new(reason::INVALID_CLIENT_CERTIFICATE_REF, "unusable")
            });
            let reason = if p.reason == reason::REF_NOT_PERMITTED {
                reason::REF_NOT_PERMITTED
            } else {
                reason::INVALID_CLIENT_CERTIFICATE_REF
            };
            Err(Problem::new(
                reason,
                format!("spec.tls.backend.clientCertificateRef: {}", p.message),
            ))
        }
    })
}

/// Which Gateways' served routes (HTTPRoutes and GRPCRoutes) name which ports of which
/// Services: (namespace, Service) → port name → Gateways. A ref counts whether or not it
/// resolved, so a policy that closes its Service still names the Gateways it closes it for.
pub fn service_usage(
    idx: &Index<'_>,
    gateways: &[super::listeners::GatewayModel<'_>],
    routes: &super::routes::Routes<'_>,
) -> BTreeMap<(String, String), BTreeMap<String, BTreeSet<ObjectKey>>> {
    let mut out: BTreeMap<(String, String), BTreeMap<String, BTreeSet<ObjectKey>>> =
        BTreeMap::new();
    for r in &routes.routes {
        if r.attachments.is_empty() {
            continue;
        }
        let refs: Vec<RefSpec<'_>> = match r.kind {
            super::RouteKind::Http => {
                let Ok(i) = idx
                    .routes
                    .binary_search_by(|x| key_cmp(&x.metadata, &r.key))
                else {
                    continue;
                };
                idx.routes[i]
                    .spec
                    .rules
                    .iter()
                    .flatten()
                    .flat_map(|rule| rule.backend_refs.iter().flatten())
                    .map(|b| RefSpec {
                        group: b.group.as_deref(),
                        kind: b.kind.as_deref(),
                        name: b.name.as_str(),
                        namespace: b.namespace.as_deref(),
                        port: b.port,
                    })
                    .collect()
            }
            super::RouteKind::Grpc => {
                let Ok(i) = idx
                    .grpc_routes
                    .binary_search_by(|x| key_cmp(&x.metadata, &r.key))
                else {
                    continue;
                };
                idx.grpc_routes[i]
                    .spec
                    .rules
                    .iter()
                    .flatten()
                    .flat_map(|rule| rule.backend_refs.iter().flatten())
                    .map(|b| RefSpec {
                        group: b.group.as_deref(),
                        kind: b.kind.as_deref(),
                        name: b.name.as_str(),
                        namespace: b.namespace.as_deref(),
                        port: b.port,
                    })
                    .collect()
            }
            // TLS streams are copied or terminated here, TCP streams and UDP datagrams copied:
            // never encrypted.
            super::RouteKind::Tls | super::RouteKind::Tcp | super::RouteKind::Udp => continue,
        };
        let gws: BTreeSet<ObjectKey> = r
            .attachments
            .iter()
            .filter_map(|a| gateways.get(a.gateway).map(|g| g.key.clone()))
            .collect();
        for RefSpec {
            group,
            kind,
            name,
            namespace,
            port,
        } in refs
        {
            if !matches!(group, None | Some("" | "core")) || kind.unwrap_or("Service") != "Service"
            {
                continue;
            }
            let ns = namespace.unwrap_or(&r.key.namespace);
            let Some(port_name) = idx
                .services
                .get(&(ns, name))
                .and_then(|s| s.spec.as_ref())
                .and_then(|s| s.ports.as_ref())
                .and_then(|ports| ports.iter().find(|p| Some(p.port) == port))
                .map(|p| p.name.clone().unwrap_or_default())
            else {
                continue;
            };
            out.entry((ns.to_owned(), name.to_owned()))
                .or_default()
                .entry(port_name)
                .or_default()
                .extend(gws.iter().cloned());
        }
    }
    out
}

fn key_cmp(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &ObjectKey,
) -> std::cmp::Ordering {
    (ns_of(meta), name_of(meta)).cmp(&(key.namespace.as_str(), key.name.as_str()))
}
