//! Typed rows: tasks, statuses, the error envelope, and what the
//! worker's operations answer. Plain data: reading them from a row is
//! `rows` and `cells`.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

/// The five statuses of protocol v1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    /// Waiting to be claimed (possibly not yet due).
    Queued,
    /// Claimed by a worker that holds a lease.
    Running,
    /// Finished with a result.
    Succeeded,
    /// Finished with an error, no attempts left or not retryable.
    Failed,
    /// Canceled before or while running.
    Canceled,
}

impl TaskStatus {
    /// Every status, in protocol order.
    pub const ALL: [TaskStatus; 5] = [
        TaskStatus::Queued,
        TaskStatus::Running,
        TaskStatus::Succeeded,
        TaskStatus::Failed,
        TaskStatus::Canceled,
    ];

    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Queued => "queued",
            TaskStatus::Running => "running",
            TaskStatus::Succeeded => "succeeded",
            TaskStatus::Failed => "failed",
            TaskStatus::Canceled => "canceled",
        }
    }

    /// Whether the task has finished (succeeded, failed or canceled).
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskStatus::Succeeded | TaskStatus::Failed | TaskStatus::Canceled)
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A task row. Field names are the table's column names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// `task_` + ULID.
    pub id: String,
    /// The handler name.
    pub name: String,
    /// The queue.
    pub queue: String,
    /// Where the task is in its life.
    pub status: TaskStatus,
    /// The input.
    pub payload: Json,
    /// The handler's result, once succeeded.
    pub result: Option<Json>,
    /// The error envelope of the last failure (see [`ErrorEnvelope`]).
    pub error: Option<Json>,
    /// Free-form metadata: any JSON value, an object by convention.
    pub metadata: Json,
    /// Progress in `[0, 1]`, as the handler last reported it.
    pub progress: Option<f64>,
    /// A message the handler last reported.
    pub message: Option<String>,
    /// Runs started so far (incremented by each claim).
    pub attempt: i32,
    /// Runs allowed.
    pub max_attempts: i32,
    /// Higher is claimed first.
    pub priority: i32,
    /// The worker running it (kept on terminal rows).
    pub worker_id: Option<String>,
    /// Lease deadline, epoch ms; set exactly while running.
    pub lease_until_ms: Option<i64>,
    /// When the task is due, epoch ms.
    pub run_at_ms: i64,
    /// When a cancel was requested while it ran, epoch ms.
    pub cancel_requested_at_ms: Option<i64>,
    /// The task that submitted this one.
    pub parent_id: Option<String>,
    /// The top of this task's tree (its own id for a top-level task).
    pub root_id: Option<String>,
    /// A caller-chosen id tying related tasks together.
    pub correlation_id: Option<String>,
    /// Insert time, epoch ms (database clock).
    pub created_at_ms: i64,
    /// Last write, epoch ms.
    pub updated_at_ms: i64,
    /// When it became terminal, epoch ms.
    pub completed_at_ms: Option<i64>,
    /// The JSON columns of the row that could not be read: legal jsonb
    /// that serde_json cannot hold (a number past f64's range such as
    /// `1e400`, nesting deeper than 128), which another SDK or plain SQL
    /// may have written. Each such field reads as `null` here; the database
    /// keeps the value as written. A claim never hands out a task whose
    /// payload or metadata is unreadable: it fails it for good (see
    /// [`WorkerProtocol::claim`](crate::worker_protocol::WorkerProtocol::claim)).
    /// [`Store::call`](crate::Store::call)
    /// answers [`Error::UnreadableAnswer`](crate::Error::UnreadableAnswer)
    /// for a result or an error it cannot read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<Unreadable>,
}

/// One JSON column of a row that could not be read ([`Task::unreadable`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unreadable {
    /// The column: `payload`, `result`, `error` or `metadata`.
    pub column: String,
    /// Why serde_json could not hold it.
    pub reason: String,
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "column {}: {}", self.column, self.reason)
    }
}

impl Task {
    /// The stored error as an envelope, when there is one. An error that
    /// is not shaped as an envelope (a plain string, a `code` that is a
    /// number), as another client or plain SQL may write it, is kept
    /// rather than dropped: its text is the message, the value itself the
    /// details, and the type and code are empty.
    pub fn error_envelope(&self) -> Option<ErrorEnvelope> {
        let error = self.error.as_ref()?;
        Some(serde_json::from_value(error.clone()).unwrap_or_else(|_| ErrorEnvelope {
            kind: String::new(),
            code: String::new(),
            message: match error {
                Json::String(s) => s.clone(),
                other => other.to_string(),
            },
            retryable: false,
            details: error.clone(),
        }))
    }

    /// Whether a handler could not see this task as it was submitted: its
    /// payload or metadata cannot be read.
    pub fn input_unreadable(&self) -> bool {
        self.unreadable.iter().any(|u| u.column == "payload" || u.column == "metadata")
    }

    /// Why one column could not be read, if it could not.
    pub fn unreadable_column(&self, column: &str) -> Option<&Unreadable> {
        self.unreadable.iter().find(|u| u.column == column)
    }
}

/// The wait probe's answer: a task's id and status only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskState {
    /// The task.
    pub id: String,
    /// Its status.
    pub status: TaskStatus,
}

/// One lease renewed by `heartbeat_batch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beat {
    /// The task, still owned by the worker.
    pub id: String,
    /// Set when someone asked for the task to stop.
    pub cancel_requested_at_ms: Option<i64>,
}

/// What [`WorkerProtocol::renew_leases`](crate::worker_protocol::WorkerProtocol::renew_leases) found: the
/// leases it extended, and those of rows another transaction kept locked
/// past its wait. Every id asked for that is in neither has lost its lease.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renewal {
    /// Still owned, lease extended.
    pub renewed: Vec<Beat>,
    /// Owned when the renewal began, but its row stayed locked by another
    /// transaction (a settlement or progress write in flight, a handler's
    /// transaction, an operator's update), or renewing it failed or was not
    /// tried after another failed, so the lease was not extended this time.
    /// It may have been settled or lost since; the next renewal tells.
    /// Renew it again soon.
    pub held: Vec<Beat>,
}

/// One settlement's answer from
/// [`WorkerProtocol::settle_batch`](crate::worker_protocol::WorkerProtocol::settle_batch):
/// the task and the status it settled in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settled {
    /// The task.
    pub id: String,
    /// Its status after the settlement (`Succeeded`, `Canceled`, `Failed`,
    /// or `Queued` for a retry).
    pub status: TaskStatus,
}

impl From<&Task> for Settled {
    fn from(t: &Task) -> Self {
        Settled { id: t.id.clone(), status: t.status }
    }
}

/// Task counts of one queue, by status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusCounts {
    /// Queued tasks (delayed ones included).
    pub queued: i64,
    /// Running tasks.
    pub running: i64,
    /// Succeeded tasks.
    pub succeeded: i64,
    /// Failed tasks.
    pub failed: i64,
    /// Canceled tasks.
    pub canceled: i64,
}

impl StatusCounts {
    /// The count for `status`.
    pub fn get(&self, status: TaskStatus) -> i64 {
        match status {
            TaskStatus::Queued => self.queued,
            TaskStatus::Running => self.running,
            TaskStatus::Succeeded => self.succeeded,
            TaskStatus::Failed => self.failed,
            TaskStatus::Canceled => self.canceled,
        }
    }

    pub(crate) fn add(&mut self, status: TaskStatus, n: i64) {
        let slot = match status {
            TaskStatus::Queued => &mut self.queued,
            TaskStatus::Running => &mut self.running,
            TaskStatus::Succeeded => &mut self.succeeded,
            TaskStatus::Failed => &mut self.failed,
            TaskStatus::Canceled => &mut self.canceled,
        };
        *slot += n;
    }
}

/// Error codes of the protocol's envelope.
pub mod codes {
    /// The handler raised an error (retryable).
    pub const HANDLER_ERROR: &str = "handler_error";
    /// The handler raised a task error (retryable unless it says otherwise).
    pub const TASK_ERROR: &str = "task_error";
    /// No handler is registered for the task's name (permanent).
    pub const NO_HANDLER: &str = "no_handler";
    /// The handler ran past its time limit (retryable).
    pub const HANDLER_TIMEOUT: &str = "handler_timeout";
    /// The result could not be serialised (permanent).
    pub const UNSERIALIZABLE_RESULT: &str = "unserializable_result";
    /// The lease expired with no attempts left (permanent).
    pub const LEASE_EXPIRED: &str = "lease_expired";
}

/// The error envelope stored in `error`: `{type, code, message, retryable, details}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorEnvelope {
    /// The error's class name, such as `LeaseExpired`.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// One of [`codes`], or a handler's own code.
    #[serde(default)]
    pub code: String,
    /// Human-readable message.
    #[serde(default)]
    pub message: String,
    /// Whether another attempt may succeed.
    #[serde(default)]
    pub retryable: bool,
    /// Anything else.
    #[serde(default)]
    pub details: Json,
}

impl ErrorEnvelope {
    /// An envelope with empty details.
    pub fn new(
        kind: impl Into<String>,
        code: impl Into<String>,
        message: impl Into<String>,
        retryable: bool,
    ) -> Self {
        ErrorEnvelope {
            kind: kind.into(),
            code: code.into(),
            message: message.into(),
            retryable,
            details: Json::Object(Default::default()),
        }
    }

    /// The envelope recover_leases writes when a lease expires on the last attempt.
    pub fn lease_expired() -> Self {
        ErrorEnvelope::new(
            "LeaseExpired",
            codes::LEASE_EXPIRED,
            "task lease expired and max attempts reached",
            false,
        )
    }

    /// As JSON, for the `error` column.
    pub fn to_json(&self) -> Json {
        serde_json::to_value(self).unwrap_or(Json::Null)
    }
}
