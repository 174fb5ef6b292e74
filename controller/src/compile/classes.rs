//! GatewayClass acceptance.
//!
//! In: every GatewayClass. Out: for those whose `controllerName` is ours, whether they are
//! accepted and the status they should carry (Accepted condition and `supportedFeatures`).

use std::collections::BTreeMap;

use gateway_types::gatewayclasses::{
    GatewayClass, GatewayClassStatus, GatewayClassStatusSupportedFeatures,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::CONTROLLER_NAME;
use super::conditions::{ACCEPTED, Conds, reason};

/// Gateway API features this implementation supports, advertised in
/// `GatewayClass.status.supportedFeatures` (sorted): the features `e2e/conformance.sh` claims
/// and the conformance suite proves (`compile_classes` tests keep the two lists equal).
pub const SUPPORTED_FEATURES: &[&str] = &[
    "BackendTLSPolicy",
    "BackendTLSPolicySANValidation",
    "GRPCRoute",
    "GRPCRouteNamedRouteRule",
    "Gateway",
    "GatewayAddressEmpty",
    "GatewayBackendClientCertificate",
    "GatewayFrontendClientCertificateValidation",
    "GatewayFrontendClientCertificateValidationInsecureFallback",
    "GatewayHTTPListenerIsolation",
    "GatewayHTTPSListenerDetectMisdirectedRequests",
    "GatewayInfrastructure",
    "GatewayPort8080",
    "GatewayStaticAddresses",
    "HTTPRoute",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteBackendTimeout",
    "HTTPRouteCORS",
    "HTTPRouteDestinationPortMatching",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteParentRefPort",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteRetry",
    "HTTPRouteRetryBackendTimeout",
    "HTTPRouteRetryConnectionError",
    "HTTPRouteSchemeRedirect",
    "ListenerSet",
    "ReferenceGrant",
    "TCPRoute",
    "TLSRoute",
    "TLSRouteModeMixed",
    "TLSRouteModeTerminate",
    "UDPRoute",
];

/// One of our GatewayClasses.
#[derive(Debug, Clone)]
pub struct ClassModel {
    /// Whether Gateways of this class may be compiled.
    pub accepted: bool,
    /// Status to write.
    pub status: GatewayClassStatus,
}

/// Compiles every GatewayClass whose controllerName is ours, by name.
pub fn compile_classes<'a>(
    classes: &'a [GatewayClass],
    now: &Time,
) -> BTreeMap<&'a str, ClassModel> {
    let mut features: Vec<&str> = SUPPORTED_FEATURES.to_vec();
    features.sort_unstable();
    features.dedup();
    let supported: Vec<GatewayClassStatusSupportedFeatures> = features
        .iter()
        .map(|f| GatewayClassStatusSupportedFeatures {
            name: (*f).to_owned(),
        })
        .collect();

    let mut out = BTreeMap::new();
    for class in classes {
        if class.spec.controller_name != CONTROLLER_NAME {
            continue;
        }
        let Some(name) = class.metadata.name.as_deref() else {
            continue;
        };
        let conds = Conds::new(class.metadata.generation, now);
        // We take no parameters: a parametersRef is something we cannot honour, and
        // silently ignoring it would run the Gateway with settings the user did not ask for.
        let (accepted, cond) = match &class.spec.parameters_ref {
            None => (
                true,
                conds.yes(ACCEPTED, reason::ACCEPTED, "GatewayClass is accepted"),
            ),
            Some(p) => (
                false,
                conds.no(
                    ACCEPTED,
                    reason::INVALID_PARAMETERS,
                    format!(
                        "spec.parametersRef ({}/{} {}) is not supported by {CONTROLLER_NAME}",
                        p.group, p.kind, p.name
                    ),
                ),
            ),
        };
        out.insert(
            name,
            ClassModel {
                accepted,
                status: GatewayClassStatus {
                    conditions: Some(vec![cond]),
                    supported_features: Some(supported.clone()),
                },
            },
        );
    }
    out
}
