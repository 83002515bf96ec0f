//! Human output: aligned tables, a task in full, and times as UTC.

use std::collections::BTreeMap;

use waymark_store::{StatusCounts, Task, TaskStatus};

/// Text from the database made safe for a terminal: control characters
/// (escape sequences a producer could hide in a name) become spaces.
pub fn clean(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

/// An aligned table: a header and rows, each column as wide as its widest
/// cell. Every cell is [`clean`]ed.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows.iter().map(|r| r.iter().map(|c| clean(c)).collect()).collect();
    let rows = &rows[..];
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            out.push_str(cell);
            out.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
        }
        out.trim_end().to_owned()
    };
    let mut out = line(&mut header.iter().copied());
    out.push('\n');
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
        out.push('\n');
    }
    out
}

/// Counts per queue and status, with a total row.
pub fn stats(counts: &BTreeMap<String, StatusCounts>) -> String {
    let mut header = vec!["queue"];
    header.extend(TaskStatus::ALL.iter().map(|s| s.as_str()));
    let row = |name: &str, c: &StatusCounts| {
        let mut r = vec![name.to_owned()];
        r.extend(TaskStatus::ALL.iter().map(|s| count_of(c, *s).to_string()));
        r
    };
    let mut rows: Vec<Vec<String>> = counts.iter().map(|(q, c)| row(q, c)).collect();
    if counts.len() > 1 {
        let mut total = StatusCounts::default();
        for c in counts.values() {
            total.queued += c.queued;
            total.running += c.running;
            total.succeeded += c.succeeded;
            total.failed += c.failed;
            total.canceled += c.canceled;
        }
        rows.push(row("(all)", &total));
    }
    if rows.is_empty() {
        return "no tasks\n".to_owned();
    }
    table(&header, &rows)
}

pub fn count_of(c: &StatusCounts, s: TaskStatus) -> i64 {
    match s {
        TaskStatus::Queued => c.queued,
        TaskStatus::Running => c.running,
        TaskStatus::Succeeded => c.succeeded,
        TaskStatus::Failed => c.failed,
        TaskStatus::Canceled => c.canceled,
    }
}

/// One line per task.
pub fn tasks(tasks: &[Task]) -> String {
    if tasks.is_empty() {
        return "no tasks\n".to_owned();
    }
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            vec![
                t.id.clone(),
                t.name.clone(),
                t.queue.clone(),
                t.status.to_string(),
                format!("{}/{}", t.attempt, t.max_attempts),
                utc(t.created_at_ms),
                t.error_envelope().map(|e| one_line(&e.message, 60)).unwrap_or_default(),
            ]
        })
        .collect();
    table(&["id", "name", "queue", "status", "attempt", "created (UTC)", "error"], &rows)
}

/// A task in full: identity, state, times, tree, and its JSON.
pub fn task(t: &Task) -> String {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_owned());
    let time = |v: Option<i64>| v.map(utc).unwrap_or_else(|| "-".to_owned());
    let mut lines = vec![
        ("id", t.id.clone()),
        ("name", t.name.clone()),
        ("queue", t.queue.clone()),
        ("status", t.status.to_string()),
        ("attempt", format!("{} of {}", t.attempt, t.max_attempts)),
        ("priority", t.priority.to_string()),
        ("worker", opt(&t.worker_id)),
        ("progress", t.progress.map(|p| format!("{p:.2}")).unwrap_or_else(|| "-".to_owned())),
        ("message", opt(&t.message)),
        ("created", utc(t.created_at_ms)),
        ("updated", utc(t.updated_at_ms)),
        ("run at", utc(t.run_at_ms)),
        ("lease until", time(t.lease_until_ms)),
        ("completed", time(t.completed_at_ms)),
        ("cancel asked", time(t.cancel_requested_at_ms)),
        ("parent", opt(&t.parent_id)),
        ("root", opt(&t.root_id)),
        ("correlation", opt(&t.correlation_id)),
    ];
    let json = |v: &serde_json::Value| serde_json::to_string(v).unwrap_or_default();
    // A column waymark could not read shows why, not the null it holds.
    let cell = |column: &str, v: Option<&serde_json::Value>| match t.unreadable_column(column) {
        Some(why) => format!("(unreadable: {})", why.reason),
        None => v.map(json).unwrap_or_else(|| "-".to_owned()),
    };
    lines.push(("payload", cell("payload", Some(&t.payload))));
    lines.push(("metadata", cell("metadata", Some(&t.metadata))));
    lines.push(("result", cell("result", t.result.as_ref())));
    lines.push(("error", cell("error", t.error.as_ref())));
    let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    lines.iter().map(|(k, v)| format!("{k:<width$}  {}\n", clean(v))).collect()
}

fn one_line(s: &str, max: usize) -> String {
    let flat = clean(s);
    if flat.chars().count() <= max {
        flat
    } else {
        let mut cut: String = flat.chars().take(max - 1).collect();
        cut.push('…');
        cut
    }
}

/// Epoch milliseconds as `YYYY-MM-DD HH:MM:SS.mmm` UTC.
pub fn utc(ms: i64) -> String {
    let (secs, milli) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{milli:03}", rest / 3600, rest % 3600 / 60, rest % 60)
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// well-known algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000");
        assert_eq!(utc(1_764_816_728_123), "2025-12-04 02:52:08.123");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00.000");
    }

    #[test]
    fn escape_sequences_never_reach_the_terminal() {
        let t = table(&["name"], &[vec!["evil\x1b]52;c;aGk=\x07name".into()]]);
        assert!(!t.contains('\x1b') && !t.contains('\x07'), "{t:?}");
    }

    #[test]
    fn a_column_waymark_could_not_read_shows_why_not_null() {
        let t: Task = serde_json::from_value(serde_json::json!({
            "id": "task_1", "name": "x", "queue": "q", "status": "queued", "payload": null,
            "result": null, "error": null, "metadata": {}, "progress": null, "message": null,
            "attempt": 0, "max_attempts": 3, "priority": 0, "worker_id": null,
            "lease_until_ms": null, "run_at_ms": 0, "cancel_requested_at_ms": null,
            "parent_id": null, "root_id": "task_1", "correlation_id": null,
            "created_at_ms": 0, "updated_at_ms": 0, "completed_at_ms": null,
            "unreadable": [{ "column": "payload", "reason": "number out of range" }],
        }))
        .expect("a task");
        let shown = task(&t);
        assert!(shown.contains("payload       (unreadable: number out of range)"), "{shown}");
        assert!(shown.contains("metadata      {}"), "{shown}");
    }

    #[test]
    fn tables_align_on_the_widest_cell() {
        let t = table(&["a", "bb"], &[vec!["xyz".into(), "1".into()], vec!["q".into(), "22".into()]]);
        assert_eq!(t, "a    bb\nxyz  1\nq    22\n");
    }
}
