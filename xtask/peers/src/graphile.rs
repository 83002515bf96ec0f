//! graphile_worker (Rust port of Graphile Worker).
//!
//! Enqueue: `WorkerUtils::add_job` (one INSERT per call through the
//! `add_job` SQL function) and `WorkerUtils::add_jobs` (native batch: one
//! `add_jobs(specs[])` call per batch).
//! Drain "done": graphile_worker deletes a job row when it completes, so the
//! drain ends when `graphile_worker._private_jobs` is empty.

use std::sync::Arc;
use std::time::Duration;

use graphile_worker::{
    IntoTaskHandlerResult, JobSpec, LocalQueueConfig, RefetchDelayConfig, TaskHandler, Worker, WorkerContext,
    WorkerOptions, WorkerUtils,
};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::common::{
    chunks, drive_latency, err, finish_drain, Meter, Opts, Probe, Report, Result, Scenario, Settings,
    LATENCY_WARMUP,
};

pub const SYSTEM: &str = concat!("graphile_worker ", env!("PEER_VERSION_GRAPHILE_WORKER"));

const SCHEMA: &str = "graphile_worker";
/// Batch size for the untimed preload of `drain`.
const PRELOAD_BATCH: usize = 5_000;

/// The no-op task: payload `{"n": i}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Noop {
    n: u64,
}

impl TaskHandler for Noop {
    const IDENTIFIER: &'static str = "bench_noop";

    async fn run(self, ctx: WorkerContext) -> impl IntoTaskHandlerResult {
        if let Some(probe) = ctx.get_ext::<Probe>() {
            probe.hit();
        }
        Ok::<(), String>(())
    }
}

/// The latency probe: payload `{"seq": k}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Ping {
    seq: u64,
}

impl TaskHandler for Ping {
    const IDENTIFIER: &'static str = "bench_latency";

    async fn run(self, ctx: WorkerContext) -> impl IntoTaskHandlerResult {
        if let Some(probe) = ctx.get_ext::<Probe>() {
            probe.started(self.seq as usize);
        }
        Ok::<(), String>(())
    }
}

/// Worker settings; `None` leaves graphile_worker's own default in place.
#[derive(Debug, Clone, Default)]
struct Tuning {
    concurrency: Option<usize>,
    pool: Option<u32>,
    poll_ms: Option<u64>,
    /// LocalQueue size (batch-fetching jobs); `Some(0)` disables it.
    local_queue: Option<usize>,
    local_queues: Option<usize>,
    /// complete_job_batch_delay in ms; `Some(0)` disables batching.
    complete_batch_ms: Option<u64>,
    /// LocalQueue refetch delay in ms after a short fetch; `Some(0)` = none.
    refetch_ms: Option<u64>,
}

const KNOWN_KEYS: &[&str] =
    &["concurrency", "pool", "poll_ms", "local_queue", "local_queues", "complete_batch_ms", "refetch_ms"];

/// Best found for a no-op drain of 20k tasks on the 2-core reference machine
/// (see README.md). Without a LocalQueue each job slot fetches one job per
/// poll tick or NOTIFY, so a backlog drains at only concurrency/poll_interval;
/// the LocalQueue batch-fetches instead (two queues fetch in parallel) and
/// completion batching turns one DELETE per job into one per 2 ms window.
/// Concurrency beyond ~20 barely matters for no-op handlers. The 10 ms
/// refetch delay costs the drain nothing but stops an idle LocalQueue from
/// re-fetching in a tight loop (~13k empty fetches/s without it).
const TUNED: Tuning = Tuning {
    concurrency: Some(50),
    pool: Some(20),
    poll_ms: None,
    local_queue: Some(1000),
    local_queues: Some(2),
    complete_batch_ms: Some(2),
    refetch_ms: Some(10),
};

impl Tuning {
    fn from_opts(opts: &Opts) -> Result<Self> {
        opts.overrides.ensure_known(KNOWN_KEYS)?;
        let mut t = match opts.settings {
            Settings::Tuned => TUNED,
            Settings::Default => Tuning::default(),
        };
        let o = &opts.overrides;
        if let Some(v) = o.usize("concurrency")? {
            t.concurrency = Some(v.max(1));
        }
        if let Some(v) = o.usize("pool")? {
            t.pool = Some(v.max(1) as u32);
        }
        if let Some(v) = o.usize("poll_ms")? {
            t.poll_ms = Some(v as u64);
        }
        if let Some(v) = o.usize("local_queue")? {
            t.local_queue = Some(v);
        }
        if let Some(v) = o.usize("local_queues")? {
            t.local_queues = Some(v.max(1));
        }
        if let Some(v) = o.usize("complete_batch_ms")? {
            t.complete_batch_ms = Some(v as u64);
        }
        if let Some(v) = o.usize("refetch_ms")? {
            t.refetch_ms = Some(v as u64);
        }
        Ok(t)
    }

    fn describe(&self, opts: &Opts) -> String {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut parts = vec![match self.concurrency {
            Some(c) => format!("concurrency {c}"),
            None => format!("concurrency {cpus} (default: num_cpus)"),
        }];
        parts.push(match self.pool {
            Some(p) => format!("pool {p}"),
            None => "pool 20 (default)".into(),
        });
        parts.push(match self.poll_ms {
            Some(p) => format!("poll_interval {p}ms"),
            None => "poll_interval 1000ms (default)".into(),
        });
        parts.push("LISTEN/NOTIFY on (default)".into());
        parts.push(match (self.local_queue, self.local_queues) {
            (Some(n), q) if n > 0 => {
                let refetch = match self.refetch_ms {
                    Some(ms) if ms > 0 => format!(" refetch_delay {ms}ms"),
                    _ => String::new(),
                };
                format!("local_queue size {n} x{}{refetch}", q.unwrap_or(1))
            }
            _ => "no local_queue (default)".into(),
        });
        parts.push(match self.complete_batch_ms {
            Some(ms) if ms > 0 => format!("complete_job_batch_delay {ms}ms"),
            _ => "no completion batching (default)".into(),
        });
        let name = match opts.settings {
            Settings::Tuned => "tuned",
            Settings::Default => "default",
        };
        let custom = if opts.overrides.is_empty() { "" } else { " +overrides" };
        format!("{name}{custom}: {}", parts.join(", "))
    }

    fn options(&self, url: &str) -> WorkerOptions {
        // Not a performance setting: lets SIGINT/SIGTERM from the bench
        // driver end this process right away instead of a graceful drain.
        let mut o =
            WorkerOptions::default().database_url(url).schema(SCHEMA).listen_os_shutdown_signals(false);
        if let Some(c) = self.concurrency {
            o = o.concurrency(c);
        }
        if let Some(p) = self.pool {
            o = o.max_pg_conn(p);
        }
        if let Some(ms) = self.poll_ms {
            o = o.poll_interval(Duration::from_millis(ms));
        }
        if let Some(size) = self.local_queue.filter(|n| *n > 0) {
            let mut cfg = LocalQueueConfig::default().with_size(size);
            if let Some(q) = self.local_queues {
                cfg = cfg.with_queue_count(q);
            }
            if let Some(ms) = self.refetch_ms.filter(|ms| *ms > 0) {
                cfg = cfg.with_refetch_delay(
                    RefetchDelayConfig::default().with_duration(Duration::from_millis(ms)),
                );
            }
            o = o.local_queue(cfg);
        }
        if let Some(ms) = self.complete_batch_ms.filter(|ms| *ms > 0) {
            o = o.complete_job_batch_delay(Duration::from_millis(ms));
        }
        o
    }
}

pub async fn run(opts: &Opts) -> Result<Report> {
    let tuning = Tuning::from_opts(opts)?;
    let settings = tuning.describe(opts);
    eprintln!("[graphile] {settings}");
    match opts.scenario {
        Scenario::EnqueueSingle | Scenario::EnqueueBatch => enqueue(opts, &tuning, settings).await,
        Scenario::Drain => drain(opts, &tuning, settings).await,
        Scenario::Latency => latency(opts, &tuning, settings).await,
    }
}

/// Builds the worker; `init()` connects and migrates the schema.
async fn init(opts: &Opts, tuning: &Tuning, probe: &Probe) -> Result<Worker> {
    let worker = tuning
        .options(&opts.url)
        .define_job::<Noop>()
        .define_job::<Ping>()
        .add_extension(probe.clone())
        .init()
        .await
        .map_err(|e| err(format!("graphile_worker init/migrate failed: {e}")))?;
    Ok(worker)
}

async fn jobs_left(pool: &PgPool) -> Result<i64> {
    // SCHEMA is "graphile_worker"; sqlx wants a literal statement.
    const SQL: &str = "select count(*) from graphile_worker._private_jobs";
    Ok(sqlx::query_scalar::<_, i64>(SQL).fetch_one(pool).await?)
}

async fn add_in_batches(utils: &WorkerUtils, range: std::ops::Range<usize>) -> Result<()> {
    let spec = JobSpec::default();
    let jobs: Vec<(Noop, &JobSpec)> = range.map(|n| (Noop { n: n as u64 }, &spec)).collect();
    let added = utils.add_jobs(&jobs).await?;
    if added.len() != jobs.len() {
        return Err(err(format!("add_jobs returned {} jobs for a batch of {}", added.len(), jobs.len())));
    }
    Ok(())
}

async fn enqueue(opts: &Opts, tuning: &Tuning, settings: String) -> Result<Report> {
    let n = opts.tasks;
    let probe = Probe::new(n);
    let worker = init(opts, tuning, &probe).await?;
    let utils = worker.create_utils();
    let mut report = Report::new(SYSTEM, opts.scenario, &settings, n);

    let meter = Meter::start();
    if opts.scenario == Scenario::EnqueueSingle {
        for i in 0..n {
            utils.add_job(Noop { n: i as u64 }, JobSpec::default()).await?;
        }
    } else {
        for range in chunks(n, opts.batch) {
            add_in_batches(&utils, range).await?;
        }
        report
            .set("batch", opts.batch)
            .set("batch_api", "WorkerUtils::add_jobs (native: one add_jobs() SQL call per batch)");
    }
    let measured = meter.finish();
    report.measured(n, &measured);
    if opts.scenario == Scenario::EnqueueSingle {
        report.set("api", "WorkerUtils::add_job (one add_job() SQL call per task)");
    }

    let stored = jobs_left(worker.pg_pool()).await?;
    if stored != n as i64 {
        return Err(err(format!("expected {n} stored jobs, found {stored}")));
    }
    Ok(report)
}

async fn drain(opts: &Opts, tuning: &Tuning, settings: String) -> Result<Report> {
    let n = opts.tasks;
    let probe = Probe::new(n);
    let worker = Arc::new(init(opts, tuning, &probe).await?);
    let utils = worker.create_utils();

    eprintln!("[graphile] preloading {n} jobs (untimed)");
    for range in chunks(n, PRELOAD_BATCH) {
        add_in_batches(&utils, range).await?;
    }
    let observer = PgPoolOptions::new().max_connections(1).connect(&opts.url).await?;
    let stored = jobs_left(&observer).await?;
    if stored != n as i64 {
        return Err(err(format!("expected {n} preloaded jobs, found {stored}")));
    }

    let mut report = Report::new(SYSTEM, opts.scenario, &settings, n);
    eprintln!("[graphile] draining");
    let meter = Meter::start();
    let runner = {
        let worker = Arc::clone(&worker);
        tokio::spawn(async move { worker.run().await })
    };
    let timed = finish_drain(&mut report, &meter, &probe, n, opts.timeout, || {
        let pool = observer.clone();
        async move { jobs_left(&pool).await }
    })
    .await;
    stop(&worker, runner, opts.timeout).await?;
    if timed? {
        report.set(
            "done",
            "handler ran N times AND graphile_worker deleted all N job rows (its completion record)",
        );
    }
    Ok(report)
}

async fn latency(opts: &Opts, tuning: &Tuning, settings: String) -> Result<Report> {
    let samples = opts.samples;
    let probe = Probe::with_starts(samples);
    let worker = Arc::new(init(opts, tuning, &probe).await?);
    let utils = worker.create_utils();
    let runner = {
        let worker = Arc::clone(&worker);
        tokio::spawn(async move { worker.run().await })
    };
    tokio::time::sleep(LATENCY_WARMUP).await;

    let mut report = Report::new(SYSTEM, opts.scenario, &settings, samples);
    let driven = drive_latency(&mut report, &probe, samples, |seq| {
        let utils = utils.clone();
        async move {
            utils.add_job(Ping { seq: seq as u64 }, JobSpec::default()).await?;
            Ok(())
        }
    })
    .await;
    stop(&worker, runner, opts.timeout).await?;
    driven?;
    Ok(report)
}

async fn stop(
    worker: &Worker,
    runner: tokio::task::JoinHandle<Result<(), graphile_worker::runner::WorkerRuntimeError>>,
    timeout: Duration,
) -> Result<()> {
    worker.request_shutdown();
    match tokio::time::timeout(timeout, runner).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(err(format!("graphile_worker run failed: {e}"))),
        Ok(Err(e)) => Err(err(format!("graphile_worker run task panicked: {e}"))),
        Err(_) => Err(err("graphile_worker did not shut down in time")),
    }
}
