//! Many queues and names on one worker: the same backlog drained from one
//! queue by one handler, and spread round robin over ten queues and ten
//! task names, each with a handler, on one worker that claims from all ten
//! queues. Reported as the spread drain's throughput over the single one's.

use std::time::Duration;

use serde_json::json;
use waymark_store::NewTask;
use waymark_worker::{HandlerOptions, Worker};

use super::scenarios::{backlog_of, drain_with, fresh};
use super::{rounds, RoundFn, Row, CONCURRENCY, SETTLE, TASKS};

/// Queues, and task names: `QUEUES` x `QUEUES` combinations.
const QUEUES: usize = 10;

fn queue(i: usize) -> String {
    format!("bench{}", i % QUEUES)
}

fn name(i: usize) -> String {
    // Another walk than the queues', so each queue holds every name.
    format!("bench.noop{}", (i / QUEUES) % QUEUES)
}

async fn spread_drain(server: &str, spread: bool) -> Result<super::measure::Round, String> {
    let (_url, store) = fresh(server, "waymark_bench_spread").await?;
    // TASKS no-op tasks: in one queue under one name, or spread.
    backlog_of(&store, TASKS, |i| {
        let (q, n) = if spread { (queue(i), name(i)) } else { (queue(0), name(0)) };
        NewTask::new(n, json!({ "n": i })).queue(q)
    })
    .await?;
    let width = if spread { QUEUES } else { 1 };
    let mut builder = Worker::builder(store.clone())
        .queues((0..width).map(queue))
        .concurrency(CONCURRENCY)
        .settle_batch(SETTLE, Duration::from_millis(2))
        .poll_interval(Duration::from_millis(200));
    for i in 0..width {
        builder = builder.task_with(
            name(i * QUEUES),
            HandlerOptions::new().quick(),
            |_ctx, _p: serde_json::Value| async move { Ok(()) },
        );
    }
    drain_with(builder.build().map_err(|e| e.to_string())?).await
}

pub(super) async fn spread_cost(server: &str, n: usize) -> Result<Vec<Row>, String> {
    let detail = |what: &str| format!("{what}, concurrency {CONCURRENCY}");
    let mut rows = vec![
        Row::new("waymark", "spread-drain", detail("1 queue, 1 name")),
        Row::new("waymark", "spread-drain", detail(&format!("{QUEUES} queues x {QUEUES} names"))),
    ];
    let run = |spread: bool| -> RoundFn<'_> { Box::new(move || Box::pin(spread_drain(server, spread))) };
    rounds(n, &mut rows, &[run(false), run(true)]).await?;
    let ratio = rows[1].tasks_per_s() / rows[0].tasks_per_s();
    println!(
        "spread-drain: {QUEUES} queues x {QUEUES} names at {ratio:.3} of one queue and one name; \
         cpu {:.2} us/task against {:.2}",
        rows[1].cpu_per_task_us(),
        rows[0].cpu_per_task_us()
    );
    Ok(rows)
}
