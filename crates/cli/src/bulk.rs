//! The commands that act on many tasks at once, a bulk retry and a purge:
//! each shows how many tasks match and changes nothing (exit 4) until it
//! is told `--yes`.

use serde_json::json;
use waymark_store::{PurgeFilter, TaskStatus};

use crate::args::{PurgeArgs, RetryArgs};
use crate::error::{CliError, Kind};
use crate::shared::{doc, duration, list_filter, open, status_of, Out};

/// Bulk retries read the matches in pages of this many.
const PAGE: i64 = 1000;

/// Every failed (or canceled) task matching the filters: the count first,
/// and the retries only with --yes. The retries take the newest page of
/// matches again and again (a retried task leaves the set), each task at
/// most once, until a page holds nothing new: paging by offset over a set
/// that shrinks would skip tasks.
pub async fn retry_matching(url: &str, schema: Option<&str>, args: RetryArgs, json: bool) -> Out {
    let mut filter = list_filter(&args.filters, PAGE, 0)?;
    let status = filter.status.unwrap_or(TaskStatus::Failed);
    if !matches!(status, TaskStatus::Failed | TaskStatus::Canceled) {
        return Err(CliError::usage(format!("only failed or canceled tasks can be retried, not {status}")));
    }
    filter.status = Some(status);
    let store = open(url, schema).await?;
    if !args.yes {
        // A count, read in pages; tasks failing meanwhile may shift a page,
        // so ids are counted once each.
        let mut seen = std::collections::HashSet::new();
        loop {
            let page = store.list(&filter).await?;
            let short = (page.len() as i64) < PAGE;
            seen.extend(page.into_iter().map(|t| t.id));
            if short {
                break;
            }
            filter.offset += PAGE;
        }
        if seen.is_empty() {
            return Ok(if json {
                doc(&json!({"matched": 0, "retried": 0, "skipped": 0}))
            } else {
                format!("0 {status} tasks match\n")
            });
        }
        let message = format!(
            "{} {status} task(s) match; nothing was retried: pass --yes to queue them again",
            seen.len()
        );
        return Err(CliError { kind: Kind::NeedsYes, message, matched: Some(seen.len()) });
    }
    let mut done = std::collections::HashSet::new();
    let (mut retried, mut skipped) = (0u64, 0u64);
    loop {
        let page = store.list(&filter).await.map_err(|e| partly(e, retried))?;
        let full = page.len() as i64 == PAGE;
        let fresh: Vec<String> = page.into_iter().map(|t| t.id).filter(|id| !done.contains(id)).collect();
        if fresh.is_empty() {
            // A full page of tasks already retried (they failed again):
            // the older matches lie past it.
            if !full {
                break;
            }
            filter.offset += PAGE;
            continue;
        }
        for id in fresh {
            match store.retry(&id, args.reset_attempt).await.map_err(|e| partly(e, retried))? {
                Some(_) => retried += 1,
                // Retried, purged or changed since it was listed.
                None => skipped += 1,
            }
            done.insert(id);
        }
    }
    Ok(if json {
        doc(&json!({"matched": done.len(), "retried": retried, "skipped": skipped}))
    } else {
        format!(
            "queued {retried} of {} matching task(s) again ({skipped} had changed meanwhile)\n",
            done.len()
        )
    })
}

/// A failure part-way through a bulk action, saying what was done before it.
fn partly(e: waymark_store::Error, done: u64) -> CliError {
    let mut e = CliError::from(e);
    e.message = format!("{} (after {done} task(s) were done)", e.message);
    e
}

/// Terminal tasks that finished longer ago than `--older-than`: the count
/// first, and the deletes only with --yes, in batches of `--batch`.
pub async fn purge(url: &str, schema: Option<&str>, args: PurgeArgs, json: bool) -> Out {
    let older_than = duration(&args.older_than, "--older-than")?;
    let status = status_of(&args.status)?;
    if let Some(s) = status.filter(|s| !s.is_terminal()) {
        return Err(CliError::usage(format!("only terminal tasks are purged, not {s}")));
    }
    if args.batch < 1 {
        return Err(CliError::usage(format!("--batch must be at least 1, got {}", args.batch)));
    }
    let mut filter =
        PurgeFilter { queue: args.queue, status, name: args.name, older_than, limit: args.batch };
    let store = open(url, schema).await?;
    if !args.yes {
        let age = &args.older_than;
        let matched = store.purge_count(&filter).await?;
        if matched == 0 {
            return Ok(if json {
                doc(&json!({"matched": 0, "deleted": 0}))
            } else {
                format!("0 terminal tasks finished more than {age} ago: nothing to delete\n")
            });
        }
        let message = format!(
            "{matched} terminal task(s) finished more than {age} ago; nothing was deleted: pass --yes to delete them"
        );
        let matched = usize::try_from(matched).unwrap_or(usize::MAX);
        return Err(CliError { kind: Kind::NeedsYes, message, matched: Some(matched) });
    }
    let mut deleted = 0u64;
    let started = std::time::Instant::now();
    loop {
        // One cutoff for the whole purge: the age is counted from the start,
        // so tasks that finish meanwhile cannot keep every batch full.
        filter.older_than = older_than + started.elapsed();
        let ids = store.purge(&filter).await.map_err(|e| partly(e, deleted))?;
        deleted += ids.len() as u64;
        if (ids.len() as i64) < args.batch {
            break;
        }
    }
    Ok(if json { doc(&json!({"deleted": deleted})) } else { format!("deleted {deleted} task(s)\n") })
}
