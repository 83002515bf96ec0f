//! apalis 1.x with the apalis-postgres backend.
//!
//! Enqueue: `TaskSink::push` (one INSERT in its own transaction per task) and
//! `TaskSink::push_bulk` (native batch: the sink buffers the whole Vec and
//! writes it with one multi-row `INSERT ... SELECT unnest(...)`).
//! Drain "done": apalis-postgres keeps finished rows and sets
//! `status = 'Done'` when it acknowledges a result (persist_results, on by
//! default); the drain ends when no row of the queue is in another status.

use std::time::Duration;

use ::apalis::layers::limit::ConcurrencyLimitLayer;
use ::apalis::prelude::{
    BackendExt, BoxDynError, Data, ParallelizeExt, Strategy, TaskSink, WorkerBuilder, WorkerBuilderExt,
    WorkerContext, WorkerError,
};
use apalis_postgres::{Config, PostgresStorage, Pubsub};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::task::JoinHandle;

use crate::common::{
    chunks, drive_latency, err, finish_drain, Meter, Opts, Probe, Report, Result, Scenario, Settings,
    LATENCY_WARMUP,
};

pub const SYSTEM: &str = concat!(
    "apalis-postgres ",
    env!("PEER_VERSION_APALIS_POSTGRES"),
    " (apalis ",
    env!("PEER_VERSION_APALIS"),
    ")"
);

const NOOP_QUEUE: &str = "bench_noop";
const PING_QUEUE: &str = "bench_latency";
/// Batch size for the untimed preload of `drain`.
const PRELOAD_BATCH: usize = 5_000;

/// The no-op task: payload `{"n": i}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Noop {
    n: u64,
}

/// The latency probe: payload `{"seq": k}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ping {
    seq: u64,
}

async fn handle_noop(_task: Noop, probe: Data<Probe>) -> Result<(), BoxDynError> {
    probe.hit();
    Ok(())
}

async fn handle_ping(task: Ping, probe: Data<Probe>) -> Result<(), BoxDynError> {
    probe.started(task.seq as usize);
    Ok(())
}

/// Worker settings; `None`/`false` leaves apalis' own default in place.
#[derive(Debug, Clone, Default)]
struct Tuning {
    /// sqlx pool size; `None` = `PgPool::connect` (sqlx default, 10).
    pool: Option<u32>,
    /// `Config::batch_size` (tasks fetched per poll); default 10.
    batch: Option<usize>,
    /// `Config::lock_tasks`; default true (an extra UPDATE to 'Running').
    lock_tasks: Option<bool>,
    /// `with_pubsub()`: LISTEN for inserts to wake an idle worker.
    pubsub: bool,
    /// Interval poll strategy for an idle worker, in ms.
    poll_ms: Option<u64>,
    /// Number of workers consuming the queue, each with its own fetch loop.
    workers: usize,
    /// `.concurrency(n)` limit per worker; `None` = unbounded.
    concurrency: Option<usize>,
    /// `.parallelize(tokio::spawn)`: run each task on its own tokio task.
    parallelize: bool,
}

const KNOWN_KEYS: &[&str] =
    &["pool", "batch", "lock_tasks", "pubsub", "poll_ms", "workers", "concurrency", "parallelize"];

fn default_tuning() -> Tuning {
    Tuning { workers: 1, ..Tuning::default() }
}

/// Best found for a no-op drain of 20k tasks on the 2-core reference machine
/// (see README.md). One apalis worker runs fetch -> execute -> ack strictly
/// in turn, so throughput comes from bigger fetch batches and from several
/// workers on the same queue (plateau from ~4 workers x 500-1000). pubsub
/// wakes an idle worker on insert; the 1 s poll is only a safety net, like
/// graphile_worker's default poll interval.
fn tuned() -> Tuning {
    Tuning {
        pool: Some(20),
        batch: Some(1000),
        lock_tasks: None,
        pubsub: true,
        poll_ms: Some(1000),
        workers: 4,
        concurrency: None,
        parallelize: false,
    }
}

impl Tuning {
    fn from_opts(opts: &Opts) -> Result<Self> {
        opts.overrides.ensure_known(KNOWN_KEYS)?;
        let mut t = match opts.settings {
            Settings::Tuned => tuned(),
            Settings::Default => default_tuning(),
        };
        let o = &opts.overrides;
        if let Some(v) = o.usize("pool")? {
            t.pool = Some(v.max(1) as u32);
        }
        if let Some(v) = o.usize("batch")? {
            t.batch = Some(v.max(1));
        }
        if let Some(v) = o.bool("lock_tasks")? {
            t.lock_tasks = Some(v);
        }
        if let Some(v) = o.bool("pubsub")? {
            t.pubsub = v;
        }
        if let Some(v) = o.usize("poll_ms")? {
            t.poll_ms = (v > 0).then_some(v as u64);
        }
        if let Some(v) = o.usize("workers")? {
            t.workers = v.max(1);
        }
        if let Some(v) = o.usize("concurrency")? {
            t.concurrency = (v > 0).then_some(v);
        }
        if let Some(v) = o.bool("parallelize")? {
            t.parallelize = v;
        }
        Ok(t)
    }

    fn describe(&self, opts: &Opts) -> String {
        let mut parts = vec![format!("workers {}", self.workers)];
        parts.push(match self.concurrency {
            Some(c) => format!("concurrency {c} per worker"),
            None => "unbounded in-flight per worker (default: no concurrency layer)".into(),
        });
        if self.parallelize {
            parts.push("parallelize(tokio::spawn)".into());
        }
        parts.push(match self.batch {
            Some(b) => format!("batch_size {b}"),
            None => "batch_size 10 (default)".into(),
        });
        parts.push(match self.lock_tasks {
            Some(l) => format!("lock_tasks {l}"),
            None => "lock_tasks true (default)".into(),
        });
        parts.push("persist_results true (default)".into());
        parts.push(match self.pool {
            Some(p) => format!("pool {p}"),
            None => "pool 10 (sqlx default)".into(),
        });
        parts.push(match (self.pubsub, self.poll_ms) {
            (false, None) => "no pubsub, no poll strategy (default)".into(),
            (true, None) => "pubsub".into(),
            (false, Some(ms)) => format!("poll every {ms}ms"),
            (true, Some(ms)) => format!("pubsub + poll every {ms}ms"),
        });
        let name = match opts.settings {
            Settings::Tuned => "tuned",
            Settings::Default => "default",
        };
        let custom = if opts.overrides.is_empty() { "" } else { " +overrides" };
        format!("{name}{custom}: {}", parts.join(", "))
    }

    fn config(&self, queue: &str) -> Config {
        let mut c = Config::default().queue(queue);
        if let Some(b) = self.batch {
            c = c.batch_size(b);
        }
        if let Some(l) = self.lock_tasks {
            c = c.lock_tasks(l);
        }
        c
    }

    async fn connect(&self, url: &str) -> Result<PgPool> {
        Ok(match self.pool {
            Some(p) => PgPoolOptions::new().max_connections(p).connect(url).await?,
            None => PgPool::connect(url).await?,
        })
    }

    /// How an idle worker learns about new tasks. An empty [`Strategy`]
    /// behaves like a bare `PostgresStorage` (only its own wakeups).
    fn strategy(&self, pool: &PgPool, queue: &str) -> Strategy {
        let mut s = Strategy::new();
        if self.pubsub {
            s = s.stream(Pubsub::new(pool.clone(), queue.to_owned()));
        }
        if let Some(ms) = self.poll_ms {
            s = s.interval(Duration::from_millis(ms));
        }
        s
    }
}

pub async fn run(opts: &Opts) -> Result<Report> {
    let tuning = Tuning::from_opts(opts)?;
    let settings = tuning.describe(opts);
    eprintln!("[apalis] {settings}");
    let pool = tuning.connect(&opts.url).await?;
    PostgresStorage::setup(&pool)
        .await
        .map_err(|e| err(format!("apalis-postgres setup/migrate failed: {e}")))?;
    match opts.scenario {
        Scenario::EnqueueSingle | Scenario::EnqueueBatch => enqueue(opts, &tuning, &pool, settings).await,
        Scenario::Drain => drain(opts, &tuning, &pool, settings).await,
        Scenario::Latency => latency(opts, &tuning, &pool, settings).await,
    }
}

async fn count_queue(pool: &PgPool, queue: &str, not_done: bool) -> Result<i64> {
    let sql = if not_done {
        "select count(*) from apalis.jobs where job_type = $1 and status::text <> 'Done'"
    } else {
        "select count(*) from apalis.jobs where job_type = $1"
    };
    Ok(sqlx::query_scalar::<_, i64>(sql).bind(queue).fetch_one(pool).await?)
}

fn noop_batch(range: std::ops::Range<usize>) -> Vec<Noop> {
    range.map(|n| Noop { n: n as u64 }).collect()
}

async fn enqueue(opts: &Opts, tuning: &Tuning, pool: &PgPool, settings: String) -> Result<Report> {
    let n = opts.tasks;
    let mut storage = PostgresStorage::<Noop>::new(pool).with_config(tuning.config(NOOP_QUEUE));
    let mut report = Report::new(SYSTEM, opts.scenario, &settings, n);

    let meter = Meter::start();
    if opts.scenario == Scenario::EnqueueSingle {
        for i in 0..n {
            storage.push(Noop { n: i as u64 }).await?;
        }
    } else {
        for range in chunks(n, opts.batch) {
            storage.push_bulk(noop_batch(range)).await?;
        }
    }
    let measured = meter.finish();
    report.measured(n, &measured);
    if opts.scenario == Scenario::EnqueueSingle {
        report.set("api", "TaskSink::push (one transaction + INSERT per task)");
    } else {
        report
            .set("batch", opts.batch)
            .set("batch_api", "TaskSink::push_bulk (native: one multi-row INSERT ... unnest() per batch)");
    }

    let stored = count_queue(pool, NOOP_QUEUE, false).await?;
    if stored != n as i64 {
        return Err(err(format!("expected {n} stored tasks, found {stored}")));
    }
    Ok(report)
}

type Runner = JoinHandle<Result<(), WorkerError>>;

/// Starts `tuning.workers` workers on `queue` running `$handler`.
macro_rules! start_workers {
    ($tuning:expr, $pool:expr, $queue:expr, $args:ty, $probe:expr, $handler:expr) => {{
        let tuning: &Tuning = $tuning;
        let mut started: Vec<(WorkerContext, Runner)> = Vec::new();
        for i in 0..tuning.workers {
            let ctx = WorkerContext::new(&format!("bench-{}-{i}", $queue));
            let backend = PostgresStorage::<$args>::new($pool)
                .with_config(tuning.config($queue))
                .poll_with_strategy(tuning.strategy($pool, $queue));
            let builder = WorkerBuilder::new(&ctx)
                .backend(backend)
                .data($probe.clone())
                .option_layer(tuning.concurrency.map(ConcurrencyLimitLayer::new));
            let runner: Runner = if tuning.parallelize {
                tokio::spawn(builder.parallelize(tokio::spawn).build($handler).run())
            } else {
                tokio::spawn(builder.build($handler).run())
            };
            started.push((ctx, runner));
        }
        started
    }};
}

async fn stop_workers(workers: Vec<(WorkerContext, Runner)>, timeout: Duration) -> Result<()> {
    for (ctx, _) in &workers {
        // Fails only if the worker never started or already stopped.
        let _ = ctx.stop();
    }
    for (ctx, runner) in workers {
        match tokio::time::timeout(timeout, runner).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => return Err(err(format!("apalis worker {} failed: {e}", ctx.name()))),
            Ok(Err(e)) => return Err(err(format!("apalis worker task panicked: {e}"))),
            Err(_) => return Err(err(format!("apalis worker {} did not stop in time", ctx.name()))),
        }
    }
    Ok(())
}

async fn drain(opts: &Opts, tuning: &Tuning, pool: &PgPool, settings: String) -> Result<Report> {
    let n = opts.tasks;
    let probe = Probe::new(n);
    let mut storage = PostgresStorage::<Noop>::new(pool).with_config(tuning.config(NOOP_QUEUE));
    eprintln!("[apalis] preloading {n} tasks (untimed)");
    for range in chunks(n, PRELOAD_BATCH) {
        storage.push_bulk(noop_batch(range)).await?;
    }
    let observer = PgPoolOptions::new().max_connections(1).connect(&opts.url).await?;
    let stored = count_queue(&observer, NOOP_QUEUE, false).await?;
    if stored != n as i64 {
        return Err(err(format!("expected {n} preloaded tasks, found {stored}")));
    }

    let mut report = Report::new(SYSTEM, opts.scenario, &settings, n);
    eprintln!("[apalis] draining");
    let meter = Meter::start();
    let workers = start_workers!(tuning, pool, NOOP_QUEUE, Noop, probe, handle_noop);
    let timed = finish_drain(&mut report, &meter, &probe, n, opts.timeout, || {
        let pool = observer.clone();
        async move { count_queue(&pool, NOOP_QUEUE, true).await }
    })
    .await;
    stop_workers(workers, opts.timeout).await?;
    if timed? {
        report.set(
            "done",
            "handler ran N times AND apalis-postgres marked all N rows status='Done' (its completion record)",
        );
    }
    Ok(report)
}

async fn latency(opts: &Opts, tuning: &Tuning, pool: &PgPool, settings: String) -> Result<Report> {
    let samples = opts.samples;
    let probe = Probe::with_starts(samples);
    let storage = PostgresStorage::<Ping>::new(pool).with_config(tuning.config(PING_QUEUE));
    let workers = start_workers!(tuning, pool, PING_QUEUE, Ping, probe, handle_ping);
    tokio::time::sleep(LATENCY_WARMUP).await;

    let mut report = Report::new(SYSTEM, opts.scenario, &settings, samples);
    let driven = drive_latency(&mut report, &probe, samples, |seq| {
        let mut storage = storage.clone();
        async move {
            storage.push(Ping { seq: seq as u64 }).await?;
            Ok(())
        }
    })
    .await;
    stop_workers(workers, opts.timeout).await?;
    driven?;
    Ok(report)
}
