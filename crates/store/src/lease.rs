//! The lease: what every owned write names.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::task::{Task, TaskStatus};

/// One worker's claim on one running task. Every owned write (heartbeat,
/// progress, settlement, release) takes one, so a task id and a worker id
/// can never be passed in each other's place.
///
/// A lease taken from a claimed task ([`Task::lease`]) is fenced to that
/// claim's attempt: a write sent with it lands only while the task is on
/// that attempt, so a write resent after a lost answer, or made by a run
/// that lost its lease, does not touch a later claim of the same task by the
/// same worker. The fence is the attempt number, which a release (attempt
/// given back) or a `retry` with `reset_attempt` can bring back: a later
/// claim at the same number by the same worker id passes it. A lease named
/// by hand with [`Lease::new`] has no fence (the protocol's check: task,
/// worker, live lease). [`Store::heartbeat_batch`](crate::Store::heartbeat_batch),
/// one worker's beat for all it holds, checks no attempt either.
///
/// ```
/// use waymark_store::Lease;
/// let lease = Lease::new("task_01J0000000000000000000000A", "worker-1").on_attempt(2);
/// assert_eq!(lease.task_id(), "task_01J0000000000000000000000A");
/// assert_eq!(lease.attempt(), Some(2));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    // Shared, not owned: a worker names its id in every lease it holds,
    // and a lease is copied into each write made with it.
    task_id: Arc<str>,
    worker_id: Arc<str>,
    attempt: Option<i32>,
}

impl Lease {
    /// The lease `worker_id` holds on `task_id`, not fenced to an attempt.
    pub fn new(task_id: impl Into<String>, worker_id: impl Into<String>) -> Self {
        Lease::shared(Arc::from(task_id.into()), Arc::from(worker_id.into()))
    }

    /// [`Lease::new`] from ids the caller holds shared already (a worker,
    /// whose id every lease it takes names): no copy of either is made.
    pub fn shared(task_id: Arc<str>, worker_id: Arc<str>) -> Self {
        Lease { task_id, worker_id, attempt: None }
    }

    /// Fences the lease to the claim on `attempt`. A claim's attempt is at
    /// least 1; a negative one is refused as an invalid argument by every
    /// write made with the lease.
    pub fn on_attempt(mut self, attempt: i32) -> Self {
        self.attempt = Some(attempt);
        self
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

    /// The worker that holds it.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// The claim's attempt it is fenced to, if any.
    pub fn attempt(&self) -> Option<i32> {
        self.attempt
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.task_id.is_empty() {
            return Err(Error::invalid("lease task id must not be empty"));
        }
        if self.worker_id.is_empty() {
            return Err(Error::invalid("lease worker_id must not be empty"));
        }
        if let Some(n) = self.attempt.filter(|n| *n < 0) {
            return Err(Error::invalid(format!("lease attempt must not be negative, got {n}")));
        }
        Ok(())
    }
}

impl fmt::Display for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} held by {}", self.task_id, self.worker_id)?;
        match self.attempt {
            Some(n) => write!(f, " on attempt {n}"),
            None => Ok(()),
        }
    }
}

impl Task {
    /// The lease of this claim: its worker, fenced to its attempt. An
    /// [`Error::InvalidArgument`] for a task that is not running (a row
    /// read before a claim or after a settlement holds no lease).
    pub fn lease(&self) -> Result<Lease> {
        match (&self.status, &self.worker_id) {
            (TaskStatus::Running, Some(worker)) => {
                Ok(Lease::new(self.id.clone(), worker.clone()).on_attempt(self.attempt))
            }
            (status, _) => {
                Err(Error::invalid(format!("task {} is {status}, not running: it holds no lease", self.id)))
            }
        }
    }
}
