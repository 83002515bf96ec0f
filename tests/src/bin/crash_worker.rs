//! A worker process for the crash test: it runs `crash.sleep` tasks (each
//! records its run in a table first, then sleeps) until it is killed.
//! Usage: `crash_worker URL SCHEMA WORKER_ID`

use std::time::Duration;

use waymark_pool::PgPool;
use waymark_worker::{TaskError, Worker};

#[tokio::main]
async fn main() {
    let [url, schema, worker_id] = waymark_tests::child::args("crash_worker <url> <schema> <worker_id>");
    let store = waymark_tests::pool_store_at(&url, &schema).await;
    let worker = Worker::builder(store)
        .queues(["crash"])
        .concurrency(4)
        .lease(Duration::from_millis(1500))
        .worker_id(worker_id)
        .task("crash.sleep", |ctx, p: serde_json::Value| async move {
            record_run(&ctx).await?;
            // Real time: work that is still running when the process is killed.
            tokio::time::sleep(Duration::from_millis(p["ms"].as_u64().unwrap_or(100))).await;
            Ok(serde_json::json!({"by": ctx.worker_id()}))
        })
        .build()
        .expect("worker");
    println!("ready");
    worker.run().await;
}

/// One row per run, committed before the work, so the test can count runs.
pub async fn record_run(ctx: &waymark_worker::TaskContext<PgPool>) -> Result<(), TaskError> {
    use waymark_store::PgTransaction;
    let tx = ctx.begin().await?;
    tx.client()
        .execute(
            "insert into crash_runs (task_id, attempt, worker_id) values ($1, $2, $3)",
            &[&ctx.id(), &ctx.attempt(), &ctx.worker_id()],
        )
        .await
        .map_err(|e| TaskError::new(e.to_string()))?;
    tx.commit().await.map_err(|e| TaskError::new(e.to_string()))?;
    Ok(())
}
