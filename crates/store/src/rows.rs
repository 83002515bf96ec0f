//! Rows into tasks: a whole row by position when its columns are the
//! table's in order, else by name; a claim's rows, which carry neither
//! status nor worker.

use std::sync::Arc;

use serde_json::Value as Json;

use crate::cells::{int4, int8, json_cell, opt_f64, opt_int8, opt_text, status, text, Cells};
use crate::error::Result;
use crate::task::{Task, TaskState, TaskStatus, Unreadable};
use crate::value::{Row, Value};

impl Task {
    /// Decodes a row. JSON text that serde_json cannot hold does not fail
    /// the row (one such task must never fail a claim or a list of others):
    /// that field reads as `null` and [`Task::unreadable`] names it. A
    /// column of the wrong type or missing still fails: that is a broken
    /// executor or schema, not one task's data.
    pub(crate) fn from_row(mut row: Row) -> Result<Task> {
        Task::from_cells(&mut row, None)
    }

    /// The tasks of a result's rows. The rows of one result share their
    /// names: when those are the task table's columns in its order (a read
    /// of whole rows), the cells are taken by position, with no lookup by
    /// name per cell. A claim's rows are `from_claimed_rows`'.
    pub(crate) fn from_rows(rows: Vec<Row>) -> Result<Vec<Task>> {
        Task::decode_all(rows, None)
    }

    /// The tasks a claim by `worker_id` answered: the table's columns but
    /// `status` and `worker_id` (`CLAIMED_COLUMNS`), which the claim set to
    /// `running` and the claiming worker, so the row need not carry them.
    pub(crate) fn from_claimed_rows(rows: Vec<Row>, worker_id: &str) -> Result<Vec<Task>> {
        Task::decode_all(rows, Some(worker_id))
    }

    fn decode_all(rows: Vec<Row>, claimed_by: Option<&str>) -> Result<Vec<Task>> {
        let columns: &'static [&'static str] = match claimed_by {
            Some(_) => &CLAIMED_COLUMNS,
            None => &TASK_COLUMNS,
        };
        // Sized once: a claim's hundreds of tasks would otherwise move each
        // time the vector grew.
        let mut tasks = Vec::with_capacity(rows.len());
        // The last names seen and whether they are `columns`: told once
        // per shared list, either way.
        let mut seen: Option<(Arc<[String]>, bool)> = None;
        for mut row in rows {
            let in_order = match &seen {
                Some((names, in_order)) if row.shares_names(names) => *in_order,
                _ => {
                    let in_order = row.named(columns);
                    seen = Some((row.names().clone(), in_order));
                    in_order
                }
            };
            if in_order {
                let mut cells = InOrder { cells: row.into_values().into_iter(), columns, taken: 0 };
                tasks.push(Task::from_cells(&mut cells, claimed_by)?);
            } else {
                tasks.push(Task::from_cells(&mut row, claimed_by)?);
            }
        }
        Ok(tasks)
    }

    /// A task from its cells, taken in the table's order; a claimed row's
    /// status and worker are known (`claimed_by`), not read.
    fn from_cells(r: &mut impl Cells, claimed_by: Option<&str>) -> Result<Task> {
        let mut unreadable = Vec::new();
        let mut lenient = |r: &mut _, col: &str| -> Result<Option<Json>> {
            Ok(json_cell(r, col)?.unwrap_or_else(|reason| {
                unreadable.push(Unreadable { column: col.to_owned(), reason });
                None
            }))
        };
        // In the table's column order (`TASK_COLUMNS`; see `Row::take`).
        Ok(Task {
            id: text(r, "id")?,
            name: text(r, "name")?,
            queue: text(r, "queue")?,
            status: match claimed_by {
                Some(_) => TaskStatus::Running,
                None => status(r, "status")?,
            },
            payload: lenient(r, "payload")?.unwrap_or(Json::Null),
            result: lenient(r, "result")?,
            error: lenient(r, "error")?,
            metadata: lenient(r, "metadata")?.unwrap_or(Json::Null),
            progress: opt_f64(r, "progress")?,
            message: opt_text(r, "message")?,
            attempt: int4(r, "attempt")?,
            max_attempts: int4(r, "max_attempts")?,
            priority: int4(r, "priority")?,
            worker_id: match claimed_by {
                Some(worker) => Some(worker.to_owned()),
                None => opt_text(r, "worker_id")?,
            },
            lease_until_ms: opt_int8(r, "lease_until_ms")?,
            run_at_ms: int8(r, "run_at_ms")?,
            cancel_requested_at_ms: opt_int8(r, "cancel_requested_at_ms")?,
            parent_id: opt_text(r, "parent_id")?,
            root_id: opt_text(r, "root_id")?,
            correlation_id: opt_text(r, "correlation_id")?,
            created_at_ms: int8(r, "created_at_ms")?,
            updated_at_ms: int8(r, "updated_at_ms")?,
            completed_at_ms: opt_int8(r, "completed_at_ms")?,
            unreadable,
        })
    }
}

/// The task table's columns in its order (`cairnq_tasks`, migration 0001),
/// as `Task::from_cells` takes them.
const TASK_COLUMNS: [&str; 23] = [
    "id",
    "name",
    "queue",
    "status",
    "payload",
    "result",
    "error",
    "metadata",
    "progress",
    "message",
    "attempt",
    "max_attempts",
    "priority",
    "worker_id",
    "lease_until_ms",
    "run_at_ms",
    "cancel_requested_at_ms",
    "parent_id",
    "root_id",
    "correlation_id",
    "created_at_ms",
    "updated_at_ms",
    "completed_at_ms",
];

/// What a claim answers: `TASK_COLUMNS` less `status` and `worker_id`,
/// in the same order (see `Task::from_claimed_rows`).
const CLAIMED_COLUMNS: [&str; 21] = claimed_columns();

/// `TASK_COLUMNS` without the two a claim sets to known values.
const fn claimed_columns() -> [&'static str; 21] {
    let mut out = [""; 21];
    let (mut from, mut to) = (0, 0);
    while from < TASK_COLUMNS.len() {
        let name = TASK_COLUMNS[from];
        if !same(name, "status") && !same(name, "worker_id") {
            out[to] = name;
            to += 1;
        }
        from += 1;
    }
    out
}

/// String equality a constant can use.
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

impl TaskState {
    pub(crate) fn from_row(mut row: Row) -> Result<TaskState> {
        Ok(TaskState { id: text(&mut row, "id")?, status: status(&mut row, "status")? })
    }
}

/// A row's cells in the order of `columns` (`TASK_COLUMNS` or
/// `CLAIMED_COLUMNS`), and how many were taken.
struct InOrder {
    cells: std::vec::IntoIter<Value>,
    columns: &'static [&'static str],
    taken: usize,
}

impl Cells for InOrder {
    fn cell(&mut self, col: &str) -> Option<Value> {
        debug_assert_eq!(self.columns.get(self.taken).copied(), Some(col), "taken out of the table's order");
        self.taken += 1;
        self.cells.next()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The cells of a running task `id` in `TASK_COLUMNS` order, the
    /// optional ones null.
    fn cells(id: &str) -> Vec<Value> {
        TASK_COLUMNS
            .iter()
            .map(|c| match *c {
                "id" | "root_id" => Value::from(id),
                "name" => Value::from("n"),
                "queue" => Value::from("q"),
                "status" => Value::from("running"),
                "payload" | "metadata" => Value::Jsonb(Json::Object(Default::default())),
                "attempt" | "max_attempts" | "priority" => Value::Int4(1),
                "run_at_ms" | "created_at_ms" | "updated_at_ms" => Value::Int8(5),
                _ => Value::Null,
            })
            .collect()
    }

    /// A task read from [`cells`], by name.
    fn plain_task() -> Task {
        let row = Row::new(TASK_COLUMNS.iter().map(|n| (*n).to_owned()).zip(cells("t")).collect());
        Task::from_rows(vec![row]).expect("decode").remove(0)
    }

    #[test]
    fn an_error_not_shaped_as_an_envelope_is_kept_not_dropped() {
        let with = |error: Json| Task { error: Some(error), ..plain_task() };
        let e = with(json!("boom")).error_envelope().expect("kept");
        assert_eq!((e.kind.as_str(), e.code.as_str(), e.message.as_str()), ("", "", "boom"));
        let e = with(json!({ "type": "E", "code": 7, "message": "m" })).error_envelope().expect("kept");
        assert_eq!(e.message, r#"{"code":7,"message":"m","type":"E"}"#);
        assert_eq!(e.details, json!({ "type": "E", "code": 7, "message": "m" }));
        let e = with(json!({ "type": "E", "code": "c", "message": "m", "retryable": true })).error_envelope();
        assert_eq!(e.map(|e| (e.code, e.retryable)), Some(("c".to_owned(), true)));
        assert_eq!(plain_task().error_envelope(), None);
    }

    /// `TASK_COLUMNS` is the table's own order: else no claim would take
    /// the positional path (it would fall back to names, slower but right).
    #[test]
    fn task_columns_are_the_tables_in_order() {
        let init = waymark_protocol::migrations()[0].sql;
        let body = init.split("create table if not exists cairnq_tasks (").nth(1).expect("the task table");
        let body = body.split("\n);").next().expect("its end");
        // A column's line starts with its name; a continuation (a check)
        // is indented further.
        let columns: Vec<&str> = body
            .lines()
            .filter(|l| l.starts_with("    ") && !l.starts_with("     "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(columns, TASK_COLUMNS);
    }

    #[test]
    fn rows_in_the_tables_order_decode_by_position_and_others_by_name() {
        let names: Arc<[String]> = TASK_COLUMNS.iter().map(|n| (*n).to_owned()).collect();
        let rows = vec![Row::with_names(names.clone(), cells("a")), Row::with_names(names, cells("b"))];
        let tasks = Task::from_rows(rows).expect("decode");
        assert_eq!(tasks.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!((tasks[1].root_id.as_deref(), tasks[1].attempt, tasks[1].run_at_ms), (Some("b"), 1, 5));
        // Another order (a thin adapter's `select` of its own) goes by name.
        let mut reversed: Vec<(String, Value)> =
            TASK_COLUMNS.iter().map(|n| (*n).to_owned()).zip(cells("c")).collect();
        reversed.reverse();
        let tasks = Task::from_rows(vec![Row::new(reversed)]).expect("decode by name");
        assert_eq!((tasks[0].id.as_str(), tasks[0].status), ("c", TaskStatus::Running));
    }

    /// A claim's rows carry neither status nor worker: both are known.
    #[test]
    fn claimed_rows_take_their_status_and_worker_from_the_claim() {
        let claimed = |id: &str| -> Vec<(String, Value)> {
            let cells = TASK_COLUMNS.iter().zip(cells(id));
            let kept = cells.filter(|(c, _)| !matches!(**c, "status" | "worker_id"));
            kept.map(|(c, v)| ((*c).to_owned(), v)).collect()
        };
        let names: Vec<String> = claimed("a").into_iter().map(|(c, _)| c).collect();
        assert_eq!(names, CLAIMED_COLUMNS, "the claimed columns are the table's, in order, less two");
        let mut reversed = claimed("b");
        reversed.reverse();
        let tasks = Task::from_claimed_rows(vec![Row::new(claimed("a")), Row::new(reversed)], "w-1")
            .expect("decode by position, then by name");
        for (task, id) in tasks.iter().zip(["a", "b"]) {
            assert_eq!(
                (task.id.as_str(), task.status, task.worker_id.as_deref(), task.attempt),
                (id, TaskStatus::Running, Some("w-1"), 1)
            );
        }
    }
}
