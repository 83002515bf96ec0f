//! The worker's record of one unsettled task ([`Running`]): its lease, its
//! state ([`RunState`]), the handler's own
//! settlement while its write is unanswered, and what reports its end (the
//! store's observer, the worker's events). Every stage holds it: the claim
//! makes it, the call's handler and its context read and change it, the
//! settlement ends it, the heartbeat renews its lease.

use std::any::Any;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use waymark_store::{Lease, PgExecutor, RunEnd, RunScope, Settlement, Store, TaskStatus};

use super::error::panic_message;
use super::events::{Events, WorkerEvent};
use super::run_state::{AtomicRunState, CancelReason, PollState, RunState};

/// Something a call holds until it lets go (its slot, its units): a shared
/// handle, given back when its last holder drops it.
pub(crate) type Hold = Arc<dyn Any + Send + Sync>;

/// What a run holds of its call while it lasts (the call's slot and its
/// units, if it drew any, each given back when its last holder lets go):
/// shared handles, so holding them costs no allocation per run.
pub(crate) type CallHold = (Hold, Option<Hold>);

/// The worker's record of one unsettled task, shared with its handler.
#[derive(Debug)]
pub(crate) struct Running {
    /// The claim, under its own worker id: the worker's own writes name it.
    pub(crate) lease: Lease,
    /// The claim's attempt.
    attempt: i32,
    /// The token, the lease, the settlement, the future, the blocking
    /// closure and the observer's end, in one atomic.
    state: AtomicRunState,
    /// Wakes those waiting for the token to fire. (A channel would cost an
    /// allocation per task for what the state's few bits hold.)
    fired: Notify,
    /// The handler's own settlement whose write has not answered, while
    /// the state says one is kept: the worker makes it, rather than the one
    /// the handler's return maps to.
    pending: Mutex<Option<Settlement>>,
    /// The call this run belongs to, while it lasts: a blocking closure
    /// holds it (its slot and units) until the closure returns.
    call: Mutex<Option<CallHold>>,
    events: Events,
    /// The store's observer's view of this run, ended once.
    scope: Observed,
}

/// A run's [`RunScope`], if the store has an observer.
struct Observed(Option<Box<dyn RunScope>>);

impl std::fmt::Debug for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Observed" } else { "Unobserved" })
    }
}

impl Running {
    pub(crate) fn new(
        lease: Lease,
        attempt: i32,
        events: Events,
        scope: Option<Box<dyn RunScope>>,
    ) -> Arc<Self> {
        Arc::new(Running {
            lease,
            attempt,
            events,
            scope: Observed(scope),
            state: AtomicRunState::default(),
            fired: Notify::new(),
            pending: Mutex::new(None),
            call: Mutex::new(None),
        })
    }

    pub(crate) fn id(&self) -> &str {
        self.lease.task_id()
    }

    /// The task id as the worker's map of running tasks keys it.
    pub(crate) fn key(&self) -> &Arc<str> {
        self.lease.shared_task_id()
    }

    pub(crate) fn attempt(&self) -> i32 {
        self.attempt
    }

    /// The run's state now.
    pub(crate) fn state(&self) -> RunState {
        self.state.load()
    }

    /// Polls (or calls) the run's code inside the observer's context.
    pub(crate) fn enter<T>(&self, run: impl FnOnce() -> T) -> T {
        let Some(scope) = &self.scope.0 else { return run() };
        let (mut run, mut out) = (Some(run), None);
        scope.enter(&mut || {
            if let Some(run) = run.take() {
                out = Some(run());
            }
        });
        // An observer that did not call `poll` is not obeyed: the run goes on.
        match (out, run) {
            (Some(out), _) => out,
            (None, Some(run)) => run(),
            (None, None) => unreachable!("the run was taken, so it answered"),
        }
    }

    /// Tells the observer how the handler answered.
    pub(crate) fn observe_return(&self, took: Duration, error: impl FnOnce() -> Option<String>) {
        if let Some(scope) = &self.scope.0 {
            scope.returned(took, error().as_deref());
        }
    }

    /// Tells the observer how a run ended whose settlement answered "lost
    /// lease": a resend of a write that had committed answers so too (the
    /// executor's, the batcher's fallback), so the row decides. Our attempt,
    /// ended: settled; a later attempt or another worker's run: lost; else
    /// (a queued row: our retry, or a recovered lease) unknown. One read,
    /// and only when the run is observed.
    pub(crate) async fn observe_lost_answer<E: PgExecutor>(&self, store: &Store<E>) {
        if self.scope.0.is_none() || self.state().observed {
            return;
        }
        let end = match store.fetch(self.id()).await {
            Ok(row) => {
                let ours =
                    row.attempt == self.attempt() && row.worker_id.as_deref() == Some(self.lease.worker_id());
                if ours && row.status.is_terminal() {
                    RunEnd::Settled(row.status)
                } else if row.attempt > self.attempt() || (row.status == TaskStatus::Running && !ours) {
                    RunEnd::LeaseLost
                } else {
                    RunEnd::Unknown
                }
            }
            Err(_) => RunEnd::Unknown,
        };
        self.observe_end(end);
    }

    /// Tells the observer how the run ended, the first time only.
    pub(crate) fn observe_end(&self, end: RunEnd) {
        if let Some(scope) = &self.scope.0 {
            if !self.state.update(|s| s.observed = true).observed {
                // The observer's code: a panic there is logged, not let
                // through the loops that report ends (a flush, the
                // heartbeat), where it would stop other tasks' work.
                let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scope.end(end)));
                if let Err(panic) = ended {
                    tracing::error!(
                        task = %self.id(),
                        panic = %panic_message(&panic),
                        "an observer panicked as a run ended"
                    );
                }
            }
        }
    }

    /// Reports a settlement of this run that committed.
    pub(crate) fn report_settled(&self, status: TaskStatus) {
        self.report(RunEnd::Settled(status), |task_id, attempt| WorkerEvent::Settled {
            task_id,
            attempt,
            status,
        });
    }

    /// Reports a give-back of this run's task that committed.
    pub(crate) fn report_given_back(&self, status: TaskStatus) {
        self.report(RunEnd::GivenBack(status), |task_id, attempt| WorkerEvent::GivenBack {
            task_id,
            attempt,
            status,
        });
    }

    /// Tells the observer how the run ended, and the subscribers the event
    /// `event` makes from the task's id and attempt.
    fn report(&self, end: RunEnd, event: impl FnOnce(String, i32) -> WorkerEvent) {
        self.observe_end(end);
        self.events.emit(|| event(self.id().to_owned(), self.attempt()));
    }

    /// Fires the token, keeping the first reason.
    pub(crate) fn cancel(&self, reason: CancelReason) {
        let before = self.state.update(|s| {
            s.token.get_or_insert(reason);
        });
        if before.token.is_none() {
            self.fired.notify_waiters();
        }
    }

    /// Why the token fired, if it did.
    pub(crate) fn reason(&self) -> Option<CancelReason> {
        self.state().token
    }

    /// Resolves when the token fires, with the reason it fired for.
    pub(crate) async fn fired(&self) -> CancelReason {
        loop {
            // Registered before the reason is read: a fire between the two
            // still wakes this waiter.
            let notified = self.fired.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if let Some(reason) = self.reason() {
                return reason;
            }
            notified.await;
        }
    }

    pub(crate) fn mark_lost(&self) {
        let before = self.state.update(|s| s.lost = true);
        // A run already settled loses nothing (a re-claim of a retry due
        // at once finds it winding down).
        if !before.lost && !before.settlement.is_taken() {
            // With the handler's own settlement unanswered, the row may be
            // settled by it rather than taken.
            let pending = before.settlement.is_pending();
            self.observe_end(if pending { RunEnd::Unknown } else { RunEnd::LeaseLost });
            self.events
                .emit(|| WorkerEvent::LeaseLost { task_id: self.id().to_owned(), attempt: self.attempt() });
        }
        self.cancel(CancelReason::LeaseLost);
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.state().lost
    }

    /// Claims the one settlement; false if something settled it already.
    pub(crate) fn take_settlement(&self) -> bool {
        let mut took = false;
        self.state.update(|s| took = s.take_settlement());
        took
    }

    /// Undoes [`Running::take_settlement`] for a settlement whose write
    /// failed without an answer, or a give-back that failed.
    pub(crate) fn give_back_settlement(&self) {
        self.state.update(RunState::give_back_settlement);
    }

    pub(crate) fn is_settled(&self) -> bool {
        self.state().settlement.is_taken()
    }

    /// Keeps the handler's own settlement until its write answers.
    pub(crate) fn set_pending(&self, settlement: Settlement) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        *pending = Some(settlement);
        self.state.update(|s| s.keep_pending(true));
    }

    /// The handler's own settlement whose write did not answer, if any.
    pub(crate) fn take_pending(&self) -> Option<Settlement> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        self.state.update(|s| s.keep_pending(false));
        pending.take()
    }

    /// Ties this run to its call's slot and units (see `Slot`), or unties it.
    pub(crate) fn hold_call(&self, call: Option<CallHold>) {
        *self.call.lock().unwrap_or_else(|p| p.into_inner()) = call;
    }

    /// What the run holds of its call, for a blocking closure to hold too.
    pub(crate) fn call_hold(&self) -> Option<CallHold> {
        self.call.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Marks a blocking closure running, or returned.
    pub(crate) fn set_blocking(&self, blocking: bool) {
        self.state.update(|s| s.blocking = blocking);
    }

    /// Marks the run over: its future finished or was dropped.
    pub(crate) fn mark_ended(&self) {
        self.state.update(|s| s.future = PollState::Ended);
    }

    /// Marks a poll of the run's future begun or returned.
    pub(crate) fn set_in_poll(&self, polling: bool) {
        self.state.update(|s| s.poll(polling));
    }

    /// Whether the run is inside a poll that has not returned, or its
    /// blocking closure runs: seen after shutdown's bound, it is stuck in
    /// blocking code. (A run merely starved of a thread is not: it is
    /// parked, waiting to be polled.)
    pub(crate) fn is_stuck(&self) -> bool {
        self.state().is_stuck()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Nothing reported an end: no write of this run is known to have
        // committed.
        self.observe_end(RunEnd::Unknown);
    }
}
