//! GatewayClass acceptance.
//!
//! In: every GatewayClass and the GatewayParameters. Out: for those whose `controllerName` is
//! ours, the parameters they name (or why these cannot be used) and the status they should
//! carry (Accepted condition and `supportedFeatures`).

use std::collections::BTreeMap;

use gateway_types::gatewayclasses::{
    GatewayClass, GatewayClassStatus, GatewayClassStatusSupportedFeatures,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::CONTROLLER_NAME;
use super::conditions::{ACCEPTED, Conds, reason};
use super::parameters::{self, ParametersIndex};
use crate::compile::Objects;
use crate::crds::GatewayParametersSpec;

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
pub struct ClassModel<'a> {
    /// The GatewayParameters its `parametersRef` names (`None` without one), or why they
    /// cannot be used. Either way its Gateways are compiled and served: invalid parameters
    /// hold their provisioning, not their traffic.
    pub parameters: Result<Option<&'a GatewayParametersSpec>, String>,
    /// Status to write.
    pub status: GatewayClassStatus,
}

/// Compiles every GatewayClass whose controllerName is ours, by name.
pub fn compile_classes<'a>(
    classes: &'a Objects<GatewayClass>,
    index: &ParametersIndex<'a>,
    now: &Time,
) -> BTreeMap<&'a str, ClassModel<'a>> {
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
        let parameters = parameters::class_parameters(class.spec.parameters_ref.as_ref(), index);
        let cond = match &parameters {
            Ok(_) => conds.yes(ACCEPTED, reason::ACCEPTED, "GatewayClass is accepted"),
            Err(e) => conds.no(
                ACCEPTED,
                reason::INVALID_PARAMETERS,
                format!("{e}; its Gateways are served, their proxies left as they are"),
            ),
        };
        out.insert(
            name,
            ClassModel {
                parameters,
                status: GatewayClassStatus {
                    conditions: Some(vec![cond]),
                    supported_features: Some(supported.clone()),
                },
            },
        );
    }
    out
}
