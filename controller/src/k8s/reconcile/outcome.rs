//! The work a reconcile leaves owed, and how soon the loop comes back for it: every retry
//! and backoff of the reconciler is decided here, from what the three parts reported.

use std::time::Duration;

use super::super::stores::Relevance;

/// What a reconcile asks of the loop.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Some write failed or conflicted: reconcile statuses again soon.
    pub retry: bool,
    /// More writes are due than one pass sends: run another status pass right away (after
    /// the loop had a chance to handle other changes, e.g. endpoints).
    pub more: bool,
    /// Provisioning (or a proxy's TLS Secret) failed for some Gateway: run a full reconcile
    /// again after a pause (a status pass does not provision).
    pub reprovision: bool,
    /// A referenced Secret or ConfigMap could not be read: nothing was published, written or
    /// provisioned (see [`UNREADABLE_GRACE`]); run a full reconcile again soon.
    pub incomplete: bool,
    /// A referenced object unreadable past [`UNREADABLE_GRACE`] was compiled without its
    /// payload: run a full reconcile again after a pause, to read it once it can be.
    pub unread: bool,
}

/// How long a referenced object that cannot be read (an API server failing or slow to answer,
/// as during a control-plane restart) holds back publishing, status writes and provisioning:
/// within it, the tables and statuses in place stay (proxies keep serving the listeners that
/// name the object); past it, the controller compiles without the object, which rejects those
/// listeners, rather than hold every other change back for good.
pub const UNREADABLE_GRACE: Duration = Duration::from_secs(30);

/// Pause before statuses are compared again after a failed or conflicting write.
pub const STATUS_RETRY: Duration = Duration::from_secs(1);

/// Pause before a full reconcile retries a failed provisioning (it recompiles everything, so
/// less eagerly than a status retry).
pub const REPROVISION_RETRY: Duration = Duration::from_secs(5);

impl Outcome {
    /// The work still owed once a reconcile of `relevance` returned `next`, `self` being what
    /// was owed before it: only a pass that writes statuses (Status, Full) settles `retry` and
    /// `more`, only a Full pass settles `reprovision`; a pass that does not do that work (an
    /// endpoints pass among a stream of EndpointSlice changes) leaves it owed.
    pub fn after(self, relevance: Relevance, next: Outcome) -> Outcome {
        if next.incomplete {
            // It stopped before doing any of that work.
            return Outcome {
                incomplete: true,
                ..self
            };
        }
        let statuses = relevance.covers(Relevance::Status);
        let full = relevance == Relevance::Full;
        Outcome {
            retry: next.retry || (!statuses && self.retry),
            more: next.more || (!statuses && self.more),
            reprovision: next.reprovision || (!full && self.reprovision),
            incomplete: !full && self.incomplete,
            unread: next.unread || (!full && self.unread),
        }
    }

    /// The reconcile this owed work asks for and how soon; `None` when nothing is owed.
    pub fn wants(&self) -> Option<(Duration, Relevance)> {
        let relevance = if self.reprovision || self.incomplete || self.unread {
            Relevance::Full
        } else {
            Relevance::Status
        };
        // A pass that failed pauses before the next, even with more writes due: failures that
        // come back at once (an API server refusing connections) must not spin the loop.
        if self.retry || self.incomplete {
            Some((STATUS_RETRY, relevance))
        } else if self.more {
            Some((Duration::ZERO, relevance))
        } else if self.reprovision || self.unread {
            Some((REPROVISION_RETRY, relevance))
        } else {
            None
        }
    }
}
