//! Periodic tasks for waymark: a [`Scheduler`] submits a task on every slot
//! of each [`Periodic`] schedule, a cron expression with seconds in a time
//! zone or a fixed interval ([`Every`]).
//!
//! However many schedulers run the same schedules, each slot gets one task
//! and no leader is needed: a slot's task is a keyed submit whose key names
//! the schedule and the slot (`schedule:<id>:<slot in RFC 3339, UTC>`), with
//! [`waymark_store::Conflict::Reject`], so the first insert wins and the
//! rest find the key taken. Slots are read off the database's clock, so
//! hosts whose clocks disagree still fire the same slot at the same time.
//!
//! A cron expression is read in its time zone, and across a clock change
//! follows Vixie cron's convention: an expression whose hour field is `*`
//! (it fires every hour, or more often) follows instants, its slots evenly
//! spaced (both passes of a repeated hour have them, a skipped hour has
//! none); any other expression names wall-clock times, and a time that
//! falls twice fires once, at its first occurrence, while a time the
//! change skips fires once as the gap ends. See [`Every::cron`].
//!
//! A scheduler that starts late, or that could not submit for a while,
//! catches up by its schedule's [`CatchUp`] policy: skip what was missed,
//! or submit the newest `n` missed slots. A failed submit keeps its slot
//! (within that policy) whatever the failure, the database away, read-only
//! (a failover), out of space, the queue full, ...; only bad input that
//! can never be submitted (a task the store refuses, data the server
//! refuses) drops the slot, logged as an error. Skipped slots are counted
//! and logged once per pass, however many. Each schedule runs on its own,
//! so one whose queue is full, or whose submits fail, holds up no other. A
//! slot whose task is still in the table is never submitted again; one
//! whose task was purged could be, if it falls within the catch-up bound,
//! so keep retention longer than `n` slots. A changed schedule (a new
//! expression under the same id) keeps every slot it shares with the old
//! one under the same key.
//!
//! The tasks are ordinary cairnq v1 rows (the key in `cairnq_task_keys`,
//! the schedule and slot in the metadata): a cairnq worker runs them as
//! any other.
//!
//! ```no_run
//! # async fn demo<E: waymark_store::PgExecutor + 'static>(
//! #     store: std::sync::Arc<waymark_store::Store<E>>,
//! #     stop: tokio::sync::oneshot::Receiver<()>,
//! # ) -> waymark_store::Result<()> {
//! use waymark_schedule::{CatchUp, Every, Periodic, Scheduler};
//! use waymark_store::NewTask;
//!
//! let nightly = Periodic::new(
//!     "nightly-report",
//!     Every::cron("0 30 2 * * *", "Europe/Paris")?,
//!     NewTask::new("report.build", serde_json::json!({"kind": "daily"})).queue("reports"),
//! )
//! .catch_up(CatchUp::Missed(1));
//! let heartbeat = Periodic::new(
//!     "ping",
//!     Every::interval(std::time::Duration::from_secs(30))?,
//!     NewTask::new("ping", serde_json::json!({})),
//! )
//! .catch_up(CatchUp::Skip);
//! // Runs until `stop` fires (a shutdown signal, say).
//! Scheduler::new(store).schedule(nightly).schedule(heartbeat).run_until(async {
//!     let _ = stop.await;
//! }).await
//! # }
//! ```

#[cfg(test)]
mod dst_tests;
mod every;
mod periodic;
mod scheduler;
mod slots;
mod zoned;

pub use every::Every;
pub use periodic::{CatchUp, Fired, Periodic, MAX_CATCH_UP, SCHEDULE_KEY, SLOT_KEY};
pub use scheduler::Scheduler;
