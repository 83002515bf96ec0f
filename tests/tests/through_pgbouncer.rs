//! The store through a real PgBouncer in transaction mode, in front of the
//! shared cluster: every conformance scenario passes on the built-in pool.

use std::path::PathBuf;

use waymark_pool::PgPool;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::Lease;
use waymark_store::{ConnectOptions, Store};
use waymark_tests::cluster::server_url;
use waymark_tests::conformance::{load_scenarios, run_scenario};
use waymark_tests::pgbouncer::{host_and_port, PgBouncer};
use waymark_tests::TestDatabase;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_scenarios_pass_through_pgbouncer_in_transaction_mode() {
    let Some(dir) = std::env::var_os("WAYMARK_CONFORMANCE_DIR").map(PathBuf::from) else {
        eprintln!("SKIPPED: WAYMARK_CONFORMANCE_DIR is not set; `cargo xtask test` sets it");
        return;
    };
    let scenarios = load_scenarios(&dir).unwrap_or_else(|e| panic!("{e}"));
    assert!(!scenarios.is_empty(), "no scenarios in {}", dir.display());
    let (host, port) = host_and_port(&server_url());
    let bouncer = tokio::task::spawn_blocking(move || {
        PgBouncer::builder().default_pool_size(4).start(&host, port, "transaction")
    })
    .await
    .expect("pgbouncer");

    let mut failures = Vec::new();
    for scenario in &scenarios {
        // A fresh installation per scenario, in its own database's public
        // schema: no session-level search_path, which transaction mode drops.
        let db = TestDatabase::new().await;
        let pool = PgPool::builder(bouncer.url(&db.name)).max_size(4).build().expect("pool");
        let store = Store::connect(pool, ConnectOptions::default()).await.expect("connect through pgbouncer");
        match run_scenario(&store, scenario).await {
            Ok(()) => println!("PASS {} [pgbouncer]", scenario.name),
            Err(why) => {
                println!("FAIL {} [pgbouncer]: {why}", scenario.name);
                failures.push(scenario.name.clone());
            }
        }
        drop(store);
        db.drop().await;
    }
    println!("{} passed, {} failed", scenarios.len() - failures.len(), failures.len());
    assert!(failures.is_empty(), "failed through pgbouncer: {failures:?}");
}

/// Through PgBouncer in transaction mode the hub's probe never comes back:
/// the store does not listen, and waits still finish by polling, within the
/// backstop's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_through_pgbouncer_finish_by_polling() {
    use std::time::{Duration, Instant};
    use waymark_store::protocol::Statement;
    use waymark_store::{ClaimRequest, NewTask, TaskStatus};

    let (host, port) = host_and_port(&server_url());
    let bouncer = tokio::task::spawn_blocking(move || {
        PgBouncer::builder().default_pool_size(4).start(&host, port, "transaction")
    })
    .await
    .expect("pgbouncer");
    let db = TestDatabase::new().await;
    let pool = PgPool::builder(bouncer.url(&db.name)).max_size(4).build().expect("pool");
    let connected = Store::connect(pool, ConnectOptions::default()).await.expect("connect");
    // Counts the waits' reads of a task's status: each commit below lands
    // once its waiter has read the row, and so can only be found by a poll.
    let (store, mut reads) = waymark_tests::fault_executor::counted(&connected, Statement::GetStatus);
    let store = std::sync::Arc::new(store);
    for i in 0..5 {
        let task =
            store.submit(NewTask::new("bounced", serde_json::json!({ "i": i }))).await.expect("submit");
        store.claim(&ClaimRequest::new("w", ["default"]).limit(1)).await.expect("claim");
        let first_read = reads.so_far() + 1;
        let waiter = waymark_tests::wait_kit::spawn_wait(&store, &task.id, Duration::from_secs(20));
        reads.reach(first_read).await;
        store.complete(&Lease::new(&task.id, "w"), serde_json::json!(i)).await.expect("complete");
        let committed = Instant::now();
        let (returned, done) = waiter.await.expect("waiter").expect("wait");
        assert_eq!(done.status, TaskStatus::Succeeded);
        let late = returned.saturating_duration_since(committed);
        // Polled: the next backstop is at most 500 ms away; the rest is
        // room for a loaded machine, far short of the wait's 20 s.
        assert!(late < Duration::from_millis(1500), "round {i}: {late:?}, past the 500 ms backstop");
    }
    assert!(!store.is_listening(), "no LISTEN through a transaction-mode pooler");
    drop((store, connected));
    db.drop().await;
}
