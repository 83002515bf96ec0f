//! The reference row of the drain: the cairnq Python worker (the seed
//! system) on the same kind of backlog, where a Python with cairnq can be
//! had (`waymark_tests::python` makes the venv). It is a reference, not a
//! contestant: it runs once per setting, and no ratio is taken to it.

use std::time::Duration;

use super::measure::Round;
use super::scenarios::{backlog, fresh};
use super::Row;

pub const SYSTEM: &str = "cairnq-py";

/// Worker settings tried: (concurrency, pool size).
const SETTINGS: [(usize, usize); 2] = [(64, 8), (256, 16)];

/// The best of [`SETTINGS`], or `None` (said loudly) without Python.
pub async fn drain_reference(server: &str, tasks: usize) -> Option<Row> {
    let mut best: Option<Row> = None;
    for (concurrency, pool) in SETTINGS {
        match one(server, tasks, concurrency, pool).await {
            Ok(round) => {
                println!(
                    "drain: cairnq Python worker, concurrency {concurrency} -> {:.0} tasks/s",
                    round.tasks_per_s
                );
                if best.as_ref().is_none_or(|b| b.tasks_per_s() < round.tasks_per_s) {
                    let mut row =
                        Row::new(SYSTEM, "drain", format!("concurrency {concurrency}, pool {pool}"));
                    row.rounds.push(round);
                    best = Some(row);
                }
            }
            Err(why) => {
                println!("drain: NO cairnq Python reference row: {why}");
                return None;
            }
        }
    }
    best
}

async fn one(server: &str, tasks: usize, concurrency: usize, pool: usize) -> Result<Round, String> {
    let (url, store) = fresh(server, "waymark_bench_drain_py").await?;
    backlog(&store, "bench", tasks).await?;
    let args = [
        "--queue".to_owned(),
        "bench".to_owned(),
        "--total".to_owned(),
        tasks.to_string(),
        "--concurrency".to_owned(),
        concurrency.to_string(),
        "--pool".to_owned(),
        pool.to_string(),
    ];
    let script = waymark_tests::python::scripts_dir().join("bench_drain.py");
    // The venv may need installing (pip), and the helpers panic with the
    // failing step: keep that off the runtime and turn it into a reason.
    let out = tokio::task::spawn_blocking(move || {
        waymark_tests::python::run_script(
            &script,
            &args,
            &[("CAIRNQ_DSN", url.as_str())],
            Duration::from_secs(300),
        )
    })
    .await
    .map_err(|e| match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "the Python run panicked".to_owned()),
        Err(e) => e.to_string(),
    })?;
    let doc: serde_json::Value =
        serde_json::from_str(out.trim()).map_err(|e| format!("bench_drain.py printed {out:?}: {e}"))?;
    Ok(Round {
        tasks_per_s: doc["tasks_per_s"].as_f64().ok_or("bench_drain.py gave no tasks_per_s")?,
        cpu: doc["cpu_cores"].as_f64().unwrap_or(f64::NAN),
        other_cpu: f64::NAN, // not measured: the worker is another process
        latency_ms: Vec::new(),
        note: None,
    })
}
