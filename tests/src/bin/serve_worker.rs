//! A worker process for the signal tests: `Worker::serve` over `serve.*`
//! tasks until SIGINT or SIGTERM. Usage: `serve_worker URL SCHEMA`.
//! `serve.work` sleeps its payload's `ms`; `serve.hold` sleeps a minute,
//! deaf to its token, so only a second signal ends its run early.

use std::time::Duration;

use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, Store};
use waymark_worker::Worker;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, schema] = args.as_slice() else {
        eprintln!("usage: serve_worker <url> <schema>");
        std::process::exit(2);
    };
    let pool = PgPool::builder(url.as_str()).max_size(4).schema(schema.as_str()).build().expect("pool");
    let store = Store::connect(pool, ConnectOptions::schema(schema.as_str())).await.expect("connect");
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
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(serde_json::json!("held"))
        })
        .build()
        .expect("worker");
    println!("ready");
    worker.serve().await.expect("signal handlers");
    println!("stopped");
}
