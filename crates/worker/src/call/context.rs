//! What a handler gets besides its payload: the task's identity, progress
//! and heartbeat writes, a cancellation token, child submits, and
//! `complete_in` to commit its own writes with the settlement.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value as Json;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{
    codes, Error, ExecErrorKind, Failure, Lease, NewTask, PgExecutor, PgTransaction, Result, RetryBackoff,
    Settlement, Store, Task, TaskStatus, MAX_SNOOZE,
};

use super::blocking::BlockingGuard;
use crate::shared::{envelope, CancelReason, Running, TaskError};

/// Gives a handler's own settlement back to the worker unless disarmed
/// (its write answered).
pub(super) struct HandBack<'a>(pub(super) Option<&'a Running>);

impl Drop for HandBack<'_> {
    fn drop(&mut self) {
        if let Some(running) = self.0 {
            running.give_back_settlement();
        }
    }
}

/// The handler's view of its task.
#[derive(Debug)]
pub struct TaskContext<E> {
    store: Arc<Store<E>>,
    task: Arc<Task>,
    lease_length: Duration,
    backoff: RetryBackoff,
    pub(super) running: Arc<Running>,
    pub(super) steps: Arc<super::steps::StepLog>,
}

impl<E> Clone for TaskContext<E> {
    fn clone(&self) -> Self {
        TaskContext {
            store: self.store.clone(),
            task: self.task.clone(),
            lease_length: self.lease_length,
            backoff: self.backoff,
            running: self.running.clone(),
            steps: self.steps.clone(),
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
        TaskContext { store, task, lease_length, backoff, running, steps: Arc::default() }
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
        BlockingGuard::new(self.running.clone())
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
    pub(super) fn lost(&self) -> Error {
        Error::LostLease { task_id: self.task.id.clone(), worker_id: self.worker_id().to_owned() }
    }

    /// Fails at once, without touching the row, when the lease is gone or
    /// the task is already settled.
    pub(super) fn check_owned(&self) -> Result<()> {
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
    pub async fn fail(&self, error: TaskError) -> Result<Option<Task>> {
        let delay = if error.is_retryable() { self.backoff.delay(self.task.attempt) } else { Duration::ZERO };
        let failure = Failure::new(error.envelope()).retryable(error.is_retryable()).delay(delay);
        self.settle_now(Settlement::Fail { lease: self.lease().clone(), failure }).await
    }

    /// Snoozes the task now, as the worker would on
    /// `Err(TaskError::snooze(delay))`: queued again, due after `delay`,
    /// its attempt unspent. A delay past [`MAX_SNOOZE`] is
    /// cut to it. See [`TaskContext::complete`].
    pub async fn snooze(&self, delay: Duration) -> Result<Option<Task>> {
        let delay = delay.min(MAX_SNOOZE);
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
        let definite = e.exec_kind() == Some(ExecErrorKind::Query) && e.sqlstate().is_some();
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
        let envelope = envelope(
            "CommitFailed",
            codes::HANDLER_ERROR,
            format!("the commit of complete_in failed: {e}"),
            true,
        );
        let failure = Failure::new(envelope).delay(self.backoff.delay(self.task.attempt));
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
