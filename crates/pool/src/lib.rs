//! waymark's built-in [`PgExecutor`](waymark_store::PgExecutor): a bb8 pool of tokio-postgres
//! connections.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use waymark_pool::PgPool;
//! use waymark_store::{ConnectOptions, Store};
//!
//! let pool = PgPool::builder("postgres://postgres@127.0.0.1/app").max_size(8).build()?;
//! let store = Store::connect(pool, ConnectOptions::default()).await?;
//! # let _ = store; Ok(()) }
//! ```
//!
//! Statements are bound with `query_typed`: one round trip, the parameter
//! types declared by the protocol, and no server-side prepared statement, so
//! a pooler in transaction mode is safe.
//!
//! This is the first cut; admission lanes, bounded waiting, the circuit
//! breaker, retries, stats and TLS come with the robust pool.

pub mod codec;
mod pool;
mod transaction;

pub use pool::{PgPool, PgPoolBuilder, PoolError, MAX_POOL_SIZE};
pub use transaction::PoolTransaction;

// Compiles the README's example as a doc test, so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
