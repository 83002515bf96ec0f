//! `cargo xtask bench`: waymark side by side with a raw-SQL baseline, in the
//! same run, on the same server and settings. Each scenario runs in rounds;
//! a round runs every contestant once, each on a fresh database, one after
//! another, in an order that flips every round so drift on a shared machine
//! hits both alike. A contestant's figure is its median over the rounds, and
//! `ratio` is waymark's median over the baseline's. Prints a table and one
//! JSON line per scenario and system.
//!
//! `cargo xtask bench` builds and runs itself in release mode; `binding`
//! compares statement binding modes, `explain` prints the hot statements'
//! plans on a large backlog.

mod baseline;
mod binding;
mod chart;
mod measure;
mod python;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, NewTask, Store};
use waymark_worker::Worker;

use measure::{median, percentiles, CpuClock, Round, Stamps};

const TASKS: usize = 20_000;
const BATCH: usize = 500;
const LATENCY_TASKS: usize = 200;
const MIXED_FOR: Duration = Duration::from_secs(8);
/// Rounds per scenario: more where one run is short (its figure noisy),
/// fewer where a run lasts seconds. An even count gives each system the
/// first place equally often. `--rounds N` sets every scenario's.
const ROUNDS_ENQUEUE_SINGLE: usize = 2;
const ROUNDS_ENQUEUE_BATCH: usize = 8;
const ROUNDS_DRAIN: usize = 6;
const ROUNDS_LATENCY: usize = 2;
const ROUNDS_MIXED: usize = 2;
const SCENARIOS: [&str; 4] = ["enqueue", "drain", "latency", "mixed"];

/// Worker settings the drain tries: (concurrency, settle batch).
const DRAIN_SETTINGS: [(usize, usize); 5] = [(128, 64), (512, 256), (1024, 512), (2048, 1024), (4096, 1024)];

pub async fn run(args: &[String]) -> Result<(), String> {
    let (rounds, rest) = rounds_arg(args)?;
    match rest.first().map(String::as_str) {
        Some("binding") => binding::binding().await,
        Some("explain") => explain().await,
        None | Some("all") => all(&SCENARIOS, rounds).await,
        Some(one) if SCENARIOS.contains(&one) => all(&[one], rounds).await,
        Some(other) => Err(format!(
            "bench: unknown scenario {other:?} (known: all, binding, explain, {})",
            SCENARIOS.join(", ")
        )),
    }
}

/// Takes `--rounds N` out of the arguments.
fn rounds_arg(args: &[String]) -> Result<(Option<usize>, Vec<String>), String> {
    let mut rounds = None;
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--rounds" {
            let n = it.next().ok_or("bench: --rounds needs a number")?;
            rounds = Some(
                n.parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or(format!("bench: --rounds must be 1 or more, got {n:?}"))?,
            );
        } else {
            rest.push(a.clone());
        }
    }
    Ok((rounds, rest))
}

/// One contestant's figures in one scenario.
#[derive(Debug, Clone)]
struct Row {
    system: &'static str,
    scenario: &'static str,
    detail: String,
    rounds: Vec<Round>,
}

impl Row {
    fn new(system: &'static str, scenario: &'static str, detail: impl Into<String>) -> Self {
        Row { system, scenario, detail: detail.into(), rounds: Vec::new() }
    }

    fn tasks_per_s(&self) -> f64 {
        median(self.rounds.iter().map(|r| r.tasks_per_s))
    }

    /// Percentiles over every round's samples together.
    fn latency(&self) -> Option<[f64; 3]> {
        let samples: Vec<f64> = self.rounds.iter().flat_map(|r| r.latency_ms.iter().copied()).collect();
        (!samples.is_empty()).then(|| percentiles(&samples))
    }

    fn cpu(&self) -> (f64, f64) {
        (median(self.rounds.iter().map(|r| r.cpu)), median(self.rounds.iter().map(|r| r.other_cpu)))
    }
}

type RoundFn<'a> = Box<dyn Fn() -> BoxFuture<'a, Result<Round, String>> + 'a>;

/// Runs every contestant once per round, in an order that flips each round.
async fn rounds(rounds: usize, rows: &mut [Row], runs: &[RoundFn<'_>]) -> Result<(), String> {
    for r in 0..rounds {
        let order: Vec<usize> =
            if r % 2 == 0 { (0..runs.len()).collect() } else { (0..runs.len()).rev().collect() };
        for i in order {
            let round = runs[i]().await?;
            println!(
                "  round {}: {} {} ({}) {:.0} tasks/s",
                r + 1,
                rows[i].system,
                rows[i].scenario,
                rows[i].detail,
                round.tasks_per_s
            );
            rows[i].rounds.push(round);
        }
    }
    Ok(())
}

async fn all(which: &[&str], rounds: Option<usize>) -> Result<(), String> {
    let n = |default: usize| rounds.unwrap_or(default);
    let server = crate::demo::find_postgres().await?;
    let sync = waymark_tests::db::server_setting(&server, "synchronous_commit").await?;
    println!("bench: synchronous_commit = {sync}; each run on a fresh database");
    let mut rows = Vec::new();
    if which.contains(&"enqueue") {
        for producers in [1, 16] {
            rows.extend(enqueue_single(&server, producers, n(ROUNDS_ENQUEUE_SINGLE)).await?);
        }
        rows.extend(enqueue_batch(&server, n(ROUNDS_ENQUEUE_BATCH)).await?);
    }
    if which.contains(&"drain") {
        rows.extend(drain(&server, n(ROUNDS_DRAIN)).await?);
    }
    if which.contains(&"latency") {
        rows.extend(latency(&server, n(ROUNDS_LATENCY)).await?);
    }
    if which.contains(&"mixed") {
        rows.extend(mixed(&server, n(ROUNDS_MIXED)).await?);
    }
    report(&rows);
    Ok(())
}

/// The baseline row compared with `r`: same scenario, same detail.
fn baseline_of<'a>(rows: &'a [Row], r: &Row) -> Option<&'a Row> {
    rows.iter().find(|b| b.system == baseline::SYSTEM && b.scenario == r.scenario && same_shape(b, r))
}

/// Rows compare within a scenario of the same producer count.
fn same_shape(a: &Row, b: &Row) -> bool {
    a.scenario != "enqueue-single" || a.detail.split(',').next() == b.detail.split(',').next()
}

fn report(rows: &[Row]) {
    println!(
        "\n{:<9} {:<15} {:<36} {:>9} {:>6} {:>17} {:>5} {:>5}",
        "system", "scenario", "settings", "tasks/s", "ratio", "p50/p95/p99 ms", "cpu", "db"
    );
    for r in rows {
        let ratio = baseline_of(rows, r).map(|b| r.tasks_per_s() / b.tasks_per_s());
        let lat = r.latency().map(|l| format!("{:.1}/{:.1}/{:.1}", l[0], l[1], l[2])).unwrap_or_default();
        let (cpu, other) = r.cpu();
        let cores = |c: f64| if c.is_nan() { String::new() } else { format!("{c:.2}") };
        println!(
            "{:<9} {:<15} {:<36} {:>9.0} {:>6} {:>17} {:>5} {:>5}",
            r.system,
            r.scenario,
            r.detail,
            r.tasks_per_s(),
            ratio.map(|x| format!("{x:.2}")).unwrap_or_default(),
            lat,
            cores(cpu),
            cores(other)
        );
    }
    println!("(medians of the rounds; cpu: this process in cores; db: the rest of the machine, mostly PostgreSQL)\n");
    for r in rows {
        let base = baseline_of(rows, r);
        let (cpu, other) = r.cpu();
        let mut doc = json!({
            "system": r.system,
            "scenario": r.scenario,
            "settings": r.detail,
            "tasks_per_s": r.tasks_per_s(),
            "ratio": base.map(|b| r.tasks_per_s() / b.tasks_per_s()),
            "rounds": r.rounds.iter().map(|x| x.tasks_per_s.round()).collect::<Vec<_>>(),
            "cpu_cores": cpu,
            "other_cpu_cores": other,
        });
        if let Some([p50, p95, p99]) = r.latency() {
            doc["p50_ms"] = json!(p50);
            doc["p95_ms"] = json!(p95);
            doc["p99_ms"] = json!(p99);
            if let Some(b) = base.and_then(Row::latency) {
                doc["p50_ratio"] = json!(p50 / b[0]);
                doc["p99_ratio"] = json!(p99 / b[2]);
            }
        }
        println!("{doc}");
    }
}

/// A fresh database with waymark's tables, and a store on it. Both systems
/// talk plain TCP: the baseline has no TLS, and a server with `ssl = on`
/// would otherwise encrypt waymark's traffic under the default `prefer`.
async fn fresh(server: &str, name: &str) -> Result<(String, Arc<Store<PgPool>>), String> {
    let url = crate::demo::fresh_database(server, name).await?;
    let url = format!("{url}{}sslmode=disable", if url.contains('?') { '&' } else { '?' });
    let pool = PgPool::builder(&url).max_size(16).build().map_err(|e| e.to_string())?;
    let store = Store::connect(pool, ConnectOptions::default()).await.map_err(|e| e.to_string())?;
    Ok((url, Arc::new(store)))
}

async fn enqueue_single(server: &str, producers: usize, n: usize) -> Result<Vec<Row>, String> {
    let detail = format!("{producers} producer(s), one per call");
    let mut rows = vec![
        Row::new("waymark", "enqueue-single", &detail),
        Row::new(baseline::SYSTEM, "enqueue-single", &detail),
    ];
    let waymark: RoundFn<'_> = Box::new(|| {
        Box::pin(async move {
            let (_, store) = fresh(server, "waymark_bench_enqueue").await?;
            let clock = CpuClock::start();
            let mut joins = Vec::new();
            for p in 0..producers {
                let store = store.clone();
                joins.push(tokio::spawn(async move {
                    for i in (p..TASKS).step_by(producers) {
                        store
                            .submit(NewTask::new("bench.noop", json!({ "n": i })).queue("bench"))
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                    Ok::<_, String>(())
                }));
            }
            for j in joins {
                j.await.map_err(|e| e.to_string())??;
            }
            Ok(clock.round(TASKS))
        })
    });
    let raw: RoundFn<'_> = Box::new(|| {
        Box::pin(async move {
            let (url, _store) = fresh(server, "waymark_bench_enqueue").await?;
            let mut clients = Vec::new();
            for _ in 0..producers {
                clients.push(baseline::connect(&url).await?);
            }
            let clock = CpuClock::start();
            let mut joins = Vec::new();
            for (p, client) in clients.into_iter().enumerate() {
                joins.push(tokio::spawn(async move {
                    for i in (p..TASKS).step_by(producers) {
                        let id = waymark_store::new_task_id();
                        baseline::insert_one(&client, &id, "bench.noop", "raw", &json!({ "n": i })).await?;
                    }
                    Ok::<_, String>(())
                }));
            }
            for j in joins {
                j.await.map_err(|e| e.to_string())??;
            }
            Ok(clock.round(TASKS))
        })
    });
    rounds(n, &mut rows, &[waymark, raw]).await?;
    Ok(rows)
}

async fn enqueue_batch(server: &str, n: usize) -> Result<Vec<Row>, String> {
    let detail = format!("1 producer, {BATCH} per statement");
    let mut rows = vec![
        Row::new("waymark", "enqueue-batch", &detail),
        Row::new(baseline::SYSTEM, "enqueue-batch", &detail),
    ];
    let waymark: RoundFn<'_> = Box::new(|| {
        Box::pin(async move {
            let (_, store) = fresh(server, "waymark_bench_batch").await?;
            let clock = CpuClock::start();
            backlog(&store, "bench", TASKS).await?;
            Ok(clock.round(TASKS))
        })
    });
    let raw: RoundFn<'_> = Box::new(|| {
        Box::pin(async move {
            let (url, _store) = fresh(server, "waymark_bench_batch").await?;
            let client = baseline::connect(&url).await?;
            let clock = CpuClock::start();
            for chunk in (0..TASKS).collect::<Vec<_>>().chunks(BATCH) {
                let ids: Vec<String> = chunk.iter().map(|_| waymark_store::new_task_id()).collect();
                let payloads: Vec<serde_json::Value> = chunk.iter().map(|i| json!({ "n": i })).collect();
                baseline::insert_many(&client, &ids, "bench.noop", "raw", &payloads).await?;
            }
            Ok(clock.round(TASKS))
        })
    });
    rounds(n, &mut rows, &[waymark, raw]).await?;
    Ok(rows)
}

/// Fills `queue` with `n` no-op tasks, in batches.
async fn backlog(store: &Store<PgPool>, queue: &str, n: usize) -> Result<(), String> {
    for chunk in (0..n).collect::<Vec<_>>().chunks(BATCH) {
        let batch: Vec<NewTask> =
            chunk.iter().map(|i| NewTask::new("bench.noop", json!({ "n": i })).queue(queue)).collect();
        store.submit_batch(batch).await.map_err(|e| e.to_string())?;
    }
    Ok(())
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

/// One waymark drain of a fresh backlog of [`TASKS`].
async fn waymark_drain(server: &str, concurrency: usize, settle: usize) -> Result<Round, String> {
    let (_url, store) = fresh(server, "waymark_bench_drain").await?;
    backlog(&store, "bench", TASKS).await?;
    let w = worker(&store, "bench", concurrency, settle, Arc::new(|_| {}))?;
    let handle = w.handle();
    let clock = CpuClock::start();
    let started = Instant::now();
    let run = tokio::spawn(w.run());
    while (handle.settled() as usize) < TASKS {
        if started.elapsed() > Duration::from_secs(120) {
            return Err("drain: waymark did not finish in 120 s".to_owned());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let round = clock.round(TASKS);
    handle.shutdown();
    run.await.map_err(|e| e.to_string())?;
    Ok(round)
}

async fn drain(server: &str, n: usize) -> Result<Vec<Row>, String> {
    let mut rows: Vec<Row> = DRAIN_SETTINGS
        .iter()
        .map(|(c, s)| Row::new("waymark", "drain", format!("concurrency {c}, settle batch {s}")))
        .collect();
    rows.push(Row::new(baseline::SYSTEM, "drain", "2 connections, claims of 500"));
    let mut runs: Vec<RoundFn<'_>> = DRAIN_SETTINGS
        .iter()
        .map(|&(c, s)| -> RoundFn<'_> { Box::new(move || Box::pin(waymark_drain(server, c, s))) })
        .collect();
    runs.push(Box::new(|| {
        Box::pin(async move {
            let (url, store) = fresh(server, "waymark_bench_drain").await?;
            backlog(&store, "bench", TASKS).await?;
            let clock = CpuClock::start();
            baseline::drain(&url, "bench", TASKS, 2, 500, Arc::new(|_| {}), None).await?;
            Ok(clock.round(TASKS))
        })
    }));
    rounds(n, &mut rows, &runs).await?;

    let base = rows.pop().expect("the baseline row");
    let tried: Vec<(String, f64)> =
        DRAIN_SETTINGS.iter().zip(&rows).map(|((c, s), r)| (format!("{c} ({s})"), r.tasks_per_s())).collect();
    let reference = python::drain_reference(server, TASKS).await;
    let dir = crate::workspace_root().join("target/waymark-bench");
    let svg = dir.join("drain.svg");
    std::fs::create_dir_all(&dir)
        .and_then(|_| std::fs::write(&svg, chart::drain_svg(&tried, base.tasks_per_s())))
        .map_err(|e| format!("writing {}: {e}", svg.display()))?;
    println!("drain: chart written to {}", svg.display());
    for r in &rows {
        println!("drain: waymark {} -> {:.0} tasks/s (median)", r.detail, r.tasks_per_s());
    }
    let best = rows
        .into_iter()
        .max_by(|a, b| a.tasks_per_s().total_cmp(&b.tasks_per_s()))
        .expect("settings were tried");
    Ok([Some(best), Some(base), reference].into_iter().flatten().collect())
}

async fn latency(server: &str, n: usize) -> Result<Vec<Row>, String> {
    let detail = format!("{LATENCY_TASKS} tasks, 20 ms apart, idle worker");
    let mut rows =
        vec![Row::new("waymark", "latency", &detail), Row::new(baseline::SYSTEM, "latency", &detail)];
    let waymark: RoundFn<'_> = Box::new(|| {
        Box::pin(async move {
            let (_, store) = fresh(server, "waymark_bench_latency").await?;
            let stamps = Arc::new(Stamps::default());
            let w = worker(&store, "bench", 16, 64, stamps.on_start())?;
            let handle = w.handle();
            let run = tokio::spawn(w.run());
            tokio::time::sleep(Duration::from_millis(500)).await; // idle, listening
            let clock = CpuClock::start();
            for seq in 0..LATENCY_TASKS as u64 {
                store
                    .submit(NewTask::new("bench.noop", json!({ "seq": seq })).queue("bench"))
                    .await
                    .map_err(|e| e.to_string())?;
                stamps.committed(seq);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let started = Instant::now();
            while stamps.seen() < LATENCY_TASKS && started.elapsed() < Duration::from_secs(30) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let mut round = clock.round(stamps.seen());
            round.latency_ms = stamps.samples();
            handle.shutdown();
            run.await.map_err(|e| e.to_string())?;
            Ok(round)
        })
    });
    let raw: RoundFn<'_> = Box::new(|| {
        Box::pin(async move {
            let (url, _store) = fresh(server, "waymark_bench_latency").await?;
            let stamps = Arc::new(Stamps::default());
            let (_listener, consumer) =
                baseline::woken_drain(&url, LATENCY_TASKS, 1, stamps.on_start()).await?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let client = baseline::connect(&url).await?;
            let clock = CpuClock::start();
            for seq in 0..LATENCY_TASKS as u64 {
                let id = waymark_store::new_task_id();
                baseline::insert_one(&client, &id, "bench.noop", "raw", &json!({ "seq": seq })).await?;
                stamps.committed(seq);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            consumer.await.map_err(|e| e.to_string())??;
            let mut round = clock.round(stamps.seen());
            round.latency_ms = stamps.samples();
            Ok(round)
        })
    });
    rounds(n, &mut rows, &[waymark, raw]).await?;
    Ok(rows)
}

async fn mixed(server: &str, n: usize) -> Result<Vec<Row>, String> {
    const PRODUCERS: usize = 4;
    let detail = format!("{PRODUCERS} producers + 1 worker, {}s", MIXED_FOR.as_secs());
    let mut rows = vec![Row::new("waymark", "mixed", &detail), Row::new(baseline::SYSTEM, "mixed", &detail)];
    let waymark: RoundFn<'_> = Box::new(|| {
        Box::pin(async move {
            let (_, store) = fresh(server, "waymark_bench_mixed").await?;
            let stamps = Arc::new(Stamps::default());
            let w = worker(&store, "bench", 256, 128, stamps.on_start())?;
            let handle = w.handle();
            let run = tokio::spawn(w.run());
            let seq = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let clock = CpuClock::start();
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
                        stamps.committed(n);
                    }
                    Ok::<_, String>(())
                }));
            }
            for p in producers {
                p.await.map_err(|e| e.to_string())??;
            }
            let mut round = clock.round(handle.settled() as usize);
            round.latency_ms = stamps.samples();
            handle.shutdown();
            run.await.map_err(|e| e.to_string())?;
            Ok(round)
        })
    });
    let raw: RoundFn<'_> = Box::new(|| {
        Box::pin(async move {
            let (url, _store) = fresh(server, "waymark_bench_mixed").await?;
            let stamps = Arc::new(Stamps::default());
            let total = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let mut clients = Vec::new();
            for _ in 0..PRODUCERS {
                clients.push(baseline::connect(&url).await?);
            }
            let (_listener, consumer) = baseline::woken_drain(&url, usize::MAX, 2, stamps.on_start()).await?;
            let clock = CpuClock::start();
            let started = Instant::now();
            let mut producers = Vec::new();
            for client in clients {
                let (stamps, total) = (stamps.clone(), total.clone());
                producers.push(tokio::spawn(async move {
                    while started.elapsed() < MIXED_FOR {
                        let n = total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let id = waymark_store::new_task_id();
                        baseline::insert_one(&client, &id, "bench.noop", "raw", &json!({ "seq": n })).await?;
                        stamps.committed(n);
                    }
                    Ok::<_, String>(())
                }));
            }
            for p in producers {
                p.await.map_err(|e| e.to_string())??;
            }
            let mut round = clock.round(stamps.seen());
            round.latency_ms = stamps.samples();
            consumer.abort();
            Ok(round)
        })
    });
    rounds(n, &mut rows, &[waymark, raw]).await?;
    Ok(rows)
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
