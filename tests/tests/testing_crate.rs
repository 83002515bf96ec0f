//! waymark-testing's helpers, on a real PostgreSQL: a worker run until its
//! queues are idle, and what was submitted found by name and payload.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use waymark_store::{NewTask, TaskStatus};
use waymark_testing::{require_submitted, run_until_idle, submitted};
use waymark_tests::{pool_store, TestSchema};
use waymark_worker::{TaskError, Worker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_runs_until_nothing_is_due_and_what_was_submitted_is_found() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    for n in 0..20 {
        store.submit(NewTask::new("double", json!({ "n": n }))).await.expect("submit");
    }
    // A task due in an hour is not work for now: it must not keep the
    // worker from being idle.
    let later = NewTask::new("double", json!({ "n": 99 })).delay(Duration::from_millis(3_600_000));
    let later = store.submit(later).await.expect("submit");
    let worker = Worker::builder(store.clone())
        .task("double", |ctx, p: serde_json::Value| async move {
            let n = p["n"].as_i64().unwrap_or(0);
            if n == 7 {
                // A child submit while running: idle waits for it too.
                ctx.submit(NewTask::new("double", json!({ "n": 700 })))
                    .await
                    .map_err(|e| TaskError::new(e.to_string()))?;
            }
            Ok(json!(n * 2))
        })
        .build()
        .expect("worker");
    let report = run_until_idle(worker, Duration::from_secs(30)).await.expect("idle");
    assert_eq!(report.settled, 21, "twenty tasks and the child, not the one due later");
    let child = require_submitted(&store, "double", json!({ "n": 700 })).await;
    assert_eq!((child.status, child.result), (TaskStatus::Succeeded, Some(json!(1400))));
    assert_eq!(submitted(&store, "double", json!({})).await.len(), 22);
    assert_eq!(store.fetch(&later.id).await.expect("fetch").status, TaskStatus::Queued);
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_still_busy_at_the_limit_is_reported_not_idle() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    store.submit(NewTask::new("forever", json!({}))).await.expect("submit");
    let worker = Worker::builder(store.clone())
        .shutdown_grace(Duration::from_millis(50))
        .task("forever", |ctx, _p: serde_json::Value| async move {
            ctx.cancelled().await;
            Ok(json!({}))
        })
        .build()
        .expect("worker");
    // Real time is what is under test: the limit (long enough for the claim
    // to land on a loaded machine).
    let err = run_until_idle(worker, Duration::from_secs(3)).await.expect_err("never idle");
    assert_eq!((err.running, err.due), (1, 0), "{err}");
    assert!(err.to_string().contains("1 running"), "{err}");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "expected one task \"email\"")]
async fn require_submitted_names_what_it_did_not_find() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    store.submit(NewTask::new("email", json!({ "to": "a" }))).await.expect("submit");
    require_submitted(&store, "email", json!({ "to": "b" })).await;
}
