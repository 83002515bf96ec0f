//! `cargo xtask bench budget`: the drain at each statement budget
//! (`WorkerBuilder::statement_concurrency`) beside the raw-SQL baseline at
//! two and three connections, in the same rounds. It shows what the budget
//! is for: how many writing statements at once the server runs best.

use std::sync::Arc;

use super::measure::CpuClock;
use super::scenarios::{backlog, drain_with, fresh, worker_builder};
use super::{baseline, rounds, RoundFn, Row, TASKS};

/// The budgets tried, at the drain's best setting.
const BUDGETS: [usize; 4] = [1, 2, 3, 6];
const CONCURRENCY: usize = 2048;
const SETTLE: usize = 1024;
const ROUNDS: usize = 6;

pub(super) async fn budget(rounds_asked: Option<usize>) -> Result<(), String> {
    let server = crate::demo::find_postgres().await?;
    let server = server.as_str();
    let mut rows: Vec<Row> = BUDGETS
        .iter()
        .map(|b| {
            Row::new(
                "waymark",
                "drain",
                format!("statement_concurrency {b}, concurrency {CONCURRENCY}, settle batch {SETTLE}, quick handler"),
            )
        })
        .collect();
    let mut runs: Vec<RoundFn<'_>> = BUDGETS
        .iter()
        .map(|&b| -> RoundFn<'_> {
            Box::new(move || {
                Box::pin(async move {
                    let (_url, store) = fresh(server, "waymark_bench_drain").await?;
                    backlog(&store, "bench", TASKS).await?;
                    let w = worker_builder(&store, "bench", CONCURRENCY, SETTLE, Arc::new(|_| {}))
                        .statement_concurrency(b)
                        .build()
                        .map_err(|e| e.to_string())?;
                    drain_with(w).await
                })
            })
        })
        .collect();
    for connections in [2, 3] {
        rows.push(Row::new(baseline::SYSTEM, "drain", format!("{connections} connections, claims of 500")));
        runs.push(Box::new(move || {
            Box::pin(async move {
                let (url, store) = fresh(server, "waymark_bench_drain").await?;
                backlog(&store, "bench", TASKS).await?;
                let clock = CpuClock::start();
                baseline::drain(&url, "bench", TASKS, connections, 500, Arc::new(|_| {}), None).await?;
                Ok(clock.round(TASKS))
            })
        }));
    }
    rounds(rounds_asked.unwrap_or(ROUNDS), &mut rows, &runs).await?;
    let reference = rows[BUDGETS.len()].tasks_per_s();
    println!("\nbudget: medians of the rounds; ratio to the baseline at 2 connections");
    for r in &rows {
        let (_, db) = r.cpu();
        println!(
            "budget: {:8} {:62} {:>7.0} tasks/s  ratio {:.3}  worker {:.2} µs a task  db {:.2} cores",
            r.system,
            r.detail,
            r.tasks_per_s(),
            r.tasks_per_s() / reference,
            r.cpu_per_task_us(),
            db,
        );
    }
    Ok(())
}
