//! `cargo xtask bench soak [--minutes N] [--tuned]`: a steady load for a long time,
//! the way a queue lives in production. First the capacity of the soak's
//! worker settings is measured: what it settles while producers submit as
//! fast as they can beside it. Then producers offer
//! [`LOAD`] of that capacity, in small batches every few milliseconds, for
//! N minutes (15 unless said), to one worker, while the retention sweeper
//! purges what finished more than [`KEEP`] ago. Every minute it reports the
//! throughput, the submit-to-start latency of a sample of the tasks, and
//! the task table's size, dead rows and autovacuum runs; at the end, the
//! last minute beside the first and the sizes beside the first minute
//! after warm-up. CI does not run it (it takes a quarter of an hour).
//! The server has PostgreSQL's stock settings; `--tuned` gives the task
//! table's vacuum more room ([`TUNED`]), as an operator would at a high
//! rate.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use waymark_store::{NewTask, Retention, Sweeper};
use waymark_tests::db::{table_health, TableHealth};
use waymark_tests::private_cluster::PrivateCluster;

use super::measure::{percentiles, Stamps};
use super::scenarios::{fresh, until_watching, worker};
use super::MIXED_WORKER;

const DEFAULT_MINUTES: u64 = 15;
/// The share of the measured capacity offered.
const LOAD: f64 = 0.7;
/// The worker's settings: those of the mixed-load scenario.
const CONCURRENCY: usize = MIXED_WORKER.0;
const SETTLE: usize = MIXED_WORKER.1;
const PRODUCERS: usize = 4;
/// Each producer submits what it owes every tick.
const TICK: Duration = Duration::from_millis(10);
/// Terminal tasks older than this are purged...
const KEEP: Duration = Duration::from_secs(60);
/// ...by a sweep this often.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// One task in this many carries a latency stamp.
const SAMPLE_EVERY: u64 = 20;
/// Minutes before the table reaches its steady size: tasks are kept for
/// [`KEEP`], then swept.
const WARM_UP_MINUTES: usize = 2;
/// What `--tuned` changes: ten times autovacuum's stock cost limit (200),
/// and shared buffers that hold the task table's indexes.
const TUNED: [(&str, &str); 2] = [("autovacuum_vacuum_cost_limit", "2000"), ("shared_buffers", "512MB")];

pub(super) async fn soak(args: &[String]) -> Result<(), String> {
    let (minutes, tuned) = soak_args(args)?;
    // A server of its own with PostgreSQL's stock settings, autovacuum on
    // among them: how a table lives for hours depends on it, and a shared
    // server's settings (this machine's has autovacuum off) are not ours
    // to change. Durable, as the other scenarios' server is.
    let cluster = tokio::task::spawn_blocking(move || {
        let mut b = PrivateCluster::builder()
            .max_connections(100)
            .setting("fsync", "on")
            .setting("full_page_writes", "on")
            .setting("shared_buffers", "128MB")
            .setting("autovacuum", "on");
        if tuned {
            for (k, v) in TUNED {
                b = b.setting(k, v);
            }
        }
        b.start("soak")
    })
    .await
    .map_err(|e| format!("soak: starting a PostgreSQL server of its own: {e}"))?;
    let server = cluster.url("postgres");
    let settings = if tuned {
        TUNED.iter().map(|(k, v)| format!("{k} = {v}")).collect::<Vec<_>>().join(", ")
    } else {
        "stock settings".to_owned()
    };
    println!("soak: a server of its own on port {} ({settings}, autovacuum on, fsync on)", cluster.port());
    println!(
        "soak: measuring the capacity of concurrency {CONCURRENCY}, settle batch {SETTLE}, \
         with {PRODUCERS} producers submitting flat out"
    );
    let capacity = capacity(&server).await?;
    let rate = capacity * LOAD;
    println!(
        "soak: capacity {capacity:.0} tasks/s; offering {rate:.0} tasks/s ({:.0} %) for {minutes} min, \
         purging tasks finished {} s ago every {} s",
        LOAD * 100.0,
        KEEP.as_secs(),
        SWEEP_EVERY.as_secs()
    );

    let (url, store) = fresh(&server, "waymark_bench_soak").await?;
    let client = waymark_tests::db::admin_client(&url).await;
    let pickups = Arc::new(Stamps::default());
    let on_start: Arc<dyn Fn(&serde_json::Value) + Send + Sync> = {
        let stamp = pickups.on_start();
        Arc::new(move |payload| {
            if payload["seq"].as_u64().is_some_and(sampled) {
                stamp(payload)
            }
        })
    };
    let w = worker(&store, "bench", CONCURRENCY, SETTLE, on_start)?;
    let handle = w.handle();
    let run = tokio::spawn(w.run());
    until_watching(&store).await?;
    let purged = Arc::new(AtomicU64::new(0));
    let sweep_failures = Arc::new(AtomicU64::new(0));
    let sweeper = {
        let (purged, failures) = (purged.clone(), sweep_failures.clone());
        Sweeper::start(
            store.clone(),
            Retention::older_than(KEEP).interval(SWEEP_EVERY),
            Arc::new(move |out| match out {
                Ok(n) => {
                    purged.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    failures.fetch_add(1, Ordering::Relaxed);
                    eprintln!("soak: a sweep failed: {e}");
                }
            }),
        )
        .map_err(|e| e.to_string())?
    };

    let stop = Arc::new(AtomicBool::new(false));
    let submitted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let (store, pickups, stop, submitted) =
            (store.clone(), pickups.clone(), stop.clone(), submitted.clone());
        let per_producer = rate / PRODUCERS as f64;
        producers.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(TICK);
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                ticks.tick().await;
                let owed = (started.elapsed().as_secs_f64() * per_producer) as u64;
                // Behind by more than a batch: the rest goes next tick.
                let n = owed.saturating_sub(sent).min(500);
                if n == 0 {
                    continue;
                }
                // Sequence numbers interleave the producers: p, p + P, ...
                let seqs: Vec<u64> = (sent..sent + n).map(|k| k * PRODUCERS as u64 + p as u64).collect();
                let batch =
                    seqs.iter().map(|s| NewTask::new("bench.noop", json!({ "seq": s })).queue("bench"));
                store.submit_batch(batch).await.map_err(|e| format!("soak submit: {e}"))?;
                seqs.iter().copied().filter(|s| sampled(*s)).for_each(|s| pickups.committed(s));
                sent += n;
                submitted.fetch_add(n, Ordering::Relaxed);
            }
            Ok::<_, String>(())
        }));
    }

    let mut minutes_seen: Vec<Minute> = Vec::new();
    let (mut last_settled, mut last_submitted, mut last_purged) = (0u64, 0u64, 0u64);
    let first = table_health(&client).await?;
    println!(
        "\n{:>3} {:>9} {:>9} {:>13} {:>9} {:>9} {:>9} {:>9} {:>8} {:>4}",
        "min", "offered/s", "done/s", "p50/p99 ms", "table MB", "index MB", "live", "dead", "purged", "avac"
    );
    for m in 1..=minutes {
        let due = started + Duration::from_secs(60 * m);
        while Instant::now() < due {
            if producers.iter().any(|p| p.is_finished()) || run.is_finished() {
                break; // a producer failed (its error is taken below), or the worker stopped
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if producers.iter().any(|p| p.is_finished()) {
            stop.store(true, Ordering::Relaxed);
            for p in producers {
                p.await.map_err(|e| e.to_string())??;
            }
            return Err("soak: a producer stopped early".to_owned());
        }
        if run.is_finished() {
            stop.store(true, Ordering::Relaxed);
            return Err("soak: the worker stopped before the end".to_owned());
        }
        let (settled, sub, pur) =
            (handle.settled(), submitted.load(Ordering::Relaxed), purged.load(Ordering::Relaxed));
        let health = table_health(&client).await?;
        let minute = Minute {
            minute: m as usize,
            offered_per_s: (sub - last_submitted) as f64 / 60.0,
            done_per_s: (settled - last_settled) as f64 / 60.0,
            pickup_ms: Some(pickups.take_samples()).filter(|s| !s.is_empty()).map(|s| percentiles(&s)),
            health,
            purged: pur - last_purged,
        };
        (last_settled, last_submitted, last_purged) = (settled, sub, pur);
        minute.print(&first);
        minutes_seen.push(minute);
    }
    stop.store(true, Ordering::Relaxed);
    for p in producers {
        p.await.map_err(|e| e.to_string())??;
    }
    handle.shutdown();
    run.await.map_err(|e| e.to_string())?;
    sweeper.stop();
    drop(client);
    let out = summary(&minutes_seen, &first, rate, capacity, sweep_failures.load(Ordering::Relaxed));
    tokio::task::spawn_blocking(move || drop(cluster)).await.map_err(|e| e.to_string())?;
    out
}

/// Tasks per second one worker settles while the producers submit as fast
/// as they can: the rate a steady load is measured against (a drain of a
/// standing backlog alone gets the server to itself, and is faster).
async fn capacity(server: &str) -> Result<f64, String> {
    const WARM: Duration = Duration::from_secs(5);
    const MEASURED: Duration = Duration::from_secs(20);
    let (_url, store) = fresh(server, "waymark_bench_soak").await?;
    let w = worker(&store, "bench", CONCURRENCY, SETTLE, Arc::new(|_| {}))?;
    let handle = w.handle();
    let run = tokio::spawn(w.run());
    until_watching(&store).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut producers = Vec::new();
    for _ in 0..PRODUCERS {
        let (store, stop) = (store.clone(), stop.clone());
        producers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let batch = (0..100).map(|i| NewTask::new("bench.noop", json!({ "n": i })).queue("bench"));
                store.submit_batch(batch).await.map_err(|e| format!("soak submit: {e}"))?;
            }
            Ok::<_, String>(())
        }));
    }
    tokio::time::sleep(WARM).await;
    let (from, at) = (handle.settled(), Instant::now());
    tokio::time::sleep(MEASURED).await;
    let rate = (handle.settled() - from) as f64 / at.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for p in producers {
        p.await.map_err(|e| e.to_string())??;
    }
    handle.shutdown();
    run.await.map_err(|e| e.to_string())?;
    Ok(rate)
}

/// `--minutes N` (15 unless said) and `--tuned`, in any order.
fn soak_args(args: &[String]) -> Result<(u64, bool), String> {
    let (mut minutes, mut tuned) = (DEFAULT_MINUTES, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--tuned" => tuned = true,
            "--minutes" => {
                let n = it.next().ok_or("bench soak: --minutes needs a number")?;
                minutes = n.parse().ok().filter(|n| *n >= 2).ok_or(format!(
                    "bench soak: --minutes must be a whole number of at least 2, got {n:?}"
                ))?;
            }
            other => {
                return Err(format!("bench soak: unexpected argument {other:?} (takes --minutes N, --tuned)"))
            }
        }
    }
    Ok((minutes, tuned))
}

/// One minute of the soak.
struct Minute {
    minute: usize,
    offered_per_s: f64,
    done_per_s: f64,
    /// p50, p95, p99 of the sampled tasks that started this minute.
    pickup_ms: Option<[f64; 3]>,
    health: TableHealth,
    purged: u64,
}

impl Minute {
    fn print(&self, first: &TableHealth) {
        let mb = |b: i64| b as f64 / 1048576.0;
        let lat =
            self.pickup_ms.map(|l| format!("{:.1}/{:.1}", l[0], l[2])).unwrap_or_else(|| "-".to_owned());
        println!(
            "{:>3} {:>9.0} {:>9.0} {:>13} {:>9.1} {:>9.1} {:>9} {:>9} {:>8} {:>4}",
            self.minute,
            self.offered_per_s,
            self.done_per_s,
            lat,
            mb(self.health.table_bytes),
            mb(self.health.index_bytes),
            self.health.live_rows,
            self.health.dead_rows,
            self.purged,
            self.health.autovacuums - first.autovacuums
        );
    }

    fn json(&self, first: &TableHealth) -> serde_json::Value {
        json!({
            "minute": self.minute,
            "offered_per_s": self.offered_per_s,
            "done_per_s": self.done_per_s,
            "p50_ms": self.pickup_ms.map(|l| l[0]),
            "p95_ms": self.pickup_ms.map(|l| l[1]),
            "p99_ms": self.pickup_ms.map(|l| l[2]),
            "table_bytes": self.health.table_bytes,
            "index_bytes": self.health.index_bytes,
            "live_rows": self.health.live_rows,
            "dead_rows": self.health.dead_rows,
            "autovacuums": self.health.autovacuums - first.autovacuums,
            "purged": self.purged,
        })
    }
}

fn summary(
    minutes: &[Minute],
    before: &TableHealth,
    rate: f64,
    capacity: f64,
    sweep_failures: u64,
) -> Result<(), String> {
    let (Some(first), Some(last)) = (minutes.first(), minutes.last()) else {
        return Err("soak: no minute was measured".to_owned());
    };
    let warm = minutes.get(WARM_UP_MINUTES).unwrap_or(first);
    let size = |m: &Minute| (m.health.table_bytes + m.health.index_bytes) as f64;
    let p50 = |m: &Minute| m.pickup_ms.map_or(f64::NAN, |l| l[0]);
    let p99 = |m: &Minute| m.pickup_ms.map_or(f64::NAN, |l| l[2]);
    let doc = json!({
        "scenario": "soak",
        "capacity_per_s": capacity,
        "offered_per_s": rate,
        "minutes": minutes.iter().map(|m| m.json(before)).collect::<Vec<_>>(),
        "last_over_first_throughput": last.done_per_s / first.done_per_s,
        "last_over_first_p50": p50(last) / p50(first),
        "last_over_first_p99": p99(last) / p99(first),
        "size_growth_after_warm_up": size(last) / size(warm) - 1.0,
        "sweep_failures": sweep_failures,
    });
    println!(
        "\nsoak: the last minute ran {:.0} tasks/s against the first's {:.0} ({:.3}); pickup p50 {:.1} ms against \
         {:.1}, p99 {:.1} against {:.1}; table and indexes {:.1} MB after minute {} and {:.1} MB at the end ({:+.1} %); \
         {sweep_failures} sweep(s) failed",
        last.done_per_s,
        first.done_per_s,
        last.done_per_s / first.done_per_s,
        p50(last),
        p50(first),
        p99(last),
        p99(first),
        size(warm) / 1048576.0,
        warm.minute,
        size(last) / 1048576.0,
        (size(last) / size(warm) - 1.0) * 100.0,
    );
    let dir = crate::workspace_root().join("target/waymark-bench");
    let file = dir.join("soak.json");
    std::fs::create_dir_all(&dir)
        .and_then(|_| std::fs::write(&file, serde_json::to_string_pretty(&doc).unwrap_or_default()))
        .map_err(|e| format!("writing {}: {e}", file.display()))?;
    println!("soak: figures written to {}\n{doc}", file.display());
    Ok(())
}

/// Whether the task of sequence number `seq` carries a latency stamp: one
/// in [`SAMPLE_EVERY`] of each producer's tasks (sequence numbers
/// interleave the producers, so `seq` alone would pick one producer).
fn sampled(seq: u64) -> bool {
    (seq / PRODUCERS as u64).is_multiple_of(SAMPLE_EVERY)
}
