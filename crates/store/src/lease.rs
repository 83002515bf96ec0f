//! The lease: what every owned write names.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::task::{Task, TaskStatus};

/// One worker's claim on one running task. Every owned write (heartbeat,
/// progress, settlement, release) takes one, so a task id and a worker id
/// can never be passed in each other's place.
///
/// Every owned write lands only while the row is running, under this
/// worker id, with a live lease: the protocol's ownership test. The worker
/// id is what tells two claims of one task apart: a release or a snooze
/// gives the attempt back, so a later claim can carry the same attempt
/// number, and only a worker id the later claim does not share keeps a
/// write resent after a lost answer off it. waymark's worker therefore
/// claims under an id of its own per claim ([`claim_id`]); a caller that
/// claims through [`WorkerProtocol::claim`](crate::worker_protocol::WorkerProtocol::claim) itself and may
/// resend any owned write (a settlement whose answer was lost) should do
/// the same: under one fixed id, a resent write lands on a later claim of
/// the task by that id.
///
/// ```
/// use waymark_store::Lease;
/// let lease = Lease::new("task_01J0000000000000000000000A", "worker-1/1f");
/// assert_eq!(lease.task_id(), "task_01J0000000000000000000000A");
/// assert_eq!(lease.worker_id(), "worker-1/1f");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    // Shared, not owned: a worker names its id in every lease it holds,
    // and a lease is copied into each write made with it.
    task_id: Arc<str>,
    worker_id: Arc<str>,
    // A task released from the held ledger: its settlement passes its end
    // on to what waits for it, in the same transaction.
    from_held: bool,
}

/// A worker id for one claim: `worker_id`, `/`, and a number no other call
/// of this process gives, from a random 64-bit start per process (so a
/// worker id configured by hand and started again, or twice at once, does
/// not repeat its claims' ids). Claim with it
/// (`ClaimRequest::new(claim_id("worker-1"), ...)`) and every owned write
/// of the claimed tasks' leases is fenced to that claim.
///
/// ```
/// let a = waymark_store::claim_id("worker-1");
/// let b = waymark_store::claim_id("worker-1");
/// assert!(a.starts_with("worker-1/") && b.starts_with("worker-1/"));
/// assert_ne!(a, b);
/// ```
pub fn claim_id(worker_id: &str) -> String {
    static NEXT: std::sync::OnceLock<std::sync::atomic::AtomicU64> = std::sync::OnceLock::new();
    let next = NEXT.get_or_init(|| std::sync::atomic::AtomicU64::new(rand::random::<u64>()));
    let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{worker_id}/{n:x}")
}

impl Lease {
    /// The lease `worker_id` holds on `task_id`.
    pub fn new(task_id: impl Into<String>, worker_id: impl Into<String>) -> Self {
        Lease::shared(Arc::from(task_id.into()), Arc::from(worker_id.into()))
    }

    /// [`Lease::new`] from ids the caller holds shared already (a worker,
    /// whose id every lease it takes names): no copy of either is made.
    pub fn shared(task_id: Arc<str>, worker_id: Arc<str>) -> Self {
        Lease { task_id, worker_id, from_held: false }
    }

    /// Marks the lease's task as released from the held ledger (its
    /// metadata says `waymark_held`, as [`Task::is_from_held`] reads it):
    /// a settlement of it then releases, in its own transaction, the tasks
    /// that waited for it. [`Task::lease`] sets it.
    pub fn from_held(mut self, yes: bool) -> Self {
        self.from_held = yes;
        self
    }

    /// Whether the task was released from the held ledger.
    pub fn is_from_held(&self) -> bool {
        self.from_held
    }

    /// The task.
    pub fn task_id(&self) -> &str {
        &self.task_id
    }

    /// The task id as [`Lease::shared`] took it: a holder that keys tasks
    /// by id shares it rather than copying it.
    pub fn shared_task_id(&self) -> &Arc<str> {
        &self.task_id
    }

    /// The worker id the row holds: the claim's own, for a claim of
    /// waymark's worker.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.task_id.is_empty() {
            return Err(Error::invalid("lease task id must not be empty"));
        }
        if self.worker_id.is_empty() {
            return Err(Error::invalid("lease worker_id must not be empty"));
        }
        Ok(())
    }
}

impl fmt::Display for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} held by {}", self.task_id, self.worker_id)
    }
}

impl Task {
    /// Whether the task was released from waymark's held ledger: its
    /// metadata is an object with `waymark_held: true`.
    pub fn is_from_held(&self) -> bool {
        self.metadata.get("waymark_held") == Some(&serde_json::Value::Bool(true))
    }

    /// The lease of this claim: the task and the worker id it was claimed
    /// under. An
    /// [`Error::InvalidArgument`] for a task that is not running (a row
    /// read before a claim or after a settlement holds no lease).
    pub fn lease(&self) -> Result<Lease> {
        match (&self.status, &self.worker_id) {
            (TaskStatus::Running, Some(worker)) => {
                Ok(Lease::new(self.id.clone(), worker.clone()).from_held(self.is_from_held()))
            }
            (status, _) => {
                Err(Error::invalid(format!("task {} is {status}, not running: it holds no lease", self.id)))
            }
        }
    }
}
