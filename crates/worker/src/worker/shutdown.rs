//! Graceful shutdown: grace, tokens, a bound past stuck handlers, and
//! the releases of what was stopped.

use std::sync::Arc;
use std::time::Duration;

use waymark_store::PgExecutor;

use crate::call::{Runs, STOP_GRACE};
use crate::settle::{release, GiveBack};
use crate::shared::{CancelReason, Running, Shared};

/// How long shutdown waits, after the stop grace, for runs that are
/// finishing a settlement, before it stops waiting for them.
pub(crate) const SETTLE_BOUND: Duration = Duration::from_secs(2);

/// Stop claiming (done by the caller), let handlers finish within the
/// grace period, then fire the tokens of the rest and give their tasks back.
/// Ends within the grace plus [`STOP_GRACE`], [`SETTLE_BOUND`] and the
/// releases, even when a handler is stuck in blocking code. Such a run's
/// task is not given back (another worker would start it while this one
/// still runs it): it is left to its lease, which is no longer renewed.
pub(crate) async fn shutdown<E: PgExecutor + 'static>(shared: &Arc<Shared<E>>, runs: &Runs<E>) {
    let mut now = shared.state.stop_now.subscribe();
    let ended = tokio::select! {
        out = tokio::time::timeout(shared.settings.shutdown_grace, all_ended(shared, runs)) => out.is_ok(),
        Ok(_) = now.wait_for(|now| *now) => false,
    };
    if ended {
        return;
    }
    // Past the grace first, so that a run answering its token keeps its
    // entry (and its lease renewed) until shutdown gives its task back.
    shared.state.past_grace.send_replace(true);
    let left: Vec<Arc<Running>> =
        shared.state.running.lock().expect("running lock").values().cloned().collect();
    for r in &left {
        r.cancel(CancelReason::Shutdown);
    }
    // A run that answers its token, or is dropped after STOP_GRACE, ends
    // here; one already settling gets a moment to hear its answer.
    let ended = tokio::time::timeout(STOP_GRACE + SETTLE_BOUND, all_ended(shared, runs)).await.is_ok();
    if !ended {
        // Blocking code never yields, so it cannot be aborted or awaited.
        // An aborted run that does yield ends at once; wait a moment for
        // those, and leave the rest behind.
        runs.abort(Duration::from_millis(100)).await;
    }
    // A call not stuck may still be waiting for a runner, or its runner for
    // a thread (one the stuck run holds): dropped with the queue, or
    // aborted, it can never run its handler again, so its task is safe to
    // give back.
    let (stuck, done): (Vec<_>, Vec<_>) = left.into_iter().partition(|r| r.is_stuck());
    for r in &stuck {
        tracing::warn!(task = %r.id(), "a handler is stuck in blocking code at shutdown; its task returns when its lease expires");
    }
    let give_back: Vec<Arc<Running>> =
        done.into_iter().filter(|r| !r.is_lost() && r.take_settlement()).collect();
    {
        // The heartbeat renews what the map holds: the tasks being given
        // back, while their releases are retried; not the stuck runs',
        // whose leases run out.
        let mut map = shared.state.running.lock().expect("running lock");
        map.clear();
        map.extend(give_back.iter().map(|r| (r.key().clone(), r.clone())));
    }
    futures::future::join_all(give_back.iter().map(|r| release(shared, r, GiveBack::Shutdown))).await;
    shared.state.running.lock().expect("running lock").clear();
}

/// Until every call has ended and every settlement it handed off has been
/// answered (a call that handed its settlement off has ended already; its
/// task is settled once the batcher answers).
async fn all_ended<E: PgExecutor + 'static>(shared: &Shared<E>, runs: &Runs<E>) {
    runs.all_ended().await;
    shared.state.settlements_answered().await;
}
