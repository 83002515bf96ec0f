//! `cargo xtask bench`: waymark side by side with a raw-SQL baseline, in the
//! same run, on the same server and settings. Each scenario runs in rounds;
//! a round runs every contestant once, each on a fresh database, one after
//! another, in an order that flips every round so drift on a shared machine
//! hits both alike. A contestant's figure is its median over the rounds, and
//! `ratio` is waymark's median over the baseline's. Prints a table and one
//! JSON line per scenario and system.
//!
//! `cargo xtask bench` builds and runs itself in release mode; `binding`
//! compares statement binding modes, `budget` the worker's statement
//! budgets beside the baseline at two and three connections, `flows` held
//! tasks beside plain ones (a dependent's start after its predecessor, keys'
//! ordered drains), `explain` prints the hot statements'
//! plans on a large backlog, `soak` holds a steady load for a quarter of an
//! hour (not part of `all`), `server` shows where the server's time per
//! task goes.

mod backlog;
mod baseline;
mod binding;
mod budget;
mod chart;
mod dashboard;
mod explain;
mod flows;
mod limits;
mod measure;
mod peers;
mod python;
mod scenarios;
mod server;
mod soak;
mod spread;
mod steps;
mod telemetry;

use scenarios::{drain, enqueue_batch, enqueue_single, latency, mixed, sweep};

use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::json;

use measure::{median, percentiles, Round};

const TASKS: usize = 20_000;
const BATCH: usize = 500;
const LATENCY_TASKS: usize = 200;
const MIXED_FOR: Duration = Duration::from_secs(8);
/// Rounds per scenario: more where one run is short (its figure noisy),
/// fewer where a run lasts seconds. An even count gives each system the
/// first place equally often. `--rounds N` sets every scenario's.
const ROUNDS_ENQUEUE_SINGLE: usize = 2;
const ROUNDS_ENQUEUE_BATCH: usize = 8;
const ROUNDS_DRAIN: usize = 6;
const ROUNDS_LATENCY: usize = 2;
const ROUNDS_MIXED: usize = 2;
const ROUNDS_SWEEP: usize = 4;
const ROUNDS_OTEL: usize = 6;
const ROUNDS_LIMITS: usize = 4;
const ROUNDS_SPREAD: usize = 4;
const ROUNDS_BACKLOG: usize = 2;
const SCENARIOS: [&str; 9] =
    ["enqueue", "drain", "latency", "mixed", "sweep", "otel", "limits", "spread", "backlog"];

/// The drain setting of the scenarios that compare waymark with itself
/// (otel, limits, spread, backlog): the one `drain` finds best on this
/// machine's kind.
const CONCURRENCY: usize = 1024;
const SETTLE: usize = 512;
/// The worker of the mixed load and the soak, where pickup latency counts
/// as much as throughput: (concurrency, settle batch).
const MIXED_WORKER: (usize, usize) = (256, 128);

/// Worker settings the drain tries: (concurrency, settle batch).
const DRAIN_SETTINGS: [(usize, usize); 5] = [(128, 64), (512, 256), (1024, 512), (2048, 1024), (4096, 1024)];

pub async fn run(args: &[String]) -> Result<(), String> {
    let (rounds, rest) = rounds_arg(args)?;
    let with_peers = rest.iter().any(|a| a == "--peers");
    let rest: Vec<String> = rest.into_iter().filter(|a| a != "--peers").collect();
    let first = rest.first().map_or("all", String::as_str);
    let chosen: Option<Vec<&str>> = match first {
        "all" => Some(SCENARIOS.to_vec()),
        one => SCENARIOS.iter().find(|s| **s == one).map(|s| vec![*s]),
    };
    // The peers join the enqueue, drain and latency scenarios, nothing else.
    let peers = match (with_peers, &chosen) {
        (false, _) => None,
        (true, Some(c)) if c.iter().any(|s| ["enqueue", "drain", "latency"].contains(s)) => {
            Some(peers::build()?)
        }
        (true, _) => {
            return Err(
                "bench: --peers goes with the enqueue, drain and latency scenarios (or all)".to_owned()
            )
        }
    };
    if let Some(which) = chosen {
        return all(&which, rounds, peers).await;
    }
    match first {
        "binding" => binding::binding().await,
        "explain" => explain::explain().await,
        "dashboard" => dashboard::dashboard().await,
        "soak" => soak::soak(&rest[1..]).await,
        "server" => server::server_costs().await,
        "budget" => budget::budget(rounds).await,
        "flows" => flows::flows(rounds).await,
        other => Err(format!(
            "bench: unknown scenario {other:?} (known: all, binding, budget, explain, dashboard, flows, soak, server, {})",
            SCENARIOS.join(", ")
        )),
    }
}

/// Takes `--rounds N` out of the arguments.
fn rounds_arg(args: &[String]) -> Result<(Option<usize>, Vec<String>), String> {
    let mut rounds = None;
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--rounds" {
            let n = it.next().ok_or("bench: --rounds needs a number")?;
            rounds = Some(
                n.parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or(format!("bench: --rounds must be 1 or more, got {n:?}"))?,
            );
        } else {
            rest.push(a.clone());
        }
    }
    Ok((rounds, rest))
}

/// One contestant's figures in one scenario.
#[derive(Debug, Clone)]
struct Row {
    system: &'static str,
    scenario: &'static str,
    detail: String,
    rounds: Vec<Round>,
}

impl Row {
    fn new(system: &'static str, scenario: &'static str, detail: impl Into<String>) -> Self {
        Row { system, scenario, detail: detail.into(), rounds: Vec::new() }
    }

    fn tasks_per_s(&self) -> f64 {
        median(self.rounds.iter().map(|r| r.tasks_per_s))
    }

    /// Percentiles over every round's samples together.
    fn latency(&self) -> Option<[f64; 3]> {
        let samples: Vec<f64> = self.rounds.iter().flat_map(|r| r.latency_ms.iter().copied()).collect();
        (!samples.is_empty()).then(|| percentiles(&samples))
    }

    /// This process's CPU per task, in microseconds (median of the rounds).
    fn cpu_per_task_us(&self) -> f64 {
        median(self.rounds.iter().map(|r| r.cpu / r.tasks_per_s * 1e6))
    }

    fn cpu(&self) -> (f64, f64) {
        (median(self.rounds.iter().map(|r| r.cpu)), median(self.rounds.iter().map(|r| r.other_cpu)))
    }
}

type RoundFn<'a> = Box<dyn Fn() -> BoxFuture<'a, Result<Round, String>> + 'a>;

/// Runs every contestant once per round, in an order that flips each round.
async fn rounds(rounds: usize, rows: &mut [Row], runs: &[RoundFn<'_>]) -> Result<(), String> {
    for r in 0..rounds {
        let order: Vec<usize> =
            if r % 2 == 0 { (0..runs.len()).collect() } else { (0..runs.len()).rev().collect() };
        for i in order {
            let round = runs[i]().await?;
            println!(
                "  round {}: {} {} ({}) {:.0} tasks/s",
                r + 1,
                rows[i].system,
                rows[i].scenario,
                rows[i].detail,
                round.tasks_per_s
            );
            if let Some(note) = &round.note {
                if !rows[i].detail.contains(note.as_str()) {
                    rows[i].detail = format!("{}; {note}", rows[i].detail);
                }
            }
            rows[i].rounds.push(round);
        }
    }
    Ok(())
}

async fn all(which: &[&str], rounds: Option<usize>, peers: Option<std::path::PathBuf>) -> Result<(), String> {
    let n = |default: usize| rounds.unwrap_or(default);
    let server = crate::demo::find_postgres().await?;
    let sync = waymark_tests::db::server_setting(&server, "synchronous_commit").await?;
    println!("bench: synchronous_commit = {sync}; each run on a fresh database");
    let mut rows = Vec::new();
    if which.contains(&"enqueue") {
        for producers in [1, 16] {
            rows.extend(
                enqueue_single(&server, producers, n(ROUNDS_ENQUEUE_SINGLE), peers.as_deref()).await?,
            );
        }
        rows.extend(enqueue_batch(&server, n(ROUNDS_ENQUEUE_BATCH), peers.as_deref()).await?);
    }
    if which.contains(&"drain") {
        rows.extend(drain(&server, n(ROUNDS_DRAIN), peers.as_deref()).await?);
    }
    if which.contains(&"latency") {
        rows.extend(latency(&server, n(ROUNDS_LATENCY), peers.as_deref()).await?);
    }
    if which.contains(&"mixed") {
        rows.extend(mixed(&server, n(ROUNDS_MIXED)).await?);
    }
    if which.contains(&"sweep") {
        rows.extend(sweep(&server, n(ROUNDS_SWEEP)).await?);
    }
    if which.contains(&"otel") {
        rows.extend(telemetry::telemetry_cost(&server, n(ROUNDS_OTEL)).await?);
    }
    if which.contains(&"limits") {
        rows.extend(limits::limit_cost(&server, n(ROUNDS_LIMITS)).await?);
    }
    if which.contains(&"spread") {
        rows.extend(spread::spread_cost(&server, n(ROUNDS_SPREAD)).await?);
    }
    if which.contains(&"backlog") {
        rows.extend(backlog::backlog_cost(&server, n(ROUNDS_BACKLOG)).await?);
    }
    report(&rows);
    peers::report(&rows);
    Ok(())
}

/// The baseline row compared with `r`: same scenario, same detail.
fn baseline_of<'a>(rows: &'a [Row], r: &Row) -> Option<&'a Row> {
    rows.iter().find(|b| b.system == baseline::SYSTEM && b.scenario == r.scenario && same_shape(b, r))
}

/// Rows compare within a scenario of the same producer count.
fn same_shape(a: &Row, b: &Row) -> bool {
    a.scenario != "enqueue-single" || a.detail.split(',').next() == b.detail.split(',').next()
}

fn report(rows: &[Row]) {
    println!(
        "\n{:<9} {:<15} {:<36} {:>9} {:>6} {:>17} {:>5} {:>5}",
        "system", "scenario", "settings", "tasks/s", "ratio", "p50/p95/p99 ms", "cpu", "db"
    );
    for r in rows {
        let ratio = baseline_of(rows, r).map(|b| r.tasks_per_s() / b.tasks_per_s());
        let lat = r.latency().map(|l| format!("{:.1}/{:.1}/{:.1}", l[0], l[1], l[2])).unwrap_or_default();
        let (cpu, other) = r.cpu();
        let cores = |c: f64| if c.is_nan() { String::new() } else { format!("{c:.2}") };
        println!(
            "{:<9} {:<15} {:<36} {:>9.0} {:>6} {:>17} {:>5} {:>5}",
            r.system,
            r.scenario,
            r.detail,
            r.tasks_per_s(),
            ratio.map(|x| format!("{x:.2}")).unwrap_or_default(),
            lat,
            cores(cpu),
            cores(other)
        );
    }
    println!("(medians of the rounds; cpu: this process in cores; db: the rest of the machine, mostly PostgreSQL)\n");
    for r in rows {
        let base = baseline_of(rows, r);
        let (cpu, other) = r.cpu();
        let mut doc = json!({
            "system": r.system,
            "scenario": r.scenario,
            "settings": r.detail,
            "tasks_per_s": r.tasks_per_s(),
            "ratio": base.map(|b| r.tasks_per_s() / b.tasks_per_s()),
            "rounds": r.rounds.iter().map(|x| x.tasks_per_s.round()).collect::<Vec<_>>(),
            "cpu_cores": cpu,
            "other_cpu_cores": other,
        });
        if let Some([p50, p95, p99]) = r.latency() {
            doc["p50_ms"] = json!(p50);
            doc["p95_ms"] = json!(p95);
            doc["p99_ms"] = json!(p99);
            if let Some(b) = base.and_then(Row::latency) {
                doc["p50_ratio"] = json!(p50 / b[0]);
                doc["p99_ratio"] = json!(p99 / b[2]);
            }
        }
        println!("{doc}");
    }
}
