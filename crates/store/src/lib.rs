//! Every queue operation of cairnq protocol v1 over a small [`PgExecutor`]
//! trait that you can implement on the pool you already run.
//!
//! A task submitted here can be run by a cairnq Python or TypeScript worker,
//! and the reverse: the tables and the state machine are the protocol's.
//!
//! ```no_run
//! # async fn demo<E: waymark_store::PgExecutor>(exec: E) -> waymark_store::Result<()> {
//! use serde_json::json;
//! use waymark_store::worker_protocol::WorkerProtocol;
//! use waymark_store::{ClaimRequest, ConnectOptions, NewTask, Store};
//!
//! let store = Store::connect(exec, ConnectOptions::new()).await?;
//! let task = store.submit(NewTask::new("email.send", json!({"to": "ada@example.com"}))).await?;
//!
//! // A worker id of its own per claim fences every write to its claim.
//! let claim = ClaimRequest::new(waymark_store::claim_id("worker-1"), ["default"]).limit(10);
//! for claimed in store.claim(&claim).await? {
//!     store.complete(&claimed.lease()?, json!({"sent": true})).await?;
//! }
//! assert!(store.fetch(&task.id).await?.status.is_terminal());
//! # Ok(()) }
//! ```
//!
//! The API comes in two parts. [`Store`]'s own methods are the
//! application's: submit, read, list, wait, call, watch, cancel, retry,
//! purge, sweep, each write with an `*_in` twin that runs inside your
//! transaction. The worker's operations (claim, heartbeats, progress,
//! settlements) are [`worker_protocol::WorkerProtocol`]'s, which
//! `waymark-worker` calls for you; bring the trait in with a `use` to claim
//! by hand, as above. Every setting is a [`ConnectOptions`] builder that
//! [`Store::connect`] takes.
//!
//! Submitting inside your own transaction is why a Postgres queue exists:
//! [`Store::submit_in`] takes your [`PgExecutor::Transaction`], and the task
//! exists only if your transaction commits.
//! [`WorkerProtocol::complete_in`](worker_protocol::WorkerProtocol::complete_in)
//! does the same for a task's settlement (a handler reaches it through
//! `TaskContext::complete_in`).

/// Builder setters: each `vis fn name(arg: Type) => field = value;`, with
/// its doc comment, is the method `vis fn name(mut self, arg: Type) -> Self`
/// that sets `field` to `value` and returns the builder.
macro_rules! setters {
    ($($(#[$attr:meta])* $vis:vis fn $name:ident($arg:ident: $ty:ty) => $field:ident = $value:expr;)*) => {$(
        $(#[$attr])*
        $vis fn $name(mut self, $arg: $ty) -> Self {
            self.$field = $value;
            self
        }
    )*};
}

mod backoff;
mod backpressure;
mod cells;
mod closing;
mod definition;
mod error;
mod executor;
mod fleet;
mod held;
mod held_view;
mod id;
mod lease;
mod migrate;
mod new_task;
mod observe;
mod options;
mod retention;
mod rows;
mod settings;
mod signals;
mod statements;
mod steps;
mod store;
mod task;
mod value;
mod wait;
pub mod worker_protocol;

pub use backoff::RetryBackoff;
pub use backpressure::{Backpressure, DEFAULT_MAX_QUEUE_WAIT, MAX_GRANT};
pub use definition::TaskDef;
pub use error::{Error, Result};
pub use executor::{
    sqlstate_passes, ExecError, ExecErrorKind, Lane, ListenEvent, Notification, NotificationStream,
    PgExecutor, PgSession, PgTransaction, Sql,
};
pub use fleet::{FleetLimit, GroupKey, FLEET_LIMIT_TURN_WAIT};
pub use held::{Flow, Held, OnDeadline};
pub use held_view::{HeldFilter, HeldReceipt, HeldState, HeldSweep, HeldTask};
pub use id::{new_task_id, task_id_from_parts};
pub use lease::{claim_id, Lease};
pub use migrate::{MigrationReport, MigrationState};
pub use new_task::{Conflict, NewTask};
pub use observe::{Observer, RunEnd, RunScope, Scope};
pub use options::{ClaimRequest, Failure, ListFilter, PurgeFilter};
pub use retention::{Retention, RetentionRule, SweepHook, Sweeper};
pub use settings::{
    ConnectOptions, DEFAULT_LOCK_TIMEOUT, DEFAULT_MIGRATION_LOCK_TIMEOUT, DEFAULT_MIGRATION_STATEMENT_TIMEOUT,
};
pub use signals::Signal;
pub use steps::{EventWait, StepHistory, StepKind, StepRecord};
pub use store::{Store, EVENT_RETENTION};
pub use task::{
    codes, Beat, ErrorEnvelope, Renewal, Settled, StatusCounts, Task, TaskState, TaskStatus, Unreadable,
};
pub use value::{Row, Value};
pub use wait::Watch;
/// The protocol crate, re-exported for executors that need parameter types.
pub use waymark_protocol as protocol;
pub use worker_protocol::{Settlement, MAX_SNOOZE};
