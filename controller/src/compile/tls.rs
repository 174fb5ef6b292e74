//! Listener TLS settings beyond certificates: client-certificate validation, refused options.
//!
//! In: a Gateway's `spec.tls` and a listener's `tls.options`, Secrets, ConfigMaps and
//! ReferenceGrants through the [`Index`]. Out: the [`Frontend`] validation of an HTTPS
//! listener, a [`Problem`] that rejects one listener, or a Gateway `ResolvedRefs` condition.
//!
//! - `spec.tls.frontend` validation (the `default`, or the `perPort` entry for the listener's
//!   port, which overrides it) applies to the HTTPS listeners on that port: their
//!   `caCertificateRefs` (core ConfigMaps, and Secrets as an implementation-specific kind, key
//!   `ca.crt`, cross-namespace only with a ReferenceGrant) become the port's CA bundle and
//!   mode in the table. Each unusable reference makes the listener `ResolvedRefs=False`
//!   (`InvalidCACertificateRef`, `InvalidCACertificateKind`, `RefNotPermitted`); when none is
//!   usable the listener is `Accepted=False NoValidCACertificate` and not served, never served
//!   without the validation it asks for.
//! - Listener `tls.options` ("Support: Implementation-specific") are all unknown to us: we
//!   define no keys and the spec defines none yet. Options typically tighten TLS (minimum
//!   version, cipher suites), so ignoring one could serve weaker TLS than asked: a listener
//!   with any option is `Accepted=False`, `UnsupportedValue`, naming the keys.
//! - `spec.tls.backend.clientCertificateRef` (the certificate the proxy presents to TLS
//!   backends, module [`super::backend_tls`]): the Gateway gets `ResolvedRefs=True` when it
//!   resolves, else `ResolvedRefs=False` with reason `RefNotPermitted` (cross-namespace without
//!   a ReferenceGrant) or `InvalidClientCertificateRef`; as the spec says, this "does not
//!   directly impact the Gateway's Accepted or Programmed conditions". TLS backends are then
//!   dialled without a client certificate (one that requires it refuses the handshake: 502).

use gateway_types::gateways::{
    Gateway, GatewayListeners, GatewayTlsFrontendDefaultValidationMode,
    GatewayTlsFrontendPerPortTlsValidationMode,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tollgate_api::{ClientCertMode, ClientValidation, Protocol};

use super::conditions::{Conds, INSECURE_FRONTEND_VALIDATION_MODE, Problem, RESOLVED_REFS, reason};
use super::grants::{CrossRef, GATEWAY_GROUP, permitted};
use super::index::{Index, ns_of};

/// Why listener `l` of `gw` cannot be accepted because of TLS settings we do not implement.
pub fn listener_problem(
    gw: &Gateway,
    l: &GatewayListeners,
    protocol: Option<Protocol>,
) -> Option<Problem> {
    let options: Vec<&str> = l
        .tls
        .as_ref()
        .and_then(|t| t.options.as_ref())
        .into_iter()
        .flat_map(|o| o.keys().map(String::as_str))
        .collect();
    if !options.is_empty() {
        return Some(Problem::new(
            reason::UNSUPPORTED_VALUE,
            format!(
                "tls.options {} not supported (Tollgate recognises no TLS options)",
                if options.len() == 1 {
                    format!("{} is", options[0])
                } else {
                    format!("{} are", options.join(", "))
                }
            ),
        ));
    }
    let _ = (gw, protocol);
    None
}

/// What `spec.tls.frontend` asks of an HTTPS listener: the CA bundle its clients are verified
/// against, the problems of its `caCertificateRefs` (for `ResolvedRefs=False`), and the
/// `NoValidCACertificate` problem when none of them is usable (the listener is not accepted:
/// serving it without the validation asked for would let any client in).
#[derive(Debug, Default)]
pub struct Frontend {
    /// The validation to program, when at least one CA resolved.
    pub validation: Option<ClientValidation>,
    /// One problem per unusable reference.
    pub problems: Vec<Problem>,
    /// Set when validation is asked for and no reference is usable.
    pub no_valid_ca: Option<Problem>,
}

/// One caCertificateRef and the mode, whichever generated type it came from.
struct ValidationSpec<'s> {
    refs: Vec<(&'s str, &'s str, &'s str, Option<&'s str>)>,
    insecure_fallback: bool,
}

macro_rules! validation_spec {
    ($v:expr, $fallback:path) => {
        ValidationSpec {
            refs: $v
                .ca_certificate_refs
                .iter()
                .map(|r| {
                    (
                        r.group.as_str(),
                        r.kind.as_str(),
                        r.name.as_str(),
                        r.namespace.as_deref(),
                    )
                })
                .collect(),
            insecure_fallback: matches!($v.mode, Some($fallback)),
        }
    };
}

/// The frontend validation of listener `l` (HTTPS only; the `perPort` entry for its port
/// overrides the `default`).
pub fn frontend(
    gw: &Gateway,
    l: &GatewayListeners,
    protocol: Option<Protocol>,
    idx: &Index<'_>,
) -> Frontend {
    let Some(fe) = gw.spec.tls.as_ref().and_then(|t| t.frontend.as_ref()) else {
        return Frontend::default();
    };
    if protocol != Some(Protocol::Https) {
        return Frontend::default();
    }
    let spec = match fe.per_port.iter().flatten().find(|p| p.port == l.port) {
        Some(pp) => match &pp.tls.validation {
            Some(v) => validation_spec!(
                v,
                GatewayTlsFrontendPerPortTlsValidationMode::AllowInsecureFallback
            ),
            None => return Frontend::default(),
        },
        None => match &fe.default.validation {
            Some(v) => validation_spec!(
                v,
                GatewayTlsFrontendDefaultValidationMode::AllowInsecureFallback
            ),
            None => return Frontend::default(),
        },
    };
    let gw_ns = ns_of(&gw.metadata);
    let mut out = Frontend::default();
    let mut bundle = String::new();
    for (group, kind, name, ns) in &spec.refs {
        let ns = ns.unwrap_or(gw_ns);
        match ca_bundle(idx, gw_ns, group, kind, name, ns) {
            Ok(pem) => bundle.push_str(&pem),
            Err(p) => out.problems.push(p),
        }
    }
    if bundle.is_empty() {
        out.no_valid_ca = Some(Problem::new(
            reason::NO_VALID_CA_CERTIFICATE,
            format!(
                "spec.tls.frontend: no usable CA certificate for port {} ({} reference(s) invalid)",
                l.port,
                out.problems.len()
            ),
        ));
    } else {
        out.validation = Some(ClientValidation {
            ca_pem: bundle,
            mode: if spec.insecure_fallback {
                ClientCertMode::AllowInsecureFallback
            } else {
                ClientCertMode::AllowValidOnly
            },
        });
    }
    out
}

/// The PEM certificates of one caCertificateRef (key `ca.crt` of a ConfigMap, or of a Secret).
fn ca_bundle(
    idx: &Index<'_>,
    gw_ns: &str,
    group: &str,
    kind: &str,
    name: &str,
    ns: &str,
) -> Result<String, Problem> {
    let what = format!("caCertificateRef {kind} {ns}/{name}");
    if !group.is_empty() || !matches!(kind, "ConfigMap" | "Secret") {
        return Err(Problem::new(
            reason::INVALID_CA_CERTIFICATE_KIND,
            format!("{what}: only core ConfigMaps and Secrets are supported (group {group:?})"),
        ));
    }
    let cross = CrossRef {
        from_group: GATEWAY_GROUP,
        from_kind: "Gateway",
        from_namespace: gw_ns,
        to_group: "",
        to_kind: kind,
        to_namespace: ns,
        to_name: name,
    };
    if ns != gw_ns && !permitted(idx, &cross) {
        return Err(Problem::new(
            reason::REF_NOT_PERMITTED,
            format!("{what} is not permitted by any ReferenceGrant"),
        ));
    }
    let data = if kind == "ConfigMap" {
        idx.config_maps
            .get(&(ns, name))
            .map(|c| c.data.as_ref().and_then(|d| d.get(CA_KEY)).cloned())
    } else {
        idx.secrets.get(&(ns, name)).map(|s| {
            s.data
                .as_ref()
                .and_then(|d| d.get(CA_KEY))
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
                .or_else(|| s.string_data.as_ref().and_then(|d| d.get(CA_KEY)).cloned())
        })
    };
    let pem = match data {
        None => {
            return Err(Problem::new(
                reason::INVALID_CA_CERTIFICATE_REF,
                format!("{what} does not exist"),
            ));
        }
        Some(None) => {
            return Err(Problem::new(
                reason::INVALID_CA_CERTIFICATE_REF,
                format!("{what} has no key {CA_KEY}"),
            ));
        }
        Some(Some(pem)) => pem,
    };
    check_ca_pem(&pem, &what)
}

/// Checks that `pem` holds CA certificates the proxy (rustls) takes as trust anchors, and
/// returns it ending in one newline. `what` names the reference in the problem.
pub(super) fn check_ca_pem(pem: &str, what: &str) -> Result<String, Problem> {
    let mut reader = pem.as_bytes();
    let certs: Vec<_> = rustls_pemfile::certs(&mut reader)
        .collect::<Result<_, _>>()
        .map_err(|e| {
            Problem::new(
                reason::INVALID_CA_CERTIFICATE_REF,
                format!("{what}: {CA_KEY} is not PEM: {e}"),
            )
        })?;
    if certs.is_empty() {
        return Err(Problem::new(
            reason::INVALID_CA_CERTIFICATE_REF,
            format!("{what}: {CA_KEY} holds no PEM certificate"),
        ));
    }
    // The proxy builds its trust anchors with rustls: accept exactly what it accepts, so a
    // bad CA rejects its listener or policy here instead of the whole table there.
    let mut roots = rustls::RootCertStore::empty();
    for c in certs {
        roots.add(c).map_err(|e| {
            Problem::new(
                reason::INVALID_CA_CERTIFICATE_REF,
                format!(
                    "{what}: {CA_KEY} holds a certificate that is not a usable trust anchor: {e}"
                ),
            )
        })?;
    }
    let mut out = pem.trim_end().to_owned();
    out.push('\n');
    Ok(out)
}

/// Key of a ConfigMap or Secret holding a CA bundle.
pub const CA_KEY: &str = "ca.crt";

/// `InsecureFrontendValidationMode=True` (reason `ConfigurationChanged`) while the frontend
/// validation of `gw`, its default or a per-port entry, is `AllowInsecureFallback`: clients
/// without a valid certificate are served there. Absent otherwise, as the spec asks.
pub fn insecure_frontend_condition(gw: &Gateway, conds: &Conds<'_>) -> Option<Condition> {
    let fe = gw.spec.tls.as_ref()?.frontend.as_ref()?;
    let default = fe.default.validation.as_ref().is_some_and(|v| {
        matches!(
            v.mode,
            Some(GatewayTlsFrontendDefaultValidationMode::AllowInsecureFallback)
        )
    });
    let ports: Vec<String> = fe
        .per_port
        .iter()
        .flatten()
        .filter(|p| {
            p.tls.validation.as_ref().is_some_and(|v| {
                matches!(
                    v.mode,
                    Some(GatewayTlsFrontendPerPortTlsValidationMode::AllowInsecureFallback)
                )
            })
        })
        .map(|p| p.port.to_string())
        .collect();
    if !default && ports.is_empty() {
        return None;
    }
    let mut scope = Vec::new();
    if default {
        scope.push("spec.tls.frontend.default".to_owned());
    }
    if !ports.is_empty() {
        scope.push(format!("perPort {}", ports.join(", ")));
    }
    Some(conds.yes(
        INSECURE_FRONTEND_VALIDATION_MODE,
        reason::CONFIGURATION_CHANGED,
        format!(
            "client certificate validation is AllowInsecureFallback ({}): clients without a valid certificate are served",
            scope.join("; ")
        ),
    ))
}

/// The Gateway `ResolvedRefs` condition for `spec.tls.backend.clientCertificateRef`, when set.
pub fn backend_condition(gw: &Gateway, idx: &Index<'_>, conds: &Conds<'_>) -> Option<Condition> {
    Some(match super::backend_tls::client_certificate(gw, idx)? {
        Ok(c) => conds.yes(
            RESOLVED_REFS,
            reason::RESOLVED_REFS,
            format!(
                "spec.tls.backend.clientCertificateRef {} is presented to TLS backends",
                c.source
            ),
        ),
        Err(p) => conds.no(RESOLVED_REFS, p.reason, p.message),
    })
}
