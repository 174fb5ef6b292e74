//! The decision counters of a compiled auth set ([`CompiledAuth`]): what each authentication
//! method, authorization rule and policy as a whole counts in
//! `tollgate_policy_decisions_total` (module [`decisions`](crate::lifecycle::policy::decisions)).
//!
//! In: the [`PolicyDecisions`] family, once per table ([`CompiledAuth::count_with`]). Out:
//! counter handles kept by the compiled methods and rules; per request one atomic increment
//! per decision.

use std::sync::Arc;

use crate::lifecycle::policy::decisions::Decided as Counter;

use super::{CompiledAuth, CompiledMethod, MethodKind, Outcome as AuthOutcome};
use crate::lifecycle::policy::decisions::{
    Outcome, PolicyDecisions, WHOLE_POLICY, policy_label, rule_label,
};

/// An authentication method's counters. `Default`: counting nowhere (not yet resolved).
#[derive(Debug, Clone, Default)]
pub(super) struct MethodCounters {
    pub authenticated: Counter,
    pub unauthenticated: Counter,
    pub error: Counter,
}

/// An authorization rule's counters.
#[derive(Debug, Clone, Default)]
pub(super) struct RuleCounters {
    pub allowed: Counter,
    pub forbidden: Counter,
}

/// The decisions taken by the contributing policies as a whole (`rule="-"`).
#[derive(Debug, Clone, Default)]
pub(super) struct WholeCounters {
    /// The policy-level `when` did not hold: one per contributing policy.
    pub skipped: Vec<Counter>,
    /// Every method was skipped by its own `when`: one per policy with methods.
    pub unauthenticated: Vec<Counter>,
}

/// The `policy` labels of `auth.sources` joined by `,`: the label of a method or rule whose
/// table entry names no policy.
pub(crate) fn sources_label(auth: &tollgate_api::policy::Auth) -> Arc<str> {
    auth.sources
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
        .into()
}

impl CompiledAuth {
    /// Resolves the decision counters of every method and rule in `decisions`: call once
    /// when the table is applied. Before, decisions count nowhere.
    pub fn count_with(&mut self, decisions: &PolicyDecisions) {
        for m in &mut self.methods {
            let rule = rule_label("authentication", &m.name);
            let [authenticated, unauthenticated, error] = decisions.counters(
                &m.policy,
                &rule,
                [
                    Outcome::Authenticated,
                    Outcome::Unauthenticated,
                    Outcome::Error,
                ],
            );
            m.counted = MethodCounters {
                authenticated,
                unauthenticated,
                error,
            };
        }
        for r in &mut self.rules {
            let rule = rule_label("authorization", &r.name);
            let [allowed, forbidden] =
                decisions.counters(&r.policy, &rule, [Outcome::Allowed, Outcome::Forbidden]);
            r.counted = RuleCounters { allowed, forbidden };
        }
        let whole: Arc<str> = WHOLE_POLICY.into();
        // Series only for what can happen: a `when` that can fail, methods that can all be
        // skipped.
        self.whole.skipped = if self.when.is_empty() {
            Vec::new()
        } else {
            self.policies
                .iter()
                .map(|p| decisions.counter(p, &whole, Outcome::Skipped))
                .collect()
        };
        self.whole.unauthenticated = if self.methods.iter().any(|m| m.when.is_empty()) {
            Vec::new()
        } else {
            let mut policies: Vec<&Arc<str>> = self.methods.iter().map(|m| &m.policy).collect();
            policies.sort();
            policies.dedup();
            policies
                .into_iter()
                .map(|p| decisions.counter(p, &whole, Outcome::Unauthenticated))
                .collect()
        };
    }
}

impl CompiledAuth {
    /// Counts a request no method authenticated: on the method whose verification could not
    /// run (`error`), else the one `shown` (shown a credential, else the first tried), else
    /// (every method skipped) on each policy with methods as a whole. The method type and
    /// outcome for `tollgate_auth_requests_total`.
    pub(super) fn count_failure(
        &self,
        error: Option<&CompiledMethod>,
        shown: Option<&CompiledMethod>,
    ) -> (MethodKind, AuthOutcome) {
        match (error, shown) {
            (Some(m), _) => {
                m.counted.error.inc();
                (m.kind, AuthOutcome::Error)
            }
            (None, Some(m)) => {
                m.counted.unauthenticated.inc();
                (m.kind, AuthOutcome::Unauthenticated)
            }
            (None, None) => {
                for c in &self.whole.unauthenticated {
                    c.inc();
                }
                (MethodKind::None, AuthOutcome::Unauthenticated)
            }
        }
    }
}

/// The `policy` labels of the contributing policies (`sources`).
pub(super) fn policies(auth: &tollgate_api::policy::Auth) -> Vec<Arc<str>> {
    let fallback = sources_label(auth);
    auth.sources
        .iter()
        .map(|k| policy_label(k, &fallback))
        .collect()
}
