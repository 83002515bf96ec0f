//! waymark's built-in [`PgExecutor`](waymark_store::PgExecutor): a bb8 pool
//! of tokio-postgres connections that sheds load, fails fast and recovers.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use waymark_pool::PgPool;
//! use waymark_store::{ConnectOptions, Store};
//!
//! let pool = PgPool::builder("postgres://postgres@127.0.0.1/app")
//!     .max_size(8)
//!     .acquire_timeout(Duration::from_secs(2))
//!     .build()?; // does not connect
//! let store = Store::connect(pool.clone(), ConnectOptions::default()).await?;
//! println!("{:?}", pool.stats());
//! # let _ = store; Ok(()) }
//! ```
//!
//! Around bb8:
//!
//! - **Admission lanes.** At most `max_size` calls hold a connection; others
//!   wait in two lanes. Critical work (heartbeats, settlements) goes first
//!   but passes at most one waiting ordinary call in a row.
//! - **Bounded waiting.** Past `max_waiting` waiters, or after the acquire
//!   timeout, a call fails at once with kind `Saturated`.
//! - **Circuit breaker.** Consecutive connection failures open it; while open
//!   calls fail in microseconds with kind `CircuitOpen` and the last cause;
//!   one half-open trial closes it again.
//! - **Retries** with jittered exponential backoff, only where safe: a
//!   connection failure before anything was sent (connect, `BEGIN`) always; a
//!   failure after sending, or 40001/40P01/55P03/25006, only for statements
//!   the store marks repeatable (reads, heartbeats, progress, `insert_task`
//!   and the batched inserts, whose client-made ids turn a duplicate into
//!   the same tasks). Statements inside a transaction are never retried.
//! - **Errors by class.** SQLSTATE 08*, 57P01-57P03 and I/O failures are
//!   `Connection` (the connection is dropped, never reused); 53300 and "too
//!   many clients" are `Capacity` (never open the breaker); the rest surface
//!   as `Query`, their SQLSTATE kept. Of those, the refusals that pass with
//!   time (25006 read-only as in a failover, 53100 disk full, 53200 out of
//!   memory, 40001, 40P01, 55P03, 57014 cancelled) are
//!   `waymark_store::Error::is_transient`; a session that found the server
//!   read-only (25006) is dropped, so the next call may reach the new
//!   primary.
//! - **Client-side query timeout**: the server is asked to cancel and the
//!   connection is dropped.
//! - **Stats** ([`PgPool::stats`]): acquires, wait percentiles, rejections,
//!   errors by class, retries, peaks, breaker state.
//!
//! Statements are bound with `query_typed`: one round trip, the parameter
//! types declared by the protocol, and no server-side prepared statement, so
//! a pooler in transaction mode is safe.

mod admission;
mod breaker;
pub mod codec;
mod config;
mod conninfo;
mod error;
mod executor;
mod listen;
mod manager;
mod pool;
mod query;
mod refusal;
mod stats;
mod tls;
mod transaction;

pub use breaker::BreakerState;
pub use config::{PgPoolBuilder, MAX_POOL_SIZE};
pub use error::PoolError;
pub use pool::PgPool;
pub use stats::PoolStats;
pub use tls::SslMode;
pub use transaction::PoolTransaction;
