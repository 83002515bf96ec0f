//! The store through a real PgBouncer in transaction mode, in front of the
//! shared cluster: every conformance scenario passes on the built-in pool.

use std::path::PathBuf;

use waymark_pool::PgPool;
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
