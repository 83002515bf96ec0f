//! Testing code built on waymark, on a real PostgreSQL.
//!
//! - [`TestSchema`]: a fresh schema per test on the server `DATABASE_URL`
//!   names, so tests run side by side without seeing each other's tasks.
//! - [`run_until_idle`]: runs a worker until its queues hold nothing due and
//!   nothing running, then shuts it down and says what it settled.
//! - [`require_submitted`], [`submitted`]: what a piece of code submitted,
//!   by name and a part of the payload.
//! - [`eventually`], [`until_some`]: wait on what can be observed, not on
//!   a fixed time.
//! - [`kit`] and [`store_contract!`]: the store's whole contract as test
//!   cases for any executor, the ones waymark's own executors pass.
//!
//! ```no_run
//! # async fn demo() {
//! use serde_json::json;
//! use waymark_store::NewTask;
//! use waymark_testing::{require_submitted, run_until_idle, TestSchema};
//! use waymark_worker::Worker;
//!
//! let schema = TestSchema::new().await;
//! let store = std::sync::Arc::new(schema.pool_store().await);
//! store.submit(NewTask::new("email", json!({"to": "a@example.com"}))).await.unwrap();
//! let sent = require_submitted(&store, "email", json!({"to": "a@example.com"})).await;
//! let worker = Worker::builder(store.clone())
//!     .task("email", |_ctx, _p: serde_json::Value| async move { Ok(json!("sent")) })
//!     .build()
//!     .unwrap();
//! let report = run_until_idle(worker, std::time::Duration::from_secs(10)).await.unwrap();
//! assert_eq!(report.settled, 1);
//! assert_eq!(store.fetch(&sent.id).await.unwrap().result, Some(json!("sent")));
//! schema.drop().await;
//! # }
//! ```

mod idle;
pub mod kit;
pub mod schema;
mod submitted;
mod wait;

pub use idle::{run_until_idle, IdleReport, NotIdle};
pub use schema::TestSchema;
pub use submitted::{require_submitted, submitted};
pub use wait::{eventually, until_some};
