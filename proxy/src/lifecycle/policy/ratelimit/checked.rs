//! What the rate limits decided for one request, and the costs left to count after its
//! response.
//!
//! In: each applicable limit's [`Decision`] on the request's counter, in table order. Out: a
//! [`Checked`]: the enforced limits' decisions merged (refused if one refused, and the
//! numbers for `X-RateLimit-*`), the shadow limits that would have refused (for the access
//! log; they never refuse and send no numbers), and the [`Pending`] response costs of the
//! limits that admitted the request with a `cost.response`.

use super::limit::RequestCost;
use super::{Activation, CompiledLimit, Decision, KeyBuffers};

/// What [`RateLimiter::check_request`](super::RateLimiter::check_request) found for a request.
#[derive(Debug, Default)]
pub struct Checked<'l> {
    /// The enforced limits' decisions merged ([`Decision::merge`]): refused if one refused,
    /// and the numbers for the response's headers; `None` when no enforced limit applied.
    /// Shadow limits never contribute (no refusal, no `X-RateLimit-*` of theirs).
    pub decision: Option<Decision>,
    /// The shadow limits that would have refused the request (for the access log).
    pub shadow_refused: Vec<&'l CompiledLimit>,
    /// The limits that admitted the request and count its cost once the response is known
    /// ([`RateLimiter::add_response_costs`](super::RateLimiter::add_response_costs)), each
    /// with its counter's key.
    pub pending: Vec<Pending<'l>>,
}

/// A cost to count after the response: the limit, and the key of the counter that
/// admitted the request.
#[derive(Debug, Clone)]
pub struct Pending<'l> {
    /// The limit.
    pub limit: &'l CompiledLimit,
    /// Its counter's key.
    pub key: String,
}

impl<'l> Checked<'l> {
    /// Takes the decision `d` of `limit` on `key` in; true when it ends the request (an
    /// enforced refusal).
    pub(super) fn fold(&mut self, limit: &'l CompiledLimit, key: &str, d: Decision) -> bool {
        if d.allowed && limit.costs_after_response() {
            self.pending.push(Pending {
                limit,
                key: key.to_owned(),
            });
        }
        if limit.is_shadow() {
            if !d.allowed {
                tracing::debug!(
                    limit = limit.id(),
                    "rate limit: shadow limit would have refused"
                );
                self.shadow_refused.push(limit);
            }
            return false;
        }
        self.decision = Some(self.decision.map_or(d, |prev| prev.merge(d)));
        !d.allowed
    }
}

/// The synchronous loop of
/// [`RateLimiter::check_request`](super::RateLimiter::check_request): `decide` on each
/// applicable limit's key (and its hash) and cost until an enforced one refuses.
pub(super) fn fold_decisions<'l>(
    limits: &'l [CompiledLimit],
    act: &Activation<'_>,
    buffers: &mut KeyBuffers,
    mut decide: impl FnMut(&CompiledLimit, &str, u64, RequestCost) -> Decision,
) -> Checked<'l> {
    let mut out = Checked::default();
    for limit in limits {
        if !limit.applies(act) {
            continue;
        }
        let cost = limit.request_cost(act);
        let (key, hash) = buffers.key_of(limit, act);
        let d = decide(limit, key, hash, cost);
        if out.fold(limit, key, d) {
            break;
        }
    }
    out
}
