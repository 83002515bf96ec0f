//! `cargo xtask bench`: waymark side by side with a raw-SQL baseline, in the
//! same run, on the same server and settings, each scenario on a fresh
//! database, one after another. Prints a table and one JSON line per
//! scenario and system; `ratio` is waymark over the baseline.
//!
//! `cargo xtask bench` builds and runs itself in release mode; `binding`
//! runs the pool's binding comparison instead.

mod baseline;
mod binding;
mod chart;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, NewTask, Store};
use waymark_worker::Worker;

const TASKS: usize = 20_000;
const BATCH: usize = 500;
const LATENCY_TASKS: usize = 200;
const MIXED_FOR: Duration = Duration::from_secs(8);

pub async fn run(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("binding") => binding::binding().await,
        Some("explain") => explain().await,
        None | Some("all") => all(&SCENARIOS).await,
        Some(one) if SCENARIOS.contains(&one) => all(&[one]).await,
        Some(other) => Err(format!(
            "bench: unknown scenario {other:?} (known: all, binding, explain, {})",
            SCENARIOS.join(", ")
        )),
    }
}

/// One measured row.
#[derive(Debug, Clone)]
struct Row {
    system: &'static str,
    scenario: &'static str,
    detail: String,
    tasks_per_s: f64,
    latency: Option<[f64; 3]>,
    cpu: Option<f64>,
}

const SCENARIOS: [&str; 4] = ["enqueue", "drain", "latency", "mixed"];

async fn all(which: &[&str]) -> Result<(), String> {
    let server = crate::demo::find_postgres().await?;
    let admin = waymark_tests::db::admin_client(&server).await;
    let sync: String =
        admin.query_one("show synchronous_commit", &[]).await.map_err(|e| e.to_string())?.get(0);
    println!("bench: synchronous_commit = {sync}; each scenario on a fresh database");
    let mut rows = Vec::new();
    if which.contains(&"enqueue") {
        rows.extend(enqueue_single(&server, 1).await?);
        rows.extend(enqueue_single(&server, 16).await?);
        rows.extend(enqueue_batch(&server).await?);
    }
    if which.contains(&"drain") {
        rows.extend(drain(&server).await?);
    }
    if which.contains(&"latency") {
        rows.extend(latency(&server).await?);
    }
    if which.contains(&"mixed") {
        rows.extend(mixed(&server).await?);
    }
    report(&rows);
    Ok(())
}

fn report(rows: &[Row]) {
    println!(
        "\n{:<9} {:<15} {:<34} {:>11} {:>7} {:>22} {:>6}",
        "system", "scenario", "settings", "tasks/s", "ratio", "p50/p95/p99 ms", "cpu"
    );
    for r in rows {
        let base = rows
            .iter()
            .find(|b| b.system == baseline::SYSTEM && b.scenario == r.scenario && same_shape(b, r));
        let ratio = base.map(|b| r.tasks_per_s / b.tasks_per_s);
        let lat = r.latency.map(|l| format!("{:.1}/{:.1}/{:.1}", l[0], l[1], l[2])).unwrap_or_default();
        let cpu = r.cpu.map(|c| format!("{c:.2}")).unwrap_or_default();
        println!(
            "{:<9} {:<15} {:<34} {:>11.0} {:>7} {:>22} {:>6}",
            r.system,
            r.scenario,
            r.detail,
            r.tasks_per_s,
            ratio.map(|x| format!("{x:.2}")).unwrap_or_default(),
            lat,
            cpu
        );
    }
    println!();
    for r in rows {
        let base = rows
            .iter()
            .find(|b| b.system == baseline::SYSTEM && b.scenario == r.scenario && same_shape(b, r));
        let mut doc = json!({
            "system": r.system,
            "scenario": r.scenario,
            "settings": r.detail,
            "tasks_per_s": r.tasks_per_s,
            "ratio": base.map(|b| r.tasks_per_s / b.tasks_per_s),
        });
        if let Some([p50, p95, p99]) = r.latency {
            doc["p50_ms"] = json!(p50);
            doc["p95_ms"] = json!(p95);
            doc["p99_ms"] = json!(p99);
            if let Some(b) = base.and_then(|b| b.latency) {
                doc["p50_ratio"] = json!(p50 / b[0]);
                doc["p99_ratio"] = json!(p99 / b[2]);
            }
        }
        if let Some(cpu) = r.cpu {
            doc["cpu_cores"] = json!(cpu);
        }
        println!("{doc}");
    }
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of the probe, the claim and the batched
/// writes on a 100,000-row backlog whose statistics are stale (see
/// `waymark_tests::plans`); each write is rolled back.
async fn explain() -> Result<(), String> {
    const TOTAL: i64 = 100_000;
    const QUEUED: i64 = 50_000;
    const RUNNING: i64 = 512;
    let server = crate::demo::find_postgres().await?;
    let (url, _store) = fresh(&server, "waymark_bench_explain").await?;
    let mut client = waymark_tests::db::admin_client(&url).await;
    let running = waymark_tests::plans::stale_backlog(&client, TOTAL, QUEUED, RUNNING).await;
    println!(
        "explain: {TOTAL} tasks ({QUEUED} queued, {RUNNING} of them running, the rest succeeded), \
         statistics taken while every task was queued\n"
    );
    for plan in waymark_tests::plans::explain_hot_statements(&mut client, &running, true).await {
        println!("-- {}", plan.statement);
        for line in plan.text.lines() {
            // A bound id array prints in full; its first ids are enough.
            match line.char_indices().nth(150) {
                Some((cut, _)) => println!("{} ...", &line[..cut]),
                None => println!("{line}"),
            }
        }
        println!();
    }
    Ok(())
}

/// Rows compare within a scenario of the same producer count.
fn same_shape(a: &Row, b: &Row) -> bool {
    a.scenario != "enqueue-single" || a.detail.split(',').next() == b.detail.split(',').next()
}

async fn fresh(server: &str, name: &str) -> Result<(String, Arc<Store<PgPool>>), String> {
    let url = crate::demo::fresh_database(server, name).await?;
    let pool = PgPool::builder(&url).max_size(16).build().map_err(|e| e.to_string())?;
    let store = Store::connect(pool, ConnectOptions::default()).await.map_err(|e| e.to_string())?;
    Ok((url, Arc::new(store)))
}

fn rate(n: usize, took: Duration) -> f64 {
    n as f64 / took.as_secs_f64()
}

async fn enqueue_single(server: &str, producers: usize) -> Result<Vec<Row>, String> {
    let detail = format!("{producers} producer(s), one per call");
    let (url, store) = fresh(server, "waymark_bench_enqueue").await?;
    let started = Instant::now();
    let mut joins = Vec::new();
    for p in 0..producers {
        let store = store.clone();
        joins.push(tokio::spawn(async move {
            for n in (p..TASKS).step_by(producers) {
                store
                    .submit(NewTask::new("bench.noop", json!({ "n": n })).queue("bench"))
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(())
        }));
    }
    for j in joins {
        j.await.map_err(|e| e.to_string())??;
    }
    let waymark = rate(TASKS, started.elapsed());

    let started = Instant::now();
    let mut joins = Vec::new();
    for p in 0..producers {
        let client = baseline::connect(&url).await?;
        joins.push(tokio::spawn(async move {
            for n in (p..TASKS).step_by(producers) {
                let id = waymark_store::new_task_id();
                baseline::insert_one(&client, &id, "bench.noop", "raw", &json!({ "n": n })).await?;
            }
            Ok::<_, String>(())
        }));
    }
    for j in joins {
        j.await.map_err(|e| e.to_string())??;
    }
    let raw = rate(TASKS, started.elapsed());
    Ok(vec![
        row("waymark", "enqueue-single", &detail, waymark),
        row(baseline::SYSTEM, "enqueue-single", &detail, raw),
    ])
}

fn row(system: &'static str, scenario: &'static str, detail: &str, tasks_per_s: f64) -> Row {
    Row { system, scenario, detail: detail.to_owned(), tasks_per_s, latency: None, cpu: None }
}

async fn enqueue_batch(server: &str) -> Result<Vec<Row>, String> {
    let detail = format!("1 producer, {BATCH} per statement");
    let (url, store) = fresh(server, "waymark_bench_batch").await?;
    let started = Instant::now();
    for chunk in (0..TASKS).collect::<Vec<_>>().chunks(BATCH) {
        let batch: Vec<NewTask> =
            chunk.iter().map(|n| NewTask::new("bench.noop", json!({ "n": n })).queue("bench")).collect();
        store.submit_batch(&batch).await.map_err(|e| e.to_string())?;
    }
    let waymark = rate(TASKS, started.elapsed());
    let client = baseline::connect(&url).await?;
    let started = Instant::now();
    for chunk in (0..TASKS).collect::<Vec<_>>().chunks(BATCH) {
        let ids: Vec<String> = chunk.iter().map(|_| waymark_store::new_task_id()).collect();
        let payloads: Vec<serde_json::Value> = chunk.iter().map(|n| json!({ "n": n })).collect();
        baseline::insert_many(&client, &ids, "bench.noop", "raw", &payloads).await?;
    }
    let raw = rate(TASKS, started.elapsed());
    Ok(vec![
        row("waymark", "enqueue-batch", &detail, waymark),
        row(baseline::SYSTEM, "enqueue-batch", &detail, raw),
    ])
}

/// Fills `queue` with `n` no-op tasks, in batches.
async fn backlog(store: &Store<PgPool>, queue: &str, n: usize) -> Result<(), String> {
    for chunk in (0..n).collect::<Vec<_>>().chunks(BATCH) {
        let batch: Vec<NewTask> =
            chunk.iter().map(|i| NewTask::new("bench.noop", json!({ "n": i })).queue(queue)).collect();
        store.submit_batch(&batch).await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// CPU seconds this process has used (user + system).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn worker(
    store: &Arc<Store<PgPool>>,
    queue: &str,
    concurrency: usize,
    settle: usize,
    on_start: Arc<dyn Fn(&serde_json::Value) + Send + Sync>,
) -> Result<Worker<PgPool>, String> {
    Worker::builder(store.clone())
        .queues([queue])
        .concurrency(concurrency)
        .settle_batch(settle, Duration::from_millis(2))
        .poll_interval(Duration::from_millis(200))
        .task("bench.noop", move |_ctx, p: serde_json::Value| {
            on_start(&p);
            async move { Ok(()) }
        })
        .build()
        .map_err(|e| e.to_string())
}

async fn drain(server: &str) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    let mut tried = Vec::new();
    let mut best: Option<Row> = None;
    for (concurrency, settle) in [(128, 128), (512, 256), (1024, 512)] {
        let (_url, store) = fresh(server, "waymark_bench_drain").await?;
        backlog(&store, "bench", TASKS).await?;
        let w = worker(&store, "bench", concurrency, settle, Arc::new(|_| {}))?;
        let handle = w.handle();
        let cpu0 = cpu_seconds();
        let started = Instant::now();
        let run = tokio::spawn(w.run());
        while (handle.settled() as usize) < TASKS {
            if started.elapsed() > Duration::from_secs(120) {
                return Err("drain: waymark did not finish in 120 s".to_owned());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let took = started.elapsed();
        let cpu = (cpu_seconds() - cpu0) / took.as_secs_f64();
        handle.shutdown();
        run.await.map_err(|e| e.to_string())?;
        let r = Row {
            system: "waymark",
            scenario: "drain",
            detail: format!("concurrency {concurrency}, settle batch {settle}"),
            tasks_per_s: rate(TASKS, took),
            latency: None,
            cpu: Some(cpu),
        };
        println!("drain: waymark {} -> {:.0} tasks/s, {cpu:.2} cores", r.detail, r.tasks_per_s);
        tried.push((format!("{concurrency} ({settle})"), r.tasks_per_s));
        if best.as_ref().is_none_or(|b| b.tasks_per_s < r.tasks_per_s) {
            best = Some(r);
        }
    }
    rows.extend(best);
    let (url, store) = fresh(server, "waymark_bench_drain").await?;
    backlog(&store, "bench", TASKS).await?;
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    baseline::drain(&url, "bench", TASKS, 2, 500, Arc::new(|_| {}), None).await?;
    let took = started.elapsed();
    rows.push(Row {
        system: baseline::SYSTEM,
        scenario: "drain",
        detail: "2 connections, claims of 500".to_owned(),
        tasks_per_s: rate(TASKS, took),
        latency: None,
        cpu: Some((cpu_seconds() - cpu0) / took.as_secs_f64()),
    });
    let dir = crate::workspace_root().join("target/waymark-bench");
    let svg = dir.join("drain.svg");
    std::fs::create_dir_all(&dir)
        .and_then(|_| std::fs::write(&svg, chart::drain_svg(&tried, rate(TASKS, took))))
        .map_err(|e| format!("writing {}: {e}", svg.display()))?;
    println!("drain: chart written to {}", svg.display());
    Ok(rows)
}

/// Submit-commit to handler-start times, in ms, by sequence number.
#[derive(Default)]
struct Stamps {
    committed: Mutex<HashMap<u64, Instant>>,
    started: Mutex<HashMap<u64, Instant>>,
}

impl Stamps {
    fn on_start(self: &Arc<Self>) -> Arc<dyn Fn(&serde_json::Value) + Send + Sync> {
        let me = self.clone();
        Arc::new(move |p| {
            if let Some(seq) = p["seq"].as_u64() {
                me.started.lock().unwrap().entry(seq).or_insert_with(Instant::now);
            }
        })
    }

    fn percentiles(&self) -> [f64; 3] {
        let committed = self.committed.lock().unwrap();
        let started = self.started.lock().unwrap();
        let mut ms: Vec<f64> = committed
            .iter()
            .filter_map(|(seq, c)| {
                started.get(seq).map(|s| s.saturating_duration_since(*c).as_secs_f64() * 1e3)
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms.get(((ms.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(f64::NAN);
        [at(0.50), at(0.95), at(0.99)]
    }

    fn seen(&self) -> usize {
        self.started.lock().unwrap().len()
    }
}

async fn latency(server: &str) -> Result<Vec<Row>, String> {
    let detail = format!("{LATENCY_TASKS} tasks, 20 ms apart, idle worker");
    // waymark: an idle worker woken by LISTEN (or its poll).
    let (url, store) = fresh(server, "waymark_bench_latency").await?;
    let stamps = Arc::new(Stamps::default());
    let w = worker(&store, "bench", 16, 64, stamps.on_start())?;
    let handle = w.handle();
    let run = tokio::spawn(w.run());
    tokio::time::sleep(Duration::from_millis(500)).await; // idle, listening
    let started = Instant::now();
    for seq in 0..LATENCY_TASKS as u64 {
        store
            .submit(NewTask::new("bench.noop", json!({ "seq": seq })).queue("bench"))
            .await
            .map_err(|e| e.to_string())?;
        stamps.committed.lock().unwrap().insert(seq, Instant::now());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while stamps.seen() < LATENCY_TASKS && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waymark = Row {
        system: "waymark",
        scenario: "latency",
        detail: detail.clone(),
        tasks_per_s: rate(LATENCY_TASKS, started.elapsed()),
        latency: Some(stamps.percentiles()),
        cpu: None,
    };
    handle.shutdown();
    run.await.map_err(|e| e.to_string())?;

    // The baseline: a LISTEN session wakes its claim loop.
    let stamps = Arc::new(Stamps::default());
    let wake = Arc::new(tokio::sync::Notify::new());
    let _listener = baseline::listen(&url, wake.clone()).await?;
    let consumer = tokio::spawn({
        let (url, on_start, wake) = (url.clone(), stamps.on_start(), wake.clone());
        async move { baseline::drain(&url, "raw", LATENCY_TASKS, 1, 500, on_start, Some(wake)).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let client = baseline::connect(&url).await?;
    let started = Instant::now();
    for seq in 0..LATENCY_TASKS as u64 {
        let id = waymark_store::new_task_id();
        baseline::insert_one(&client, &id, "bench.noop", "raw", &json!({ "seq": seq })).await?;
        stamps.committed.lock().unwrap().insert(seq, Instant::now());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    consumer.await.map_err(|e| e.to_string())??;
    let raw = Row {
        system: baseline::SYSTEM,
        scenario: "latency",
        detail,
        tasks_per_s: rate(LATENCY_TASKS, started.elapsed()),
        latency: Some(stamps.percentiles()),
        cpu: None,
    };
    Ok(vec![waymark, raw])
}

async fn mixed(server: &str) -> Result<Vec<Row>, String> {
    const PRODUCERS: usize = 4;
    let detail = format!("{PRODUCERS} producers + 1 worker, {}s", MIXED_FOR.as_secs());
    let (url, store) = fresh(server, "waymark_bench_mixed").await?;
    let stamps = Arc::new(Stamps::default());
    let w = worker(&store, "bench", 256, 128, stamps.on_start())?;
    let handle = w.handle();
    let run = tokio::spawn(w.run());
    let seq = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    let mut producers = Vec::new();
    for _ in 0..PRODUCERS {
        let (store, stamps, seq) = (store.clone(), stamps.clone(), seq.clone());
        producers.push(tokio::spawn(async move {
            while started.elapsed() < MIXED_FOR {
                let n = seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                store
                    .submit(NewTask::new("bench.noop", json!({ "seq": n })).queue("bench"))
                    .await
                    .map_err(|e| e.to_string())?;
                stamps.committed.lock().unwrap().insert(n, Instant::now());
            }
            Ok::<_, String>(())
        }));
    }
    for p in producers {
        p.await.map_err(|e| e.to_string())??;
    }
    let done = handle.settled() as usize;
    let waymark = Row {
        system: "waymark",
        scenario: "mixed",
        detail: detail.clone(),
        tasks_per_s: rate(done, started.elapsed()),
        latency: Some(stamps.percentiles()),
        cpu: None,
    };
    handle.shutdown();
    run.await.map_err(|e| e.to_string())?;

    let stamps = Arc::new(Stamps::default());
    let wake = Arc::new(tokio::sync::Notify::new());
    let _listener = baseline::listen(&url, wake.clone()).await?;
    let total = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    let mut producers = Vec::new();
    for _ in 0..PRODUCERS {
        let client = baseline::connect(&url).await?;
        let (stamps, total) = (stamps.clone(), total.clone());
        producers.push(tokio::spawn(async move {
            while started.elapsed() < MIXED_FOR {
                let n = total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                baseline::insert_one(
                    &client,
                    &waymark_store::new_task_id(),
                    "bench.noop",
                    "raw",
                    &json!({ "seq": n }),
                )
                .await?;
                stamps.committed.lock().unwrap().insert(n, Instant::now());
            }
            Ok::<_, String>(())
        }));
    }
    let consumer = tokio::spawn({
        let (url, on_start, wake) = (url.clone(), stamps.on_start(), wake.clone());
        async move { baseline::drain(&url, "raw", usize::MAX, 2, 500, on_start, Some(wake)).await }
    });
    for p in producers {
        p.await.map_err(|e| e.to_string())??;
    }
    let done = stamps.seen();
    consumer.abort();
    let raw = Row {
        system: baseline::SYSTEM,
        scenario: "mixed",
        detail,
        tasks_per_s: rate(done, started.elapsed()),
        latency: Some(stamps.percentiles()),
        cpu: None,
    };
    Ok(vec![waymark, raw])
}
