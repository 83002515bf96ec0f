//! `cargo xtask demo`: the main job, end to end. Finds or starts PostgreSQL,
//! migrates a fresh `waymark_demo` database, submits tasks, processes them
//! through the store's claim/complete API with visible progress, and reports.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::{ClaimRequest, ConnectOptions, NewTask, Store, TaskStatus};

const DEFAULT_TASKS: usize = 5_000;
const PRODUCERS: usize = 8;
const CLAIMERS: usize = 4;
const CLAIM_BATCH: i64 = 100;
const SETTLE_CONCURRENCY: usize = 2;

pub async fn run(args: &[String]) -> Result<(), String> {
    let mut tasks = DEFAULT_TASKS;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--tasks" => {
                tasks = it.next().and_then(|n| n.parse().ok()).ok_or("--tasks needs a positive number")?;
            }
            other => return Err(format!("demo: unknown argument {other:?}")),
        }
    }
    let server = find_postgres().await?;
    let url = fresh_database(&server, "waymark_demo").await?;
    let pool = PgPool::builder(&url)
        .max_size(12)
        .application_name("waymark-demo")
        .build()
        .map_err(|e| e.to_string())?;
    let store = Arc::new(Store::new(pool));
    let report = store.prepare(&ConnectOptions::default()).await.map_err(|e| e.to_string())?;
    println!("migrated: {} migrations applied", report.applied.len());

    let started = Instant::now();
    submit_all(&store, tasks).await?;
    let submitted_in = started.elapsed();
    println!(
        "submitted {tasks} tasks in {:.2} s ({:.0} tasks/s)",
        submitted_in.as_secs_f64(),
        tasks as f64 / submitted_in.as_secs_f64()
    );

    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..CLAIMERS)
        .map(|i| tokio::spawn(work(store.clone(), format!("demo-worker-{i}"), done.clone(), tasks)))
        .collect();
    while done.load(Ordering::Relaxed) < tasks && !workers.iter().all(|w| w.is_finished()) {
        draw_progress(done.load(Ordering::Relaxed), tasks, started.elapsed());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for w in workers {
        w.await.map_err(|e| e.to_string())??;
    }
    let elapsed = started.elapsed();
    let processed = done.load(Ordering::Relaxed);
    draw_progress(processed, tasks, elapsed);
    println!();

    let stats = store.stats(Some("demo")).await.map_err(|e| e.to_string())?;
    let counts = stats.get("demo").copied().unwrap_or_default();
    println!(
        "queue demo: succeeded {}, failed {}, queued {}, running {}",
        counts.get(TaskStatus::Succeeded),
        counts.get(TaskStatus::Failed),
        counts.get(TaskStatus::Queued),
        counts.get(TaskStatus::Running)
    );
    if counts.get(TaskStatus::Succeeded) != tasks as i64 {
        return Err(format!("expected {tasks} succeeded tasks, found {}", counts.get(TaskStatus::Succeeded)));
    }
    println!(
        "processed {processed} tasks in {:.2} s ({:.0} tasks/s)",
        elapsed.as_secs_f64(),
        processed as f64 / elapsed.as_secs_f64()
    );
    Ok(())
}

/// DATABASE_URL, else the local server on 5432, else the throwaway cluster.
pub(crate) async fn find_postgres() -> Result<String, String> {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        if !url.is_empty() {
            println!("postgres: DATABASE_URL");
            return Ok(url);
        }
    }
    let local = "postgres://postgres@127.0.0.1:5432/postgres";
    if tokio_postgres::connect(local, tokio_postgres::NoTls).await.is_ok() {
        println!("postgres: found {local}");
        return Ok(local.to_owned());
    }
    let url = waymark_tests::cluster::ensure_throwaway()?;
    println!("postgres: started a throwaway cluster at {url}");
    Ok(url)
}

pub(crate) async fn fresh_database(server: &str, name: &str) -> Result<String, String> {
    let admin = waymark_tests::db::admin_client(server).await;
    // Two calls: a multi-statement string would run as one transaction,
    // which DROP/CREATE DATABASE refuse.
    for sql in [format!("drop database if exists {name} with (force)"), format!("create database {name}")] {
        admin
            .batch_execute(&sql)
            .await
            .map_err(|e| format!("{sql}: {}", waymark_pool::codec::map_error(e)))?;
    }
    Ok(waymark_tests::db::url_with_database(server, name))
}

async fn submit_all(store: &Arc<Store<PgPool>>, tasks: usize) -> Result<(), String> {
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let store = store.clone();
            tokio::spawn(async move {
                for n in (p..tasks).step_by(PRODUCERS) {
                    let task = NewTask::new("demo.square", json!({ "n": n })).queue("demo");
                    store.submit(task).await.map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(())
            })
        })
        .collect();
    for p in producers {
        p.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// One claim loop: claim a batch, run each (square the number), complete it.
async fn work(
    store: Arc<Store<PgPool>>,
    worker: String,
    done: Arc<AtomicUsize>,
    total: usize,
) -> Result<(), String> {
    let request =
        ClaimRequest::new(&worker, ["demo"]).names(["demo.square"]).limit(CLAIM_BATCH).lease_ms(30_000);
    while done.load(Ordering::Relaxed) < total {
        let claimed = store.claim(&request).await.map_err(|e| e.to_string())?;
        if claimed.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        // Settle the batch a few at a time: each complete is its own
        // ownership-checked statement and commit.
        let settled: Vec<Result<(), String>> = futures::stream::iter(claimed)
            .map(|task| {
                let (store, worker, done) = (&store, &worker, &done);
                async move {
                    let n = task.payload["n"].as_i64().unwrap_or(0);
                    store
                        .complete(&task.id, worker, json!({ "square": n * n }))
                        .await
                        .map_err(|e| e.to_string())?;
                    done.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }
            })
            .buffer_unordered(SETTLE_CONCURRENCY)
            .collect()
            .await;
        settled.into_iter().collect::<Result<(), String>>()?;
    }
    Ok(())
}

fn draw_progress(done: usize, total: usize, elapsed: Duration) {
    const WIDTH: usize = 40;
    let filled = (done * WIDTH).checked_div(total).unwrap_or(WIDTH);
    let rate = done as f64 / elapsed.as_secs_f64().max(1e-3);
    print!(
        "\r[{}{}] {done}/{total} tasks, {rate:.0} tasks/s",
        "#".repeat(filled),
        ".".repeat(WIDTH - filled)
    );
    let _ = std::io::stdout().flush();
}
