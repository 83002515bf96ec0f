//! `cargo xtask bench flows`: held tasks beside plain tasks, in the same
//! run and on the same worker settings.
//!
//! - `flows-release`: two-task flows, one after another, on an idle worker:
//!   the time from the first task's handler returning to the second's
//!   handler starting (its settlement's batch window and commit, the
//!   release in that commit, the wakeup, the claim); beside it, plain
//!   pickup on the same worker (a submit's commit to its handler's start).
//! - `flows-ordered`: a backlog of tasks ordered by key, at 1, 100 and
//!   10,000 keys, drained beside the same number of plain tasks; the ratio
//!   is the ordered drain's throughput over the plain one's.
//! - then `steps.rs`: recorded steps per second beside plain tasks, and a
//!   park and resume.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};
use waymark_store::{Flow, NewTask};

use super::measure::{percentiles, CpuClock, Round};
use super::scenarios::{backlog, drain_until, fresh, until_watching, worker, worker_builder};
use super::{rounds, RoundFn, Row, CONCURRENCY, SETTLE};

const FLOWS: u64 = 200;
const ROUNDS: usize = 2;
/// (keys, tasks): one key runs one task at a time, so it gets fewer.
const ORDERED: [(usize, usize); 3] = [(1, 1_000), (100, 20_000), (10_000, 20_000)];
/// Held tasks per submit_flow call while filling the backlog.
const FILL_CHUNK: usize = 500;

pub(super) async fn flows(n: Option<usize>) -> Result<(), String> {
    let n = n.unwrap_or(ROUNDS);
    let server = crate::demo::find_postgres().await?;
    let mut rows = release_latency(&server, n).await?;
    rows.extend(ordered(&server, n).await?);
    for r in &rows {
        let lat = r.latency().map(|l| format!(", p50/p95/p99 {:.2}/{:.2}/{:.2} ms", l[0], l[1], l[2]));
        println!("{} {}: {:.0} tasks/s{}", r.scenario, r.detail, r.tasks_per_s(), lat.unwrap_or_default());
    }
    for pair in rows.chunks(2).skip(1) {
        let ratio = pair[0].tasks_per_s() / pair[1].tasks_per_s();
        println!("flows-ordered: {} at {ratio:.3} of plain tasks", pair[0].detail);
    }
    super::steps::steps_cost(&server, n).await
}

/// Handler-start instants, by the payload's `seq`.
#[derive(Default)]
struct Marks {
    started: Mutex<HashMap<u64, Instant>>,
}

impl Marks {
    fn has_started(&self, seq: u64) -> bool {
        self.started.lock().unwrap().contains_key(&seq)
    }

    /// Each start's time since its `from` instant, in ms.
    fn since(&self, from: &HashMap<u64, Instant>) -> Vec<f64> {
        let starts = self.started.lock().unwrap();
        starts.iter().filter_map(|(s, at)| from.get(s).map(|e| (*at - *e).as_secs_f64() * 1e3)).collect()
    }
}

async fn release_latency(server: &str, n: usize) -> Result<Vec<Row>, String> {
    let mut rows = vec![
        Row::new("waymark", "flows-release", format!("{FLOWS} two-task flows, idle worker")),
        Row::new("waymark", "flows-pickup", format!("{FLOWS} plain tasks, idle worker")),
    ];
    let run = |held: bool| -> RoundFn<'_> { Box::new(move || Box::pin(one_by_one(server, held))) };
    rounds(n, &mut rows, &[run(true), run(false)]).await?;
    Ok(rows)
}

/// `FLOWS` flows of two (or plain tasks), each after the last has run;
/// samples from the first's end (or the submit's commit) to the second's
/// start.
async fn one_by_one(server: &str, held: bool) -> Result<Round, String> {
    let (_, store) = fresh(server, "waymark_bench_flows").await?;
    let marks = Arc::new(Marks::default());
    let ended: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let (seen, done) = (marks.clone(), ended.clone());
    let w = worker_builder(&store, "bench", 16, 64, Arc::new(|_| {}))
        .task("bench.step", move |_ctx, p: Json| {
            let (seen, done) = (seen.clone(), done.clone());
            async move {
                let seq = p["seq"].as_u64().unwrap_or(0);
                if p["first"].as_bool() == Some(true) {
                    done.lock().unwrap().insert(seq, Instant::now());
                } else {
                    seen.started.lock().unwrap().insert(seq, Instant::now());
                }
                Ok(())
            }
        })
        .build()
        .map_err(|e| e.to_string())?;
    let handle = w.handle();
    let run = tokio::spawn(w.run());
    until_watching(&store).await?;
    tokio::time::sleep(Duration::from_millis(500)).await; // idle
    let clock = CpuClock::start();
    let step = |seq: u64, first: bool| {
        NewTask::new("bench.step", json!({"seq": seq, "first": first})).queue("bench")
    };
    for seq in 0..FLOWS {
        if held {
            let mut flow = Flow::new();
            let first = flow.add(step(seq, true));
            flow.add(step(seq, false).after([first]));
            store.submit_flow(&flow).await.map_err(|e| e.to_string())?;
        } else {
            store.submit(step(seq, false)).await.map_err(|e| e.to_string())?;
            ended.lock().unwrap().insert(seq, Instant::now());
        }
        let waited = Instant::now();
        while !marks.has_started(seq) {
            if waited.elapsed() > Duration::from_secs(10) {
                return Err(format!("bench flows: task {seq} did not start within 10 s"));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut round = clock.round(FLOWS as usize);
    round.latency_ms = marks.since(&ended.lock().unwrap());
    handle.shutdown();
    run.await.map_err(|e| e.to_string())?;
    let [p50, _, p99] = percentiles(&round.latency_ms);
    println!("    {} p50 {p50:.2} ms, p99 {p99:.2} ms", if held { "release" } else { "pickup" });
    Ok(round)
}

async fn ordered(server: &str, n: usize) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    for (keys, tasks) in ORDERED {
        let mut pair = vec![
            Row::new("waymark", "flows-ordered", format!("{tasks} tasks over {keys} keys")),
            Row::new("waymark", "flows-plain", format!("{tasks} plain tasks")),
        ];
        let run = |ordered: bool| -> RoundFn<'_> {
            Box::new(move || Box::pin(ordered_drain(server, ordered.then_some(keys), tasks)))
        };
        rounds(n, &mut pair, &[run(true), run(false)]).await?;
        rows.extend(pair);
    }
    Ok(rows)
}

/// A backlog of `tasks`, ordered by `keys` keys round robin (or plain),
/// drained by the drain's worker.
async fn ordered_drain(server: &str, keys: Option<usize>, tasks: usize) -> Result<Round, String> {
    let (_, store) = fresh(server, "waymark_bench_flows").await?;
    match keys {
        None => backlog(&store, "bench", tasks).await?,
        Some(keys) => {
            for chunk in (0..tasks).collect::<Vec<_>>().chunks(FILL_CHUNK) {
                let mut flow = Flow::new();
                for &i in chunk {
                    let task = NewTask::new("bench.noop", json!({ "n": i })).queue("bench");
                    flow.add(task.ordered_by(format!("key:{}", i % keys)));
                }
                store.submit_flow(&flow).await.map_err(|e| e.to_string())?;
            }
        }
    }
    let w = worker(&store, "bench", CONCURRENCY, SETTLE, Arc::new(|_| {}))?;
    drain_until(w, tasks).await
}
