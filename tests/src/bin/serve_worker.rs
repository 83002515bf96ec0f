//! A worker process for the signal tests: `Worker::serve` over `serve.*`
//! tasks until SIGINT or SIGTERM. Usage: `serve_worker URL SCHEMA`.
//! `serve.work` sleeps its payload's `ms`; `serve.hold` sleeps a minute,
//! deaf to its token, so only a second signal ends its run early.

use std::time::Duration;

use waymark_worker::Worker;

#[tokio::main]
async fn main() {
    let [url, schema] = waymark_tests::child::args("serve_worker <url> <schema>");
    let store = waymark_tests::pool_store_at(&url, &schema).await;
    let worker = Worker::builder(store)
        .queues(["serve"])
        .concurrency(4)
        .shutdown_grace(Duration::from_secs(30))
        .task("serve.work", |_ctx, p: serde_json::Value| async move {
            // Real time: work under way when the signal comes.
            tokio::time::sleep(Duration::from_millis(p["ms"].as_u64().unwrap_or(100))).await;
            Ok(serde_json::json!("done"))
        })
        .task("serve.hold", |_ctx, _p: serde_json::Value| async move {
            // Real time: a long run, deaf to its token.
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(serde_json::json!("held"))
        })
        .build()
        .expect("worker");
    println!("ready");
    worker.serve().await.expect("signal handlers");
    println!("stopped");
}
