//! A worker process for the fleet-limit tests: 32 slots over queue
//! `fleet`, tasks `fleet.work` (sleeps its payload's `ms`; with `"hold":
//! true`, its first run holds on until the worker stops or dies, so a test
//! knows which worker holds it), under one fleet limit. Usage: `fleet_worker URL SCHEMA LIMIT` where LIMIT is
//! `name:N` (at most N `fleet.work` at once) or `tenant:N` (at most N per
//! payload `tenant`). Leases of 2 s. Runs until SIGTERM or SIGINT.

use std::time::Duration;

use waymark_store::{FleetLimit, GroupKey};
use waymark_worker::{TaskError, Worker};

#[tokio::main]
async fn main() {
    let [url, schema, limit] = waymark_tests::child::args("fleet_worker <url> <schema> <name:N | tenant:N>");
    let limit = match limit.split_once(':').map(|(kind, n)| (kind, n.parse::<i64>())) {
        Some(("name", Ok(n))) => FleetLimit::name("fleet.work", n),
        Some(("tenant", Ok(n))) => FleetLimit::name("fleet.work", n).per_group(GroupKey::payload(["tenant"])),
        _ => {
            eprintln!("fleet_worker: LIMIT must be name:N or tenant:N, got {limit:?}");
            std::process::exit(2);
        }
    };
    let store = waymark_tests::pool_store_at(&url, &schema).await;
    let worker = Worker::builder(store)
        .queues(["fleet"])
        .concurrency(32)
        // Short, so that a killed worker's slots free within the test.
        .lease(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(100))
        .fleet_limit(limit)
        .task("fleet.work", |ctx, p: serde_json::Value| async move {
            if p["hold"] == true && ctx.attempt() == 1 {
                // Running until the test kills this worker; a later run,
                // after the lease is recovered, goes through.
                ctx.cancelled().await;
                return Err(TaskError::new("a held task's worker stopped"));
            }
            // Real time: the task must be running while the test samples.
            tokio::time::sleep(Duration::from_millis(p["ms"].as_u64().unwrap_or(20))).await;
            Ok(serde_json::json!("done"))
        })
        .build()
        .expect("worker");
    println!("ready");
    worker.serve().await.expect("signal handlers");
}
