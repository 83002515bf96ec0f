//! The store's error type.

use crate::executor::{ExecError, ExecErrorKind};
use crate::task::{ErrorEnvelope, Task, TaskStatus};

/// Result alias for store operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a store operation can fail with. Domain answers (a lost lease,
/// a key already taken) are variants of their own, never raw SQL errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A keyed submit with `Conflict::Reject` found the key taken.
    #[error("key {key:?} already names task {task_id}")]
    AlreadyExists {
        /// The key.
        key: String,
        /// The task the key names.
        task_id: String,
    },
    /// An owned write found the task no longer held by this worker (settled,
    /// reclaimed, or its lease ran out). The write changed nothing.
    #[error("lease lost on task {task_id} for worker {worker_id:?}")]
    LostLease {
        /// The task.
        task_id: String,
        /// The worker that tried to write.
        worker_id: String,
    },
    /// A row the caller asked for does not exist.
    #[error("{what} not found")]
    NotFound {
        /// What was looked for, such as `task task_01...`.
        what: String,
    },
    /// The connection would see a different installation than intended.
    #[error("schema mismatch: {0}")]
    SchemaMismatch(String),
    /// The installation speaks another protocol version.
    #[error("protocol version mismatch: the database speaks {found}, waymark speaks {expected}")]
    ProtocolVersionMismatch {
        /// The version found (0 when the meta row is missing).
        found: i64,
        /// The version this crate speaks.
        expected: i64,
    },
    /// A lock wait inside `operation` ran past the store's lock timeout (the
    /// key or the rows are held by another transaction). Nothing of the
    /// operation was committed; it is safe to try again.
    #[error(
        "lock timeout in {operation}: another transaction held the lock too long; nothing was committed"
    )]
    LockTimeout {
        /// The operation, such as `submit`.
        operation: &'static str,
    },
    /// A caller passed a bad argument; the message names it.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A migration failed; nothing of it was committed.
    #[error("applying migration {name}: {source}")]
    Migration {
        /// The migration file name.
        name: String,
        /// The cause.
        #[source]
        source: ExecError,
    },
    /// A migration waited past its lock timeout (another session holds the
    /// ledger or a table the file alters) or ran past its statement timeout.
    /// Nothing of it was committed; running `migrate` again resumes there.
    #[error("migration {name} {}; nothing of it was committed", if *.waited_for_lock { format!("waited longer than {limit} for a lock (another migrator, or a session holding a table it alters)") } else { format!("ran longer than the statement timeout of {limit}") })]
    MigrationTimeout {
        /// The migration file name.
        name: String,
        /// True for a lock wait, false for a statement that ran too long.
        waited_for_lock: bool,
        /// The bound that was passed, such as `30000ms`.
        limit: String,
    },
    /// A wait ran out before the task finished. The task goes on; wait
    /// again, or cancel it.
    #[error("task {task_id} did not finish within {waited:?}{}", last_seen(.last))]
    TaskTimeout {
        /// The task (for a `wait_by_key` whose key never named one, `key "..."`).
        task_id: String,
        /// How long the caller waited.
        waited: std::time::Duration,
        /// The task as one full read at the timeout found it, or, if that
        /// read could not run (a saturated pool, a lost connection), as the
        /// wait last read it in full. `None` when the read found no task
        /// (purged, or a key that names none) or no full read ever ran.
        last: Option<Box<Task>>,
    },
    /// [`Store::call`](crate::Store::call): the task ended `failed`.
    #[error("task {task_id} failed: {}", envelope_summary(.error))]
    TaskFailed {
        /// The task.
        task_id: String,
        /// Its error envelope, when it has one.
        error: Option<Box<ErrorEnvelope>>,
    },
    /// [`Store::call`](crate::Store::call): the task ended `canceled`.
    #[error("task {task_id} was canceled")]
    TaskCanceled {
        /// The task.
        task_id: String,
    },
    /// A row did not have the shape the protocol promises.
    #[error("decoding {0}")]
    Decode(String),
    /// The executor failed.
    #[error(transparent)]
    Executor(#[from] ExecError),
    /// A task ended, but its answer (a succeeded task's result, a failed
    /// one's error) is JSON that the store cannot read: written by another
    /// client, legal jsonb that serde_json cannot hold.
    #[error("task {task_id} ended {status}, but its {column} cannot be read here: {reason}")]
    UnreadableAnswer {
        /// The task.
        task_id: String,
        /// How it ended.
        status: TaskStatus,
        /// `result` or `error`.
        column: String,
        /// Why serde_json could not hold it.
        reason: String,
    },
    /// The store was closed ([`Store::close`](crate::Store::close)): it
    /// runs nothing more. The executor it was handed is not closed.
    #[error("the store is closed; open a new one over the executor to go on")]
    StoreClosed,
    /// A submit waited past the backpressure's maximum wait for room in a
    /// queue at its depth limit. Nothing was submitted.
    #[error("queue {queue:?} stayed at its depth limit of {limit} for {waited:?}; nothing was submitted")]
    QueueFull {
        /// The queue.
        queue: String,
        /// Its depth limit.
        limit: i64,
        /// How long the submit waited.
        waited: std::time::Duration,
    },
    /// Something failed that never should (a panic in a background task,
    /// say): a bug, in waymark or in the executor it was handed.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidArgument(message.into())
    }

    /// Whether this is [`Error::LostLease`].
    pub fn is_lost_lease(&self) -> bool {
        matches!(self, Error::LostLease { .. })
    }

    /// Whether this is [`Error::AlreadyExists`].
    pub fn is_already_exists(&self) -> bool {
        matches!(self, Error::AlreadyExists { .. })
    }

    /// Whether this is [`Error::NotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    /// Whether this is [`Error::LockTimeout`].
    pub fn is_lock_timeout(&self) -> bool {
        matches!(self, Error::LockTimeout { .. })
    }

    /// Whether this is [`Error::StoreClosed`].
    pub fn is_store_closed(&self) -> bool {
        matches!(self, Error::StoreClosed)
    }

    /// Whether this is [`Error::QueueFull`].
    pub fn is_queue_full(&self) -> bool {
        matches!(self, Error::QueueFull { .. })
    }

    /// Whether the failure may pass if the same call is made again later:
    /// the executor saturated or its breaker open, a connection lost, a
    /// timeout, the server out of connections, a lock wait past its limit,
    /// or a refusal of the server's that passes with time (read-only as in
    /// a failover, disk full, out of memory, a serialization failure or a
    /// deadlock, a statement cancelled: [`crate::sqlstate_passes`]).
    /// Anything else (bad input, a constraint, a closed store) fails the
    /// same way again.
    pub fn is_transient(&self) -> bool {
        use ExecErrorKind::{Capacity, CircuitOpen, Connection, Saturated, Timeout};
        matches!(self.exec_kind(), Some(Saturated | CircuitOpen | Connection | Timeout | Capacity))
            || self.is_lock_timeout()
            || self.exec_error().is_some_and(ExecError::is_passing_refusal)
    }

    /// The task as a timed-out wait last saw it, for [`Error::TaskTimeout`].
    pub fn last_snapshot(&self) -> Option<&Task> {
        match self {
            Error::TaskTimeout { last, .. } => last.as_deref(),
            _ => None,
        }
    }

    /// Whether this is [`Error::InvalidArgument`].
    pub fn is_invalid_argument(&self) -> bool {
        matches!(self, Error::InvalidArgument(_))
    }

    /// The SQLSTATE of the underlying database error, if any.
    pub fn sqlstate(&self) -> Option<&str> {
        self.exec_error().and_then(ExecError::sqlstate)
    }

    /// The executor's error kind, if the executor failed.
    pub fn exec_kind(&self) -> Option<ExecErrorKind> {
        self.exec_error().map(ExecError::kind)
    }

    /// The class name the cairnq SDKs use for this error (`AlreadyExists`,
    /// `LostLease`, ...), as conformance scenarios name them.
    pub fn class_name(&self) -> &'static str {
        match self {
            Error::AlreadyExists { .. } => "AlreadyExists",
            Error::LostLease { .. } => "LostLease",
            Error::NotFound { .. } => "NotFound",
            Error::SchemaMismatch(_) => "SchemaMismatch",
            Error::ProtocolVersionMismatch { .. } => "ProtocolVersionMismatch",
            Error::InvalidArgument(_) => "InvalidArgument",
            Error::LockTimeout { .. } => "LockTimeout",
            Error::Migration { .. } | Error::MigrationTimeout { .. } => "MigrationError",
            Error::TaskTimeout { .. } => "TaskTimeout",
            Error::TaskFailed { .. } => "TaskFailed",
            Error::TaskCanceled { .. } => "TaskCanceled",
            Error::Decode(_) => "DecodeError",
            Error::Executor(_) => "ExecutorError",
            Error::UnreadableAnswer { .. } => "UnreadableAnswer",
            Error::StoreClosed => "StoreClosed",
            Error::QueueFull { .. } => "QueueFull",
            Error::Internal(_) => "InternalError",
        }
    }

    /// The task this error is about, where there is one.
    pub fn task_id(&self) -> Option<&str> {
        match self {
            Error::AlreadyExists { task_id, .. }
            | Error::LostLease { task_id, .. }
            | Error::TaskTimeout { task_id, .. }
            | Error::TaskFailed { task_id, .. }
            | Error::TaskCanceled { task_id }
            | Error::UnreadableAnswer { task_id, .. } => Some(task_id),
            _ => None,
        }
    }

    pub(crate) fn exec_error(&self) -> Option<&ExecError> {
        match self {
            Error::Executor(e) | Error::Migration { source: e, .. } => Some(e),
            _ => None,
        }
    }
}

fn last_seen(last: &Option<Box<Task>>) -> String {
    match last {
        Some(task) => format!(" (last seen {}); it keeps running", task.status),
        None => String::new(),
    }
}

fn envelope_summary(error: &Option<Box<ErrorEnvelope>>) -> String {
    match error {
        Some(e) if !e.code.is_empty() => format!("{} ({})", e.message, e.code),
        Some(e) => e.message.clone(),
        None => "no error envelope".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: &str) -> Error {
        Error::Executor(ExecError::new(ExecErrorKind::Query, "refused").with_sqlstate(code))
    }

    #[test]
    fn refusals_that_pass_are_transient_and_bad_input_is_not() {
        for code in ["25006", "53100", "53200", "40001", "40P01", "55P03", "57014"] {
            assert!(refused(code).is_transient(), "{code} passes");
        }
        for code in ["23505", "22P05", "42P01", "54000"] {
            assert!(!refused(code).is_transient(), "{code} does not pass");
        }
        assert!(!Error::InvalidArgument("bad".into()).is_transient());
    }
}
