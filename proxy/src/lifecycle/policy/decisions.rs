//! Per-policy decision counters: `tollgate_policy_decisions_total{policy, rule, outcome}`.
//!
//! In: the policies of a table, when it is applied ([`Enforcer::build`](super::Enforcer::build)
//! resolves one counter per outcome a compiled rule can have), then one increment per decision
//! on the request path (an atomic add on a counter already resolved: no label is built and no
//! family is looked up per request). Out: the family [`PolicyDecisions::register`] adds to the
//! proxy's registry.
//!
//! Labels are bounded by the configuration, never by traffic:
//!
//! - `policy`: `namespace/name` of the AuthPolicy or RateLimitPolicy that decided;
//! - `rule`: what in that policy decided: `authentication.<method>`,
//!   `authorization.<rule>` (a CEL predicate or an external authorization service),
//!   `limits.<limit>`, or `-` for the policy as a whole;
//! - `outcome`: [`Outcome`], a fixed set per kind of rule.
//!
//! Every counter a table can use exists (at 0) once the table is applied, so a policy the
//! proxies enforce but no request reached shows as a series that stays at 0. Series of
//! policies a later table drops stay until the proxy restarts, like every family's.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tollgate_api::ObjectKey;

/// The `rule` label of a decision taken by a policy as a whole.
pub const WHOLE_POLICY: &str = "-";

/// What a rule decided (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Authentication method: it verified the request's credential. Authorization rule,
    /// external authorization service, rate limit: the request may go on.
    Allowed,
    /// Authentication method: it verified the credential (the request is authenticated;
    /// authorization rules may still refuse it).
    Authenticated,
    /// Authentication: no method verified a credential (the request was refused, 401 or
    /// the OIDC login); counted on the method that was shown a credential, else the first
    /// one tried, else (every method skipped by its `when`) on each policy as a whole.
    Unauthenticated,
    /// Authentication method: verification could not run (keys or introspection
    /// unavailable); the request was refused.
    Error,
    /// Authorization rule: its predicate did not hold (403).
    Forbidden,
    /// External authorization: the service refused the request.
    Denied,
    /// External authorization: the service could not be asked, and the rule fails open.
    FailOpen,
    /// AuthPolicy as a whole: its `when` did not hold, so it neither allowed nor refused.
    Skipped,
    /// Rate limit: the request was over the limit and refused (429).
    Limited,
    /// Rate limit in `mode: Shadow`: the request was over the limit and went on.
    ShadowLimited,
    /// AuthPolicy as a whole: invalid with no valid version to keep, it closes the rule
    /// (500).
    Closed,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Authenticated => "authenticated",
            Self::Unauthenticated => "unauthenticated",
            Self::Error => "error",
            Self::Forbidden => "forbidden",
            Self::Denied => "denied",
            Self::FailOpen => "fail_open",
            Self::Skipped => "skipped",
            Self::Limited => "limited",
            Self::ShadowLimited => "shadow_limited",
            Self::Closed => "closed",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    policy: Arc<str>,
    rule: Arc<str>,
    outcome: &'static str,
}

/// One (policy, rule, outcome)'s counter: each increment also notes the decision on the
/// sampled request being enforced, as a span event (module `otel`). `Default`: counting
/// nowhere.
#[derive(Debug, Clone, Default)]
pub struct Decided {
    counter: Counter,
    labels: Option<Arc<Labels>>,
}

impl Decided {
    /// Counts one decision.
    pub fn inc(&self) {
        self.counter.inc();
        if let Some(l) = &self.labels {
            crate::otel::note_decision(&l.policy, &l.rule, l.outcome);
        }
    }

    /// The value counted.
    pub fn get(&self) -> u64 {
        self.counter.get()
    }
}

/// The family of decision counters. Cheap to clone (a shared handle); `Default` gives one
/// that is registered nowhere (tests, tools).
#[derive(Debug, Clone, Default)]
pub struct PolicyDecisions {
    family: Family<Labels, Counter>,
}

impl PolicyDecisions {
    /// Unregistered counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `policy_decisions` (`tollgate_policy_decisions_total` in the proxy's
    /// registry).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "policy_decisions",
            "Decisions of AuthPolicy and RateLimitPolicy rules, by policy (namespace/name), rule and outcome",
            self.family.clone(),
        );
    }

    /// The counter of one (policy, rule, outcome), created at 0 when new: call at table
    /// build, keep the handle, increment it per request.
    pub fn counter(&self, policy: &Arc<str>, rule: &Arc<str>, outcome: Outcome) -> Decided {
        let labels = Labels {
            policy: policy.clone(),
            rule: rule.clone(),
            outcome: outcome.as_str(),
        };
        Decided {
            counter: self.family.get_or_create(&labels).clone(),
            labels: Some(Arc::new(labels)),
        }
    }

    /// The counters of one rule for each of `outcomes`, in that order.
    pub fn counters<const N: usize>(
        &self,
        policy: &Arc<str>,
        rule: &Arc<str>,
        outcomes: [Outcome; N],
    ) -> [Decided; N] {
        outcomes.map(|o| self.counter(policy, rule, o))
    }

    /// The value counted for these labels, 0 when the series does not exist (for tests and
    /// diagnostics).
    pub fn count(&self, policy: &str, rule: &str, outcome: Outcome) -> u64 {
        self.family
            .get(&Labels {
                policy: policy.into(),
                rule: rule.into(),
                outcome: outcome.as_str(),
            })
            .map_or(0, |c| c.get())
    }
}

/// The `policy` label of `key`; `fallback` when the key is empty (a table from a compiler
/// that did not name the policy of each rule).
pub fn policy_label(key: &ObjectKey, fallback: &Arc<str>) -> Arc<str> {
    if key.name.is_empty() {
        fallback.clone()
    } else {
        key.to_string().into()
    }
}

/// The `rule` label `<section>.<name>`.
pub fn rule_label(section: &str, name: &str) -> Arc<str> {
    format!("{section}.{name}").into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_resolved_once_count_in_the_family_and_encode() {
        let d = PolicyDecisions::new();
        let mut registry = Registry::with_prefix("tollgate");
        d.register(&mut registry);
        let policy: Arc<str> = "shop/keys".into();
        let rule = rule_label("authentication", "api");
        let [ok, unauth] = d.counters(
            &policy,
            &rule,
            [Outcome::Authenticated, Outcome::Unauthenticated],
        );
        ok.inc();
        ok.inc();
        // A second resolution of the same labels shares the series.
        d.counter(&policy, &rule, Outcome::Authenticated).inc();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"tollgate_policy_decisions_total{policy="shop/keys",rule="authentication.api",outcome="authenticated"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tollgate_policy_decisions_total{policy="shop/keys",rule="authentication.api",outcome="unauthenticated"} 0"#),
            "{text}"
        );
        assert_eq!(unauth.get(), 0);
        assert_eq!(
            d.count("shop/keys", "authentication.api", Outcome::Authenticated),
            3
        );
        assert_eq!(d.count("shop/keys", "-", Outcome::Skipped), 0);
    }

    #[test]
    fn policy_label_falls_back_when_the_table_names_no_policy() {
        let fallback: Arc<str> = "a/b,c/d".into();
        assert_eq!(
            &*policy_label(&ObjectKey::new("shop", "keys"), &fallback),
            "shop/keys"
        );
        assert_eq!(&*policy_label(&ObjectKey::default(), &fallback), "a/b,c/d");
    }
}
