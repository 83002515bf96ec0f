//! Giving a task back to its queue (`release`): its attempt unspent, due
//! now, for any worker to take. Shutdown gives back what it stopped; the
//! claim loop what it claimed ahead of a slot and never started.

use std::sync::Arc;
use std::time::Instant;

use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{Error, PgExecutor};

use super::resend::while_passing;
use crate::shared::{Running, Shared};

/// Why a task is given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GiveBack {
    /// Shutdown stopped its run: counted as settled by this worker.
    Shutdown,
    /// It was claimed ahead and never started (see the claim stage's `ready`): not
    /// counted, and a lease lost meanwhile is no failure.
    Unstarted,
}

/// Gives one task back, trying again on passing failures while its lease
/// lasts (the heartbeat loop keeps renewing it meanwhile). Answers whether
/// it was given back (or found gone); what cannot be given back is
/// reported.
pub(crate) async fn release<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    r: &Running,
    why: GiveBack,
) -> bool {
    let deadline = Instant::now() + shared.settings.lease;
    let again = || shared.store.release(&r.lease);
    let first = again().await;
    let resent = first.as_ref().is_err_and(Error::is_transient);
    // After `stop_now`, no more tries: what fails is left to its lease.
    let stop = || r.is_lost() || *shared.state.stop_now.borrow();
    match while_passing(first, deadline, stop, r.id(), again).await {
        Ok(task) => {
            if why == GiveBack::Shutdown {
                shared.state.settled.add_one();
            }
            r.report_given_back(task.status);
            true
        }
        // A resend finds the task gone when the first try had committed; a
        // task not yet started may have lost its lease while it waited.
        Err(e) if e.is_lost_lease() && (resent || why == GiveBack::Unstarted) => {
            tracing::debug!(task = %r.id(), "a release found the task no longer ours");
            true
        }
        Err(e) => {
            shared.report(format!("giving back {}", r.id()), e);
            false
        }
    }
}
