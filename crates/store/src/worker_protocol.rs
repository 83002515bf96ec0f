//! The worker's side of the protocol: claiming tasks, renewing their
//! leases, reporting progress and settling them. These are the operations
//! of `waymark-worker` and of the executor contract kit (`waymark-testing`),
//! not of an application: an application submits, reads, waits, cancels
//! and retries through [`Store`](crate::Store)'s own methods, and hands
//! tasks to a `Worker`, which makes these calls for it.
//!
//! They are a trait, [`WorkerProtocol`], implemented for `Store<E>`, so
//! that they stay off `Store`'s page and out of an application's way
//! (River keeps the same operations in its driver, marked not for
//! applications), while a caller that needs them (a worker, the kit, a
//! test, a tool that claims by hand) brings them in with one `use`, and
//! its calls read as before:
//!
//! ```no_run
//! # async fn demo<E: waymark_store::PgExecutor>(store: waymark_store::Store<E>) -> waymark_store::Result<()> {
//! use serde_json::json;
//! use waymark_store::worker_protocol::WorkerProtocol;
//! use waymark_store::{claim_id, ClaimRequest};
//!
//! let claim = ClaimRequest::new(claim_id("worker-1"), ["default"]).limit(10);
//! for claimed in store.claim(&claim).await? {
//!     store.complete(&claimed.lease()?, json!({"done": true})).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! A trait rather than a view type (`store.protocol().claim(..)`): call
//! sites across the workspace change by their `use` line only, and the
//! store's clones, `Arc`s and generic callers need nothing new. It is
//! sealed: `Store` is its one implementation, so an operation can be added
//! without breaking anyone. Every method returns a `Send` future, as a
//! worker spawns them.
//!
//! Every owned write (all but the claim) takes the [`Lease`] of the claim
//! that made it and lands only while that claim holds the task; otherwise
//! it changes nothing and answers [`Error::LostLease`](crate::Error::LostLease).
//! A caller that claims by hand and may resend a write should claim under
//! an id of its own per claim ([`claim_id`](crate::claim_id)): see
//! [`Lease`].

use std::future::Future;
use std::time::Duration;

use serde_json::Value as Json;

use crate::error::Result;
use crate::executor::PgExecutor;
use crate::lease::Lease;
use crate::options::{ClaimRequest, Failure};
use crate::steps::{EventWait, StepHistory, StepKind, StepRecord};
use crate::task::{Beat, Renewal, Settled, Task};

/// The worker's operations on a store; see the [module docs](self).
pub trait WorkerProtocol: sealed::Sealed {
    /// The store's executor.
    type Executor: PgExecutor;

    /// One claim pass: a cheap probe outside any transaction; if it finds
    /// an expired lease, one transaction that recovers expired leases and
    /// then claims (so the pass that recovers a task has the first pick of
    /// it); if it finds only due work, the claim statement alone in
    /// autocommit, which skips locked rows and so never waits on a lock.
    /// With [`ClaimRequest::probe`] off, the pass is that claim statement
    /// alone. Rows come back in no particular order.
    ///
    /// A claimed task whose payload or metadata cannot be read
    /// ([`Task::input_unreadable`]) is never handed out: it fails for good,
    /// and the pass claims again in its place (up to `limit` more such
    /// rows, within a quarter of the lease), so a short answer means the
    /// queues ran dry, short of a run of unreadable rows longer than that.
    ///
    /// Under a [`ClaimRequest::fleet_limit`], the claim waits for its turn
    /// [`FLEET_LIMIT_TURN_WAIT`](crate::FLEET_LIMIT_TURN_WAIT) at most:
    /// past it (another claimer holds the turn that long), it fails with
    /// [`Error::LockTimeout`](crate::Error::LockTimeout), having claimed
    /// nothing, and may be tried again at once.
    fn claim(&self, req: &ClaimRequest) -> impl Future<Output = Result<Vec<Task>>> + Send;

    /// Extends a lease by `length`;
    /// [`Error::LostLease`](crate::Error::LostLease) if the claim no longer
    /// holds the task.
    fn heartbeat(&self, lease: &Lease, length: Duration) -> impl Future<Output = Result<Task>> + Send;

    /// Extends every lease in `ids`, all held by `worker_id`, at once (the
    /// protocol's `heartbeat_batch`). Returns the tasks still owned, in the
    /// order of `ids`; a missing id is a lost lease.
    fn heartbeat_batch(
        &self,
        ids: &[String],
        worker_id: &str,
        length: Duration,
    ) -> impl Future<Output = Result<Vec<Beat>>> + Send;

    /// Extends every lease in `leases` (each checked against its own
    /// worker id: a worker's claims may each hold an id of their own, see
    /// [`Lease`]), as [`WorkerProtocol::heartbeat_batch`] does, without
    /// letting a locked row hold back the others. One statement renews
    /// every owned row it can lock at once and skips the rows another
    /// transaction holds; those alone are then renewed in one statement
    /// waiting up to 100 ms for each lock (about 200 ms in all), and if
    /// that times out, one by one, in the order given, each waiting up to
    /// 100 ms, then those still locked each with an equal share of what is
    /// left of `wait` (all of them together take about `wait` at most, and
    /// at least the first statement's 200 ms; keep it under the executor's
    /// query timeout). A row still locked then, whose renewal failed, or
    /// not tried after an earlier one failed, is reported
    /// [`Renewal::held`], not lost: a later call renews it, and if its
    /// lease runs out first the row drops out of the owned set as any lost
    /// lease does. Both lists keep the order of `leases`; a task in
    /// neither has lost its lease. A task named twice is refused.
    ///
    /// `heartbeat_batch` waits for every lock in its one statement: a
    /// transaction holding one task's row for long (an operator's update, a
    /// handler that locked its own row) keeps every lease in the batch from
    /// renewal meanwhile.
    fn renew_leases(
        &self,
        leases: &[Lease],
        length: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<Renewal>> + Send;

    /// Records progress (`[0, 1]`) and/or a message; `None` keeps a field.
    fn progress(
        &self,
        lease: &Lease,
        progress: Option<f64>,
        message: Option<&str>,
    ) -> impl Future<Output = Result<Task>> + Send;

    /// Settles an owned task: canceled if a cancel was requested, else
    /// succeeded with `result`.
    fn complete(&self, lease: &Lease, result: Json) -> impl Future<Output = Result<Task>> + Send;

    /// [`WorkerProtocol::complete`] inside the caller's transaction: the
    /// settlement commits with the caller's other writes, or neither does.
    /// A lost lease is reported before the caller commits. A handler
    /// reaches it through `TaskContext::complete_in`.
    fn complete_in(
        &self,
        tx: &mut <Self::Executor as PgExecutor>::Transaction,
        lease: &Lease,
        result: Json,
    ) -> impl Future<Output = Result<Task>> + Send;

    /// Marks an owned task succeeded with `result` and an optional
    /// message: the protocol's `succeed`, where a requested cancel does not
    /// win (workers settle with [`WorkerProtocol::complete`]).
    fn succeed(
        &self,
        lease: &Lease,
        result: Json,
        message: Option<&str>,
    ) -> impl Future<Output = Result<Task>> + Send;

    /// Records a failure: canceled if a cancel was requested; queued again
    /// after its delay if retryable with attempts left; else failed.
    fn fail(&self, lease: &Lease, failure: &Failure) -> impl Future<Output = Result<Task>> + Send;

    /// Gives an owned task back (at shutdown): queued and due now, its
    /// attempt not spent; canceled instead if a cancel was requested.
    /// A waymark addition to the protocol (`release.sql`).
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<Task>> + Send;

    /// Snoozes an owned task: queued again, due after `delay` (at most
    /// [`MAX_SNOOZE`]), its attempt not spent and its error left as it was
    /// (a handler's "not yet"); canceled instead if a cancel was requested.
    /// The same statement as [`WorkerProtocol::release`] (`release.sql`),
    /// with a delay.
    fn snooze(&self, lease: &Lease, delay: Duration) -> impl Future<Output = Result<Task>> + Send;

    /// Makes one settlement on its own, as [`WorkerProtocol::complete`],
    /// [`WorkerProtocol::fail`] or [`WorkerProtocol::snooze`].
    fn settle(&self, settlement: &Settlement) -> impl Future<Output = Result<Task>> + Send;

    /// Settles several owned tasks with one commit for all: each settlement
    /// is still ownership-checked and answered on its own (a lost lease
    /// fails only that one). `Err` means the batch failed as a whole: it
    /// did not commit, or its answer was lost or unreadable, so none of
    /// them is known to have committed (a settlement made again then finds
    /// its task settled and answers a lost lease; the rows are right either
    /// way).
    ///
    /// The completes go in one `complete_batch` statement, each row checked
    /// against its own lease; failures and snoozes run one statement each.
    /// When that makes one statement (the usual case: completes only), it
    /// runs in autocommit, with no transaction around it.
    fn settle_batch(&self, items: &[Settlement])
        -> impl Future<Output = Result<Vec<Result<Settled>>>> + Send;

    /// The recorded steps and sleeps of a task's runs, in run order (the
    /// worker reads them once per run, at its first step).
    fn steps(&self, task_id: &str) -> impl Future<Output = Result<StepHistory>> + Send;

    /// Records the step or sleep at `seq` of the lease's run, named `name`:
    /// a step with its `result`, a sleep ending `sleep` from now. One
    /// statement, fenced to the lease (it holds the task's row shared, so
    /// no recovery of the lease falls inside it);
    /// [`Error::LostLease`](crate::Error::LostLease) when the claim no
    /// longer holds the task. Answers the record and the database's clock.
    #[allow(clippy::too_many_arguments)]
    fn record_step(
        &self,
        lease: &Lease,
        seq: i32,
        name: &str,
        kind: StepKind,
        result: Option<Json>,
        sleep: Duration,
    ) -> impl Future<Output = Result<(StepRecord, i64)>> + Send;

    /// [`WorkerProtocol::record_step`] of a step's `result` inside the
    /// caller's transaction, which holds the step's own writes: the effect
    /// and its record commit together, or neither (a lost lease answers
    /// [`Error::LostLease`](crate::Error::LostLease) and the caller rolls back).
    fn record_step_in(
        &self,
        tx: &mut <Self::Executor as PgExecutor>::Transaction,
        lease: &Lease,
        seq: i32,
        name: &str,
        result: Json,
    ) -> impl Future<Output = Result<(StepRecord, i64)>> + Send;

    /// Begins (or reads again) the wait for `event` at `seq` of the lease's
    /// run, in one transaction under the event's lock: done at once when
    /// the event is kept; otherwise the task is snoozed until `timeout`
    /// from the wait's start (an emit makes it due at once) and the claim
    /// ends. [`Error::LostLease`](crate::Error::LostLease) when the claim no
    /// longer holds the task.
    fn wait_for_event(
        &self,
        lease: &Lease,
        seq: i32,
        event: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<EventWait>> + Send;
}

/// One settlement of [`WorkerProtocol::settle_batch`].
#[derive(Debug, Clone)]
pub enum Settlement {
    /// As [`WorkerProtocol::complete`].
    Complete {
        /// The task's lease.
        lease: Lease,
        /// The handler's result.
        result: Json,
    },
    /// As [`WorkerProtocol::fail`].
    Fail {
        /// The task's lease.
        lease: Lease,
        /// The failure.
        failure: Failure,
    },
    /// As [`WorkerProtocol::snooze`].
    Snooze {
        /// The task's lease.
        lease: Lease,
        /// How long until the task is due again.
        delay: Duration,
    },
}

impl Settlement {
    /// The task this settlement is for.
    pub fn task_id(&self) -> &str {
        self.lease().task_id()
    }

    /// The lease it settles.
    pub fn lease(&self) -> &Lease {
        match self {
            Settlement::Complete { lease, .. }
            | Settlement::Fail { lease, .. }
            | Settlement::Snooze { lease, .. } => lease,
        }
    }
}

/// The longest snooze: a delay past it would overflow the due time's
/// milliseconds in the statement, and no real "not yet" is that long.
pub const MAX_SNOOZE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

pub(crate) mod sealed {
    /// Keeps [`WorkerProtocol`](super::WorkerProtocol) to the store's own
    /// implementation.
    pub trait Sealed {}
}
