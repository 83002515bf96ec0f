//! What a worker did, published on a broadcast channel for whoever
//! subscribes (tests, metrics, a dashboard). Nothing is built or sent
//! while nobody listens.

use tokio::sync::broadcast;
use waymark_store::TaskStatus;

/// How many events a slow subscriber may fall behind before it misses
/// some (it then gets `RecvError::Lagged` with the count).
const CAPACITY: usize = 4096;

/// One thing a worker did. For one claim of a task (one attempt) the
/// events come in the order it happened; the events of two claims of one
/// task may interleave (a retry due at once can be claimed again before
/// the first run's slot is free), so each carries its attempt.
///
/// A settlement or give-back whose first try committed but whose answer
/// was lost, and whose resend then found the task settled, is reported by
/// no event: the worker cannot tell it from a lease lost meanwhile.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerEvent {
    /// A task was claimed; its run starts when a slot is free (at once,
    /// unless the worker claimed it ahead of its free slots).
    Claimed {
        /// The task.
        task_id: String,
        /// Its handler name.
        name: String,
        /// The claim's attempt, from 1.
        attempt: i32,
    },
    /// A settlement committed: the worker's own (from the handler's
    /// answer) or the handler's `complete_in`.
    Settled {
        /// The task.
        task_id: String,
        /// The claim's attempt.
        attempt: i32,
        /// What the row became: `succeeded`, `failed`, `canceled`, or
        /// `queued` for a retry.
        status: TaskStatus,
    },
    /// The worker no longer holds the task's lease (it ran out, or another
    /// worker took the task): its run's later writes are refused.
    LeaseLost {
        /// The task.
        task_id: String,
        /// The claim's attempt.
        attempt: i32,
    },
    /// The worker gave the task back unspent (`queued`), or ended it
    /// `canceled` on a cancel request: at shutdown, or a task claimed ahead
    /// that waited too long for a slot and never ran.
    GivenBack {
        /// The task.
        task_id: String,
        /// The claim's attempt (the row's is one less: it was not spent).
        attempt: i32,
        /// What the row became.
        status: TaskStatus,
    },
    /// The worker stopped: its runs ended, what was unfinished is given
    /// back, its last settlements are flushed, and
    /// [`Worker::run`](crate::Worker::run) returns.
    Stopped,
}

/// The sending side, shared by the worker's tasks.
#[derive(Debug, Clone)]
pub(crate) struct Events(broadcast::Sender<WorkerEvent>);

impl Default for Events {
    fn default() -> Self {
        Events(broadcast::channel(CAPACITY).0)
    }
}

impl Events {
    /// Sends the event `make` builds, if anyone is subscribed.
    pub(crate) fn emit(&self, make: impl FnOnce() -> WorkerEvent) {
        if self.0.receiver_count() > 0 {
            // A subscriber that left since the count is no error.
            let _ = self.0.send(make());
        }
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<WorkerEvent> {
        self.0.subscribe()
    }
}
