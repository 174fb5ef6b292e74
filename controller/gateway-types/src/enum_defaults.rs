//! `Default` for the enums that generated structs deriving `Default` hold (kopium derives it
//! on structs, not on enums); written by hand, as the gateway-api crate's `enum_defaults.rs`
//! is, with the same variants. regen.sh does not touch this file.

impl Default for crate::backendtlspolicies::BackendTlsPolicyValidationSubjectAltNamesType {
    fn default() -> Self {
        Self::Hostname
    }
}

impl Default for crate::grpcroutes::GrpcRouteRulesBackendRefsFiltersType {
    fn default() -> Self {
        Self::RequestHeaderModifier
    }
}

impl Default for crate::grpcroutes::GrpcRouteRulesFiltersType {
    fn default() -> Self {
        Self::RequestHeaderModifier
    }
}

impl Default for crate::httproutes::HttpRouteRulesBackendRefsFiltersExternalAuthProtocol {
    fn default() -> Self {
        Self::Http
    }
}

impl Default for crate::httproutes::HttpRouteRulesBackendRefsFiltersRequestRedirectPathType {
    fn default() -> Self {
        Self::ReplaceFullPath
    }
}

impl Default for crate::httproutes::HttpRouteRulesBackendRefsFiltersType {
    fn default() -> Self {
        Self::RequestHeaderModifier
    }
}

impl Default for crate::httproutes::HttpRouteRulesBackendRefsFiltersUrlRewritePathType {
    fn default() -> Self {
        Self::ReplaceFullPath
    }
}

impl Default for crate::httproutes::HttpRouteRulesFiltersExternalAuthProtocol {
    fn default() -> Self {
        Self::Http
    }
}

impl Default for crate::httproutes::HttpRouteRulesFiltersRequestRedirectPathType {
    fn default() -> Self {
        Self::ReplaceFullPath
    }
}

impl Default for crate::httproutes::HttpRouteRulesFiltersType {
    fn default() -> Self {
        Self::RequestHeaderModifier
    }
}

impl Default for crate::httproutes::HttpRouteRulesFiltersUrlRewritePathType {
    fn default() -> Self {
        Self::ReplaceFullPath
    }
}
