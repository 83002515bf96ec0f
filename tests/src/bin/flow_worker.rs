//! A worker process for the held-task crash test: it runs `flow.step`
//! tasks (each records its run in `flow_runs`, committed first, then
//! commits its effect in `flow_effects` with its settlement) until it is
//! killed. Usage: `flow_worker URL SCHEMA WORKER_ID`

use std::time::Duration;

use waymark_store::PgTransaction;
use waymark_worker::{TaskError, Worker};

#[tokio::main]
async fn main() {
    let [url, schema, worker_id] = waymark_tests::child::args("flow_worker <url> <schema> <worker_id>");
    let store = waymark_tests::pool_store_at(&url, &schema).await;
    let worker = Worker::builder(store)
        .queues(["flow"])
        .concurrency(32)
        .lease(Duration::from_millis(1500))
        .poll_interval(Duration::from_millis(200))
        .retry_backoff(Duration::from_millis(10), Duration::from_millis(50))
        .worker_id(worker_id)
        .task("flow.step", |ctx, _p: serde_json::Value| async move {
            let fail = |e: tokio_postgres::Error| TaskError::new(e.to_string());
            let tx = ctx.begin().await?;
            tx.client()
                .execute(
                    "insert into flow_runs (task_id, attempt, started_at) values ($1, $2, clock_timestamp())",
                    &[&ctx.id(), &ctx.attempt()],
                )
                .await
                .map_err(fail)?;
            tx.commit().await.map_err(|e| TaskError::new(e.to_string()))?;
            // Real time: work still under way when the process is killed.
            tokio::time::sleep(Duration::from_millis(2)).await;
            let tx = ctx.begin().await?;
            tx.client()
                .execute(
                    "insert into flow_effects (task_id, at) values ($1, clock_timestamp())",
                    &[&ctx.id()],
                )
                .await
                .map_err(fail)?;
            ctx.complete_in(tx, serde_json::json!({})).await?;
            Ok(())
        })
        .build()
        .expect("worker");
    println!("ready");
    worker.run().await;
}
