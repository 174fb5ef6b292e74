//! Kinds whose CRD may be missing: whether the controller may go on without them.
//!
//! In: what the API server answered to a list of the kind and, after a 404, what it says of
//! the kind's CustomResourceDefinition ([`probe`]). Out: a [`Verdict`]: watch the kind,
//! count it as none for now, or wait and ask again.
//!
//! A 404 for a list is not proof that the CRD is missing: a kube-apiserver that has just
//! started answers 404 for custom resources until its CRD cache has synced, and so does one
//! that has just seen a CRD created (kubernetes/kubernetes#115241, #125471). Counting the kind
//! as none then would compile tables without its objects: TLS routes dropped for TLSRoute,
//! routes served without their AuthPolicy for the policies. So a 404 counts as none only once
//! the CRD itself is confirmed absent, or present without serving the version we read (or not
//! Established: no object of it can exist then).
//!
//! How much doubt a kind tolerates is its [`Optional`] mode: leaving TLSRoutes out stops only
//! those routes, so a kind RBAC forbids still counts as none ([`Optional::Forgiving`], which
//! lets a controller whose ClusterRole predates TLSRoutes serve HTTP); leaving an AuthPolicy
//! out serves its routes unauthenticated, so the policies count as none only when their CRD is
//! confirmed absent ([`Optional::FailClosed`]) and otherwise hold the controller back, as any
//! required kind does.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client, Resource};

/// How a kind whose CRD may be missing is treated when it cannot be listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Optional {
    /// Leaving the kind out only stops its own objects from being served (TLSRoute): counted
    /// as none when its CRD is missing or RBAC forbids listing it.
    Forgiving,
    /// Leaving objects of the kind out would weaken what is served (RateLimitPolicy,
    /// AuthPolicy): counted as none only when its CRD is confirmed absent.
    FailClosed,
}

/// How a list of the kind ended ([`probe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// Listed: the kind is served.
    Listed,
    /// 404, and what the API server then said of the kind's CRD.
    NotFound(CrdLookup),
    /// 403: RBAC does not let the controller list the kind.
    Forbidden,
    /// Any other failure (the API server unreachable, 5xx, a timeout).
    Failed,
}

/// What the API server says of the kind's CustomResourceDefinition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrdLookup {
    /// No such CRD.
    Absent,
    /// The CRD exists but does not serve the version the controller reads, or is not
    /// Established.
    NotServing,
    /// The CRD is Established and serves that version.
    Serving,
    /// RBAC does not let the controller read the CRD.
    Forbidden,
    /// The lookup failed otherwise.
    Failed,
}

/// What to do about an optional kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Start its watch.
    Watch,
    /// Count it as none (its store listed and empty) and ask again later; says why.
    None(&'static str),
    /// Neither: leave its store as it is, ask again soon; says why.
    Wait(&'static str),
}

/// The verdict for a kind in `mode` whose list ended as `listing`.
pub fn verdict(mode: Optional, listing: Listing) -> Verdict {
    match listing {
        Listing::Listed => Verdict::Watch,
        Listing::Failed => Verdict::Wait("the API server did not answer the list"),
        Listing::Forbidden => match mode {
            Optional::Forgiving => Verdict::None(
                "the controller may not list this kind (RBAC); upgrade the chart's ClusterRole \
                 to use it",
            ),
            Optional::FailClosed => Verdict::Wait(
                "the controller may not list this kind (RBAC): upgrade the chart's ClusterRole; \
                 until then nothing is compiled, the tables and statuses in place stay",
            ),
        },
        Listing::NotFound(crd) => match crd {
            CrdLookup::Absent => Verdict::None("its CRD is not installed"),
            CrdLookup::NotServing => Verdict::None(
                "its CRD is installed but not Established or not serving the version read",
            ),
            CrdLookup::Serving => Verdict::Wait(
                "its CRD is installed and served, yet the list answered 404 (an API server \
                 that is starting, or a CRD just installed)",
            ),
            CrdLookup::Forbidden => match mode {
                Optional::Forgiving => Verdict::None(
                    "the list answered 404 and the controller may not read CRDs to confirm \
                     it (RBAC)",
                ),
                Optional::FailClosed => Verdict::Wait(
                    "the list answered 404 and the controller may not read CRDs to confirm \
                     the CRD is absent (RBAC: upgrade the chart's ClusterRole)",
                ),
            },
            CrdLookup::Failed => Verdict::Wait("the list answered 404 and the CRD lookup failed"),
        },
    }
}

/// The name of `K`'s CustomResourceDefinition: `<plural>.<group>`.
pub fn crd_name<K: Resource<DynamicType = ()>>() -> String {
    format!("{}.{}", K::plural(&()), K::group(&()))
}

/// What the API server says of `K`'s CRD.
pub async fn crd_lookup<K: Resource<DynamicType = ()>>(client: Client) -> CrdLookup {
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    match crds.get_opt(&crd_name::<K>()).await {
        Ok(None) => CrdLookup::Absent,
        Ok(Some(crd)) => {
            let version = K::version(&());
            let served = crd
                .spec
                .versions
                .iter()
                .any(|v| v.served && v.name == version);
            // Not Established (its names conflict with another CRD's, or it was created a
            // moment ago): no object of it can exist yet.
            let established = crd
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                });
            if served && established {
                CrdLookup::Serving
            } else {
                CrdLookup::NotServing
            }
        }
        Err(kube::Error::Api(e)) if e.code == 403 => CrdLookup::Forbidden,
        Err(_) => CrdLookup::Failed,
    }
}

/// Lists `K` (one object at most) and, after a 404, looks its CRD up.
pub async fn probe<K>(api: &Api<K>) -> Listing
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(_) => Listing::Listed,
        Err(kube::Error::Api(e)) if e.code == 404 => {
            Listing::NotFound(crd_lookup::<K>(api.clone().into_client()).await)
        }
        Err(kube::Error::Api(e)) if e.code == 403 => Listing::Forbidden,
        Err(_) => Listing::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODES: [Optional; 2] = [Optional::Forgiving, Optional::FailClosed];

    #[test]
    fn a_listed_kind_is_watched_and_a_failed_list_asked_again() {
        for mode in MODES {
            assert_eq!(verdict(mode, Listing::Listed), Verdict::Watch);
            assert!(matches!(verdict(mode, Listing::Failed), Verdict::Wait(_)));
        }
    }

    #[test]
    fn a_404_counts_as_none_only_when_the_crd_confirms_it() {
        for mode in MODES {
            let v = |crd| verdict(mode, Listing::NotFound(crd));
            assert!(matches!(v(CrdLookup::Absent), Verdict::None(_)), "{mode:?}");
            assert!(matches!(v(CrdLookup::NotServing), Verdict::None(_)));
            // Served CRD, 404 list: the API server is starting (or the CRD is new).
            assert!(matches!(v(CrdLookup::Serving), Verdict::Wait(_)));
            assert!(matches!(v(CrdLookup::Failed), Verdict::Wait(_)));
        }
    }

    /// What `mode` makes of `listing`: "watch", "none" or "wait".
    fn outcome(mode: Optional, listing: Listing) -> &'static str {
        match verdict(mode, listing) {
            Verdict::Watch => "watch",
            Verdict::None(_) => "none",
            Verdict::Wait(_) => "wait",
        }
    }

    #[test]
    fn doubt_is_none_for_a_forgiving_kind_and_a_wait_for_a_fail_closed_one() {
        use {CrdLookup::Forbidden as CrdForbidden, Listing::*, Optional::*};
        for (mode, listing, want) in [
            (Forgiving, Forbidden, "none"),
            (Forgiving, NotFound(CrdForbidden), "none"),
            (FailClosed, Forbidden, "wait"),
            (FailClosed, NotFound(CrdForbidden), "wait"),
        ] {
            assert_eq!(outcome(mode, listing), want, "{mode:?} {listing:?}");
        }
    }

    #[test]
    fn crd_names_are_plural_dot_group() {
        assert_eq!(
            crd_name::<gateway_types::tlsroutes::TlsRoute>(),
            "tlsroutes.gateway.networking.k8s.io"
        );
        assert_eq!(
            crd_name::<gateway_types::tcproutes::TcpRoute>(),
            "tcproutes.gateway.networking.k8s.io"
        );
        assert_eq!(
            crd_name::<gateway_types::udproutes::UdpRoute>(),
            "udproutes.gateway.networking.k8s.io"
        );
        assert_eq!(
            crd_name::<gateway_types::listenersets::ListenerSet>(),
            "listenersets.gateway.networking.k8s.io"
        );
        assert_eq!(
            crd_name::<gateway_types::backendtlspolicies::BackendTlsPolicy>(),
            "backendtlspolicies.gateway.networking.k8s.io"
        );
        assert_eq!(
            crd_name::<crate::crds::AuthPolicy>(),
            "authpolicies.tollgate.dev"
        );
        assert_eq!(
            crd_name::<crate::crds::ClientPolicy>(),
            "clientpolicies.tollgate.dev"
        );
        assert_eq!(
            crd_name::<crate::crds::RateLimitPolicy>(),
            "ratelimitpolicies.tollgate.dev"
        );
    }
}
