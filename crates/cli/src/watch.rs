//! `waymark watch`: counts per queue and status, redrawn on each signal
//! of the store's `watch` (a task queued or finished, a poll) and at least
//! every `--every`; in a terminal the screen is redrawn in place, piped it
//! prints one table (or with `--json` one line) per redraw. A database that
//! goes away once the watch has begun is reported and watched for again;
//! Ctrl-C ends it at once.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::{StatusCounts, Store};

use crate::args::WatchArgs;
use crate::error::CliError;
use crate::render;
use crate::shared::{duration, open, Out};

/// Redraws at most this often: a busy queue signals thousands of times a
/// second, and each redraw counts rows.
const LEAST_BETWEEN: Duration = Duration::from_millis(200);

pub async fn watch(url: &str, schema: Option<&str>, args: WatchArgs, json: bool) -> Out {
    let every = duration(&args.every, "--every")?;
    if every.is_zero() {
        return Err(CliError::usage("--every must be positive"));
    }
    let store = open(url, schema).await?;
    let tty = std::io::stdout().is_terminal();
    let mut signals = if args.queue.is_empty() {
        store.watch_every_queue(every)
    } else {
        store.watch(args.queue.clone(), every)
    };
    // Ctrl-C ends it whatever it is doing (a read of a database gone away
    // may take its timeouts).
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    let mut last = Instant::now() - LEAST_BETWEEN;
    loop {
        let frame = async {
            let _ = signals.next().await;
            // Real time: redraws are spaced, whatever the signals' rate;
            // what came meanwhile is answered by this one redraw.
            tokio::time::sleep(LEAST_BETWEEN.saturating_sub(last.elapsed())).await;
            signals.skip_pending();
            last = Instant::now();
            match counts(&store, &args.queue).await {
                Ok(now) => draw(&now, json, tty),
                Err(e) => failed(&e, json, tty),
            }
        };
        let frame = tokio::select! {
            frame = frame => frame,
            _ = &mut stop => return Ok(String::new()),
        };
        let mut out = std::io::stdout().lock();
        // A closed pipe (`waymark watch | head`) ends the watch.
        if out.write_all(frame.as_bytes()).and_then(|()| out.flush()).is_err() {
            return Ok(String::new());
        }
    }
}

/// Counts of every queue, or of those named.
async fn counts(store: &Store<PgPool>, only: &[String]) -> Result<BTreeMap<String, StatusCounts>, CliError> {
    if only.is_empty() {
        return Ok(store.stats(None).await?);
    }
    let mut all = BTreeMap::new();
    for q in only {
        all.extend(store.stats(Some(q)).await?);
    }
    Ok(all)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn draw(counts: &BTreeMap<String, StatusCounts>, json: bool, tty: bool) -> String {
    if json {
        return format!("{}\n", json!({"at_ms": now_ms(), "counts": counts}));
    }
    let head = format!("waymark watch, {} UTC (Ctrl-C to stop)\n\n", &render::utc(now_ms())[..19]);
    let body = format!("{head}{}", render::stats(counts));
    if tty {
        format!("\x1b[H\x1b[2J{body}")
    } else {
        format!("{body}\n")
    }
}

fn failed(e: &CliError, json: bool, tty: bool) -> String {
    if json {
        return format!("{}\n", json!({"at_ms": now_ms(), "error": e.message}));
    }
    let line = format!("waymark watch: {e}; watching for it to come back\n");
    if tty {
        format!("\x1b[H\x1b[2J{line}")
    } else {
        line
    }
}
