//! A periodic task: its id, when it falls, what it submits, and what it
//! does about slots it missed.

use serde_json::{json, Value as Json};
use waymark_store::{Conflict, Error, NewTask, Result};

use crate::every::{slot_label, Every};

/// The metadata keys a slot's task carries (beside the template's own).
pub const SCHEDULE_KEY: &str = "waymark.schedule";
/// The slot's time, RFC 3339 in UTC.
pub const SLOT_KEY: &str = "waymark.slot";

/// What a scheduler does about slots it missed: those that fell before it
/// started, or while it could not submit (the database away or refusing
/// writes, the queue full past the store's maximum wait). The slot that
/// falls while all is well (the slot on time) is always submitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// Missed slots are not submitted: neither those before the start nor
    /// one whose submit failed, nor any that fell before the scheduler
    /// could submit again. The next slot to come is.
    Skip,
    /// Up to `n` missed slots are submitted (each only if its task is not
    /// there already), oldest first: the last `n` before the start, or the
    /// newest `n` of those missed while the database could not take them
    /// (the one whose submit failed counts among them). At most
    /// [`MAX_CATCH_UP`]; `Missed(0)` is `Skip`.
    Missed(usize),
}

impl CatchUp {
    /// How many missed slots are kept.
    pub(crate) fn keeps(self) -> usize {
        match self {
            CatchUp::Skip => 0,
            CatchUp::Missed(n) => n,
        }
    }
}

/// The most slots a [`CatchUp::Missed`] may name: a bound on the walk back
/// at the start, and on the slots held while the database is away.
pub const MAX_CATCH_UP: usize = 10_000;

/// One periodic task: its id (part of every slot's key, so keep it
/// stable), when it falls, what it submits, and its catch-up policy.
#[derive(Debug, Clone)]
pub struct Periodic {
    pub(crate) id: String,
    pub(crate) every: Every,
    task: NewTask,
    pub(crate) catch_up: CatchUp,
}

impl Periodic {
    /// Submits `task` (its name, payload, queue and options) on every slot
    /// of `every`. The task's key and conflict are the scheduler's; its
    /// metadata gains [`SCHEDULE_KEY`] and [`SLOT_KEY`]. Catches up the
    /// last missed slot by default ([`CatchUp::Missed`]`(1)`).
    pub fn new(id: impl Into<String>, every: Every, task: NewTask) -> Self {
        Periodic { id: id.into(), every, task, catch_up: CatchUp::Missed(1) }
    }

    /// Sets the catch-up policy.
    pub fn catch_up(mut self, policy: CatchUp) -> Self {
        self.catch_up = policy;
        self
    }

    /// The schedule's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The key of a slot's task: `schedule:<id>:<slot in RFC 3339, UTC>`.
    /// Any scheduler, old or new, submitting that slot names the same key.
    pub fn slot_key(&self, slot_ms: i64) -> String {
        format!("schedule:{}:{}", self.id, slot_label(slot_ms))
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.id.is_empty() || self.id.contains(':') {
            return Err(Error::InvalidArgument(format!(
                "a schedule id must be non-empty and without ':', got {:?}",
                self.id
            )));
        }
        if let CatchUp::Missed(n) = self.catch_up {
            if n > MAX_CATCH_UP {
                return Err(Error::InvalidArgument(format!(
                    "schedule {:?}: a catch-up of {n} slots is more than {MAX_CATCH_UP}",
                    self.id
                )));
            }
        }
        if self.task.name.is_empty() {
            return Err(Error::InvalidArgument(format!("schedule {:?}: the task needs a name", self.id)));
        }
        if !self.task.metadata.is_object() {
            return Err(Error::InvalidArgument(format!(
                "schedule {:?}: the task's metadata must be a JSON object",
                self.id
            )));
        }
        Ok(())
    }

    pub(crate) fn task_for(&self, slot_ms: i64) -> NewTask {
        let mut task = self.task.clone().key(self.slot_key(slot_ms)).conflict(Conflict::Reject);
        if let Json::Object(m) = &mut task.metadata {
            m.insert(SCHEDULE_KEY.to_owned(), json!(self.id));
            m.insert(SLOT_KEY.to_owned(), json!(slot_label(slot_ms)));
        }
        task
    }
}

/// A slot a scheduler dealt with: the task it submitted, or found there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fired {
    /// The schedule's id.
    pub schedule: String,
    /// The slot, epoch milliseconds.
    pub slot_ms: i64,
    /// True when this scheduler inserted the task; false when the slot's
    /// key was taken already (another scheduler, or an earlier run).
    pub submitted: bool,
}
