//! Typed rows: tasks, statuses, the error envelope.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::{Error, Result};
use crate::value::{Row, Value};

/// The five statuses of protocol v1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    /// Waiting to be claimed (possibly not yet due).
    Queued,
    /// Claimed by a worker that holds a lease.
    Running,
    /// Finished with a result.
    Succeeded,
    /// Finished with an error, no attempts left or not retryable.
    Failed,
    /// Canceled before or while running.
    Canceled,
}

impl TaskStatus {
    /// Every status, in protocol order.
    pub const ALL: [TaskStatus; 5] = [
        TaskStatus::Queued,
        TaskStatus::Running,
        TaskStatus::Succeeded,
        TaskStatus::Failed,
        TaskStatus::Canceled,
    ];

    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Queued => "queued",
            TaskStatus::Running => "running",
            TaskStatus::Succeeded => "succeeded",
            TaskStatus::Failed => "failed",
            TaskStatus::Canceled => "canceled",
        }
    }

    /// Whether the task has finished (succeeded, failed or canceled).
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskStatus::Succeeded | TaskStatus::Failed | TaskStatus::Canceled)
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TaskStatus {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        TaskStatus::ALL.into_iter().find(|st| st.as_str() == s).ok_or_else(|| {
            Error::invalid(format!(
                "unknown task status {s:?}: expected queued, running, succeeded, failed or canceled"
            ))
        })
    }
}

/// A task row. Field names are the table's column names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// `task_` + ULID.
    pub id: String,
    /// The handler name.
    pub name: String,
    /// The queue.
    pub queue: String,
    /// Where the task is in its life.
    pub status: TaskStatus,
    /// The input.
    pub payload: Json,
    /// The handler's result, once succeeded.
    pub result: Option<Json>,
    /// The error envelope of the last failure (see [`ErrorEnvelope`]).
    pub error: Option<Json>,
    /// Free-form metadata: any JSON value, an object by convention.
    pub metadata: Json,
    /// Progress in `[0, 1]`, as the handler last reported it.
    pub progress: Option<f64>,
    /// A message the handler last reported.
    pub message: Option<String>,
    /// Runs started so far (incremented by each claim).
    pub attempt: i32,
    /// Runs allowed.
    pub max_attempts: i32,
    /// Higher is claimed first.
    pub priority: i32,
    /// The worker running it (kept on terminal rows).
    pub worker_id: Option<String>,
    /// Lease deadline, epoch ms; set exactly while running.
    pub lease_until_ms: Option<i64>,
    /// When the task is due, epoch ms.
    pub run_at_ms: i64,
    /// When a cancel was requested while it ran, epoch ms.
    pub cancel_requested_at_ms: Option<i64>,
    /// The task that submitted this one.
    pub parent_id: Option<String>,
    /// The top of this task's tree (its own id for a top-level task).
    pub root_id: Option<String>,
    /// A caller-chosen id tying related tasks together.
    pub correlation_id: Option<String>,
    /// Insert time, epoch ms (database clock).
    pub created_at_ms: i64,
    /// Last write, epoch ms.
    pub updated_at_ms: i64,
    /// When it became terminal, epoch ms.
    pub completed_at_ms: Option<i64>,
    /// The JSON columns of the row that could not be read: legal jsonb
    /// that serde_json cannot hold (a number past f64's range such as
    /// `1e400`, nesting deeper than 128), which another SDK or plain SQL
    /// may have written. Each such field reads as `null` here; the database
    /// keeps the value as written. A claim never hands out a task whose
    /// payload or metadata is unreadable: it fails it for good (see
    /// [`Store::claim`](crate::Store::claim)). [`Store::call`](crate::Store::call)
    /// answers [`Error::UnreadableAnswer`](crate::Error::UnreadableAnswer)
    /// for a result or an error it cannot read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<Unreadable>,
}

/// One JSON column of a row that could not be read ([`Task::unreadable`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unreadable {
    /// The column: `payload`, `result`, `error` or `metadata`.
    pub column: String,
    /// Why serde_json could not hold it.
    pub reason: String,
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "column {}: {}", self.column, self.reason)
    }
}

impl Task {
    /// The stored error as an envelope, when there is one. An error that
    /// is not shaped as an envelope (a plain string, a `code` that is a
    /// number), as another client or plain SQL may write it, is kept
    /// rather than dropped: its text is the message, the value itself the
    /// details, and the type and code are empty.
    pub fn error_envelope(&self) -> Option<ErrorEnvelope> {
        let error = self.error.as_ref()?;
        Some(serde_json::from_value(error.clone()).unwrap_or_else(|_| ErrorEnvelope {
            kind: String::new(),
            code: String::new(),
            message: match error {
                Json::String(s) => s.clone(),
                other => other.to_string(),
            },
            retryable: false,
            details: error.clone(),
        }))
    }

    /// Whether a handler could not see this task as it was submitted: its
    /// payload or metadata cannot be read.
    pub fn input_unreadable(&self) -> bool {
        self.unreadable.iter().any(|u| u.column == "payload" || u.column == "metadata")
    }

    /// Why one column could not be read, if it could not.
    pub fn unreadable_column(&self, column: &str) -> Option<&Unreadable> {
        self.unreadable.iter().find(|u| u.column == column)
    }

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

/// The wait probe's answer: a task's id and status only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskState {
    /// The task.
    pub id: String,
    /// Its status.
    pub status: TaskStatus,
}

impl TaskState {
    pub(crate) fn from_row(mut row: Row) -> Result<TaskState> {
        Ok(TaskState { id: text(&mut row, "id")?, status: status(&mut row, "status")? })
    }
}

/// One lease renewed by `heartbeat_batch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beat {
    /// The task, still owned by the worker.
    pub id: String,
    /// Set when someone asked for the task to stop.
    pub cancel_requested_at_ms: Option<i64>,
}

/// What [`Store::renew_leases`](crate::Store::renew_leases) found: the
/// leases it extended, and those of rows another transaction kept locked
/// past its wait. Every id asked for that is in neither has lost its lease.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renewal {
    /// Still owned, lease extended.
    pub renewed: Vec<Beat>,
    /// Owned when the renewal began, but its row stayed locked by another
    /// transaction (a settlement or progress write in flight, a handler's
    /// transaction, an operator's update), or renewing it failed or was not
    /// tried after another failed, so the lease was not extended this time.
    /// It may have been settled or lost since; the next renewal tells.
    /// Renew it again soon.
    pub held: Vec<Beat>,
}

/// One settlement's answer from [`Store::settle_batch`](crate::Store::settle_batch):
/// the task and the status it settled in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settled {
    /// The task.
    pub id: String,
    /// Its status after the settlement (`Succeeded`, `Canceled`, `Failed`,
    /// or `Queued` for a retry).
    pub status: TaskStatus,
}

impl From<&Task> for Settled {
    fn from(t: &Task) -> Self {
        Settled { id: t.id.clone(), status: t.status }
    }
}

/// Task counts of one queue, by status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusCounts {
    /// Queued tasks (delayed ones included).
    pub queued: i64,
    /// Running tasks.
    pub running: i64,
    /// Succeeded tasks.
    pub succeeded: i64,
    /// Failed tasks.
    pub failed: i64,
    /// Canceled tasks.
    pub canceled: i64,
}

impl StatusCounts {
    /// The count for `status`.
    pub fn get(&self, status: TaskStatus) -> i64 {
        match status {
            TaskStatus::Queued => self.queued,
            TaskStatus::Running => self.running,
            TaskStatus::Succeeded => self.succeeded,
            TaskStatus::Failed => self.failed,
            TaskStatus::Canceled => self.canceled,
        }
    }

    pub(crate) fn add(&mut self, status: TaskStatus, n: i64) {
        let slot = match status {
            TaskStatus::Queued => &mut self.queued,
            TaskStatus::Running => &mut self.running,
            TaskStatus::Succeeded => &mut self.succeeded,
            TaskStatus::Failed => &mut self.failed,
            TaskStatus::Canceled => &mut self.canceled,
        };
        *slot += n;
    }
}

/// Error codes of the protocol's envelope.
pub mod codes {
    /// The handler raised an error (retryable).
    pub const HANDLER_ERROR: &str = "handler_error";
    /// The handler raised a task error (retryable unless it says otherwise).
    pub const TASK_ERROR: &str = "task_error";
    /// No handler is registered for the task's name (permanent).
    pub const NO_HANDLER: &str = "no_handler";
    /// The handler ran past its time limit (retryable).
    pub const HANDLER_TIMEOUT: &str = "handler_timeout";
    /// The result could not be serialised (permanent).
    pub const UNSERIALIZABLE_RESULT: &str = "unserializable_result";
    /// The lease expired with no attempts left (permanent).
    pub const LEASE_EXPIRED: &str = "lease_expired";
}

/// The error envelope stored in `error`: `{type, code, message, retryable, details}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorEnvelope {
    /// The error's class name, such as `LeaseExpired`.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// One of [`codes`], or a handler's own code.
    #[serde(default)]
    pub code: String,
    /// Human-readable message.
    #[serde(default)]
    pub message: String,
    /// Whether another attempt may succeed.
    #[serde(default)]
    pub retryable: bool,
    /// Anything else.
    #[serde(default)]
    pub details: Json,
}

impl ErrorEnvelope {
    /// An envelope with empty details.
    pub fn new(
        kind: impl Into<String>,
        code: impl Into<String>,
        message: impl Into<String>,
        retryable: bool,
    ) -> Self {
        ErrorEnvelope {
            kind: kind.into(),
            code: code.into(),
            message: message.into(),
            retryable,
            details: Json::Object(Default::default()),
        }
    }

    /// The envelope recover_leases writes when a lease expires on the last attempt.
    pub fn lease_expired() -> Self {
        ErrorEnvelope::new(
            "LeaseExpired",
            codes::LEASE_EXPIRED,
            "task lease expired and max attempts reached",
            false,
        )
    }

    /// As JSON, for the `error` column.
    pub fn to_json(&self) -> Json {
        serde_json::to_value(self).unwrap_or(Json::Null)
    }
}

// Column decoders. Each names the column it failed on.

/// Where the decoders take a row's cells from: a [`Row`], by name, or the
/// cells of a row known to hold `TASK_COLUMNS`, in order.
pub(crate) trait Cells {
    /// Takes `col`'s cell.
    fn cell(&mut self, col: &str) -> Option<Value>;
}

impl Cells for Row {
    fn cell(&mut self, col: &str) -> Option<Value> {
        self.take(col)
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

fn take(row: &mut impl Cells, col: &str) -> Result<Value> {
    row.cell(col).ok_or_else(|| Error::Decode(format!("column {col}: missing from the row")))
}

fn wrong(col: &str, want: &str, got: &Value) -> Error {
    Error::Decode(format!("column {col}: expected {want}, got {}", got.kind()))
}

/// Takes a cell, `None` for a null one. A null, and a number or a bool in
/// [`scalar`], is let go without the enum's drop glue: an out-of-line call
/// per cell otherwise, and most of a claimed row's cells are these.
fn take_non_null(row: &mut impl Cells, col: &str) -> Result<Option<Value>> {
    let v = take(row, col)?;
    if matches!(v, Value::Null) {
        std::mem::forget(v); // nothing to free
        return Ok(None);
    }
    Ok(Some(v))
}

/// A scalar column's cell: `pick` reads the variants it allows, which must
/// hold no heap data (a number or a bool), else they would leak.
fn scalar<T>(
    row: &mut impl Cells,
    col: &str,
    want: &str,
    pick: impl FnOnce(&Value) -> Option<T>,
) -> Result<Option<T>> {
    let Some(v) = take_non_null(row, col)? else { return Ok(None) };
    match pick(&v) {
        Some(x) => {
            debug_assert!(
                matches!(v, Value::Int4(_) | Value::Int8(_) | Value::Float8(_) | Value::Bool(_)),
                "only a heap-free cell may be forgotten"
            );
            std::mem::forget(v); // a number or a bool: nothing to free
            Ok(Some(x))
        }
        None => Err(wrong(col, want, &v)),
    }
}

pub(crate) fn opt_text(row: &mut impl Cells, col: &str) -> Result<Option<String>> {
    match take_non_null(row, col)? {
        None => Ok(None),
        Some(Value::Text(s)) => Ok(Some(s)),
        Some(other) => Err(wrong(col, "text", &other)),
    }
}

pub(crate) fn text(row: &mut impl Cells, col: &str) -> Result<String> {
    opt_text(row, col)?.ok_or_else(|| Error::Decode(format!("column {col}: unexpected null")))
}

pub(crate) fn text_array(row: &mut impl Cells, col: &str) -> Result<Vec<String>> {
    match take(row, col)? {
        Value::TextArray(v) => Ok(v),
        other => Err(wrong(col, "text[]", &other)),
    }
}

pub(crate) fn opt_int8(row: &mut impl Cells, col: &str) -> Result<Option<i64>> {
    scalar(row, col, "int8", |v| match v {
        Value::Int8(n) => Some(*n),
        Value::Int4(n) => Some(i64::from(*n)),
        _ => None,
    })
}

pub(crate) fn int8(row: &mut impl Cells, col: &str) -> Result<i64> {
    opt_int8(row, col)?.ok_or_else(|| Error::Decode(format!("column {col}: unexpected null")))
}

fn int4(row: &mut impl Cells, col: &str) -> Result<i32> {
    let n = int8(row, col)?;
    i32::try_from(n).map_err(|_| Error::Decode(format!("column {col}: {n} does not fit int4")))
}

fn opt_f64(row: &mut impl Cells, col: &str) -> Result<Option<f64>> {
    scalar(row, col, "float8", |v| match v {
        Value::Float8(f) => Some(*f),
        Value::Int4(n) => Some(f64::from(*n)),
        _ => None,
    })
}

pub(crate) fn opt_bool(row: &mut impl Cells, col: &str) -> Result<Option<bool>> {
    scalar(row, col, "bool", |v| match v {
        Value::Bool(b) => Some(*b),
        _ => None,
    })
}

/// A JSON column: the outer error is a broken row (missing, wrong type);
/// the inner one is JSON text serde_json cannot hold, with the reason.
fn json_cell(row: &mut impl Cells, col: &str) -> Result<std::result::Result<Option<Json>, String>> {
    match take_non_null(row, col)? {
        None => Ok(Ok(None)),
        Some(Value::Jsonb(j)) => Ok(Ok(Some(j))),
        // An executor hands back as text the JSON that serde_json cannot
        // hold (see `Value`); JSON text from a thin adapter parses here.
        Some(Value::Text(s)) => {
            Ok(serde_json::from_str(&s).map(Some).map_err(|e| format!("its JSON cannot be read here ({e})")))
        }
        Some(other) => Err(wrong(col, "jsonb", &other)),
    }
}

pub(crate) fn status(row: &mut impl Cells, col: &str) -> Result<TaskStatus> {
    let s = text(row, col)?;
    s.parse().map_err(|_| Error::Decode(format!("column {col}: unknown status {s:?}")))
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
