//! What a handler gets besides its payload: the task's identity, progress
//! and heartbeat writes, a cancellation token, child submits, and
//! `complete_in` to commit its own writes with the settlement.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value as Json;
use std::time::Duration;

use crate::events::{Events, WorkerEvent};
use tokio::sync::Notify;

use waymark_store::{
    Error, Lease, NewTask, PgExecutor, PgTransaction, Result, RetryBackoff, RunEnd, RunScope, Settlement,
    Store, Task, TaskStatus,
};

/// Why a task's token fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelReason {
    /// Someone asked for the task to stop (`Store::cancel`); a settlement
    /// now ends it `canceled`.
    Requested,
    /// The lease is gone (it ran out, or another worker took the task):
    /// every later write of this run is a no-op, so stop.
    LeaseLost,
    /// The worker is shutting down past its grace period; the task will be
    /// given back to the queue.
    Shutdown,
    /// The handler ran past the worker's `max_run_time`: the task is
    /// failed (and retried if attempts remain), so stop. An async handler
    /// is dropped then; a blocking closure cannot be, and should return.
    TimedOut,
}

impl CancelReason {
    /// Its code in [`Running`]'s token (0 is "not fired").
    fn code(self) -> u8 {
        match self {
            CancelReason::Requested => 1,
            CancelReason::LeaseLost => 2,
            CancelReason::Shutdown => 3,
            CancelReason::TimedOut => 4,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(CancelReason::Requested),
            2 => Some(CancelReason::LeaseLost),
            3 => Some(CancelReason::Shutdown),
            4 => Some(CancelReason::TimedOut),
            _ => None,
        }
    }
}

/// What a run holds of its call while it lasts (the call's slot and its
/// units, if it drew any, each given back when its last holder lets go):
/// shared handles, so holding them costs no allocation per run.
pub(crate) type CallHold =
    (Arc<dyn std::any::Any + Send + Sync>, Option<Arc<dyn std::any::Any + Send + Sync>>);

/// The worker's record of one unsettled task, shared with its handler.
#[derive(Debug)]
pub(crate) struct Running {
    /// The claim, under its own worker id: the worker's own writes name it.
    pub(crate) lease: Lease,
    /// The claim's attempt.
    attempt: i32,
    /// The token: the first reason it fired for ([`CancelReason::code`]),
    /// 0 while it has not; `fired` wakes those waiting on it. (A channel
    /// would cost an allocation per task for what one byte holds.)
    reason: AtomicU8,
    fired: Notify,
    lost: AtomicBool,
    /// Settled (or given back): no other write may follow.
    settled: AtomicBool,
    /// The run is over (its future finished or was dropped).
    ended: AtomicBool,
    /// The run's future is being polled right now; true for long only
    /// when it is stuck in blocking code.
    in_poll: AtomicBool,
    /// A blocking handler's closure is running on a blocking thread (it
    /// may outlive the run's future).
    blocking: AtomicBool,
    /// A settlement the handler began itself whose write has not answered:
    /// the worker makes it, rather than the one the handler's return maps to.
    pending: std::sync::Mutex<Option<Settlement>>,
    /// The call this run belongs to, while it lasts: a blocking closure
    /// holds it (its slot and units) until the closure returns.
    call: std::sync::Mutex<Option<CallHold>>,
    events: Events,
    /// The store's observer's view of this run, ended once (`observed`).
    scope: Observed,
    observed: AtomicBool,
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
            observed: AtomicBool::new(false),
            reason: AtomicU8::new(0),
            fired: Notify::new(),
            lost: AtomicBool::new(false),
            settled: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            in_poll: AtomicBool::new(false),
            blocking: AtomicBool::new(false),
            pending: std::sync::Mutex::new(None),
            call: std::sync::Mutex::new(None),
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
    pub(crate) fn observe_return(&self, took: std::time::Duration, error: impl FnOnce() -> Option<String>) {
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
        if self.scope.0.is_none() || self.observed.load(Ordering::SeqCst) {
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
            if !self.observed.swap(true, Ordering::SeqCst) {
                // The observer's code: a panic there is logged, not let
                // through the loops that report ends (a flush, the
                // heartbeat), where it would stop other tasks' work.
                let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scope.end(end)));
                if let Err(panic) = ended {
                    tracing::error!(
                        task = %self.id(),
                        panic = %crate::run::panic_message(&panic),
                        "an observer panicked as a run ended"
                    );
                }
            }
        }
    }

    /// Reports a settlement of this run that committed.
    pub(crate) fn report_settled(&self, status: waymark_store::TaskStatus) {
        self.observe_end(RunEnd::Settled(status));
        self.events.emit(|| WorkerEvent::Settled {
            task_id: self.id().to_owned(),
            attempt: self.attempt(),
            status,
        });
    }

    /// Reports a give-back of this run's task that committed.
    pub(crate) fn report_given_back(&self, status: waymark_store::TaskStatus) {
        self.observe_end(RunEnd::GivenBack(status));
        self.events.emit(|| WorkerEvent::GivenBack {
            task_id: self.id().to_owned(),
            attempt: self.attempt(),
            status,
        });
    }

    /// Fires the token, keeping the first reason.
    pub(crate) fn cancel(&self, reason: CancelReason) {
        if self.reason.compare_exchange(0, reason.code(), Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            self.fired.notify_waiters();
        }
    }

    /// Why the token fired, if it did.
    pub(crate) fn reason(&self) -> Option<CancelReason> {
        CancelReason::from_code(self.reason.load(Ordering::SeqCst))
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
        // A run already settled loses nothing (a re-claim of a retry due
        // at once finds it winding down).
        if !self.lost.swap(true, Ordering::SeqCst) && !self.is_settled() {
            // With the handler's own settlement unanswered, the row may be
            // settled by it rather than taken.
            let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner()).is_some();
            self.observe_end(if pending { RunEnd::Unknown } else { RunEnd::LeaseLost });
            self.events
                .emit(|| WorkerEvent::LeaseLost { task_id: self.id().to_owned(), attempt: self.attempt() });
        }
        self.cancel(CancelReason::LeaseLost);
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Claims the one settlement; false if something settled it already.
    pub(crate) fn take_settlement(&self) -> bool {
        !self.settled.swap(true, Ordering::SeqCst)
    }

    pub(crate) fn set_pending(&self, settlement: Settlement) {
        *self.pending.lock().unwrap_or_else(|p| p.into_inner()) = Some(settlement);
    }

    /// The handler's own settlement whose write did not answer, if any.
    pub(crate) fn take_pending(&self) -> Option<Settlement> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Ties this run to its call's slot and units (see `run::SlotHold` and
    /// `run::UnitsHold`), or unties it.
    pub(crate) fn hold_call(&self, call: Option<CallHold>) {
        *self.call.lock().unwrap_or_else(|p| p.into_inner()) = call;
    }

    /// Undoes [`Running::take_settlement`] for a handler's own settlement
    /// whose write failed without an answer.
    pub(crate) fn give_back_settlement(&self) {
        self.settled.store(false, Ordering::SeqCst);
    }

    pub(crate) fn is_settled(&self) -> bool {
        self.settled.load(Ordering::SeqCst)
    }

    pub(crate) fn mark_ended(&self) {
        self.ended.store(true, Ordering::SeqCst);
    }

    pub(crate) fn set_in_poll(&self, polling: bool) {
        self.in_poll.store(polling, Ordering::SeqCst);
    }

    /// Whether the run is inside a poll that has not returned: seen after
    /// shutdown's bound, it is stuck in blocking code. (A run merely
    /// starved of a thread is not: it is parked, waiting to be polled.)
    pub(crate) fn is_stuck(&self) -> bool {
        (!self.ended.load(Ordering::SeqCst) && self.in_poll.load(Ordering::SeqCst))
            || self.blocking.load(Ordering::SeqCst)
    }
}

/// Gives a handler's own settlement back to the worker unless disarmed
/// (its write answered).
struct HandBack<'a>(Option<&'a Running>);

impl Drop for Running {
    fn drop(&mut self) {
        // Nothing reported an end: no write of this run is known to have
        // committed.
        self.observe_end(RunEnd::Unknown);
    }
}

impl Drop for HandBack<'_> {
    fn drop(&mut self) {
        if let Some(running) = self.0 {
            running.give_back_settlement();
        }
    }
}

/// Marks a blocking handler's closure running, until dropped with it.
/// It holds the call (its concurrency slot and its units) too: a closure
/// that outlives its run (past `max_run_time`) still occupies them.
#[derive(Debug)]
pub(crate) struct BlockingGuard {
    running: Arc<Running>,
    _call: Option<CallHold>,
}

impl BlockingGuard {
    /// Calls a blocking handler inside the observer's context.
    pub(crate) fn enter<T>(&self, call: impl FnOnce() -> T) -> T {
        self.running.enter(call)
    }
}

impl Drop for BlockingGuard {
    fn drop(&mut self) {
        self.running.blocking.store(false, Ordering::SeqCst);
    }
}

/// The handler's view of its task.
#[derive(Debug)]
pub struct TaskContext<E> {
    store: Arc<Store<E>>,
    task: Arc<Task>,
    lease_length: Duration,
    backoff: RetryBackoff,
    running: Arc<Running>,
}

impl<E> Clone for TaskContext<E> {
    fn clone(&self) -> Self {
        TaskContext {
            store: self.store.clone(),
            task: self.task.clone(),
            lease_length: self.lease_length,
            backoff: self.backoff,
            running: self.running.clone(),
        }
    }
}

impl<E> TaskContext<E> {
    pub(crate) fn new(
        store: Arc<Store<E>>,
        task: Arc<Task>,
        lease_length: Duration,
        backoff: RetryBackoff,
        running: Arc<Running>,
    ) -> Self {
        TaskContext { store, task, lease_length, backoff, running }
    }

    /// The task id.
    pub fn id(&self) -> &str {
        &self.task.id
    }

    /// The handler name.
    pub fn name(&self) -> &str {
        &self.task.name
    }

    /// The queue.
    pub fn queue(&self) -> &str {
        &self.task.queue
    }

    /// This run's attempt, from 1.
    pub fn attempt(&self) -> i32 {
        self.task.attempt
    }

    /// The task's metadata.
    pub fn metadata(&self) -> &Json {
        &self.task.metadata
    }

    /// The worker id this run's claim holds the task under, as the row's
    /// `worker_id` shows it while it runs: the worker's id, `/`, and the
    /// claim's number (see [`TaskContext::lease`]).
    pub fn worker_id(&self) -> &str {
        self.running.lease.worker_id()
    }

    /// This run's lease, under its claim's own worker id (so no write made
    /// with it can land on a later claim of the task), for owned writes made
    /// through [`TaskContext::store`] directly. A settlement written that
    /// way is the handler's own: the worker's settlement after it finds
    /// the task settled and is dropped, and no event reports it; settle
    /// with [`TaskContext::complete_in`] instead.
    pub fn lease(&self) -> &Lease {
        &self.running.lease
    }

    /// The task as claimed.
    pub fn task(&self) -> &Task {
        &self.task
    }

    /// The store, for reads and writes of the handler's own.
    pub fn store(&self) -> &Store<E> {
        &self.store
    }

    pub(crate) fn blocking_guard(&self) -> BlockingGuard {
        self.running.blocking.store(true, Ordering::SeqCst);
        let call = self.running.call.lock().unwrap_or_else(|p| p.into_inner()).clone();
        BlockingGuard { running: self.running.clone(), _call: call }
    }

    /// Whether the token fired, and why.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.running.reason()
    }

    /// Whether the token fired.
    pub fn is_cancelled(&self) -> bool {
        self.cancel_reason().is_some()
    }

    /// Resolves when the token fires: a cancel request, a lost lease,
    /// shutdown past the grace period, or the time limit. Select on it in
    /// long handlers.
    pub async fn cancelled(&self) -> CancelReason {
        self.running.fired().await
    }
}

impl<E: PgExecutor> TaskContext<E> {
    fn lost(&self) -> Error {
        Error::LostLease { task_id: self.task.id.clone(), worker_id: self.worker_id().to_owned() }
    }

    /// Fails at once, without touching the row, when the lease is gone or
    /// the task is already settled.
    fn check_owned(&self) -> Result<()> {
        if self.running.is_lost() || self.running.is_settled() {
            Err(self.lost())
        } else {
            Ok(())
        }
    }

    /// Whether a cancel of this task was requested, reading the row now
    /// rather than waiting for the next heartbeat (free once the token
    /// fired for a request). A request found this way fires the token with
    /// [`CancelReason::Requested`]. A task gone from the table, or already
    /// canceled, counts as canceled. A row that shows the task no longer
    /// held by this run (the lease ran out, another worker took it) marks
    /// the run lost: the token fires with [`CancelReason::LeaseLost`].
    pub async fn canceled(&self) -> Result<bool> {
        if self.cancel_reason() == Some(CancelReason::Requested) {
            return Ok(true);
        }
        let Some(row) = self.store.get(self.id()).await? else {
            self.running.mark_lost();
            return Ok(true);
        };
        let owned = row.status == TaskStatus::Running
            && row.worker_id.as_deref() == Some(self.worker_id())
            && row.attempt == self.attempt();
        if !owned && !self.running.is_settled() {
            self.running.mark_lost();
        }
        let requested = row.cancel_requested_at_ms.is_some() || row.status == TaskStatus::Canceled;
        if requested && owned {
            self.running.cancel(CancelReason::Requested);
        }
        Ok(requested)
    }

    /// Settles the task now, as the worker would on `Ok(result)`: succeeded
    /// (canceled if a cancel was requested). For a batch handler that
    /// settles some tasks itself; after it the worker does not settle the
    /// task again, and a second settlement is a no-op answering `None`. A
    /// lost lease is [`Error::LostLease`]. A failed write that may have not
    /// landed (a saturated pool, a lost connection) hands the settlement
    /// back to the worker, which settles by the handler's return.
    pub async fn complete(&self, result: impl Serialize) -> Result<Option<Task>> {
        let result = serde_json::to_value(result)
            .map_err(|e| Error::InvalidArgument(format!("result does not serialise to JSON: {e}")))?;
        self.settle_now(Settlement::Complete { lease: self.lease().clone(), result }).await
    }

    /// Fails the task now, as the worker would on `Err(error)`: retried
    /// after the backoff if retryable with attempts left, else failed
    /// (canceled if a cancel was requested). See [`TaskContext::complete`].
    pub async fn fail(&self, error: crate::TaskError) -> Result<Option<Task>> {
        let delay = if error.is_retryable() { self.backoff.delay(self.task.attempt) } else { Duration::ZERO };
        let failure =
            waymark_store::Failure::new(error.envelope()).retryable(error.is_retryable()).delay(delay);
        self.settle_now(Settlement::Fail { lease: self.lease().clone(), failure }).await
    }

    /// Snoozes the task now, as the worker would on
    /// `Err(TaskError::snooze(delay))`: queued again, due after `delay`,
    /// its attempt unspent. A delay past [`waymark_store::MAX_SNOOZE`] is
    /// cut to it. See [`TaskContext::complete`].
    pub async fn snooze(&self, delay: Duration) -> Result<Option<Task>> {
        let delay = delay.min(waymark_store::MAX_SNOOZE);
        self.settle_now(Settlement::Snooze { lease: self.lease().clone(), delay }).await
    }

    /// The handler's own settlement. Until its write answers, the worker
    /// holds it as the task's intended end: if the write fails without an
    /// answer, or this future is dropped mid-write (a time limit, a
    /// `select!`), the worker makes this settlement when the run ends,
    /// whatever the handler returned (a resend of one that had landed finds
    /// no lease, fenced to this claim's worker id, and changes nothing).
    async fn settle_now(&self, settlement: Settlement) -> Result<Option<Task>> {
        if self.running.is_lost() {
            return Err(self.lost());
        }
        if !self.running.take_settlement() {
            return Ok(None);
        }
        self.running.set_pending(settlement.clone());
        let mut hand_back = HandBack(Some(&self.running));
        let out = self.store.settle(&settlement).await;
        match out {
            Ok(task) => {
                hand_back.0 = None;
                self.running.take_pending();
                self.running.report_settled(task.status);
                Ok(Some(task))
            }
            Err(e) if e.is_lost_lease() => {
                hand_back.0 = None;
                self.running.take_pending();
                self.running.mark_lost();
                self.running.observe_lost_answer(&self.store).await;
                Err(e)
            }
            // `hand_back` gives the settlement, still pending, to the worker.
            Err(e) => Err(e),
        }
    }

    /// Records progress (`None` keeps what is there).
    pub async fn progress(&self, progress: Option<f64>, message: Option<&str>) -> Result<()> {
        self.check_owned()?;
        let out = self.store.progress(self.lease(), progress, message).await;
        self.note(out).map(|_| ())
    }

    /// Renews the lease now (the worker also renews every lease it holds
    /// on its heartbeat interval).
    pub async fn heartbeat(&self) -> Result<()> {
        self.check_owned()?;
        let out = self.store.heartbeat(self.lease(), self.lease_length).await;
        self.note(out).map(|_| ())
    }

    /// Submits a child task: its parent is this task, its root this task's
    /// root, and it inherits the correlation id unless it has its own.
    /// Refused with [`Error::LostLease`] once the lease is lost: that run
    /// was given up and the task runs again elsewhere, whose run submits
    /// its own children. (A settled task may still fan out.)
    pub async fn submit(&self, child: NewTask) -> Result<Task> {
        self.check_lease()?;
        self.store.submit(self.child(child)).await
    }

    /// [`TaskContext::submit`] inside the caller's transaction.
    pub async fn submit_in(&self, tx: &mut E::Transaction, child: NewTask) -> Result<Task> {
        self.check_lease()?;
        self.store.submit_in(tx, self.child(child)).await
    }

    fn check_lease(&self) -> Result<()> {
        if self.running.is_lost() {
            Err(self.lost())
        } else {
            Ok(())
        }
    }

    fn child(&self, mut child: NewTask) -> NewTask {
        child.parent_id = Some(self.task.id.clone());
        child.root_id = Some(self.task.root_id.clone().unwrap_or_else(|| self.task.id.clone()));
        if child.correlation_id.is_none() {
            child.correlation_id = self.task.correlation_id.clone();
        }
        child
    }

    /// Opens a transaction for the handler's own writes, to be finished by
    /// [`TaskContext::complete_in`].
    pub async fn begin(&self) -> Result<E::Transaction> {
        self.check_owned()?;
        Ok(self.store.executor().begin().await?)
    }

    /// Settles the task inside `tx` and commits: the handler's writes and
    /// the settlement commit together, or, if the lease is gone, both roll
    /// back and this returns [`Error::LostLease`]. After it, the worker does
    /// not settle the task again (the handler's return value is dropped).
    pub async fn complete_in(&self, mut tx: E::Transaction, result: impl Serialize) -> Result<Task> {
        if let Err(e) = self.check_owned() {
            let _ = tx.rollback().await;
            return Err(e);
        }
        let result = match serde_json::to_value(result) {
            Ok(v) => v,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(Error::InvalidArgument(format!("result does not serialise to JSON: {e}")));
            }
        };
        match self.store.complete_in(&mut tx, self.lease(), result).await {
            Ok(task) => {
                // Claimed before the commit, so the worker never settles the
                // task on top of it (a handler returning Ok after a failed
                // commit must not succeed without its writes).
                self.running.take_settlement();
                match tx.commit().await {
                    Ok(()) => {
                        self.running.report_settled(task.status);
                        Ok(task)
                    }
                    Err(e) => {
                        let e = Error::from(e);
                        self.record_failed_commit(&e).await;
                        Err(e)
                    }
                }
            }
            Err(e) => {
                let _ = tx.rollback().await;
                Err(self.note::<Task>(Err(e)).unwrap_err())
            }
        }
    }

    /// A COMMIT that the server refused (it answered with an error: a
    /// deferred constraint, a serialisation failure) rolled everything back,
    /// settlement included, and the task is still ours: record that error
    /// as a retryable failure, as if the handler had returned it. A commit
    /// whose answer never came (a lost connection, a timeout) may have
    /// landed: that task is left to its lease.
    async fn record_failed_commit(&self, e: &Error) {
        let definite = e.exec_kind() == Some(waymark_store::ExecErrorKind::Query) && e.sqlstate().is_some();
        if !definite || self.running.is_lost() {
            tracing::warn!(task = %self.task.id, error = %e, "commit of complete_in failed with an unknown outcome; the lease decides");
            return;
        }
        if self.running.reason() == Some(CancelReason::Shutdown) {
            // Shutdown gives back what it stopped, attempt unspent; this
            // run took the settlement, so it gives the task back itself.
            match self.store.release(self.lease()).await {
                Ok(task) => self.running.report_given_back(task.status),
                Err(err) => {
                    tracing::warn!(task = %self.task.id, error = %err, "giving back a task whose commit failed at shutdown failed; the lease decides");
                }
            }
            return;
        }
        let envelope = crate::error::envelope(
            "CommitFailed",
            waymark_store::codes::HANDLER_ERROR,
            format!("the commit of complete_in failed: {e}"),
            true,
        );
        let failure = waymark_store::Failure::new(envelope).delay(self.backoff.delay(self.task.attempt));
        match self.store.fail(self.lease(), &failure).await {
            Ok(task) => self.running.report_settled(task.status),
            Err(err) => {
                tracing::warn!(task = %self.task.id, error = %err, "recording a failed commit failed; the lease decides");
            }
        }
    }

    /// Marks the task lost when an owned write says so.
    fn note<T>(&self, out: Result<T>) -> Result<T> {
        if let Err(e) = &out {
            if e.is_lost_lease() {
                self.running.mark_lost();
            }
        }
        out
    }
}
