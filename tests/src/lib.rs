//! Test support for waymark's workspace integration tests: a real PostgreSQL
//! (found or started), a place of its own per test, a second executor that
//! proves the seam is open, the executor conformance kit, and the runner for
//! cairnq's shared scenarios.

pub mod browser;
pub mod child;
pub mod client_executor;
pub mod cluster;
pub mod conformance;
pub mod db;
pub mod fault_executor;

pub mod pgbouncer;
pub mod plans;
pub mod private_cluster;
pub mod prometheus;
pub mod proxy;
pub mod python;
pub mod test_worker;
pub mod wait_kit;

use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, Store};

pub use client_executor::ClientExecutor;
pub use db::{TestDatabase, TestSchema};
pub use test_worker::{test_worker, Running, TestWorker};
pub use waymark_testing::{eventually, until_some};

/// Looks until `look` answers `Some`, blocking the thread in between, for
/// the harness's synchronous waits (a server's port, a child's exit):
/// `None` past `limit`.
pub fn poll_blocking<T>(limit: std::time::Duration, mut look: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(found) = look() {
            return Some(found);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        // The one pause of the harness's blocking waits: between two looks.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Waits until task `id` has `status`; the test fails past `limit`,
/// naming `what` it waited for.
pub async fn until_status<E: waymark_store::PgExecutor>(
    limit: std::time::Duration,
    what: &str,
    store: &Store<E>,
    id: &str,
    status: waymark_store::TaskStatus,
) {
    eventually(limit, what, || async { store.fetch(id).await.expect("fetch").status == status }).await;
}

/// A store on the built-in pool, connected (migrated) in `schema`.
pub async fn pool_store(schema: &TestSchema) -> Store<PgPool> {
    pool_store_at(&schema.url, &schema.schema).await
}

/// A store on the built-in pool (four connections) in `schema` of the
/// database at `url`, connected (migrated): how the tests' worker
/// processes, given the two, reach the test's installation.
pub async fn pool_store_at(url: &str, schema: &str) -> Store<PgPool> {
    let pool = PgPool::builder(url).max_size(4).schema(schema).build().expect("pool");
    Store::connect(pool, ConnectOptions::new().schema(schema)).await.expect("connect")
}

/// The built-in pool's builder for `schema`, at most `max_size`
/// connections.
pub fn pool_in(schema: &TestSchema, max_size: u32) -> waymark_pool::PgPoolBuilder {
    PgPool::builder(&schema.url).max_size(max_size).schema(&schema.schema)
}

/// A store over `exec`, connected (migrated) in `schema`.
pub async fn connect_in<E: waymark_store::PgExecutor>(exec: E, schema: &TestSchema) -> Store<E> {
    Store::connect(exec, ConnectOptions::new().schema(&schema.schema)).await.expect("connect")
}

/// A store on [`ClientExecutor`], connected (migrated) in `schema`.
pub async fn client_store(schema: &TestSchema) -> Store<ClientExecutor> {
    let exec = ClientExecutor::connect(&schema.url, Some(&schema.schema)).await.expect("client");
    Store::connect(exec, ConnectOptions::new().schema(&schema.schema))
        .await
        .expect("connect through the client")
}

/// A store on the built-in pool with statements prepared once per
/// connection, connected (migrated) in `schema`.
pub async fn pool_store_prepared(schema: &TestSchema) -> Store<PgPool> {
    connect_in(pool_in(schema, 4).prepared_statements(true).build().expect("pool"), schema).await
}
