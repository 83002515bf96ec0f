//! A call's hold on the worker, from its start until its tasks are
//! settled ([`Slot`]): its place among the worker's `concurrency` slots,
//! its runs (in the running map, their leases renewed) and the units it
//! drew. The call stage makes it and frees its place when the handler
//! ends; the settle stage ends it by dropping it, alone or with the other
//! calls a flush answered ([`Ended`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use waymark_store::PgExecutor;

use super::one_or_many::OneOrMany;
use super::running::{Hold, Running};
use super::state::{end_runs_in, RunningMap, Shared};

/// A call's place among the worker's `concurrency` slots. Given back (and
/// the claim loop woken) when the last holder lets go: the call's [`Slot`]
/// once the handler has ended (its settlement need not wait for it), or a
/// blocking closure that outlives its run.
struct SlotHold<E> {
    shared: Arc<Shared<E>>,
}

impl<E> SlotHold<E> {
    fn new(shared: &Arc<Shared<E>>) -> Arc<Self> {
        shared.state.busy.fetch_add(1, Ordering::SeqCst);
        Arc::new(SlotHold { shared: shared.clone() })
    }
}

impl<E> Drop for SlotHold<E> {
    fn drop(&mut self) {
        self.shared.state.busy.fetch_sub(1, Ordering::SeqCst);
        self.shared.state.slot_freed.notify_one();
    }
}

/// Ends a call when it drops, however the call ends: with its future, or,
/// for a one-task call that handed its settlement off, once the batcher has
/// its answer (several at once through [`Ended`]). Its tasks' entries leave
/// the running map (those that are still this call's), except past the
/// shutdown grace: shutdown owns the map then, and a run it stopped ends
/// unsettled, its lease renewed until shutdown gives the task back.
///
/// The call's place goes earlier, when the handler ends
/// ([`Slot::handler_ended`]): a slot bounds handlers at work, and tasks
/// whose settlements are on their way (batched, committing) count among
/// the worker's settling tasks (`State::settling`), bounded apart. Its
/// units go with it, after the settlement.
pub(crate) struct Slot<E> {
    shared: Arc<Shared<E>>,
    runs: OneOrMany<Arc<Running>>,
    place: Mutex<Option<Hold>>,
    _units: Option<Hold>,
    /// When it took its place: how long a call holds one, its wait for a
    /// runner with it, is what `CallTime` keeps (the claim loop sizes what
    /// it claims ahead by it).
    started: Instant,
    /// Its runs already ended, with others' ([`Ended`]).
    ended: bool,
}

impl<E: PgExecutor + 'static> Slot<E> {
    /// Takes a place for a call of `runs`, which hold it (and `units`, what
    /// the call drew of the worker's limits) until they end. From here on,
    /// whatever happens (a panic, the call dropped unrun as the runners
    /// stop), the place comes free.
    pub(crate) fn new(shared: &Arc<Shared<E>>, runs: OneOrMany<Arc<Running>>, units: Option<Hold>) -> Self {
        let place: Hold = SlotHold::new(shared);
        for run in &runs {
            run.hold_call(Some((place.clone(), units.clone())));
        }
        Slot {
            shared: shared.clone(),
            runs,
            place: Mutex::new(Some(place)),
            _units: units,
            started: Instant::now(),
            ended: false,
        }
    }
}

impl<E> Slot<E> {
    /// The call's runs, one per task.
    pub(crate) fn runs(&self) -> &OneOrMany<Arc<Running>> {
        &self.runs
    }

    /// The worker's shared parts.
    pub(crate) fn shared(&self) -> &Arc<Shared<E>> {
        &self.shared
    }

    /// The handler has ended: the call's place comes free (unless a
    /// blocking closure still holds it) while its tasks' settlements go
    /// on, counted as settling until this slot drops.
    pub(crate) fn handler_ended(&self) {
        let place = self.place.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if place.is_none() {
            return;
        }
        self.shared.state.settling.fetch_add(self.runs.len(), Ordering::SeqCst);
        self.shared.state.call_time.record(self.started.elapsed());
        for run in &self.runs {
            run.hold_call(None);
        }
        drop(place);
    }

    /// Ends the call's runs (the running map locked, and whether shutdown
    /// is past its grace read, by the caller), its place with them if its
    /// handler never ended; answers how many of its tasks stop settling.
    fn end_in(&mut self, map: &mut RunningMap, past_grace: bool) -> usize {
        self.ended = true;
        end_runs_in(map, past_grace, &self.runs);
        // Settled after its handler ended (which took the place): its
        // tasks stop settling. Otherwise the place goes here, unless a
        // blocking closure still holds it.
        match self.place.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner()).take() {
            None => self.runs.len(),
            Some(_) => 0,
        }
    }
}

impl<E> Drop for Slot<E> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let shared = self.shared.clone();
        let settled = {
            let past_grace = *shared.state.past_grace.borrow();
            let mut map = shared.state.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            self.end_in(&mut map, past_grace)
        };
        shared.state.stopped_settling(settled);
        // The units go at the end of this body, unless a blocking closure
        // still holds them.
    }
}

/// Calls whose settlements are answered, ended together when this drops
/// (at the end of a flush): the running map locked once for them all, and
/// the claim loop woken once for their settling (and by each call's units,
/// when it has limits, as they go).
pub(crate) struct Ended<E>(Vec<Slot<E>>);

impl<E> Ended<E> {
    /// Room for `calls` ended calls: a flush's hundreds would otherwise
    /// move the list each time it grew.
    pub(crate) fn with_capacity(calls: usize) -> Self {
        Ended(Vec::with_capacity(calls))
    }

    /// Adds a call, to end with the others.
    pub(crate) fn push(&mut self, slot: Slot<E>) {
        self.0.push(slot);
    }
}

impl<E> Drop for Ended<E> {
    fn drop(&mut self) {
        let Some(first) = self.0.first() else { return };
        let shared = first.shared.clone();
        let settled = {
            let past_grace = *shared.state.past_grace.borrow();
            let mut map = shared.state.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            self.0.iter_mut().map(|slot| slot.end_in(&mut map, past_grace)).sum()
        };
        shared.state.stopped_settling(settled);
        // Each slot's drop now only lets go of its units.
    }
}
