//! The scenarios, each waymark beside the raw-SQL baseline: enqueue one by
//! one and in batches, drain, pickup latency, and a mixed load.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, NewTask, Store};
use waymark_worker::{HandlerOptions, Worker, WorkerBuilder};

use super::measure::{CpuClock, Round, Stamps};
use super::{
    baseline, chart, peers, python, rounds, RoundFn, Row, BATCH, DRAIN_SETTINGS, LATENCY_TASKS, MIXED_FOR,
    MIXED_WORKER, TASKS,
};

/// A fresh database with waymark's tables, and a store on it. Both systems
/// talk plain TCP: the baseline has no TLS, and a server with `ssl = on`
/// would otherwise encrypt waymark's traffic under the default `prefer`.
pub(super) async fn fresh(server: &str, name: &str) -> Result<(String, Arc<Store<PgPool>>), String> {
    let url = crate::demo::fresh_database(server, name).await?;
    let url = format!("{url}{}sslmode=disable", if url.contains('?') { '&' } else { '?' });
    let pool = PgPool::builder(&url).max_size(16).build().map_err(|e| e.to_string())?;
    let store = Store::connect(pool, ConnectOptions::default()).await.map_err(|e| e.to_string())?;
    Ok((url, Arc::new(store)))
}

pub(super) async fn enqueue_single(
    server: &str,
    producers: usize,
    n: usize,
    peers: Option<&Path>,
) -> Result<Vec<Row>, String> {
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
    let mut runs = vec![waymark, raw];
    if producers == 1 {
        let (peer_rows, peer_runs) = peers::contestants(peers, server, "enqueue-single", &detail);
        rows.extend(peer_rows);
        runs.extend(peer_runs);
    }
    rounds(n, &mut rows, &runs).await?;
    Ok(rows)
}

pub(super) async fn enqueue_batch(server: &str, n: usize, peers: Option<&Path>) -> Result<Vec<Row>, String> {
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
    let (peer_rows, peer_runs) = peers::contestants(peers, server, "enqueue-batch", &detail);
    rows.extend(peer_rows);
    let runs: Vec<RoundFn<'_>> = [waymark, raw].into_iter().chain(peer_runs).collect();
    rounds(n, &mut rows, &runs).await?;
    Ok(rows)
}

/// Fills `queue` with `n` no-op tasks, in batches.
pub(super) async fn backlog(store: &Store<PgPool>, queue: &str, n: usize) -> Result<(), String> {
    backlog_of(store, n, |i| NewTask::new("bench.noop", json!({ "n": i })).queue(queue)).await
}

/// `n` tasks made by `task`, submitted in batches of [`BATCH`].
pub(super) async fn backlog_of(
    store: &Store<PgPool>,
    n: usize,
    task: impl Fn(usize) -> NewTask,
) -> Result<(), String> {
    for chunk in (0..n).collect::<Vec<_>>().chunks(BATCH) {
        let batch: Vec<NewTask> = chunk.iter().map(|&i| task(i)).collect();
        store.submit_batch(batch).await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

pub(super) fn worker(
    store: &Arc<Store<PgPool>>,
    queue: &str,
    concurrency: usize,
    settle: usize,
    on_start: Arc<dyn Fn(&serde_json::Value) + Send + Sync>,
) -> Result<Worker<PgPool>, String> {
    worker_builder(store, queue, concurrency, settle, on_start).build().map_err(|e| e.to_string())
}

/// Waits until `store` hears queued signals (its LISTEN hub is up), as
/// the baseline's listener is before its producers start: a round's first
/// tasks would otherwise be found by the worker's poll, not its signal.
/// On a database dropped and created again under the same name (every
/// round), the registry's hub of the round before is still reconnecting,
/// with backoff, for up to several hundred milliseconds.
pub(super) async fn until_watching(store: &Store<PgPool>) -> Result<(), String> {
    let started = Instant::now();
    while !store.is_watching() {
        if started.elapsed() > Duration::from_secs(30) {
            return Err("bench: the worker's listener did not come up within 30 s".to_owned());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// The bench's worker before it is built: one no-op handler on `queue`,
/// declared quick (`HandlerOptions::quick`), as a user would declare a
/// handler that never blocks.
pub(super) fn worker_builder(
    store: &Arc<Store<PgPool>>,
    queue: &str,
    concurrency: usize,
    settle: usize,
    on_start: Arc<dyn Fn(&serde_json::Value) + Send + Sync>,
) -> WorkerBuilder<PgPool> {
    Worker::builder(store.clone())
        .queues([queue])
        .concurrency(concurrency)
        .settle_batch(settle, Duration::from_millis(2))
        .poll_interval(Duration::from_millis(200))
        .task_with("bench.noop", HandlerOptions::new().quick(), move |_ctx, p: serde_json::Value| {
            on_start(&p);
            async move { Ok(()) }
        })
}

/// One waymark drain of a fresh backlog of [`TASKS`].
pub(super) async fn waymark_drain(server: &str, concurrency: usize, settle: usize) -> Result<Round, String> {
    observed_drain(server, concurrency, settle, None).await
}

/// [`waymark_drain`] on a store with `observer` installed (before the
/// backlog is submitted, so the tasks carry what it adds).
pub(super) async fn observed_drain(
    server: &str,
    concurrency: usize,
    settle: usize,
    observer: Option<Arc<dyn waymark_store::Observer>>,
) -> Result<Round, String> {
    let (_url, store) = fresh(server, "waymark_bench_drain").await?;
    let store = match observer {
        Some(o) => {
            let options = ConnectOptions::new().observer(o);
            Arc::new(Store::with_options(store.executor().clone(), options).map_err(|e| e.to_string())?)
        }
        None => store,
    };
    backlog(&store, "bench", TASKS).await?;
    drain_with(worker(&store, "bench", concurrency, settle, Arc::new(|_| {}))?).await
}

/// Runs `w` until it has settled [`TASKS`], timed from its start.
pub(super) async fn drain_with(w: Worker<PgPool>) -> Result<Round, String> {
    drain_until(w, TASKS).await
}

/// Runs `w` until it has settled `tasks`, timed from its start.
pub(super) async fn drain_until(w: Worker<PgPool>, tasks: usize) -> Result<Round, String> {
    let handle = w.handle();
    let clock = CpuClock::start();
    let run = tokio::spawn(w.run());
    // Woken by the settlement that reaches the count: a poll every few
    // milliseconds would add its own wakeups to the worker's measured CPU.
    if tokio::time::timeout(Duration::from_secs(120), handle.until_settled(tasks as u64)).await.is_err() {
        handle.shutdown();
        return Err("drain: waymark did not finish in 120 s".to_owned());
    }
    let round = clock.round(tasks);
    handle.shutdown();
    run.await.map_err(|e| e.to_string())?;
    Ok(round)
}

/// A drain as a user who sets nothing gets it: the pool's and the
/// worker's defaults, only the queue and the handler named.
async fn default_drain(server: &str) -> Result<Round, String> {
    let (url, _) = fresh(server, "waymark_bench_drain").await?;
    let pool = PgPool::builder(&url).build().map_err(|e| e.to_string())?;
    let store = Arc::new(Store::connect(pool, ConnectOptions::default()).await.map_err(|e| e.to_string())?);
    backlog(&store, "bench", TASKS).await?;
    let w = Worker::builder(store)
        .queues(["bench"])
        .task("bench.noop", |_ctx, _p: serde_json::Value| async move { Ok(()) })
        .build()
        .map_err(|e| e.to_string())?;
    drain_with(w).await
}

pub(super) async fn drain(server: &str, n: usize, peers: Option<&Path>) -> Result<Vec<Row>, String> {
    let mut rows: Vec<Row> = DRAIN_SETTINGS
        .iter()
        .map(|(c, s)| {
            Row::new("waymark", "drain", format!("concurrency {c}, settle batch {s}, quick handler"))
        })
        .collect();
    rows.push(Row::new("waymark", "drain", "default settings (concurrency 10, settle batch 64)"));
    rows.push(Row::new(baseline::SYSTEM, "drain", "2 connections, claims of 500"));
    let mut runs: Vec<RoundFn<'_>> = DRAIN_SETTINGS
        .iter()
        .map(|&(c, s)| -> RoundFn<'_> { Box::new(move || Box::pin(waymark_drain(server, c, s))) })
        .collect();
    runs.push(Box::new(|| Box::pin(default_drain(server))));
    runs.push(Box::new(|| {
        Box::pin(async move {
            let (url, store) = fresh(server, "waymark_bench_drain").await?;
            backlog(&store, "bench", TASKS).await?;
            let clock = CpuClock::start();
            baseline::drain(&url, "bench", TASKS, 2, 500, Arc::new(|_| {}), None).await?;
            Ok(clock.round(TASKS))
        })
    }));
    let (peer_rows, peer_runs) = peers::contestants(peers, server, "drain", "");
    let peer_count = peer_rows.len();
    rows.extend(peer_rows);
    runs.extend(peer_runs);
    rounds(n, &mut rows, &runs).await?;

    let peer_rows = rows.split_off(rows.len() - peer_count);
    let base = rows.pop().expect("the baseline row");
    let defaults = rows.pop().expect("the default settings' row");
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
    println!(
        "drain: waymark at its default settings -> {:.0} tasks/s, {:.2} of its best setting ({})",
        defaults.tasks_per_s(),
        defaults.tasks_per_s() / best.tasks_per_s(),
        best.detail
    );
    Ok([Some(best), Some(defaults), Some(base), reference].into_iter().flatten().chain(peer_rows).collect())
}

pub(super) async fn latency(server: &str, n: usize, peers: Option<&Path>) -> Result<Vec<Row>, String> {
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
            until_watching(&store).await?;
            tokio::time::sleep(Duration::from_millis(500)).await; // idle
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
    let (peer_rows, peer_runs) = peers::contestants(peers, server, "latency", &detail);
    rows.extend(peer_rows);
    let runs: Vec<RoundFn<'_>> = [waymark, raw].into_iter().chain(peer_runs).collect();
    rounds(n, &mut rows, &runs).await?;
    Ok(rows)
}

pub(super) async fn mixed(server: &str, n: usize) -> Result<Vec<Row>, String> {
    const PRODUCERS: usize = 4;
    let detail = format!("{PRODUCERS} producers + 1 worker, {}s", MIXED_FOR.as_secs());
    let mut rows = vec![Row::new("waymark", "mixed", &detail), Row::new(baseline::SYSTEM, "mixed", &detail)];
    let waymark: RoundFn<'_> = Box::new(|| {
        Box::pin(async move {
            let (_, store) = fresh(server, "waymark_bench_mixed").await?;
            let stamps = Arc::new(Stamps::default());
            let (concurrency, settle) = MIXED_WORKER;
            let w = worker(&store, "bench", concurrency, settle, stamps.on_start())?;
            let handle = w.handle();
            let run = tokio::spawn(w.run());
            until_watching(&store).await?;
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

/// Retention: a sweep of TASKS terminal tasks, 1000 per purge, through
/// `Store::sweep` beside the same deletes written by hand.
pub(super) async fn sweep(server: &str, n: usize) -> Result<Vec<Row>, String> {
    const HOUR_MS: i64 = 3_600_000;
    const PER_PURGE: i64 = 1000;
    let detail = format!("{TASKS} terminal tasks, {PER_PURGE} per purge");
    let mut rows = vec![Row::new("waymark", "sweep", &detail), Row::new(baseline::SYSTEM, "sweep", &detail)];
    // The same backlog for both: TASKS tasks that succeeded two hours ago.
    async fn aged(server: &str) -> Result<(Arc<Store<PgPool>>, tokio_postgres::Client), String> {
        let (url, store) = fresh(server, "waymark_bench_sweep").await?;
        backlog(&store, "bench", TASKS).await?;
        let client = baseline::connect(&url).await?;
        baseline::age_all(&client, 2 * HOUR_MS).await?;
        Ok((store, client))
    }
    let waymark: RoundFn<'_> = Box::new(|| {
        Box::pin(async move {
            let (store, _client) = aged(server).await?;
            let retention =
                waymark_store::Retention::older_than(Duration::from_millis(HOUR_MS as u64)).batch(PER_PURGE);
            let clock = CpuClock::start();
            let deleted = store.sweep(&retention).await.map_err(|e| e.to_string())?;
            let round = clock.round(TASKS);
            check_swept(deleted)?;
            Ok(round)
        })
    });
    let raw: RoundFn<'_> = Box::new(|| {
        Box::pin(async move {
            let (_store, client) = aged(server).await?;
            let clock = CpuClock::start();
            let deleted = baseline::purge_all(&client, HOUR_MS, PER_PURGE).await?;
            let round = clock.round(TASKS);
            check_swept(deleted)?;
            Ok(round)
        })
    });
    rounds(n, &mut rows, &[waymark, raw]).await?;
    Ok(rows)
}

fn check_swept(deleted: u64) -> Result<(), String> {
    if deleted as usize == TASKS {
        Ok(())
    } else {
        Err(format!("bench sweep: deleted {deleted} of {TASKS} terminal tasks"))
    }
}
