//! TLS settings we do not implement yet, refused out loud instead of ignored.
//!
//! In: a Gateway's `spec.tls` and a listener's `tls.options`, Secrets and ReferenceGrants
//! through the [`Index`]. Out: a [`Problem`] that rejects one listener, or a Gateway
//! `ResolvedRefs` condition. Silently serving a listener without the client-certificate
//! validation its Gateway asks for would let unauthenticated clients in, so:
//!
//! - `spec.tls.frontend` validation (the `default`, or the `perPort` entry for the listener's
//!   port, which overrides it) makes each HTTPS listener it applies to `Accepted=False` with
//!   reason `UnsupportedValue` ("the Listener uses a value for a field that is not supported by
//!   the implementation"). The spec scopes this configuration and its errors to "all Listeners
//!   handling HTTPS traffic that match this port", so only those listeners are refused; HTTP
//!   listeners and HTTPS listeners on other ports keep serving.
//! - Listener `tls.options` ("Support: Implementation-specific") are all unknown to us: we
//!   define no keys and the spec defines none yet. Options typically tighten TLS (minimum
//!   version, cipher suites), so ignoring one could serve weaker TLS than asked: a listener
//!   with any option is `Accepted=False`, `UnsupportedValue`, naming the keys.
//! - `spec.tls.backend.clientCertificateRef` weakens nothing when ignored (Tollgate does not
//!   originate TLS to backends, so there is no TLS connection that could lack the
//!   certificate), so it does not reject anything: the Gateway gets `ResolvedRefs=False`, the
//!   condition the spec assigns to this field and which "does not directly impact the
//!   Gateway's Accepted or Programmed conditions", with reason `RefNotPermitted` for a
//!   cross-namespace ref without a ReferenceGrant and `InvalidClientCertificateRef` otherwise.

use gateway_api::gateways::{Gateway, GatewayListeners, GatewayTlsFrontend};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tollgate_api::Protocol;

use super::conditions::{Conds, Problem, RESOLVED_REFS, reason};
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
    let frontend = gw.spec.tls.as_ref().and_then(|t| t.frontend.as_ref())?;
    if protocol == Some(Protocol::Https) && frontend_validates(frontend, l.port) {
        return Some(Problem::new(
            reason::UNSUPPORTED_VALUE,
            format!(
                "spec.tls.frontend asks for client certificate validation on port {}, which is not supported; the listener is not served rather than served without it",
                l.port
            ),
        ));
    }
    None
}

/// Whether HTTPS listeners on `port` are asked to validate client certificates.
fn frontend_validates(frontend: &GatewayTlsFrontend, port: i32) -> bool {
    match frontend.per_port.iter().flatten().find(|p| p.port == port) {
        Some(per_port) => per_port.tls.validation.is_some(),
        None => frontend.default.validation.is_some(),
    }
}

/// The Gateway `ResolvedRefs` condition for `spec.tls.backend.clientCertificateRef`, when set.
pub fn backend_condition(gw: &Gateway, idx: &Index<'_>, conds: &Conds<'_>) -> Option<Condition> {
    let r = gw
        .spec
        .tls
        .as_ref()
        .and_then(|t| t.backend.as_ref())
        .and_then(|b| b.client_certificate_ref.as_ref())?;
    let gw_ns = ns_of(&gw.metadata);
    let ns = r.namespace.as_deref().unwrap_or(gw_ns);
    let cross = CrossRef {
        from_group: GATEWAY_GROUP,
        from_kind: "Gateway",
        from_namespace: gw_ns,
        to_group: r.group.as_deref().unwrap_or(""),
        to_kind: r.kind.as_deref().unwrap_or("Secret"),
        to_namespace: ns,
        to_name: &r.name,
    };
    let (reason, message) = if permitted(idx, &cross) {
        (
            reason::INVALID_CLIENT_CERTIFICATE_REF,
            format!(
                "spec.tls.backend.clientCertificateRef {ns}/{} is not used: presenting a client certificate to backends is not supported (Tollgate does not originate TLS to backends)",
                r.name
            ),
        )
    } else {
        (
            reason::REF_NOT_PERMITTED,
            format!(
                "spec.tls.backend.clientCertificateRef to {ns}/{} is not permitted by any ReferenceGrant",
                r.name
            ),
        )
    };
    Some(conds.no(RESOLVED_REFS, reason, message))
}
