//! `tollgate controller`: the loop that turns watch events into reconciles.
//!
//! In: a kube [`Client`], [`ControllerConfig`] and a shutdown future. Out: the watches
//! ([`Stores`]), the leader elector, and a debounced loop: the first change starts a quiet
//! period of `debounce`; every change within it joins the batch; then one reconcile runs with
//! the most demanding [`Relevance`] of the batch. A batch closes at the latest
//! [`MAX_BATCH_QUIET_PERIODS`] quiet periods after its first change ([`Batch`]), so a steady
//! stream of changes (endpoint churn during a rollout) delays reconciles by that much, never
//! for good. Leadership gained, push-server sync changes, failed writes (retried after a
//! second) and failed provisioning (a full reconcile after five) also trigger reconciles;
//! a reconcile in flight when this replica loses the Lease is abandoned (its remaining writes
//! are the new leader's);
//! work a reconcile left owed stays owed until a reconcile that does it runs, and its retry
//! time is not pushed back by other changes. Mirrors `tollgate run`'s shape (`run.rs`):
//! load → compile → apply, with the cluster in place of a directory.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::{error, info};

use super::leader::{self, LeaderConfig, LeaseClient};
use super::metrics::Metrics;
use super::reconcile::{Outcome, Reconciler, Settings, Trigger};
use super::stores::{Change, Kinds, Relevance, Stores};

/// A batch of changes closes at the latest this many quiet periods after its first change,
/// however many changes keep arriving (without a bound, changes spaced closer than the quiet
/// period would hold back every reconcile for as long as they last).
pub const MAX_BATCH_QUIET_PERIODS: u32 = 10;

/// The time limits of one batch of changes (here and in `tollgate run`): the next change may
/// join it within `quiet` of the last, up to [`MAX_BATCH_QUIET_PERIODS`] quiet periods after
/// the first.
pub struct Batch {
    quiet: Duration,
    deadline: tokio::time::Instant,
}

impl Batch {
    /// A batch whose first change arrived now.
    pub fn start(quiet: Duration) -> Self {
        Self {
            quiet,
            deadline: tokio::time::Instant::now() + quiet * MAX_BATCH_QUIET_PERIODS,
        }
    }

    /// Until when to wait for the next change; `None` once the batch is closed.
    pub fn wait_until(&self) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        (now < self.deadline).then(|| (now + self.quiet).min(self.deadline))
    }
}

/// Errors that stop the controller.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The watches stopped before every kind was listed.
    #[error("the watches stopped before the first list completed")]
    WatchesStopped,
    /// The leader elector could not start.
    #[error(transparent)]
    Elector(#[from] leader::SpawnError),
}

/// Settings of `tollgate controller`.
#[derive(Clone)]
pub struct ControllerConfig {
    /// What the reconciler needs (controller name, push server, provisioning).
    pub settings: Settings,
    /// Leader election.
    pub leader: LeaderConfig,
    /// The API server configuration the elector builds a client of its own from (its own
    /// connection, on its own thread); `None`: it shares the controller's client.
    pub lease_config: Option<kube::Config>,
    /// Quiet period after a change before reconciling.
    pub debounce: Duration,
}

/// Runs the controller until `shutdown` completes (abandoning a reconcile in flight); releases
/// the Lease on the way out.
pub async fn run(
    client: Client,
    cfg: ControllerConfig,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ControllerError> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (stores, watch_tasks) = Stores::spawn(&client, &tx, &metrics);
    drop(tx);
    let lease_client = match cfg.lease_config.clone() {
        Some(config) => LeaseClient::Own(Box::new(config)),
        None => LeaseClient::Shared(client.clone()),
    };
    let elector = match leader::spawn(lease_client, cfg.leader.clone(), metrics.clone()) {
        Ok(e) => e,
        Err(e) => {
            for t in watch_tasks {
                t.abort();
            }
            return Err(e.into());
        }
    };
    let mut leading = elector.leading.clone();
    if let Some(push) = cfg.settings.push.clone() {
        // Only the leader serves proxies: it alone writes `Programmed`, from the proxies it
        // sees. A replica that loses the lease ends its streams; the proxies reconnect.
        let mut follow = elector.leading.clone();
        tokio::spawn(async move {
            loop {
                push.set_accepting(*follow.borrow_and_update());
                if follow.changed().await.is_err() {
                    break;
                }
            }
        });
    }
    let mut push_changes = cfg.settings.push.as_ref().map(|p| p.changes());
    let mut reconciler = Reconciler::new(
        client,
        stores.clone(),
        cfg.settings.clone(),
        metrics.clone(),
        &cfg.leader.id,
    );
    tokio::pin!(shutdown);

    let result = tokio::select! {
        r = stores.wait_until_ready() => r.map_err(|_| ControllerError::WatchesStopped),
        () = &mut shutdown => {
            stop(watch_tasks, elector).await;
            return Ok(());
        }
    };
    if let Err(e) = result {
        stop(watch_tasks, elector).await;
        return Err(e);
    }
    // Changes queued during the lists are covered by the first full reconcile.
    while rx.try_recv().is_ok() {}
    info!("every kind listed; first reconcile");
    // The value is copied out first: a `borrow()` guard alive across the await would block
    // the elector's send (and with it a runtime worker) until the reconcile ends, which then
    // could never be polled again.
    let is_leading = *leading.borrow();
    // Shutdown abandons a reconcile in flight (its writes are the next leader's to redo):
    // one waiting on an API server that stopped answering must not hold the exit.
    let mut owed = tokio::select! {
        o = reconciler.reconcile_for(Relevance::Full, is_leading, Trigger { cause: "start", kinds: Kinds::default() }) => o,
        () = &mut shutdown => {
            info!("shutting down during the first reconcile");
            stop(watch_tasks, elector).await;
            return Ok(());
        }
        () = stepped_down(&leading), if is_leading => {
            info!("leadership lost during the first reconcile: its remaining writes are abandoned");
            Outcome::default()
        }
    };
    metrics.set_ready();

    // The retry the owed work asks for: when, and what it needs. The deadline holds across
    // iterations (a stream of changes does not push it back), and once passed the batch that
    // runs next does that work too.
    let mut due: Option<(tokio::time::Instant, Relevance)> = None;
    loop {
        due = schedule(due, owed.wants(), tokio::time::Instant::now());
        let retry = async {
            match due {
                Some((at, _)) if at <= tokio::time::Instant::now() => {
                    tokio::task::yield_now().await;
                }
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending::<()>().await,
            }
        };
        let push_changed = async {
            match push_changes.as_mut() {
                Some(rx) => rx.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        // What started this reconcile and the kinds of the changes it covers (its span's).
        let mut trigger = "watch";
        let mut kinds = Kinds::default();
        let mut relevance = tokio::select! {
            change = rx.recv() => {
                let Some(change) = change else {
                    error!("every watch stopped");
                    break;
                };
                debounced(change, &mut rx, cfg.debounce, &mut kinds).await
            }
            changed = leading.changed() => {
                if changed.is_err() {
                    break;
                }
                // A new leader provisions and compares every status; a former leader just
                // stops writing.
                trigger = "leadership";
                Relevance::Full
            }
            true = push_changed => {
                // Let a burst of ACKs settle before comparing.
                tokio::time::sleep(cfg.debounce).await;
                trigger = "proxies";
                Relevance::Status
            }
            () = retry => {
                trigger = "retry";
                Relevance::Status
            }
            () = &mut shutdown => break,
        };
        if let Some((at, need)) = due
            && at <= tokio::time::Instant::now()
        {
            relevance = relevance.join(need);
        }
        let is_leading = *leading.borrow();
        let outcome = tokio::select! {
            o = reconciler.reconcile_for(relevance, is_leading, Trigger { cause: trigger, kinds }) => o,
            () = &mut shutdown => break,
            // A reconcile outlives the leadership it started with when its writes are slow
            // (an API server that hangs, the same trouble that cost the Lease): what it has
            // not written yet is the new leader's to write, from what it sees. What stays
            // owed stays owed, should this replica lead again.
            () = stepped_down(&leading), if is_leading => {
                info!("leadership lost during a reconcile: its remaining writes are abandoned");
                continue;
            }
        };
        owed = owed.after(relevance, outcome);
        if due.is_some_and(|(_, need)| relevance.covers(need)) {
            due = None;
        }
    }
    info!("shutting down");
    stop(watch_tasks, elector).await;
    Ok(())
}

/// Completes once `leading` says this replica no longer leads (never, if the elector is gone).
/// Waits on a clone: `wait_for` marks what it saw as seen, and the loop must still see a
/// leadership gained meanwhile (it runs the full reconcile that provisions).
async fn stepped_down(leading: &tokio::sync::watch::Receiver<bool>) {
    if leading.clone().wait_for(|l| !*l).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The next retry: `due` (kept, so that a stream of changes never pushes it back, and made
/// sooner or more demanding if `wanted` asks so), or a new one `wanted` asks for from `now`;
/// none once nothing is owed.
fn schedule(
    due: Option<(tokio::time::Instant, Relevance)>,
    wanted: Option<(Duration, Relevance)>,
    now: tokio::time::Instant,
) -> Option<(tokio::time::Instant, Relevance)> {
    let (delay, need) = wanted?;
    Some(match due {
        Some((at, had)) => (at.min(now + delay), had.join(need)),
        None => (now + delay, need),
    })
}

/// Collects the changes arriving within `quiet` of each other into one [`Relevance`], for at
/// most [`MAX_BATCH_QUIET_PERIODS`] quiet periods after `first`; changes still arriving then
/// start the next batch.
async fn debounced(
    first: Change,
    rx: &mut UnboundedReceiver<Change>,
    quiet: Duration,
    kinds: &mut Kinds,
) -> Relevance {
    let batch = Batch::start(quiet);
    let mut relevance = first.relevance;
    kinds.insert(first.kind);
    while let Some(until) = batch.wait_until() {
        match tokio::time::timeout_at(until, rx.recv()).await {
            Ok(Some(c)) => {
                relevance = relevance.join(c.relevance);
                kinds.insert(c.kind);
            }
            Ok(None) | Err(_) => break,
        }
    }
    relevance
}

async fn stop(watch_tasks: Vec<tokio::task::JoinHandle<()>>, elector: leader::Running) {
    for t in watch_tasks {
        t.abort();
    }
    elector.stop().await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::k8s::stores::Kind;

    #[tokio::test]
    async fn a_burst_is_one_reconcile_with_the_strongest_need() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let c = |kind, relevance| Change { kind, relevance };
        tx.send(c(Kind::HttpRoute, Relevance::Full)).unwrap();
        tx.send(c(Kind::EndpointSlice, Relevance::Endpoints))
            .unwrap();
        let first = c(Kind::EndpointSlice, Relevance::Endpoints);
        let r = debounced(
            first,
            &mut rx,
            Duration::from_millis(20),
            &mut Kinds::default(),
        )
        .await;
        assert_eq!(r, Relevance::Full);
        assert!(rx.try_recv().is_err());
        let r = debounced(
            first,
            &mut rx,
            Duration::from_millis(20),
            &mut Kinds::default(),
        )
        .await;
        assert_eq!(r, Relevance::Endpoints);
    }

    /// Changes every half quiet period, for ever: the batch still closes, after
    /// MAX_BATCH_QUIET_PERIODS quiet periods (virtual time: the clock is paused and moves only
    /// when every task waits), and what kept arriving starts the next batch.
    #[tokio::test(start_paused = true)]
    async fn a_steady_stream_of_changes_closes_the_batch_in_time() {
        let quiet = Duration::from_millis(100);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let c = |kind, relevance| Change { kind, relevance };
        let producer = tokio::spawn(async move {
            loop {
                tokio::time::sleep(quiet / 2).await;
                if tx
                    .send(c(Kind::EndpointSlice, Relevance::Endpoints))
                    .is_err()
                {
                    break;
                }
            }
        });
        let started = tokio::time::Instant::now();
        let first = c(Kind::HttpRoute, Relevance::Full);
        let r = tokio::time::timeout(
            Duration::from_secs(3600),
            debounced(first, &mut rx, quiet, &mut Kinds::default()),
        )
        .await
        .expect("the batch never closed while changes kept coming");
        assert_eq!(r, Relevance::Full);
        let took = started.elapsed();
        assert!(took >= quiet * (MAX_BATCH_QUIET_PERIODS - 1), "{took:?}");
        assert!(took <= quiet * (MAX_BATCH_QUIET_PERIODS + 1), "{took:?}");
        // The next batch is the changes that go on arriving, with their own relevance.
        let next = rx.recv().await.unwrap();
        assert_eq!(
            debounced(next, &mut rx, quiet, &mut Kinds::default()).await,
            Relevance::Endpoints
        );
        producer.abort();
    }

    /// Leadership gained while a reconcile runs (the first one runs before the Lease is
    /// taken): waiting for a step-down must leave that change for the loop, which answers it
    /// with the full reconcile that provisions. (Waiting on the loop's own receiver consumed
    /// it: no provisioning until some later full change.)
    #[tokio::test]
    async fn waiting_for_a_step_down_leaves_a_gained_leadership_to_the_loop() {
        let (tx, mut leading) = tokio::sync::watch::channel(false);
        leading.borrow_and_update();
        tx.send(true).unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(50), stepped_down(&leading)).await;
        assert!(waited.is_err(), "stepped down while leading");
        assert!(
            leading.has_changed().unwrap(),
            "the gained leadership was consumed"
        );
        tx.send(false).unwrap();
        tokio::time::timeout(Duration::from_secs(5), stepped_down(&leading))
            .await
            .expect("a step-down went unnoticed");
    }

    #[test]
    fn a_status_pass_and_an_endpoints_pass_join_into_a_full_one() {
        use Relevance::{Endpoints, Full, Status};
        assert_eq!(Status.join(Endpoints), Full);
        assert_eq!(Endpoints.join(Status), Full);
        assert_eq!(Status.join(Status), Status);
        assert_eq!(Endpoints.join(Full), Full);
        assert!(Full.covers(Status) && Full.covers(Endpoints));
        assert!(!Endpoints.covers(Status) && !Status.covers(Endpoints));
        assert!(!Status.covers(Full));
    }

    #[test]
    fn owed_work_survives_passes_that_do_not_do_it() {
        use crate::k8s::reconcile::{Outcome, REPROVISION_RETRY, STATUS_RETRY};
        let failed = Outcome {
            reprovision: true,
            ..Outcome::default()
        };
        let clean = Outcome::default();
        // An endpoints pass or a status pass does not provision: the retry stays owed.
        let owed = failed.after(Relevance::Endpoints, clean);
        assert!(owed.reprovision);
        let owed = owed.after(Relevance::Status, clean);
        assert!(owed.reprovision);
        assert_eq!(owed.wants(), Some((REPROVISION_RETRY, Relevance::Full)));
        // A full pass settles it.
        assert_eq!(owed.after(Relevance::Full, clean), clean);
        assert_eq!(clean.wants(), None);
        // A failed status write is settled by the next status pass, not by an endpoints pass.
        let retry = Outcome {
            retry: true,
            ..Outcome::default()
        };
        assert!(retry.after(Relevance::Endpoints, clean).retry);
        assert!(!retry.after(Relevance::Status, clean).retry);
        assert_eq!(retry.wants(), Some((STATUS_RETRY, Relevance::Status)));
    }

    #[test]
    fn a_retry_time_is_not_pushed_back() {
        let t0 = tokio::time::Instant::now();
        let later = t0 + Duration::from_secs(3);
        let five = Some((Duration::from_secs(5), Relevance::Full));
        let due = schedule(None, five, t0);
        assert_eq!(due, Some((t0 + Duration::from_secs(5), Relevance::Full)));
        // Asked again three seconds later (another change ran meanwhile): the same deadline.
        assert_eq!(schedule(due, five, later), due);
        // Something sooner brings it forward and keeps what both need.
        let now = Some((Duration::ZERO, Relevance::Status));
        assert_eq!(schedule(due, now, later), Some((later, Relevance::Full)));
        assert_eq!(schedule(due, None, later), None);
    }

    #[test]
    fn a_reconcile_that_stopped_early_settles_nothing() {
        use crate::k8s::reconcile::{Outcome, REPROVISION_RETRY, STATUS_RETRY};
        let owed = Outcome {
            reprovision: true,
            retry: true,
            ..Outcome::default()
        };
        let stopped = Outcome {
            incomplete: true,
            ..Outcome::default()
        };
        // A full pass that could not read a referenced object did no work: all stays owed.
        let after = owed.after(Relevance::Full, stopped);
        assert!(after.reprovision && after.retry && after.incomplete);
        assert_eq!(after.wants(), Some((STATUS_RETRY, Relevance::Full)));
        // The next full pass that reads everything settles it.
        let clean = Outcome::default();
        assert_eq!(after.after(Relevance::Full, clean), clean);
        // An endpoints pass does not.
        assert!(after.after(Relevance::Endpoints, clean).incomplete);
        // Compiled without the object past the grace period: tried again after a pause.
        let unread = Outcome {
            unread: true,
            ..Outcome::default()
        };
        assert_eq!(
            clean.after(Relevance::Full, unread).wants(),
            Some((REPROVISION_RETRY, Relevance::Full))
        );
    }

    #[test]
    fn a_failed_pass_pauses_even_with_more_writes_due() {
        use crate::k8s::reconcile::{Outcome, STATUS_RETRY};
        // Writes that fail at once (an API server refusing connections) with more due, or a
        // pass that could not read an object: one second, not straight away.
        let failed = Outcome {
            more: true,
            retry: true,
            ..Outcome::default()
        };
        assert_eq!(failed.wants(), Some((STATUS_RETRY, Relevance::Status)));
        let stopped = Outcome {
            more: true,
            incomplete: true,
            ..Outcome::default()
        };
        assert_eq!(stopped.wants(), Some((STATUS_RETRY, Relevance::Full)));
        let more = Outcome {
            more: true,
            ..Outcome::default()
        };
        assert_eq!(more.wants(), Some((Duration::ZERO, Relevance::Status)));
    }
}
