//! Fail closed: what an invalid policy enforces, given its last valid version.
//!
//! In: one policy as it is now, the version of it an earlier compile found valid (from
//! [`LastValid`], an explicit input the caller carries from one compile to the next: the
//! controller's reconciler and `tollgate run`'s watcher keep [`crate::compile::Output::last_valid`]
//! and pass it back as [`crate::compile::Inputs::last_valid`]), and whether the kind fails
//! closed. Out: the policy's [`State`] and the version to remember for the next compile.
//!
//! The rule (ARCHITECTURE principle 12): never leave a route open because something was
//! invalid. A policy that becomes invalid keeps enforcing its last valid version, targets
//! and rules both, as a proxy keeps its last good table. An AuthPolicy that was never valid
//! (or whose last valid version no longer compiles, e.g. its credentials Secret is gone)
//! closes the routes it targets: they answer 500 until it is fixed, as Envoy Gateway does for
//! an invalid SecurityPolicy. A RateLimitPolicy keeps its last valid version too, but one that
//! was never valid limits nothing: it never admitted a request it now refuses, and a typo in a
//! limit should not take its routes down.
//!
//! The compiler stays pure: the memory is a value in and a value out. Only the caller's
//! memory is lost on restart (a still-invalid AuthPolicy then closes its targets).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tollgate_api::ObjectKey;

use super::{Contribution, Problem};
use crate::crds::common::TargetRef;
use crate::crds::{AuthPolicy, ClientPolicy, RateLimitPolicy};

/// The policies an earlier compile found valid, by key: what a policy that becomes invalid
/// keeps enforcing. Empty on a first compile and in `tollgate validate`.
#[derive(Debug, Clone, Default)]
pub struct LastValid {
    /// RateLimitPolicies, as they were when last valid.
    pub rate_limit_policies: BTreeMap<ObjectKey, RateLimitPolicy>,
    /// AuthPolicies, as they were when last valid.
    pub auth_policies: BTreeMap<ObjectKey, AuthPolicy>,
    /// ClientPolicies, as they were when last valid.
    pub client_policies: BTreeMap<ObjectKey, ClientPolicy>,
}

impl PartialEq for LastValid {
    /// Same keys, metadata and specs (the custom resource types do not compare themselves).
    fn eq(&self, other: &Self) -> bool {
        fn same<P: PolicyObject, S: PartialEq>(
            a: &BTreeMap<ObjectKey, P>,
            b: &BTreeMap<ObjectKey, P>,
            spec: impl Fn(&P) -> &S,
        ) -> bool {
            a.len() == b.len()
                && a.iter().zip(b).all(|((ka, pa), (kb, pb))| {
                    ka == kb && pa.meta() == pb.meta() && spec(pa) == spec(pb)
                })
        }
        same(&self.rate_limit_policies, &other.rate_limit_policies, |p| {
            &p.spec
        }) && same(&self.auth_policies, &other.auth_policies, |p| &p.spec)
            && same(&self.client_policies, &other.client_policies, |p| &p.spec)
    }
}

/// A policy object: what this module reads of both kinds.
pub(super) trait PolicyObject: Clone {
    /// What a closing policy of the kind closes, for its message (`routes`, `listeners`).
    const CLOSES: &'static str = "routes";
    fn meta(&self) -> &ObjectMeta;
    fn target_refs(&self) -> &[TargetRef];
}

impl PolicyObject for AuthPolicy {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn target_refs(&self) -> &[TargetRef] {
        &self.spec.target_refs
    }
}

impl PolicyObject for ClientPolicy {
    const CLOSES: &'static str = "listeners";
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn target_refs(&self) -> &[TargetRef] {
        &self.spec.target_refs
    }
}

impl PolicyObject for RateLimitPolicy {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn target_refs(&self) -> &[TargetRef] {
        &self.spec.target_refs
    }
}

/// What one policy enforces in this compile.
#[derive(Debug, Clone)]
pub(super) enum State<T> {
    /// Valid as it is.
    Valid(Contribution<T>),
    /// Invalid; its last valid version is enforced. The problem's message says so.
    Kept(Contribution<T>, Problem),
    /// Invalid with nothing valid to enforce: the rules it targets answer 500.
    Closed(Problem),
    /// Invalid, enforces nothing (a kind that does not fail closed, never valid).
    Rejected(Problem),
}

impl<T> State<T> {
    /// What it contributes to the rules it holds, if anything.
    pub(super) fn contribution(&self) -> Option<&Contribution<T>> {
        match self {
            Self::Valid(c) | Self::Kept(c, _) => Some(c),
            Self::Closed(_) | Self::Rejected(_) => None,
        }
    }

    /// Whether it holds targets (and so acts on the rules under them).
    pub(super) fn holds_targets(&self) -> bool {
        !matches!(self, Self::Rejected(_))
    }
}

/// The state of `policy` and the targetRefs it acts through, plus the version to remember
/// as its last valid one. `closes`: whether the kind closes its targets when nothing valid is
/// left. `convert` compiles one version (against the current Secrets).
pub(super) fn resolve<P: PolicyObject, T>(
    policy: &P,
    last: Option<&P>,
    closes: bool,
    convert: impl Fn(&P) -> Result<Contribution<T>, Problem>,
) -> (State<T>, Vec<TargetRef>, Option<P>) {
    let problem = match convert(policy) {
        Ok(c) => {
            return (
                State::Valid(c),
                policy.target_refs().to_vec(),
                Some(policy.clone()),
            );
        }
        Err(p) => p,
    };
    // A policy deleted and created again under the same name is a new policy: its
    // predecessor's rules are not its own (objects read from files carry no uid: None == None).
    let last = last.filter(|l| l.meta().uid == policy.meta().uid);
    let generation = last
        .and_then(|l| l.meta().generation)
        .map(|g| format!(" (generation {g})"))
        .unwrap_or_default();
    let close = |message: String| {
        if closes {
            State::Closed(Problem::new(
                problem.reason,
                format!(
                    "{message}, so the {} it targets answer 500 until it is fixed",
                    P::CLOSES
                ),
            ))
        } else {
            State::Rejected(Problem::new(
                problem.reason,
                format!("{message}, so it enforces nothing until it is fixed"),
            ))
        }
    };
    match last.map(|l| (l, convert(l))) {
        Some((l, Ok(c))) => {
            let message = format!(
                "{}; the last valid version{generation} stays enforced until it is fixed",
                problem.message
            );
            let refs = l.target_refs().to_vec();
            (
                State::Kept(c, Problem::new(problem.reason, message)),
                refs,
                Some(l.clone()),
            )
        }
        Some((_, Err(again))) => (
            close(format!(
                "{}; its last valid version{generation} no longer compiles either ({})",
                problem.message, again.message
            )),
            policy.target_refs().to_vec(),
            None,
        ),
        None => (
            close(format!("{}; it was never valid", problem.message)),
            policy.target_refs().to_vec(),
            None,
        ),
    }
}
