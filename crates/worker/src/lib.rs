//! waymark's worker: typed handlers over any [`PgExecutor`], with lease
//! renewal, cancellation, settlement once per task and graceful shutdown.
//! It speaks cairnq protocol v1, so it shares queues with cairnq's Python
//! and TypeScript workers.
//!
//! ```no_run
//! # async fn demo(store: waymark_store::Store<waymark_pool::PgPool>) -> Result<(), Box<dyn std::error::Error>> {
//! use serde::{Deserialize, Serialize};
//! use waymark_worker::{TaskError, Worker};
//!
//! #[derive(Deserialize)]
//! struct Email { to: String }
//! #[derive(Serialize)]
//! struct Sent { id: String }
//!
//! let worker = Worker::builder(store)
//!     .queues(["mail"])
//!     .concurrency(16)
//!     .task("email.send", |ctx, email: Email| async move {
//!         if email.to.is_empty() {
//!             return Err(TaskError::permanent("no recipient"));
//!         }
//!         Ok(Sent { id: format!("{}-{}", ctx.id(), ctx.attempt()) })
//!     })
//!     .build()?;
//! let handle = worker.handle();
//! tokio::spawn(async move {
//!     let _ = tokio::signal::ctrl_c().await;
//!     handle.shutdown();
//! });
//! worker.run().await; // returns after a graceful shutdown
//! # Ok(()) }
//! ```
//!
//! # The guarantee
//!
//! Delivery is **at least once**: a task whose worker dies is run again
//! after its lease runs out. Settlement is **exactly once**: the worker
//! writes one settlement per claim, every settlement is checked against the
//! lease (`status = running`, this worker, lease not expired), and a run
//! that lost its lease writes nothing more. So a handler that has effects
//! outside the database should be idempotent; one whose effects are rows in
//! the same database can use [`TaskContext::complete_in`] to commit them
//! with the settlement, exactly once.
//!
//! # How a run ends
//!
//! | the handler | the task |
//! | --- | --- |
//! | returns `Ok(result)` | `succeeded` with the result (`canceled` if a cancel was requested) |
//! | returns `Err(TaskError)` | retried after the protocol's backoff if retryable with attempts left, else `failed`; code `task_error` unless set |
//! | panics | caught; retryable failure `handler_error`; the worker lives on |
//! | runs past `max_run_time` | stopped; retryable failure `handler_timeout` |
//! | gets a payload that does not fit its type | `failed` for good, type `InvalidPayload` |
//! | returns a result that does not serialise | `failed` for good, `unserializable_result` |
//! | (no handler for the name) | `failed` for good, `no_handler` |
//!
//! # Handlers and limits
//!
//! [`WorkerBuilder::task`] registers an async handler, under a name or a
//! [`TaskDef`](waymark_store::TaskDef) (whose types the handler must have);
//! [`WorkerBuilder::blocking_task`] a synchronous one, run on tokio's
//! blocking threads; [`WorkerBuilder::batch_task`] one that takes up to N
//! tasks a call and answers a result per task id (or one error for all,
//! or settles some itself with [`TaskContext::complete`] and
//! [`TaskContext::fail`]). The `_with` forms take [`HandlerOptions`]: a
//! resource declared with [`WorkerBuilder::resource`] (shared by every
//! handler naming it) and a `max_running` of the handler's own. The claim
//! respects both: it never takes a task whose call could not start.
//!
//! ```no_run
//! # async fn demo(store: waymark_store::Store<waymark_pool::PgPool>) -> Result<(), Box<dyn std::error::Error>> {
//! use std::collections::HashMap;
//! use waymark_worker::{BatchItem, HandlerOptions, Worker};
//!
//! let worker = Worker::builder(store)
//!     .resource("gpu", 1)
//!     .task_with("render", HandlerOptions::new().resource("gpu"), |_ctx, scene: String| async move {
//!         Ok(format!("rendered {scene}"))
//!     })
//!     .batch_task("embed", 64, |items: Vec<BatchItem<_, String>>| async move {
//!         Ok(items.iter().map(|i| (i.ctx.id().to_owned(), i.payload.len())).collect::<HashMap<_, _>>())
//!     })
//!     .blocking_task("resize", |_ctx, width: u32| Ok(width / 2))
//!     .build()?;
//! worker.serve().await?; // until SIGINT or SIGTERM; a second one stops at once
//! # Ok(()) }
//! ```
//!
//! # Shutdown
//!
//! [`WorkerHandle::shutdown`] stops claiming at once, lets running handlers
//! finish within the grace period (default 10 s), then fires their tokens
//! with [`CancelReason::Shutdown`], stops them, and gives their tasks back:
//! queued and due now, the attempt not spent, so another worker takes them
//! at once. A handler that answers its token (with `Ok` or `Err`) has its
//! task given back too, never failed or succeeded; one stuck in blocking
//! code cannot hold `run()`, which gives the others back and returns within
//! the grace plus about three seconds; the stuck run's task is left to its
//! lease (no longer renewed), so no other worker starts it before the lease
//! runs out. Work a handler hands to `spawn_blocking` itself keeps running
//! after the handler is dropped, out of the worker's sight: have it check
//! the token's reason, or finish within the grace; a
//! [`WorkerBuilder::blocking_task`] closure is watched instead, and a task
//! whose closure still runs is left to its lease. [`WorkerHandle::stop_now`]
//! skips the grace; [`Worker::serve`] maps SIGINT and SIGTERM to shutdown
//! and a second signal to `stop_now`.

mod call;
mod claim;
mod settle;
mod shared;
mod worker;

pub use call::{BatchItem, TaskContext};
pub use shared::{CancelReason, HandlerOptions, TaskError, WorkerError, WorkerEvent};
pub use worker::{TaskName, Worker, WorkerBuilder, WorkerHandle};

#[doc(no_inline)]
pub use waymark_store::{FleetLimit, GroupKey, PgExecutor};
