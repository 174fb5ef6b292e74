//! Condition builders.
//!
//! In: a condition type, a status, a reason and a message, plus the object's generation and the
//! compile's `now`. Out: `metav1.Condition` values. Every condition the compiler emits is built
//! here, so the reason strings live in one place.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition type `Accepted`.
pub const ACCEPTED: &str = "Accepted";
/// Condition type `Programmed`.
pub const PROGRAMMED: &str = "Programmed";
/// Condition type `ResolvedRefs`.
pub const RESOLVED_REFS: &str = "ResolvedRefs";
/// Condition type `Conflicted`.
pub const CONFLICTED: &str = "Conflicted";
/// Gateway condition type `InsecureFrontendValidationMode`: some frontend validation allows
/// clients without a valid certificate.
pub const INSECURE_FRONTEND_VALIDATION_MODE: &str = "InsecureFrontendValidationMode";

/// Standard Gateway API reasons used by the compiler.
pub mod reason {
    /// Positive `Accepted`.
    pub const ACCEPTED: &str = "Accepted";
    /// Positive `Programmed`.
    pub const PROGRAMMED: &str = "Programmed";
    /// Positive `ResolvedRefs`.
    pub const RESOLVED_REFS: &str = "ResolvedRefs";
    /// Negative `Programmed`.
    pub const INVALID: &str = "Invalid";
    /// Class or Gateway parametersRef we cannot honour.
    pub const INVALID_PARAMETERS: &str = "InvalidParameters";
    /// Gateway address we cannot bind.
    pub const UNSUPPORTED_ADDRESS: &str = "UnsupportedAddress";
    /// Gateway (or ListenerSet) with one or more invalid listeners.
    pub const LISTENERS_NOT_VALID: &str = "ListenersNotValid";
    /// ListenerSet the parent Gateway's `allowedListeners` does not admit.
    pub const NOT_ALLOWED: &str = "NotAllowed";
    /// ListenerSet whose parent Gateway is not accepted.
    pub const PARENT_NOT_ACCEPTED: &str = "ParentNotAccepted";
    /// Listener port outside 1..=65535.
    pub const PORT_UNAVAILABLE: &str = "PortUnavailable";
    /// Listener with a protocol (or TLS mode) we do not serve.
    pub const UNSUPPORTED_PROTOCOL: &str = "UnsupportedProtocol";
    /// Listener `Conflicted=False`.
    pub const NO_CONFLICTS: &str = "NoConflicts";
    /// Two listeners share port and hostname; also a route's `Accepted=False` when an
    /// HTTPRoute and a GRPCRoute share a hostname on a listener and the other one is older.
    pub const HOSTNAME_CONFLICT: &str = "HostnameConflict";
    /// Two listeners share a port with different protocols.
    pub const PROTOCOL_CONFLICT: &str = "ProtocolConflict";
    /// Listener certificate missing, malformed or of the wrong kind.
    pub const INVALID_CERTIFICATE_REF: &str = "InvalidCertificateRef";
    /// Listener `allowedRoutes.kinds` names a kind we do not support.
    pub const INVALID_ROUTE_KINDS: &str = "InvalidRouteKinds";
    /// A frontend caCertificateRef that does not resolve or holds no usable certificate.
    pub const INVALID_CA_CERTIFICATE_REF: &str = "InvalidCACertificateRef";
    /// A frontend caCertificateRef of a kind we do not read.
    pub const INVALID_CA_CERTIFICATE_KIND: &str = "InvalidCACertificateKind";
    /// Frontend validation asked for with no usable CA: the listener is not accepted.
    pub const NO_VALID_CA_CERTIFICATE: &str = "NoValidCACertificate";
    /// `InsecureFrontendValidationMode=True`: a frontend validation is `AllowInsecureFallback`.
    pub const CONFIGURATION_CHANGED: &str = "ConfigurationChanged";
    /// Cross-namespace reference without a ReferenceGrant.
    pub const REF_NOT_PERMITTED: &str = "RefNotPermitted";
    /// Route parentRef matches no listener or an unusable Gateway.
    pub const NO_MATCHING_PARENT: &str = "NoMatchingParent";
    /// Route refused by every listener's `allowedRoutes`.
    pub const NOT_ALLOWED_BY_LISTENERS: &str = "NotAllowedByListeners";
    /// Route hostnames intersect no listener hostname.
    pub const NO_MATCHING_LISTENER_HOSTNAME: &str = "NoMatchingListenerHostname";
    /// Route field, or listener TLS setting (`tls.options`, frontend client-certificate
    /// validation), with a value we do not support.
    pub const UNSUPPORTED_VALUE: &str = "UnsupportedValue";
    /// Gateway `spec.tls.backend.clientCertificateRef` we cannot use.
    pub const INVALID_CLIENT_CERTIFICATE_REF: &str = "InvalidClientCertificateRef";
    /// backendRef to a Service (or port) that does not exist.
    pub const BACKEND_NOT_FOUND: &str = "BackendNotFound";
    /// backendRef of a kind we do not support.
    pub const INVALID_KIND: &str = "InvalidKind";
    /// backendRef whose appProtocol we cannot speak.
    pub const UNSUPPORTED_PROTOCOL_BACKEND: &str = "UnsupportedProtocol";
}

/// Builds conditions for one object: same generation and timestamp for all of them.
#[derive(Debug, Clone)]
pub struct Conds<'a> {
    generation: Option<i64>,
    now: &'a Time,
}

impl<'a> Conds<'a> {
    /// A builder for an object at `generation`.
    pub fn new(generation: Option<i64>, now: &'a Time) -> Self {
        Self { generation, now }
    }

    /// A condition with an explicit status.
    pub fn make(
        &self,
        type_: &str,
        ok: bool,
        reason: &str,
        message: impl Into<String>,
    ) -> Condition {
        Condition {
            last_transition_time: self.now.clone(),
            message: message.into(),
            observed_generation: self.generation,
            reason: reason.to_owned(),
            status: if ok { "True" } else { "False" }.to_owned(),
            type_: type_.to_owned(),
        }
    }

    /// `type=True`.
    pub fn yes(&self, type_: &str, reason: &str, message: impl Into<String>) -> Condition {
        self.make(type_, true, reason, message)
    }

    /// `type=False`.
    pub fn no(&self, type_: &str, reason: &str, message: impl Into<String>) -> Condition {
        self.make(type_, false, reason, message)
    }
}

/// A negative outcome: the reason and a human message.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Problem {
    /// Standard reason.
    pub reason: &'static str,
    /// Message naming the offending field.
    pub message: String,
}

impl Problem {
    /// Builds a problem.
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}
