//! A worker process killed with SIGKILL mid-work: another worker finishes
//! every task once the leases run out. Nothing is lost, nothing settled
//! twice, and attempts count the runs.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use waymark_store::{NewTask, TaskStatus};
use waymark_tests::{eventually, pool_store, test_worker, TestSchema, TestWorker};
use waymark_worker::TaskError;

const TASKS: usize = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_loses_nothing_and_settles_nothing_twice() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let admin = waymark_tests::db::admin_client(&schema.url).await;
    let q = |sql: &str| sql.replace("crash_runs", &format!("\"{}\".crash_runs", schema.schema));
    admin
        .batch_execute(&q("create table crash_runs (task_id text, attempt int, worker_id text)"))
        .await
        .expect("runs table");
    let mut ids = Vec::new();
    for i in 0..TASKS {
        let t = NewTask::new("crash.sleep", json!({"ms": 400, "i": i})).queue("crash");
        ids.push(store.submit(t).await.expect("submit").id);
    }

    let (mut child, _lines) = waymark_tests::child::start_ready(
        env!("CARGO_BIN_EXE_crash_worker"),
        &[&schema.url, &schema.schema, "doomed"],
    )
    .await;

    // Let it finish some and hold others, then kill it without warning.
    eventually(Duration::from_secs(30), "the child to finish four and hold one", || async {
        let c = store.stats(Some("crash")).await.expect("stats")["crash"];
        c.succeeded >= 4 && c.running >= 1
    })
    .await;
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reaped");
    let at_kill = store.stats(Some("crash")).await.expect("stats")["crash"];
    assert!(at_kill.running >= 1, "some tasks were mid-run at the kill: {at_kill:?}");

    // A second worker finishes everything once the leases (1.5 s) expire.
    let runs_table = q("insert into crash_runs (task_id, attempt, worker_id) values ($1, $2, $3)");
    let worker = test_worker(&store, "crash")
        .concurrency(8)
        .poll_interval(Duration::from_millis(200))
        .worker_id("survivor")
        .task("crash.sleep", move |ctx, _p: serde_json::Value| {
            let sql = runs_table.clone();
            async move {
                let tx = ctx.begin().await?;
                tx.client()
                    .execute(&sql, &[&ctx.id(), &ctx.attempt(), &ctx.worker_id()])
                    .await
                    .map_err(|e| TaskError::new(e.to_string()))?;
                let by = ctx.worker_id().to_owned();
                ctx.complete_in(tx, json!({ "by": by })).await?;
                Ok(())
            }
        })
        .start();
    eventually(Duration::from_secs(30), "every task succeeded", || async {
        store.stats(Some("crash")).await.expect("stats")["crash"].succeeded == TASKS as i64
    })
    .await;
    worker.stop().await;

    let mut rerun = 0;
    for id in &ids {
        let t = store.fetch(id).await.expect("fetch");
        assert_eq!(t.status, TaskStatus::Succeeded);
        let runs = admin
            .query(&q("select attempt, worker_id from crash_runs where task_id = $1 order by attempt"), &[id])
            .await
            .expect("runs");
        let attempts: Vec<i32> = runs.iter().map(|r| r.get(0)).collect();
        // Each claim counted one attempt, in order; the last run is the one
        // that settled. (A claim the kill cut off before its handler wrote
        // its row counted an attempt with no run row: at most one.)
        assert!(attempts.windows(2).all(|w| w[0] < w[1]), "task {id}: runs {attempts:?}");
        assert_eq!(attempts.last().copied(), Some(t.attempt), "task {id}: runs {attempts:?}");
        assert!(
            t.attempt as usize - attempts.len() <= 1,
            "task {id}: runs {attempts:?}, attempt {}",
            t.attempt
        );
        let last_worker: String = runs.last().expect("a run").get(1);
        let settled_by = t.result.as_ref().and_then(|r| r["by"].as_str()).expect("result");
        assert_eq!(settled_by, last_worker, "the settling run is the last one");
        assert_eq!(t.worker_id.as_deref(), Some(settled_by));
        if t.attempt > 1 {
            rerun += 1;
            // The claim's own id: the worker's, `/`, the claim's number.
            assert!(settled_by.starts_with("survivor/"), "{settled_by}");
        }
    }
    assert!(rerun as i64 >= at_kill.running, "the tasks held at the kill ran again ({rerun})");
    schema.drop().await;
}
