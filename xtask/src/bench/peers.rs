//! `cargo xtask bench --peers`: graphile_worker and apalis-postgres, the
//! libraries a Rust user would pick instead, as contestants in the enqueue,
//! drain and latency scenarios: in the same rounds as waymark and the
//! baseline, in the order that flips every round. They live in a crate of
//! their own (`xtask/peers`, its own workspace and lock file), built here on
//! demand, so neither waymark nor this xtask ever depends on them. Each run
//! is a subprocess on a fresh, empty database that the peer migrates itself;
//! it prints one JSON line. Each peer runs with its tuned settings, and in
//! the drain and latency scenarios with its defaults too, and is reported
//! as a ratio to waymark's figure in the same scenario.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::measure::Round;
use super::{RoundFn, Row, BATCH, LATENCY_TASKS, TASKS};

/// The peers: (argument the runner takes, the name rows carry).
const PEERS: [(&str, &str); 2] = [("graphile", "graphile_worker"), ("apalis", "apalis-postgres")];
/// How long a drain at a peer's defaults may take before its rate so far
/// is what counts.
const DEFAULT_DRAIN_TIMEOUT_S: u64 = 30;

/// Builds the runner in release mode and answers its path. Blocks: call it
/// before the scenarios start.
pub(super) fn build() -> Result<PathBuf, String> {
    let dir = crate::workspace_root().join("xtask/peers");
    println!("peers: building {} (graphile_worker, apalis-postgres) in release mode", dir.display());
    let status = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(dir.join("target"))
        // apalis-postgres checks its queries against DATABASE_URL when it is
        // set (sqlx's macros); without it they use the crate's own copies.
        .env_remove("DATABASE_URL")
        .env("SQLX_OFFLINE", "true")
        .status()
        .map_err(|e| format!("peers: running cargo: {e}"))?;
    if !status.success() {
        return Err(format!("peers: building {} failed ({status})", dir.display()));
    }
    Ok(dir.join("target/release/waymark-bench-peers"))
}

/// One peer's run of `scenario` on a fresh database.
async fn one(bin: &Path, server: &str, peer: &str, scenario: &str, args: &[String]) -> Result<Round, String> {
    let url = crate::demo::fresh_database(server, "waymark_bench_peer").await?;
    // Plain TCP, as waymark and the baseline talk (see `scenarios::fresh`):
    // sqlx would otherwise prefer TLS on a server with `ssl = on`.
    let url = format!("{url}{}sslmode=disable", if url.contains('?') { '&' } else { '?' });
    let out = tokio::process::Command::new(bin)
        .args([peer, scenario, "--url", &url])
        .args(args)
        .env_remove("PGSSLMODE")
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
    // A start seen before the submit call returned counts as no wait, as
    // waymark's samples do (`measure::Stamps`).
    let latency_ms: Vec<f64> = doc["latency_ms"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_f64()).map(|x| x.max(0.0)).collect())
        .unwrap_or_default();
    Ok(Round {
        tasks_per_s: doc["tasks_per_s"].as_f64().unwrap_or(f64::NAN),
        latency_ms,
        cpu: doc["cpu_cores"].as_f64().unwrap_or(f64::NAN),
        other_cpu: f64::NAN, // the peer is another process
        // The version names the row; the settings behind "tuned" and
        // "default" are in xtask/peers/README.md.
        note: Some(format!(
            "{}{}",
            doc["system"].as_str().unwrap_or(peer),
            if unfinished { ", unfinished: its rate so far" } else { "" }
        )),
    })
}

/// The peers' contestants in one scenario of the bench (`enqueue-single`,
/// `enqueue-batch`, `drain` or `latency`), for the scenario to add to its
/// own rounds: (rows, runs), none without `bin`. `shape` starts each row's
/// settings, as the scenario's own rows do.
pub(super) fn contestants<'a>(
    bin: Option<&'a Path>,
    server: &'a str,
    scenario: &'static str,
    shape: &str,
) -> (Vec<Row>, Vec<RoundFn<'a>>) {
    let Some(bin) = bin else { return (Vec::new(), Vec::new()) };
    let sized = |tasks: usize| vec!["--tasks".to_owned(), tasks.to_string()];
    // (settings, arguments) per peer.
    let settings: Vec<(&str, Vec<String>)> = match scenario {
        "enqueue-single" => vec![("tuned", sized(TASKS))],
        "enqueue-batch" => {
            vec![("tuned", [sized(TASKS), vec!["--batch".into(), BATCH.to_string()]].concat())]
        }
        "drain" => vec![
            ("tuned", sized(TASKS)),
            (
                "default settings",
                [sized(TASKS), vec!["--timeout".into(), DEFAULT_DRAIN_TIMEOUT_S.to_string()]].concat(),
            ),
        ],
        "latency" => {
            let samples = vec!["--samples".to_owned(), LATENCY_TASKS.to_string()];
            vec![("tuned", samples.clone()), ("default settings", samples)]
        }
        _ => Vec::new(),
    };
    let mut rows = Vec::new();
    let mut runs: Vec<RoundFn<'a>> = Vec::new();
    for (peer, name) in PEERS {
        for (which, args) in &settings {
            let detail = if shape.is_empty() { (*which).to_owned() } else { format!("{shape}, {which}") };
            rows.push(Row::new(name, scenario, detail));
            let mut args = args.clone();
            args.extend([
                "--settings".to_owned(),
                if *which == "tuned" { "tuned" } else { "default" }.to_owned(),
            ]);
            runs.push(Box::new(move || {
                let args = args.clone();
                Box::pin(async move { one(bin, server, peer, scenario, &args).await })
            }));
        }
    }
    (rows, runs)
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
