//! A run's durable steps and sleeps as the ledger records them
//! ([`StepRecord`]), read back by the worker when a task runs again.

use serde::Serialize;
use serde_json::Value as Json;

use crate::cells::{int4, int8, json_cell, opt_bool, opt_int8, text};
use crate::error::{Error, Result};
use crate::value::Row;

/// What a recorded place of a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StepKind {
    /// A step: its closure ran to success, its result recorded.
    Step,
    /// A durable sleep, with the time it ends.
    Sleep,
    /// A wait for an event, with its deadline; done once the event came.
    Wait,
}

impl StepKind {
    /// The ledger's spelling: `step` or `sleep`.
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Step => "step",
            StepKind::Sleep => "sleep",
            StepKind::Wait => "wait",
        }
    }
}

/// One recorded step or sleep of a task's run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct StepRecord {
    /// Its place in the run, from 0.
    pub seq: i32,
    /// Its name, unique within the task.
    pub name: String,
    /// Step or sleep.
    pub kind: StepKind,
    /// A step's result.
    pub result: Option<Json>,
    /// When a sleep ends, or a wait gives up (epoch ms, database clock).
    pub wake_at_ms: Option<i64>,
    /// Whether a wait has its answer (the event's payload in `result`, or
    /// `timed_out`); true for steps and sleeps.
    pub done: bool,
    /// Whether a wait was closed by its deadline.
    pub timed_out: bool,
    /// When it was recorded.
    pub recorded_at_ms: i64,
}

/// A task's recorded steps, with the database's clock when they were read.
#[derive(Debug, Clone, PartialEq)]
pub struct StepHistory {
    /// In run order.
    pub records: Vec<StepRecord>,
    /// The database's clock at the read (epoch ms); none when nothing is
    /// recorded.
    pub now_ms: Option<i64>,
}

impl StepRecord {
    /// The record of `row`, and the clock the row carries (`now_ms`).
    pub(crate) fn from_row(mut row: Row) -> Result<(Self, i64)> {
        let r = &mut row;
        let kind = match text(r, "kind")?.as_str() {
            "step" => StepKind::Step,
            "sleep" => StepKind::Sleep,
            "wait" => StepKind::Wait,
            other => return Err(Error::Decode(format!("unknown step kind {other:?}"))),
        };
        let result = json_cell(r, "result")?.map_err(Error::Decode)?;
        let record = StepRecord {
            seq: int4(r, "seq")?,
            name: text(r, "name")?,
            kind,
            result,
            wake_at_ms: opt_int8(r, "wake_at_ms")?,
            done: opt_bool(r, "done")?.unwrap_or(true),
            timed_out: opt_bool(r, "timed_out")?.unwrap_or(false),
            recorded_at_ms: int8(r, "recorded_at_ms")?,
        };
        Ok((record, int8(r, "now_ms")?))
    }
}

/// How a run's wait for an event went ([`WorkerProtocol::wait_for_event`](crate::worker_protocol::WorkerProtocol::wait_for_event)).
#[derive(Debug, Clone, PartialEq)]
pub enum EventWait {
    /// The event came (now, or before the wait began and still kept): its
    /// payload.
    Received(Json),
    /// The deadline passed first.
    TimedOut,
    /// Neither yet: the task was snoozed until the deadline in the same
    /// transaction (an emit makes it due at once), for `left`; `status` is
    /// where the snooze left it (queued, or canceled when a cancel was
    /// requested).
    Parked {
        /// How long until the deadline.
        left: std::time::Duration,
        /// The task's status after the snooze.
        status: crate::task::TaskStatus,
    },
}
