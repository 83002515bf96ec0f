//! What the held ledger says of a task ([`HeldTask`]), how to ask for a
//! list of them ([`HeldFilter`]), and the answers of a submit
//! ([`HeldReceipt`]) and of the ledger's upkeep ([`HeldSweep`]).

use std::fmt;

use serde::Serialize;
use serde_json::Value as Json;

use crate::cells::{int8, opt_bool, opt_int8, opt_text, text, text_array};
use crate::error::{Error, Result};
use crate::held::OnDeadline;
use crate::value::Row;

/// Where a task of the held ledger is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HeldState {
    /// Waiting: not in `cairnq_tasks`; no worker of any SDK can claim it.
    Held,
    /// In `cairnq_tasks`, an ordinary task; its end not yet passed on.
    Released,
    /// Its end passed on to what waits for it (see [`HeldTask::outcome`]).
    Done,
    /// Canceled while held: it never ran.
    Canceled,
}

impl HeldState {
    /// The ledger's spelling: `held`, `released`, `done`, `canceled`.
    pub fn as_str(self) -> &'static str {
        match self {
            HeldState::Held => "held",
            HeldState::Released => "released",
            HeldState::Done => "done",
            HeldState::Canceled => "canceled",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<Self> {
        [HeldState::Held, HeldState::Released, HeldState::Done, HeldState::Canceled]
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| Error::Decode(format!("unknown held state {s:?}")))
    }
}

impl fmt::Display for HeldState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One task of the held ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct HeldTask {
    /// The task's id, held and in `cairnq_tasks` after its release.
    pub id: String,
    /// The flow it was submitted in, if any.
    pub flow_id: Option<String>,
    /// A plain task that a held task depends on, followed here for its end.
    pub watched: bool,
    /// Handler name.
    pub name: String,
    /// Queue it is (or will be) in.
    pub queue: String,
    /// Where it is.
    pub state: HeldState,
    /// How it ended: `succeeded`, `failed`, `canceled`, `missing` (its row
    /// was gone), `skipped` or `dropped` (by an operator); canceled while
    /// held: `dependency`, `deadline` or `operator`.
    pub outcome: Option<String>,
    /// Its key, and its place in the key's order.
    pub order_key: Option<String>,
    /// Its place in the key's order (the key's submits, in commit order).
    pub order_seq: Option<i64>,
    /// Whether it holds (or has held) its key's turn; true without a key.
    pub turn: bool,
    /// The ids it depends on.
    pub after: Vec<String>,
    /// Those of `after` that have not succeeded yet.
    pub waiting_on: Vec<String>,
    /// The event it is held for.
    pub event: Option<String>,
    /// Whether that event is still awaited.
    pub event_pending: bool,
    /// When it stops waiting for the event (epoch ms).
    pub event_deadline_ms: Option<i64>,
    /// What happens then.
    pub on_deadline: Option<OnDeadline>,
    /// When it was submitted, released and ended (epoch ms).
    pub created_at_ms: i64,
    /// When it was released into `cairnq_tasks`.
    pub released_at_ms: Option<i64>,
    /// When its end was passed on, or it was canceled.
    pub done_at_ms: Option<i64>,
}

impl HeldTask {
    pub(crate) fn from_row(mut row: Row) -> Result<Self> {
        let r = &mut row;
        let on_deadline = match opt_text(r, "on_deadline")?.as_deref() {
            None => None,
            Some("cancel") => Some(OnDeadline::Cancel),
            Some("release") => Some(OnDeadline::Release),
            Some(other) => return Err(Error::Decode(format!("unknown on_deadline {other:?}"))),
        };
        Ok(HeldTask {
            id: text(r, "id")?,
            flow_id: opt_text(r, "flow_id")?,
            watched: opt_bool(r, "watched")?.unwrap_or(false),
            name: text(r, "name")?,
            queue: text(r, "queue")?,
            state: HeldState::parse(&text(r, "state")?)?,
            outcome: opt_text(r, "outcome")?,
            order_key: opt_text(r, "order_key")?,
            order_seq: opt_int8(r, "order_seq")?,
            turn: opt_bool(r, "turn")?.unwrap_or(false),
            after: text_array(r, "after")?,
            waiting_on: text_array(r, "waiting_on")?,
            event: opt_text(r, "waits_event")?,
            event_pending: opt_text(r, "event_name")?.is_some(),
            event_deadline_ms: opt_int8(r, "event_deadline_ms")?,
            on_deadline,
            created_at_ms: int8(r, "created_at_ms")?,
            released_at_ms: opt_int8(r, "released_at_ms")?,
            done_at_ms: opt_int8(r, "done_at_ms")?,
        })
    }

    /// What a held task still waits for, in words (empty once it is not
    /// held): its key's turn, the tasks it depends on, its event.
    pub fn waiting_for(&self) -> Vec<String> {
        if self.state != HeldState::Held {
            return Vec::new();
        }
        let mut out = Vec::new();
        if let (Some(key), false) = (&self.order_key, self.turn) {
            out.push(format!("its turn in key {key}"));
        }
        if !self.waiting_on.is_empty() {
            out.push(format!("tasks {}", self.waiting_on.join(", ")));
        }
        if let (Some(event), true) = (&self.event, self.event_pending) {
            out.push(format!("event {event}"));
        }
        out
    }
}

/// Which ledger rows [`Store::list_held`](crate::Store::list_held) answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldFilter {
    /// Only this state. Defaults to [`HeldState::Held`].
    pub state: Option<HeldState>,
    /// Only this key. Defaults to any.
    pub order_key: Option<String>,
    /// Only this flow. Defaults to any.
    pub flow_id: Option<String>,
    /// Most rows, newest first, at least 1. Defaults to 100.
    pub limit: i64,
}

impl Default for HeldFilter {
    fn default() -> Self {
        HeldFilter { state: Some(HeldState::Held), order_key: None, flow_id: None, limit: 100 }
    }
}

/// A submitted held task: its id and whether it went into `cairnq_tasks`
/// at once (nothing held it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeldReceipt {
    /// The task's id.
    pub id: String,
    /// Whether it was released in the submit's own transaction.
    pub released: bool,
}

/// What one pass of the held ledger's upkeep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct HeldSweep {
    /// Ends of released tasks passed on that no settlement had passed on
    /// (settled by another SDK or by plain SQL, or a lease that expired
    /// for good, or a plain task a held task depends on).
    pub settled: i64,
    /// Tasks whose event deadline passed (released or canceled).
    pub deadlines: i64,
    /// Expired events forgotten.
    pub events_expired: i64,
    /// Ends whose passing on failed (logged by the server); the next pass
    /// tries them again.
    pub failed: i64,
}

impl HeldSweep {
    pub(crate) fn from_json(counts: &Json) -> Self {
        let n = |k: &str| counts.get(k).and_then(Json::as_i64).unwrap_or(0);
        HeldSweep {
            settled: n("settled"),
            deadlines: n("deadlines"),
            events_expired: n("events_expired"),
            failed: n("failed"),
        }
    }

    /// Whether the pass did nothing.
    pub fn is_empty(&self) -> bool {
        *self == HeldSweep::default()
    }
}
