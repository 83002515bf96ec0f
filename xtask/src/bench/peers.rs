//! `cargo xtask bench --peers`: graphile_worker and apalis-postgres, the
//! libraries a Rust user would pick instead, in the same scenarios of the
//! same run. They live in a crate of their own (`xtask/peers`, its own
//! workspace and lock file), built here on demand, so neither waymark nor
//! this xtask ever depends on them. Each run is a subprocess on a fresh,
//! empty database that the peer migrates itself; it prints one JSON line.
//! Each peer runs with its tuned settings and with its defaults, and is
//! reported as a ratio to waymark's figure in the same scenario.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use super::measure::Round;
use super::{rounds, RoundFn, Row, BATCH, LATENCY_TASKS, TASKS};

/// The peers: (argument the runner takes, the name rows carry).
const PEERS: [(&str, &str); 2] = [("graphile", "graphile_worker"), ("apalis", "apalis-postgres")];
/// One-by-one submits per round: fewer than waymark's, since a peer's run
/// also starts a process and migrates a schema; a rate is a rate.
const SINGLE_TASKS: usize = 5_000;
/// How long a drain at a peer's defaults may take before its rate so far
/// is what counts.
const DEFAULT_DRAIN_TIMEOUT_S: u64 = 30;
/// Most rounds a peer's scenario gets (its process start and migration
/// make each round longer than waymark's).
const MAX_ROUNDS: usize = 4;

/// Builds the runner in release mode and answers its path.
pub(super) fn build() -> Result<PathBuf, String> {
    let dir = crate::workspace_root().join("xtask/peers");
    println!("peers: building {} (graphile_worker, apalis-postgres) in release mode", dir.display());
    let status = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .status()
        .map_err(|e| format!("peers: running cargo: {e}"))?;
    if !status.success() {
        return Err(format!("peers: building {} failed ({status})", dir.display()));
    }
    Ok(dir.join("target/release/waymark-bench-peers"))
}

/// One peer's run of `scenario` on a fresh database.
async fn one(
    bin: &PathBuf,
    server: &str,
    peer: &str,
    scenario: &str,
    args: &[String],
) -> Result<Peer, String> {
    let url = crate::demo::fresh_database(server, "waymark_bench_peer").await?;
    let out = tokio::process::Command::new(bin)
        .args([peer, scenario, "--url", &url])
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), out)
        .await
        .map_err(|_| format!("peers: {peer} {scenario} ran over 300 s"))?
        .map_err(|e| format!("peers: starting {}: {e}", bin.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "peers: {peer} {scenario} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let doc: serde_json::Value = serde_json::from_str(stdout.trim())
        .map_err(|e| format!("peers: {peer} {scenario} printed {stdout:?}: {e}"))?;
    // A drain that did not finish in its time reports the rate it reached
    // (graphile_worker at its defaults drains a standing backlog at about
    // two jobs a second: its slots take one job per poll).
    let unfinished = doc["complete"] == serde_json::Value::Bool(false);
    let latency_ms: Vec<f64> = doc["latency_ms"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
        .unwrap_or_default();
    Ok(Peer {
        version: doc["system"].as_str().unwrap_or(peer).to_owned(),
        settings: format!(
            "{}{}",
            doc["settings"].as_str().unwrap_or(""),
            if unfinished { " (did not finish in time: its rate so far)" } else { "" }
        ),
        round: Round {
            tasks_per_s: doc["tasks_per_s"].as_f64().unwrap_or(f64::NAN),
            latency_ms,
            cpu: doc["cpu_cores"].as_f64().unwrap_or(f64::NAN),
            other_cpu: f64::NAN, // the peer is another process
        },
    })
}

struct Peer {
    version: String,
    settings: String,
    round: Round,
}

/// The peers' rows of one scenario of the bench (`enqueue`, `drain` or
/// `latency`), each in `n` rounds (at most [`MAX_ROUNDS`]).
pub(super) async fn scenario(bin: &PathBuf, server: &str, which: &str, n: usize) -> Result<Vec<Row>, String> {
    let n = n.min(MAX_ROUNDS);
    // (scenario, shape the row's detail starts with, arguments)
    let cases: Vec<(&'static str, String, Vec<String>)> = match which {
        "enqueue" => vec![
            (
                "enqueue-single",
                "1 producer(s), one per call".to_owned(),
                vec!["--tasks".into(), SINGLE_TASKS.to_string()],
            ),
            (
                "enqueue-batch",
                format!("1 producer, {BATCH} per call"),
                vec!["--tasks".into(), TASKS.to_string(), "--batch".into(), BATCH.to_string()],
            ),
        ],
        "drain" => vec![
            (
                "drain",
                "tuned".to_owned(),
                vec!["--tasks".into(), TASKS.to_string(), "--settings".into(), "tuned".into()],
            ),
            (
                "drain",
                "default settings".to_owned(),
                vec![
                    "--tasks".into(),
                    TASKS.to_string(),
                    "--settings".into(),
                    "default".into(),
                    "--timeout".into(),
                    DEFAULT_DRAIN_TIMEOUT_S.to_string(),
                ],
            ),
        ],
        "latency" => vec![(
            "latency",
            format!("{LATENCY_TASKS} tasks, 20 ms apart, idle worker"),
            vec!["--samples".into(), LATENCY_TASKS.to_string()],
        )],
        _ => return Ok(Vec::new()),
    };
    let mut out = Vec::new();
    for (scenario, shape, args) in cases {
        let mut rows: Vec<Row> =
            PEERS.iter().map(|&(_, name)| Row::new(name, scenario, shape.clone())).collect();
        let details = std::sync::Mutex::new(vec![String::new(); PEERS.len()]);
        let runs: Vec<RoundFn<'_>> = PEERS
            .iter()
            .enumerate()
            .map(|(i, (peer, _))| -> RoundFn<'_> {
                let (args, details) = (&args, &details);
                Box::new(move || {
                    Box::pin(async move {
                        let p = one(bin, server, peer, scenario, args).await?;
                        details.lock().unwrap()[i] = format!("{}: {}", p.version, p.settings);
                        Ok(p.round)
                    })
                })
            })
            .collect();
        rounds(n, &mut rows, &runs).await?;
        drop(runs);
        for (row, d) in rows.iter_mut().zip(details.into_inner().unwrap()) {
            row.detail = format!("{}; {d}", row.detail);
        }
        out.extend(rows);
    }
    Ok(out)
}

/// Each peer row against waymark's in the same scenario: throughput as
/// peer over waymark, latency as peer's p50 and p99 over waymark's.
pub(super) fn report(rows: &[Row]) {
    let waymark = |scenario: &str, default: bool| {
        rows.iter().find(|r| {
            r.system == "waymark"
                && r.scenario == scenario
                && (scenario != "drain" || r.detail.starts_with("default settings") == default)
                && (scenario != "enqueue-single" || r.detail.starts_with("1 producer"))
        })
    };
    let peers: Vec<&Row> = rows.iter().filter(|r| PEERS.iter().any(|(_, n)| *n == r.system)).collect();
    if peers.is_empty() {
        return;
    }
    println!("peers, each against waymark in the same scenario of this run:");
    for p in peers {
        let Some(w) = waymark(p.scenario, p.detail.starts_with("default settings")) else { continue };
        let line = match (p.latency(), w.latency()) {
            (Some(pl), Some(wl)) => format!(
                "p50 {:.1} ms against waymark's {:.1} ({:.2}x), p99 {:.1} against {:.1} ({:.2}x)",
                pl[0],
                wl[0],
                pl[0] / wl[0],
                pl[2],
                wl[2],
                pl[2] / wl[2]
            ),
            _ => format!(
                "{:.0} tasks/s against waymark's {:.0}: {:.2} of waymark",
                p.tasks_per_s(),
                w.tasks_per_s(),
                p.tasks_per_s() / w.tasks_per_s()
            ),
        };
        println!("  {} {} ({}): {line}", p.system, p.scenario, p.detail);
    }
    println!();
}
