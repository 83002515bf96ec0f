//! What one claim drew, registered: its tasks' runs in the running map
//! (their leases renewed, a cancel reaching them) while each call waits
//! for a slot; started (handed to the call stage), or given back.

use std::sync::Arc;

use waymark_store::{Lease, PgExecutor, Task};

use super::limits::Units;
use super::plan::DrawnCall;
use crate::call::Call;
use crate::settle::{release, GiveBack};
use crate::shared::{Hold, OneOrMany, Running, Shared, WorkerEvent};

/// A claimed call, registered (its tasks in the running map, so their
/// leases are renewed and a cancel reaches them) and waiting for a slot.
pub(crate) struct Registered {
    tasks: OneOrMany<Arc<Task>>,
    units: Units,
    running: OneOrMany<Arc<Running>>,
    /// Claimed ahead of a free slot.
    pub(crate) ahead: bool,
}

impl Registered {
    /// The call as the call stage takes it. Units of nothing (no limits)
    /// need no holder: nothing to give back, and the slot's own release
    /// wakes the claim loop.
    pub(crate) fn into_call<E: PgExecutor + 'static>(self, shared: &Arc<Shared<E>>) -> Call {
        let Registered { tasks, units, running, .. } = self;
        let units = units.hold_capacity().then(|| UnitsHold::new(shared, units) as Hold);
        Call { tasks, runs: running, units }
    }

    /// Whether every task of the call lost its lease while it waited.
    pub(crate) fn all_lost(&self) -> bool {
        self.running.iter().all(|r| r.is_lost())
    }
}

/// Registers what one claim drew (see [`Registered`]), the running map
/// locked once for all of it; `Registered::into_call` hands each to the
/// call stage.
pub(crate) fn register_calls<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    calls: Vec<DrawnCall>,
) -> Vec<Registered> {
    let observer = shared.store.observer();
    // The claim's own worker id, shared by the leases of its tasks (one
    // claim draws them all under one).
    let mut owner: Arc<str> = shared.settings.worker_id.clone();
    let registered: Vec<Registered> = calls
        .into_iter()
        .map(|DrawnCall { tasks, units, ahead }| {
            let running: OneOrMany<Arc<Running>> = tasks
                .iter()
                .map(|task| {
                    let scope = observer.and_then(|o| o.run(task));
                    if let Some(id) = task.worker_id.as_deref().filter(|id| *id != &*owner) {
                        owner = Arc::from(id);
                    }
                    let lease = Lease::shared(Arc::from(task.id.as_str()), owner.clone())
                        .from_held(task.is_from_held());
                    Running::new(lease, task.attempt, shared.state.events.clone(), scope)
                })
                .collect();
            Registered { tasks, units, running, ahead }
        })
        .collect();
    let displaced: Vec<Arc<Running>> = {
        let mut map = shared.state.running.lock().expect("running lock");
        let runs = registered.iter().flat_map(|call| call.running.iter());
        runs.filter_map(|run| map.insert(run.key().clone(), run.clone())).collect()
    };
    // Our own earlier run of a task lost its lease (the claim just
    // recovered and re-took it): that run must write nothing more. (Out of
    // the lock: marking it tells the observer.)
    for old in displaced {
        old.mark_lost();
    }
    for task in registered.iter().flat_map(|call| call.tasks.iter()) {
        shared.state.events.emit(|| WorkerEvent::Claimed {
            task_id: task.id.clone(),
            name: task.name.clone(),
            attempt: task.attempt,
        });
    }
    registered
}

/// Gives back a registered call that never started (see
/// `claim_loop::CLAIM_AHEAD_HOLD`): each task released, its attempt
/// unspent, then its units and its entry out of the running map.
/// A call whose release failed comes back (its settlement untaken) to be
/// run after all: the lease would otherwise spend its attempt.
pub(crate) async fn give_back<E: PgExecutor + 'static>(
    shared: Arc<Shared<E>>,
    call: Registered,
) -> Option<Registered> {
    let Registered { tasks, units, running, ahead } = call;
    let mut kept = true;
    for r in &running {
        if !r.is_lost() && r.take_settlement() && !release(&shared, r, GiveBack::Unstarted).await {
            r.give_back_settlement();
            kept = false;
        }
    }
    if !kept {
        return Some(Registered { tasks, units, running, ahead });
    }
    drop(units);
    shared.state.slot_freed.notify_one();
    shared.state.end_runs(&running);
    None
}

/// The units a call drew (resources, a handler's `max_running`). Given
/// back (and the claim loop woken) when the last holder lets go: the
/// call's `Slot` once its tasks are settled, so a limit counts the tasks
/// whose rows are still running, as a fleet limit does; or a blocking
/// closure that outlives its run.
struct UnitsHold<E> {
    shared: Arc<Shared<E>>,
    units: Option<Units>,
}

impl<E> UnitsHold<E> {
    fn new(shared: &Arc<Shared<E>>, units: Units) -> Arc<Self>
    where
        E: PgExecutor + 'static,
    {
        Arc::new(UnitsHold { shared: shared.clone(), units: Some(units) })
    }
}

impl<E> Drop for UnitsHold<E> {
    fn drop(&mut self) {
        // The units first: a claim the wakeup starts must find them free.
        drop(self.units.take());
        self.shared.state.slot_freed.notify_one();
    }
}
