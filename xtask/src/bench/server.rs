//! `cargo xtask bench server`: where the server's time per task goes. One
//! connection runs a task's three writes, phase by phase, over [`TASKS`]
//! tasks in statements of [`BATCH`]: the insert, the claim and the
//! settlement, with the raw-SQL baseline's statements (the same shape as
//! waymark's). It times each phase and reads how much write-ahead log it
//! wrote, on the cairnq schema as it is and on copies stripped of one cost
//! at a time, so the difference is that part's price: the notify trigger,
//! the six indexes that serve listing, trees and retention rather than the
//! claim and the lease, and the wait for each commit's flush. The WAL
//! figures are the server's whole log: run it on a quiet server. The stripped schemas are
//! measurements only; waymark's tables are always cairnq's.

use serde_json::json;
use std::time::Instant;

use super::measure::{median, process_cpu_seconds};
use super::scenarios::fresh;
use super::{baseline, BATCH, TASKS};

const ROUNDS: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Variant {
    Cairnq,
    NoTrigger,
    NoTriggerFewIndexes,
    NoCommitWait,
}

impl Variant {
    const ALL: [Variant; 4] =
        [Variant::Cairnq, Variant::NoTrigger, Variant::NoTriggerFewIndexes, Variant::NoCommitWait];

    fn describe(self) -> &'static str {
        match self {
            Variant::Cairnq => "cairnq schema (10 indexes, notify trigger)",
            Variant::NoTrigger => "without the notify trigger",
            Variant::NoTriggerFewIndexes => "and only pkey, both claim and lease indexes",
            Variant::NoCommitWait => "cairnq schema, synchronous_commit off",
        }
    }
}

/// Per task: microseconds of wall time and of the backend's CPU, and WAL
/// bytes, of the insert, the claim and the settlement.
#[derive(Debug, Clone, Copy, Default)]
struct Costs {
    us: [f64; 3],
    cpu_us: [f64; 3],
    wal: [f64; 3],
}

const PHASES: [&str; 3] = ["insert", "claim", "complete"];

async fn one(server: &str, variant: Variant) -> Result<Costs, String> {
    let (url, _store) = fresh(server, "waymark_bench_server").await?;
    let client = baseline::connect(&url).await?;
    match variant {
        Variant::Cairnq => {}
        Variant::NoTrigger => baseline::disable_notify_trigger(&client).await?,
        Variant::NoTriggerFewIndexes => {
            baseline::disable_notify_trigger(&client).await?;
            baseline::drop_secondary_indexes(&client).await?;
        }
        Variant::NoCommitWait => baseline::no_commit_wait(&client).await?,
    }
    // The backend's CPU time: steadier than the wall clock on a shared
    // machine, since time the backend waits for a core or the disk is not in it.
    let pid = baseline::backend_pid(&client).await?;
    let cpu = || process_cpu_seconds(pid);
    let per_task = |took: std::time::Duration, cpu_s: f64, wal: i64| {
        let n = TASKS as f64;
        (took.as_secs_f64() * 1e6 / n, cpu_s * 1e6 / n, wal as f64 / n)
    };
    let mut costs = Costs::default();

    let (wal, cpu0) = (baseline::wal_position(&client).await?, cpu());
    let started = Instant::now();
    for chunk in (0..TASKS).collect::<Vec<_>>().chunks(BATCH) {
        let ids: Vec<String> = chunk.iter().map(|_| waymark_store::new_task_id()).collect();
        let payloads: Vec<serde_json::Value> = chunk.iter().map(|i| json!({ "n": i })).collect();
        baseline::insert_many(&client, &ids, "bench.noop", "bench", &payloads).await?;
    }
    (costs.us[0], costs.cpu_us[0], costs.wal[0]) =
        per_task(started.elapsed(), cpu() - cpu0, baseline::wal_position(&client).await? - wal);

    let (wal, cpu0) = (baseline::wal_position(&client).await?, cpu());
    let started = Instant::now();
    let mut claims = Vec::new();
    loop {
        let claimed = baseline::claim(&client, "server-bench", "bench", BATCH as i64).await?;
        if claimed.is_empty() {
            break;
        }
        claims.push(claimed.into_iter().map(|(id, _)| id).collect::<Vec<_>>());
    }
    (costs.us[1], costs.cpu_us[1], costs.wal[1]) =
        per_task(started.elapsed(), cpu() - cpu0, baseline::wal_position(&client).await? - wal);
    let claimed: usize = claims.iter().map(Vec::len).sum();
    if claimed != TASKS {
        return Err(format!("bench server: claimed {claimed} of {TASKS}"));
    }

    let (wal, cpu0) = (baseline::wal_position(&client).await?, cpu());
    let started = Instant::now();
    for ids in &claims {
        baseline::complete_all(&client, "server-bench", ids).await?;
    }
    (costs.us[2], costs.cpu_us[2], costs.wal[2]) =
        per_task(started.elapsed(), cpu() - cpu0, baseline::wal_position(&client).await? - wal);
    Ok(costs)
}

pub(super) async fn server_costs() -> Result<(), String> {
    let server = crate::demo::find_postgres().await?;
    let sync = waymark_tests::db::server_setting(&server, "synchronous_commit").await?;
    println!("server: synchronous_commit = {sync} (the last schema sets it off for its session)");
    let mut all: Vec<Vec<Costs>> = vec![Vec::new(); Variant::ALL.len()];
    for r in 0..ROUNDS {
        // Each round starts one variant later, so none is always first.
        for k in 0..Variant::ALL.len() {
            let i = (k + r) % Variant::ALL.len();
            let v = &Variant::ALL[i];
            let c = one(&server, *v).await?;
            println!(
                "  round {}: {}: {:.1} + {:.1} + {:.1} us per task",
                r + 1,
                v.describe(),
                c.us[0],
                c.us[1],
                c.us[2]
            );
            all[i].push(c);
        }
    }
    let med = |rounds: &[Costs], f: &dyn Fn(&Costs) -> f64| median(rounds.iter().map(f));
    println!(
        "\nserver: {TASKS} tasks, {BATCH} per statement, one connection; per task, median of {ROUNDS} rounds\n\
         {:<46} {:>8} {:>8} {:>8} {:>8} {:>9} {:>10} {:>10} {:>10}",
        "schema", "insert", "claim", "complete", "total us", "cpu us", "insert WAL", "claim WAL", "compl. WAL"
    );
    let full_total = med(&all[0], &|c| c.us.iter().sum());
    for (v, rounds) in Variant::ALL.iter().zip(&all) {
        let us: Vec<f64> = (0..3).map(|p| med(rounds, &|c| c.us[p])).collect();
        let wal: Vec<f64> = (0..3).map(|p| med(rounds, &|c| c.wal[p])).collect();
        let total = med(rounds, &|c| c.us.iter().sum());
        let cpu: Vec<f64> = (0..3).map(|p| med(rounds, &|c| c.cpu_us[p])).collect();
        println!(
            "{:<46} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>9} {:>10.0} {:>10.0} {:>10.0}",
            v.describe(),
            us[0],
            us[1],
            us[2],
            total,
            format!("{:.0}+{:.0}+{:.0}", cpu[0], cpu[1], cpu[2]),
            wal[0],
            wal[1],
            wal[2]
        );
        let doc = json!({
            "scenario": "server",
            "schema": v.describe(),
            "us_per_task": PHASES.iter().zip(&us).map(|(p, x)| (p.to_string(), json!(x))).collect::<serde_json::Map<_, _>>(),
            "backend_cpu_us_per_task": PHASES.iter().zip(&cpu).map(|(p, x)| (p.to_string(), json!(x))).collect::<serde_json::Map<_, _>>(),
            "wal_bytes_per_task": PHASES.iter().zip(&wal).map(|(p, x)| (p.to_string(), json!(x))).collect::<serde_json::Map<_, _>>(),
            "total_us_per_task": total,
            "share_of_cairnq": total / full_total,
        });
        println!("{doc}");
    }
    Ok(())
}
