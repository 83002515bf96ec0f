//! `waymark-bench-peers`: runs one benchmark scenario against one peer task
//! queue (graphile_worker or apalis-postgres) and prints one JSON line.
//!
//! Run by `cargo xtask bench --peers` as a subprocess, against a fresh,
//! empty database per run. Logs go to stderr; stdout carries only the
//! result line. See README.md for the scenarios and what is timed.

mod apalis_pg;
mod common;
mod graphile;

use std::process::ExitCode;
use std::time::Duration;

use common::{err, Opts, Overrides, Report, Result, Scenario, Settings};

const USAGE: &str = "\
usage: waymark-bench-peers <system> <scenario> --url <postgres url>
           [--tasks N] [--batch N] [--samples N] [--settings tuned|default]
           [--timeout SECS] [--set key=value]...

  system:    graphile | apalis
  scenario:  enqueue-single | enqueue-batch | drain | latency
  --tasks    tasks for enqueue-*/drain (default 20000)
  --batch    batch size for enqueue-batch (default 500)
  --samples  probes for latency, 20 ms apart (default 200; --tasks is ignored)
  --settings tuned (default) or default (what a user who sets nothing gets)
  --timeout  give up on any wait for the peer after SECS (default 120); a
             drain still unfinished then reports its partial rate with
             \"complete\":false (exit 0)
  --set      override one setting on top of --settings (exploration):
               graphile: concurrency, pool, poll_ms, local_queue (0 = off),
                         local_queues, complete_batch_ms (0 = off),
                         refetch_ms (LocalQueue refetch delay, 0 = off)
               apalis:   workers, concurrency (0 = unbounded), batch, pool,
                         lock_tasks, pubsub, poll_ms (0 = off), parallelize

The database must exist and be empty; the peer migrates its own schema.
Prints exactly one JSON line on stdout.";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    Graphile,
    Apalis,
}

fn parse_args(args: &[String]) -> Result<(System, Opts)> {
    let mut positional = Vec::new();
    let mut url = None;
    let mut tasks = 20_000usize;
    let mut batch = 500usize;
    let mut samples = 200usize;
    let mut settings = Settings::Tuned;
    let mut timeout = Duration::from_secs(120);
    let mut overrides = Overrides::default();

    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
            _ => (arg.as_str(), None),
        };
        if !flag.starts_with("--") {
            positional.push(arg.clone());
            continue;
        }
        if flag == "--help" {
            return Err(err(USAGE));
        }
        let value = match inline {
            Some(v) => v,
            None => it.next().cloned().ok_or_else(|| err(format!("{flag} needs a value")))?,
        };
        let number = |v: &str| v.parse::<usize>().map_err(|e| err(format!("{flag} {v}: {e}")));
        match flag {
            "--url" => url = Some(value),
            "--tasks" => tasks = number(&value)?,
            "--batch" => batch = number(&value)?.max(1),
            "--samples" => samples = number(&value)?,
            "--timeout" => timeout = Duration::from_secs(number(&value)? as u64),
            "--settings" => {
                settings = Settings::parse(&value)
                    .ok_or_else(|| err(format!("--settings must be tuned or default, got {value:?}")))?
            }
            "--set" => overrides.push(&value)?,
            _ => return Err(err(format!("unknown option {flag}\n\n{USAGE}"))),
        }
    }

    let [system, scenario] = positional.as_slice() else {
        return Err(err(format!("expected <system> <scenario>, got {positional:?}\n\n{USAGE}")));
    };
    let system = match system.as_str() {
        "graphile" | "graphile_worker" => System::Graphile,
        "apalis" | "apalis-postgres" => System::Apalis,
        other => return Err(err(format!("unknown system {other:?}\n\n{USAGE}"))),
    };
    let scenario =
        Scenario::parse(scenario).ok_or_else(|| err(format!("unknown scenario {scenario:?}\n\n{USAGE}")))?;
    let url = url.ok_or_else(|| err(format!("--url is required\n\n{USAGE}")))?;
    if tasks == 0 || samples == 0 {
        return Err(err("--tasks and --samples must be at least 1"));
    }
    Ok((system, Opts { scenario, url, tasks, batch, samples, settings, timeout, overrides }))
}

async fn run(system: System, opts: &Opts) -> Result<Report> {
    match system {
        System::Graphile => graphile::run(opts).await,
        System::Apalis => apalis_pg::run(opts).await,
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (system, opts) = match parse_args(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("waymark-bench-peers: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("waymark-bench-peers: cannot start tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(system, &opts));
    // Do not wait for stray background tasks (listeners, heartbeats).
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(report) => {
            report.print();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("waymark-bench-peers: {system:?} {} failed: {e}", opts.scenario.name());
            ExitCode::FAILURE
        }
    }
}
