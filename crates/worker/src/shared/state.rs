//! What the worker's tasks share ([`Shared`]): its store, its settings,
//! the hook for failures it survives, its statement budget, and its state
//! ([`State`]): what changes while it runs, the running map and the
//! counters that bound its calls.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use waymark_store::{Error, Store};

use super::budget::StatementBudget;
use super::error::panic_message;
use super::events::Events;
use super::running::Running;
use super::settings::{ErrorHook, Settings, WorkerError};
use super::settled::SettledCount;

/// Unsettled tasks' runs, by task id.
pub(crate) type RunningMap = foldhash::HashMap<Arc<str>, Arc<Running>>;

/// What changes while the worker runs.
#[derive(Default)]
pub(crate) struct State {
    /// Unsettled tasks by id: what the heartbeat renews. Past the shutdown
    /// grace, shutdown alone takes entries out.
    pub(crate) running: Mutex<RunningMap>,
    /// Calls whose handlers have not ended (each holds a slot). Counted
    /// apart from `running`: a task re-claimed while our earlier run of it
    /// is still in its handler holds two slots, one entry.
    pub(crate) busy: AtomicUsize,
    /// Tasks whose calls' handlers have ended and whose settlements are on
    /// their way: they hold no slot, and the claim loop keeps them within a
    /// bound of their own (the claim stage's `settling_bound`).
    pub(crate) settling: AtomicUsize,
    /// How long handler calls take, smoothed.
    pub(crate) call_time: CallTime,
    pub(crate) slot_freed: Notify,
    pub(crate) stop: watch::Sender<bool>,
    /// Set when shutdown's grace period has passed: runs still going stop.
    pub(crate) past_grace: watch::Sender<bool>,
    /// Set by [`WorkerHandle::stop_now`](crate::WorkerHandle::stop_now): no grace, no moment to stop.
    pub(crate) stop_now: watch::Sender<bool>,
    #[cfg(feature = "test-hooks")]
    pub(crate) heartbeats_paused: std::sync::atomic::AtomicBool,
    /// Calls polled in a group (see `runners`), for tests.
    #[cfg(feature = "test-hooks")]
    pub(crate) grouped_calls: std::sync::atomic::AtomicU64,
    /// One-task calls still to panic in the worker's own code once their
    /// handlers return (see [`WorkerHandle::panic_past_handlers`]).
    #[cfg(feature = "test-hooks")]
    pub(crate) panics_past_handlers: AtomicUsize,
    pub(crate) settled: Arc<SettledCount>,
    pub(crate) events: Events,
}

impl State {
    /// Past shutdown's grace, or told to stop now: a settlement failing
    /// for a passing reason is not sent again, and its lease decides.
    pub(crate) fn settlements_given_up(&self) -> bool {
        *self.past_grace.borrow() || *self.stop_now.borrow()
    }

    /// `n` tasks' settlements have been answered (their calls ended): they
    /// stop settling, and the claim loop (or shutdown) hears it.
    pub(crate) fn stopped_settling(&self, n: usize) {
        if n > 0 {
            self.settling.fetch_sub(n, Ordering::SeqCst);
            self.slot_freed.notify_one();
        }
    }

    /// Until no task is settling: every handed-off settlement answered.
    /// Waits on `slot_freed`, which only shutdown waits on once the claim
    /// loop has ended.
    pub(crate) async fn settlements_answered(&self) {
        loop {
            let freed = self.slot_freed.notified();
            if self.settling.load(Ordering::SeqCst) == 0 {
                return;
            }
            freed.await;
        }
    }
}

impl State {
    /// Marks runs ended and takes their entries out of the running map
    /// (those that are still theirs), except past the shutdown grace, when
    /// shutdown owns the map.
    pub(crate) fn end_runs(&self, runs: &[Arc<Running>]) {
        let past_grace = *self.past_grace.borrow();
        let mut map = self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        end_runs_in(&mut map, past_grace, runs);
    }
}

/// [`State::end_runs`] with the running map locked, and whether shutdown is
/// past its grace read, by the caller.
pub(crate) fn end_runs_in(map: &mut RunningMap, past_grace: bool, runs: &[Arc<Running>]) {
    for run in runs {
        run.mark_ended();
        run.hold_call(None);
        if past_grace {
            continue;
        }
        // Taken out at once (the id hashed once); put back in the rare case
        // that the entry is a later run's of the same task.
        if let Some((key, other)) = map.remove_entry(run.id()) {
            if !Arc::ptr_eq(&other, run) {
                map.insert(key, other);
            }
        }
    }
}

/// How long handler calls take: a moving average of the last few dozen
/// (each new one weighs an eighth), unknown before the first ends. The
/// claim loop claims ahead of its free slots only while calls are short.
#[derive(Debug)]
pub(crate) struct CallTime {
    average_micros: AtomicU64,
    ended: AtomicU64,
}

impl Default for CallTime {
    fn default() -> Self {
        CallTime { average_micros: AtomicU64::new(u64::MAX), ended: AtomicU64::new(0) }
    }
}

impl CallTime {
    pub(crate) fn record(&self, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX - 1).min(u64::MAX - 1);
        let _ = self.average_micros.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
            Some(if old == u64::MAX { micros } else { old - old / 8 + micros / 8 })
        });
        self.ended.fetch_add(1, Ordering::Relaxed);
    }

    /// How many calls have ended.
    pub(crate) fn ended(&self) -> u64 {
        self.ended.load(Ordering::Relaxed)
    }

    /// The average, once a call has ended.
    pub(crate) fn average(&self) -> Option<Duration> {
        let micros = self.average_micros.load(Ordering::Relaxed);
        (micros != u64::MAX).then(|| Duration::from_micros(micros))
    }
}

/// Everything the worker's tasks share: its store, its
/// settings, and its state.
pub(crate) struct Shared<E> {
    pub(crate) store: Arc<Store<E>>,
    pub(crate) on_error: ErrorHook,
    /// Places for claims and settlement flushes (see [`StatementBudget`]).
    pub(crate) statements: Arc<StatementBudget>,
    pub(crate) settings: Settings,
    pub(crate) state: State,
}

impl<E> Shared<E> {
    /// Calls the error hook. A hook that panics is caught and logged: it
    /// is called from the heartbeat and from give-backs, which must go on.
    pub(crate) fn report(&self, during: impl Into<String>, error: Error) {
        let report = WorkerError { during: during.into(), error };
        let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.on_error)(&report)));
        if let Err(panic) = called {
            let panic = panic_message(&panic);
            tracing::error!(during = %report.during, error = %report.error, "the worker's on_error hook panicked: {panic}");
        }
    }

    pub(crate) fn running_count(&self) -> usize {
        self.state.busy.load(Ordering::SeqCst)
    }
}
