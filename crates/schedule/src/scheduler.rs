//! The scheduler: one loop per schedule, all polled together in the
//! caller's task. Each reads the database's clock, submits its due slots'
//! tasks by keyed submits, and sleeps until its next slot, so a schedule
//! held up (its queue full, its submits failing) holds up no other.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use waymark_store::{Error, PgExecutor, Result, Store};

use crate::every::slot_label;
use crate::periodic::{Fired, Periodic};
use crate::slots::Slots;

/// Runs periodic tasks. Any number of schedulers may run the same
/// schedules on one database: each slot's task is a keyed submit whose key
/// names the schedule and the slot, with
/// [`Conflict::Reject`](waymark_store::Conflict::Reject), so one insert
/// wins and the others find the key taken. No leader, no lock held.
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

/// The first pause after a failure; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause after a failure to read the clock or to submit.
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
    /// Every failure but bad input is logged and tried again, the slots due
    /// kept (by each schedule's catch-up policy) until they can be
    /// submitted; each schedule waits on its own, so a full queue or a
    /// failing submit holds up only its schedule. Answers an error only
    /// when the store is closed.
    pub async fn run_until(self, stop: impl Future<Output = ()>) -> Result<()> {
        let mut ids = HashSet::new();
        for s in &self.schedules {
            s.check()?;
            if !ids.insert(s.id.as_str()) {
                return Err(Error::InvalidArgument(format!("schedule id {:?} is given twice", s.id)));
            }
        }
        tokio::pin!(stop);
        let loops = futures::future::try_join_all(self.schedules.iter().map(|s| self.run_one(s)));
        tokio::select! {
            () = &mut stop => Ok(()),
            out = loops => out.map(|_| ()),
        }
    }

    /// Runs one schedule until the store is closed (answered as its error).
    async fn run_one(&self, s: &Periodic) -> Result<()> {
        let mut pause = FIRST_PAUSE;
        let mut slots: Option<Slots> = None;
        loop {
            let read = Instant::now();
            let now = match self.store.database_time_ms().await {
                Ok(now) => now,
                Err(e) if e.is_store_closed() => return Err(e),
                Err(e) => {
                    if let Some(skipped) = slots.as_mut().and_then(Slots::failed) {
                        skipped.log(&s.id, s.catch_up);
                    }
                    pause = self.failed(s, "reading the database clock", &e, pause).await;
                    continue;
                }
            };
            let slots = slots.get_or_insert_with(|| Slots::start(&s.every, s.catch_up, now));
            if let Some(skipped) = slots.due(&s.every, now) {
                skipped.log(&s.id, s.catch_up);
            }
            if let Err(e) = self.submit_pending(s, slots).await {
                if e.is_store_closed() {
                    return Err(e);
                }
                if let Some(skipped) = slots.failed() {
                    skipped.log(&s.id, s.catch_up);
                }
                pause = self.failed(s, "submitting a slot's task", &e, pause).await;
                continue;
            }
            slots.caught_up();
            pause = FIRST_PAUSE;
            let Some(wake) = slots.next() else {
                tracing::error!(
                    schedule = %s.id,
                    "{} has no slot after {}: this schedule submits nothing more",
                    s.every.describe(),
                    slot_label(now)
                );
                return std::future::pending().await;
            };
            // Real time is what a schedule is about. The submits took some
            // of the wait already.
            let wait = Duration::from_millis(u64::try_from(wake - now).unwrap_or(0)).min(MAX_SLEEP);
            let wait = wait.saturating_sub(read.elapsed());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
    }

    /// Submits the schedule's pending slots, oldest first, save those whose
    /// key another submit held past the lock wait last time (another
    /// scheduler mid-submit, or stalled in its transaction), which go last:
    /// a held key holds up no other slot. A slot is dropped, logged, only
    /// for bad input it can never submit (the store refusing the task, the
    /// server refusing its data); for any other failure it stays pending
    /// and the failure is answered (a held key's after the other slots).
    async fn submit_pending(&self, s: &Periodic, slots: &mut Slots) -> Result<()> {
        let mut held = None;
        for slot in slots.in_order() {
            let submitted = match self.store.submit(s.task_for(slot)).await {
                Ok(_) => true,
                Err(e) if e.is_already_exists() => false,
                Err(e) if never_submittable(&e) => {
                    tracing::error!(schedule = %s.id, slot = %slot_label(slot), error = %e, "the schedule's task is refused; slot dropped");
                    slots.done(slot);
                    continue;
                }
                Err(e) if e.is_lock_timeout() => {
                    tracing::warn!(schedule = %s.id, slot = %slot_label(slot), "the slot's key is held by another submit; trying the newer slots first");
                    slots.held_elsewhere(slot);
                    held = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            slots.done(slot);
            if let Some(tx) = &self.fired {
                let _ = tx.send(Fired { schedule: s.id.clone(), slot_ms: slot, submitted });
            }
        }
        held.map_or(Ok(()), Err)
    }

    async fn failed(&self, s: &Periodic, doing: &str, e: &Error, pause: Duration) -> Duration {
        tracing::warn!(schedule = %s.id, error = %e, "scheduler: {doing} failed; trying again in {pause:?}");
        tokio::time::sleep(pause).await;
        (pause * 2).min(MAX_PAUSE)
    }
}

/// Whether a submit failed for bad input that no later try could submit:
/// the store refusing the task, or the server refusing its data (a data
/// exception, a constraint, a value past a limit: SQLSTATE classes 22, 23
/// and 54). Anything else may pass (the database away, read-only in a
/// failover, out of space, a full queue) or be fixed (a grant, a
/// migration), so the slot is kept.
fn never_submittable(e: &Error) -> bool {
    e.is_invalid_argument()
        || e.sqlstate().is_some_and(|code| matches!(code.get(..2), Some("22" | "23" | "54")))
}
