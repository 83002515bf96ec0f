//! Throwaway profiling harness (never committed).
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, NewTask, Store};
use waymark_worker::Worker;

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("PROF_N").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let conc: usize = std::env::var("PROF_C").ok().and_then(|v| v.parse().ok()).unwrap_or(1024);
    let settle: usize = std::env::var("PROF_S").ok().and_then(|v| v.parse().ok()).unwrap_or(512);
    let base = "postgres://postgres@127.0.0.1:5432/postgres";
    let (admin, conn) = tokio_postgres::connect(base, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    admin.batch_execute("drop database if exists wm_prof with (force)").await.unwrap();
    admin.batch_execute("create database wm_prof").await.unwrap();
    let url = "postgres://postgres@127.0.0.1:5432/wm_prof?sslmode=disable";
    let pool = PgPool::builder(url).max_size(16).build().unwrap();
    let store = Arc::new(Store::connect(pool, ConnectOptions::default()).await.unwrap());
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let batch: Vec<NewTask> =
            chunk.iter().map(|&i| NewTask::new("bench.noop", json!({"n": i})).queue("bench")).collect();
        store.submit_batch(batch).await.unwrap();
    }
    if std::env::var("PROF_GATE").is_ok() {
        eprintln!("ready pid {}", std::process::id());
        while !std::path::Path::new("/tmp/prof_go").exists() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let w = Worker::builder(store.clone())
        .queues(["bench"])
        .concurrency(conc)
        .settle_batch(settle, Duration::from_millis(2))
        .poll_interval(Duration::from_millis(200))
        .task("bench.noop", |_ctx, _p: serde_json::Value| async move { Ok(()) })
        .build()
        .unwrap();
    let handle = w.handle();
    let t0 = Instant::now();
    let cpu0 = cpu();
    let run = tokio::spawn(w.run());
    while (handle.settled() as usize) < n {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let el = t0.elapsed();
    let c = cpu() - cpu0;
    eprintln!(
        "drained {n} in {el:?}: {:.0}/s, cpu {:.2} us/task",
        n as f64 / el.as_secs_f64(),
        c * 1e6 / n as f64
    );
    if std::env::var("PROF_GATE").is_ok() {
        std::fs::write("/tmp/prof_stop", "").unwrap();
    }
    handle.shutdown();
    run.await.unwrap();
}

fn cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let (u, s): (f64, f64) = (f[11].parse().unwrap(), f[12].parse().unwrap());
    (u + s) / 100.0
}
