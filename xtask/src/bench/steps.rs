//! `cargo xtask bench flows`, its durable-step part: what recorded steps
//! and a park cost beside plain tasks, in the same run.
//!
//! - `flows-steps`: a backlog of tasks of five recorded steps each, drained
//!   beside the same number of plain tasks on the drain's worker; steps/s
//!   is the drain's tasks/s times five.
//! - `flows-park`: tasks one after another on an idle worker, each parking
//!   once on a durable sleep of 1 ms: the time from the handler returning
//!   its snooze to the resumed run's start.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};
use waymark_store::NewTask;

use super::measure::{percentiles, CpuClock, Round};
use super::scenarios::{backlog, backlog_of, drain_until, fresh, until_watching, worker, worker_builder};
use super::{rounds, RoundFn, Row, CONCURRENCY, SETTLE};

const STEP_TASKS: usize = 5_000;
const STEPS: usize = 5;
const PARKS: u64 = 200;

pub(super) async fn steps_cost(server: &str, n: usize) -> Result<(), String> {
    let mut rows = vec![
        Row::new("waymark", "flows-steps", format!("{STEP_TASKS} tasks of {STEPS} steps")),
        Row::new("waymark", "flows-plain", format!("{STEP_TASKS} plain tasks")),
    ];
    let run = |steps: bool| -> RoundFn<'_> { Box::new(move || Box::pin(drain_of(server, steps))) };
    rounds(n, &mut rows, &[run(true), run(false)]).await?;
    let (with, plain) = (rows[0].tasks_per_s(), rows[1].tasks_per_s());
    println!(
        "flows-steps: {:.0} steps/s ({with:.0} tasks/s of {STEPS} steps) at {:.3} of plain tasks ({plain:.0} tasks/s)",
        with * STEPS as f64,
        with / plain
    );
    let mut park = vec![Row::new("waymark", "flows-park", format!("{PARKS} sleeps of 1 ms, idle worker"))];
    let parks: RoundFn<'_> = Box::new(move || Box::pin(park_resume(server)));
    rounds(n, &mut park, &[parks]).await?;
    if let Some([p50, p95, p99]) = park[0].latency() {
        println!(
            "flows-park: from a snooze to the resumed run's start, p50/p95/p99 {p50:.2}/{p95:.2}/{p99:.2} ms"
        );
    }
    Ok(())
}

async fn drain_of(server: &str, steps: bool) -> Result<Round, String> {
    let (_, store) = fresh(server, "waymark_bench_steps").await?;
    if !steps {
        backlog(&store, "bench", STEP_TASKS).await?;
        let w = worker(&store, "bench", CONCURRENCY, SETTLE, Arc::new(|_| {}))?;
        return drain_until(w, STEP_TASKS).await;
    }
    backlog_of(&store, STEP_TASKS, |i| NewTask::new("bench.steps", json!({ "n": i })).queue("bench")).await?;
    let w = worker_builder(&store, "bench", CONCURRENCY, SETTLE, Arc::new(|_| {}))
        .task("bench.steps", |ctx, _p: Json| async move {
            for s in 0..STEPS {
                ctx.step(&format!("s{s}"), || async move { Ok(s) }).await?;
            }
            Ok(())
        })
        .build()
        .map_err(|e| e.to_string())?;
    drain_until(w, STEP_TASKS).await
}

/// `PARKS` tasks, each after the last, each parking once on a 1 ms sleep.
async fn park_resume(server: &str) -> Result<Round, String> {
    let (_, store) = fresh(server, "waymark_bench_steps").await?;
    let parked: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let resumed: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let (p, r) = (parked.clone(), resumed.clone());
    let w = worker_builder(&store, "bench", 16, 64, Arc::new(|_| {}))
        .poll_interval(Duration::from_millis(200))
        .task("bench.nap", move |ctx, payload: Json| {
            let (p, r) = (p.clone(), r.clone());
            async move {
                let (seq, started) = (payload["seq"].as_u64().unwrap_or(0), Instant::now());
                let slept = ctx.sleep("nap", Duration::from_millis(1)).await;
                match &slept {
                    // Parked: from the first park.
                    Err(_) => {
                        p.lock().unwrap().entry(seq).or_insert_with(Instant::now);
                    }
                    // Past the sleep: this run's start is the resume.
                    Ok(()) => {
                        r.lock().unwrap().insert(seq, started);
                    }
                }
                slept
            }
        })
        .build()
        .map_err(|e| e.to_string())?;
    let handle = w.handle();
    let run = tokio::spawn(w.run());
    until_watching(&store).await?;
    let clock = CpuClock::start();
    for seq in 0..PARKS {
        let task = store
            .submit(NewTask::new("bench.nap", json!({ "seq": seq })).queue("bench"))
            .await
            .map_err(|e| e.to_string())?;
        let waited = Instant::now();
        while !store.get(&task.id).await.map_err(|e| e.to_string())?.is_some_and(|t| t.status.is_terminal()) {
            if waited.elapsed() > Duration::from_secs(10) {
                return Err(format!("bench flows: nap {seq} did not end within 10 s"));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let mut round = clock.round(PARKS as usize);
    round.latency_ms = since(&resumed.lock().unwrap(), &parked.lock().unwrap());
    handle.shutdown();
    run.await.map_err(|e| e.to_string())?;
    let [p50, _, p99] = percentiles(&round.latency_ms);
    println!("    park to resume p50 {p50:.2} ms, p99 {p99:.2} ms");
    Ok(round)
}

/// Each resume's time since its park, in ms.
fn since(resumed: &HashMap<u64, Instant>, parked: &HashMap<u64, Instant>) -> Vec<f64> {
    resumed.iter().filter_map(|(s, at)| parked.get(s).map(|p| (*at - *p).as_secs_f64() * 1e3)).collect()
}
