//! waymark: a durable task queue for Rust on PostgreSQL.
//!
//! This is the crate most users add. It re-exports the store, the built-in
//! pool and the worker, and gives [`connect`] for the common case: one URL,
//! the built-in pool, migrations applied.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use serde_json::json;
//! use waymark::{NewTask, TaskError, Worker};
//!
//! let store = waymark::connect("postgres://postgres@127.0.0.1/app").await?;
//! let worker = Worker::builder(store.clone())
//!     .task("add", |_ctx, p: serde_json::Value| async move {
//!         let sum = p["a"].as_i64().ok_or(TaskError::permanent("a is missing"))? + 1;
//!         Ok(json!({ "sum": sum }))
//!     })
//!     .build()?;
//! let handle = worker.handle();
//! tokio::spawn(worker.run());
//!
//! let done = store.call(NewTask::new("add", json!({"a": 41})), Duration::from_secs(10)).await?;
//! assert_eq!(done.result, Some(json!({"sum": 42})));
//! handle.shutdown();
//! # Ok(()) }
//! ```
//!
//! The layers, for users who need only some: `waymark-store` (every queue
//! operation over the `PgExecutor` trait, for your own pool),
//! `waymark-pool` (the built-in bb8 executor), `waymark-worker` (handlers,
//! leases, settlement), `waymark-notify` (LISTEN hubs).

pub use waymark_pool::{PgPool, PgPoolBuilder, PoolError, PoolStats, SslMode};
pub use waymark_store::*;
pub use waymark_worker::{
    CancelReason, TaskContext, TaskError, Worker, WorkerBuilder, WorkerError, WorkerHandle,
};

/// Why [`connect`] failed.
#[derive(Debug)]
pub enum ConnectError {
    /// The URL or a pool setting was refused.
    Pool(PoolError),
    /// Connecting, the schema guard, migrating or the version check failed.
    Store(Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Pool(e) => write!(f, "{e}"),
            ConnectError::Store(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConnectError::Pool(e) => Some(e),
            ConnectError::Store(e) => Some(e),
        }
    }
}

/// A store on the built-in pool for `url`, connected in protocol v1's
/// order (schema guard, migrations, version check, then LISTEN in the
/// background). For settings (pool size, TLS, a schema), build a
/// [`PgPool`] and call [`Store::connect`] instead.
pub async fn connect(url: &str) -> Result<Store<PgPool>, ConnectError> {
    let pool = PgPool::builder(url).build().map_err(ConnectError::Pool)?;
    Store::connect(pool, ConnectOptions::default()).await.map_err(ConnectError::Store)
}

// Compiles the README's examples as doc tests, so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

// And docs/flows.md's.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/flows.md")]
pub struct FlowsDoctests;
