//! The scheduler loop: reads the database's clock, submits each due slot's
//! task by a keyed submit, sleeps until the next slot.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value as Json};
use tokio::sync::mpsc;
use waymark_store::{Conflict, Error, NewTask, PgExecutor, Result, Store};

use crate::every::{slot_label, Every};

/// The metadata keys a slot's task carries (beside the template's own).
pub const SCHEDULE_KEY: &str = "waymark.schedule";
/// The slot's time, RFC 3339 in UTC.
pub const SLOT_KEY: &str = "waymark.slot";

/// What a scheduler does about slots that fell while no scheduler ran (at
/// its start) or while the database could not be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// Slots missed are not submitted; the next slot to come is.
    Skip,
    /// The last `n` slots missed are submitted (each only if its task is
    /// not there already), oldest first. At most [`MAX_CATCH_UP`].
    Missed(usize),
}

/// The most slots a [`CatchUp::Missed`] may name: a bound on the walk back
/// at the start, and on the slots held while the database is away.
pub const MAX_CATCH_UP: usize = 10_000;

/// One periodic task: its id (part of every slot's key, so keep it
/// stable), when it falls, what it submits, and its catch-up policy.
#[derive(Debug, Clone)]
pub struct Periodic {
    id: String,
    every: Every,
    task: NewTask,
    catch_up: CatchUp,
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

    fn check(&self) -> Result<()> {
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

    fn task_for(&self, slot_ms: i64) -> NewTask {
        let mut task = self.task.clone().key(self.slot_key(slot_ms)).conflict(Conflict::Reject);
        if let Json::Object(m) = &mut task.metadata {
            m.insert(SCHEDULE_KEY.to_owned(), json!(self.id));
            m.insert(SLOT_KEY.to_owned(), json!(slot_label(slot_ms)));
        }
        task
    }

    fn bound(&self) -> usize {
        match self.catch_up {
            CatchUp::Skip => 1,
            CatchUp::Missed(n) => n.max(1),
        }
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

/// Runs periodic tasks. Any number of schedulers may run the same
/// schedules on one database: each slot's task is a keyed submit whose key
/// names the schedule and the slot, with [`Conflict::Reject`], so one
/// insert wins and the others find the key taken. No leader, no lock held.
pub struct Scheduler<E> {
    store: Arc<Store<E>>,
    schedules: Vec<Periodic>,
    fired: Option<mpsc::UnboundedSender<Fired>>,
}

impl<E> std::fmt::Debug for Scheduler<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler").field("schedules", &self.schedules).finish_non_exhaustive()
    }
}

/// The longest pause after a failure to reach the database.
const MAX_PAUSE: Duration = Duration::from_secs(2);
/// The longest sleep between two looks at the clock, so that a clock that
/// jumps (or a slot far off) is re-read now and then.
const MAX_SLEEP: Duration = Duration::from_secs(60);

impl<E: PgExecutor + 'static> Scheduler<E> {
    /// A scheduler over `store`, with no schedules yet.
    pub fn new(store: Arc<Store<E>>) -> Self {
        Scheduler { store, schedules: Vec::new(), fired: None }
    }

    /// Adds a schedule.
    pub fn schedule(mut self, periodic: Periodic) -> Self {
        self.schedules.push(periodic);
        self
    }

    /// Reports every slot dealt with on this channel (for tests and
    /// metrics).
    pub fn on_fired(mut self, tx: mpsc::UnboundedSender<Fired>) -> Self {
        self.fired = Some(tx);
        self
    }

    /// Runs until `stop` resolves. Refuses bad schedules (an empty or
    /// repeated id, a task without a name) before submitting anything.
    /// Failures to reach the database are logged and retried, the slots
    /// due kept (within the catch-up bound) until they can be submitted.
    pub async fn run_until(self, stop: impl Future<Output = ()>) -> Result<()> {
        let mut ids = HashSet::new();
        for s in &self.schedules {
            s.check()?;
            if !ids.insert(s.id.as_str()) {
                return Err(Error::InvalidArgument(format!("schedule id {:?} is given twice", s.id)));
            }
        }
        tokio::pin!(stop);
        tokio::select! {
            () = &mut stop => Ok(()),
            out = self.run_loop() => out,
        }
    }

    /// Runs until the store is closed (answered as its error).
    async fn run_loop(&self) -> Result<()> {
        let mut pause = Duration::from_millis(50);
        let now = loop {
            match self.store.database_time_ms().await {
                Ok(now) => break now,
                Err(e) if e.is_store_closed() => return Err(e),
                Err(e) => pause = self.failed("reading the database clock", &e, pause).await,
            }
        };
        // The catch-up at the start: the slots at or before now, within the
        // policy's bound (none with Skip); then the slots to come.
        let mut states: Vec<State> = self
            .schedules
            .iter()
            .map(|s| {
                let pending = match s.catch_up {
                    CatchUp::Skip => VecDeque::new(),
                    CatchUp::Missed(n) => s.every.last_at_or_before(now, n).into(),
                };
                State { next: s.every.next_after(now), pending }
            })
            .collect();
        loop {
            if let Err(e) = self.submit_pending(&mut states).await {
                if e.is_store_closed() {
                    return Err(e);
                }
                pause = self.failed("submitting a slot's task", &e, pause).await;
                // Slots keep falling while the database is away.
                if let Ok(now) = self.store.database_time_ms().await {
                    self.collect_due(&mut states, now);
                }
                continue;
            }
            pause = Duration::from_millis(50);
            let Some(wake) = states.iter().filter_map(|s| s.next).min() else {
                // No schedule has a slot to come: nothing more to do.
                return std::future::pending().await;
            };
            let now = match self.store.database_time_ms().await {
                Ok(now) => now,
                Err(e) if e.is_store_closed() => return Err(e),
                Err(e) => {
                    pause = self.failed("reading the database clock", &e, pause).await;
                    continue;
                }
            };
            if wake > now {
                let wait = Duration::from_millis(u64::try_from(wake - now).unwrap_or(0)).min(MAX_SLEEP);
                // Real time is what a schedule is about.
                tokio::time::sleep(wait).await;
                continue;
            }
            self.collect_due(&mut states, now);
        }
    }

    /// Moves every slot at or before `now` into its schedule's pending
    /// slots, keeping the newest within the catch-up bound.
    fn collect_due(&self, states: &mut [State], now: i64) {
        for (s, state) in self.schedules.iter().zip(states.iter_mut()) {
            while let Some(slot) = state.next.filter(|&n| n <= now) {
                state.pending.push_back(slot);
                state.next = s.every.next_after(slot);
            }
            let bound = s.bound();
            while state.pending.len() > bound {
                let dropped = state.pending.pop_front();
                tracing::warn!(schedule = %s.id, slot = ?dropped.map(slot_label), "slot skipped: past the catch-up bound");
            }
        }
    }

    /// Submits every pending slot, oldest first per schedule. A slot whose
    /// submit fails for a reason that may pass (the database away, a full
    /// queue) stays pending and its schedule waits for the next pass, while
    /// the other schedules are still served; one the store refuses for good
    /// (bad input, a payload the server cannot store, a constraint) is
    /// dropped, logged, so it cannot stop the others. Answers the first
    /// failure that may pass, or that the store is closed.
    async fn submit_pending(&self, states: &mut [State]) -> Result<()> {
        let mut passing = None;
        for (s, state) in self.schedules.iter().zip(states.iter_mut()) {
            while let Some(&slot) = state.pending.front() {
                let submitted = match self.store.submit(s.task_for(slot)).await {
                    Ok(_) => true,
                    Err(e) if e.is_already_exists() => false,
                    Err(e) if e.is_store_closed() => return Err(e),
                    Err(e) if e.is_transient() || e.is_queue_full() => {
                        passing.get_or_insert(e);
                        break;
                    }
                    Err(e) => {
                        tracing::error!(schedule = %s.id, slot = %slot_label(slot), error = %e, "the schedule's task is refused; slot dropped");
                        state.pending.pop_front();
                        continue;
                    }
                };
                state.pending.pop_front();
                if let Some(tx) = &self.fired {
                    let _ = tx.send(Fired { schedule: s.id.clone(), slot_ms: slot, submitted });
                }
            }
        }
        passing.map_or(Ok(()), Err)
    }

    async fn failed(&self, doing: &str, e: &Error, pause: Duration) -> Duration {
        tracing::warn!(error = %e, "scheduler: {doing} failed; trying again in {pause:?}");
        tokio::time::sleep(pause).await;
        (pause * 2).min(MAX_PAUSE)
    }
}

/// A schedule's slots: the next to come, and those due but not yet
/// submitted.
struct State {
    next: Option<i64>,
    pending: VecDeque<i64>,
}
