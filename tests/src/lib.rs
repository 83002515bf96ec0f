//! Test support for waymark's workspace integration tests: a real PostgreSQL
//! (found or started), a place of its own per test, a second executor that
//! proves the seam is open, the executor conformance kit, and the runner for
//! cairnq's shared scenarios.

pub mod client_executor;
pub mod cluster;
pub mod conformance;
pub mod db;
pub mod fault_executor;

pub mod pgbouncer;
pub mod plans;
pub mod private_cluster;
pub mod proxy;
pub mod python;
pub mod wait_kit;

use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, Store};

pub use client_executor::ClientExecutor;
pub use db::{TestDatabase, TestSchema};

/// A store on the built-in pool, connected (migrated) in `schema`.
pub async fn pool_store(schema: &TestSchema) -> Store<PgPool> {
    let pool = PgPool::builder(&schema.url).max_size(4).schema(&schema.schema).build().expect("pool");
    connect_in(pool, schema).await
}

/// A store over `exec`, connected (migrated) in `schema`.
pub async fn connect_in<E: waymark_store::PgExecutor>(exec: E, schema: &TestSchema) -> Store<E> {
    Store::connect(exec, ConnectOptions::schema(&schema.schema)).await.expect("connect")
}

/// A store on [`ClientExecutor`], connected (migrated) in `schema`.
pub async fn client_store(schema: &TestSchema) -> Store<ClientExecutor> {
    let exec = ClientExecutor::connect(&schema.url, Some(&schema.schema)).await.expect("client");
    Store::connect(exec, ConnectOptions::schema(&schema.schema)).await.expect("connect through the client")
}

/// A store on the built-in pool with statements prepared once per
/// connection, connected (migrated) in `schema`.
pub async fn pool_store_prepared(schema: &TestSchema) -> Store<PgPool> {
    let pool = PgPool::builder(&schema.url)
        .max_size(4)
        .schema(&schema.schema)
        .prepared_statements(true)
        .build()
        .expect("pool");
    Store::connect(pool, ConnectOptions::schema(&schema.schema)).await.expect("connect through the pool")
}

/// Polls `check` every 20 ms until it holds; panics naming `what` past
/// `limit`. For states a test can read (a row, a count), not for time.
pub async fn eventually<F, Fut>(limit: std::time::Duration, what: &str, check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = std::time::Instant::now();
    while !check().await {
        assert!(started.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
