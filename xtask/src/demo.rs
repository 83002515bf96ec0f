//! `cargo xtask demo`: the main job, end to end. Finds or starts PostgreSQL,
//! migrates a fresh `waymark_demo` database, submits tasks, and runs a real
//! `waymark-worker` over them with a progress bar and a per-second rate,
//! twice: with settlement batching (the default) and without, then reports
//! both.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::{NewTask, Store, TaskStatus};
use waymark_worker::Worker;

const DEFAULT_TASKS: usize = 5_000;
const PRODUCERS: usize = 8;
const CONCURRENCY: usize = 64;

#[derive(Deserialize)]
struct Square {
    n: i64,
}

#[derive(Serialize)]
struct Squared {
    square: i64,
}

pub async fn run(args: &[String]) -> Result<(), String> {
    let mut tasks = DEFAULT_TASKS;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--tasks" => {
                tasks = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n > 0)
                    .ok_or("--tasks needs a positive number")?;
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
    let report = store.prepare().await.map_err(|e| e.to_string())?;
    println!("migrated: {} migrations applied", report.applied.len());

    let mut rates = Vec::new();
    for (label, batch) in
        [("batched settlement (64 per commit, 2 ms window)", 64), ("one commit per settlement", 1)]
    {
        println!("\n== {label}");
        let queue = format!("demo-{batch}");
        let started = Instant::now();
        submit_all(&store, &queue, tasks).await?;
        let submitted_in = started.elapsed();
        println!(
            "submitted {tasks} tasks in {:.2} s ({:.0} tasks/s)",
            submitted_in.as_secs_f64(),
            tasks as f64 / submitted_in.as_secs_f64()
        );
        let rate = drain(&store, &queue, tasks, batch).await?;
        rates.push((label, rate));
    }
    println!("\n== summary ({tasks} tasks each, worker concurrency {CONCURRENCY})");
    for (label, rate) in &rates {
        println!("  {rate:>8.0} tasks/s  {label}");
    }
    if let [(_, batched), (_, single)] = rates.as_slice() {
        println!("  batching settles {:.1}x faster", batched / single);
    }
    Ok(())
}

/// Runs a worker over `queue` until `tasks` succeeded; returns tasks/s.
async fn drain(store: &Arc<Store<PgPool>>, queue: &str, tasks: usize, batch: usize) -> Result<f64, String> {
    let worker = Worker::builder(store.clone())
        .queues([queue])
        .concurrency(CONCURRENCY)
        .settle_batch(batch, Duration::from_millis(2))
        .task("demo.square", |_ctx, p: Square| async move { Ok(Squared { square: p.n * p.n }) })
        .build()
        .map_err(|e| e.to_string())?;
    let handle = worker.handle();
    let started = Instant::now();
    let run = tokio::spawn(worker.run());
    let mut rate = Rate::default();
    loop {
        let done = handle.settled();
        let per_second = rate.sample(started.elapsed(), done);
        draw_progress(done as usize, tasks, started.elapsed(), per_second);
        if done as usize >= tasks {
            break;
        }
        if run.is_finished() {
            return Err("the worker stopped before the queue drained".to_owned());
        }
        if started.elapsed() > Duration::from_secs(600) {
            return Err(format!("only {done} of {tasks} tasks settled in 10 minutes"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    handle.shutdown();
    run.await.map_err(|e| e.to_string())?;
    println!();
    let counts =
        store.stats(Some(queue)).await.map_err(|e| e.to_string())?.get(queue).copied().unwrap_or_default();
    println!(
        "queue {queue}: succeeded {}, failed {}, queued {}, running {}",
        counts.get(TaskStatus::Succeeded),
        counts.get(TaskStatus::Failed),
        counts.get(TaskStatus::Queued),
        counts.get(TaskStatus::Running)
    );
    if counts.get(TaskStatus::Succeeded) != tasks as i64 {
        return Err(format!("expected {tasks} succeeded tasks, found {}", counts.get(TaskStatus::Succeeded)));
    }
    let rate = tasks as f64 / elapsed.as_secs_f64();
    println!("processed {tasks} tasks in {:.2} s ({rate:.0} tasks/s)", elapsed.as_secs_f64());
    Ok(rate)
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
    waymark_tests::db::recreate_database(server, name).await
}

async fn submit_all(store: &Arc<Store<PgPool>>, queue: &str, tasks: usize) -> Result<(), String> {
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (store, queue) = (store.clone(), queue.to_owned());
            tokio::spawn(async move {
                for n in (p..tasks).step_by(PRODUCERS) {
                    let task = NewTask::new("demo.square", json!({ "n": n })).queue(queue.as_str());
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

fn draw_progress(done: usize, total: usize, elapsed: Duration, per_second: f64) {
    const WIDTH: usize = 40;
    let filled = (done.min(total) * WIDTH).checked_div(total).unwrap_or(WIDTH);
    let average = done as f64 / elapsed.as_secs_f64().max(1e-3);
    print!(
        "\r[{}{}] {done}/{total} tasks, {per_second:>6.0} tasks/s now, {average:>6.0} average",
        "#".repeat(filled),
        ".".repeat(WIDTH - filled)
    );
    let _ = std::io::stdout().flush();
}

/// The progress line's "now": tasks settled per second over the last
/// second of samples (over all of them while there is less than a second),
/// so a run shorter than a second shows its rate too, and a stall shows 0.
#[derive(Default)]
struct Rate {
    /// (time since the start, tasks settled by then), oldest first.
    samples: VecDeque<(Duration, u64)>,
}

impl Rate {
    const WINDOW: Duration = Duration::from_secs(1);

    /// Takes `done` settled at `at` (since the start); answers the rate.
    fn sample(&mut self, at: Duration, done: u64) -> f64 {
        self.samples.push_back((at, done));
        // Keep the newest sample at or before the window's start, so the
        // window is covered whole.
        while self.samples.get(1).is_some_and(|&(t, _)| t + Self::WINDOW <= at) {
            self.samples.pop_front();
        }
        let (since, then) = self.samples[0];
        let span = (at - since).as_secs_f64();
        if span > 0.0 {
            done.saturating_sub(then) as f64 / span
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_rate_is_what_settled_in_the_last_interval_from_the_first_samples_on() {
        let mut rate = Rate::default();
        assert_eq!(rate.sample(ms(0), 0), 0.0, "nothing yet");
        // 60 tasks every 100 ms: 600 a second, seen from the second sample
        // on, in a run shorter than a second.
        for i in 1..=8 {
            let now = rate.sample(ms(100 * i), 60 * i);
            assert!((now - 600.0).abs() < 1e-6, "at {} ms: {now}", 100 * i);
        }
        // Then twice as fast: the rate follows within the interval.
        let mut done = 480;
        for i in 9..=20 {
            done += 120;
            rate.sample(ms(100 * i), done);
        }
        assert!((rate.sample(ms(2100), done + 120) - 1200.0).abs() < 1e-6);
        // Then nothing settles: the rate falls to 0 once the interval has
        // passed, not stays at the last burst.
        let stalled = done + 120;
        for i in 22..=32 {
            rate.sample(ms(100 * i), stalled);
        }
        assert_eq!(rate.sample(ms(3300), stalled), 0.0);
    }
}
