//! A call as the claim stage hands it over ([`Call`]), and started
//! ([`Started`]): its slot taken, its handler looked up, ready for a runner.

use std::sync::Arc;

use waymark_store::{PgExecutor, Task};

use super::handler::{BatchHandler, Handler, Handlers, Kind};
use super::pace::Pace;
use crate::shared::{Hold, OneOrMany, Running, Shared, Slot};

/// A claimed call, handed to the call stage: its tasks (one, or a batch of
/// one name's), their runs (registered in the running map, so their leases
/// are renewed and a cancel reaches them), and what it drew of the
/// worker's limits, held until its tasks are settled.
pub(crate) struct Call {
    pub(crate) tasks: OneOrMany<Arc<Task>>,
    pub(crate) runs: OneOrMany<Arc<Running>>,
    pub(crate) units: Option<Hold>,
}

/// Starts one call: a task, or a batch of one name's tasks, in a slot of
/// its own, ready to queue for a runner (`Runs::start_all`); `None` for a
/// call of no task.
pub(super) fn start<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    handlers: &Handlers<E>,
    call: Call,
) -> Option<Started<E>> {
    let Call { tasks, runs, units } = call;
    if tasks.is_empty() {
        return None;
    }
    let registration = handlers.get(&tasks[0].name);
    let (handler, pace) = match registration.map(|r| (&r.kind, &r.pace)) {
        Some((Kind::One(handler), pace)) => (CallHandler::One(Some(handler.clone())), pace.clone()),
        Some((Kind::Batch(handler, _), _)) => (CallHandler::Batch(handler.clone()), None),
        None => (CallHandler::One(None), None),
    };
    let slot = Slot::new(shared, runs, units);
    Some(Started { slot, tasks, handler, pace })
}

/// A call started and waiting for a runner: its slot (which holds its
/// runs), its tasks, and its handler.
pub(crate) struct Started<E> {
    pub(super) slot: Slot<E>,
    pub(super) tasks: OneOrMany<Arc<Task>>,
    pub(super) handler: CallHandler<E>,
    /// The record of its handler's first polls: a quick handler's.
    pub(super) pace: Option<Arc<Pace>>,
}

impl<E> Started<E> {
    /// Whether it may run in a group: a quick handler's call, the
    /// handler's latest calls having ended at once.
    pub(crate) fn groups(&self) -> bool {
        self.pace.as_ref().is_some_and(|pace| pace.groups())
    }

    /// The record of its handler's first polls, taken out for its runner
    /// to keep as the call runs (a quick handler's call; others never run
    /// in a group).
    pub(crate) fn take_pace(&mut self) -> Option<Arc<Pace>> {
        self.pace.take()
    }
}

/// The handler a call runs, looked up once as it starts.
pub(super) enum CallHandler<E> {
    /// A one-task call's; `None` when none is registered for the name (the
    /// call fails its task).
    One(Option<Arc<dyn Handler<E>>>),
    Batch(Arc<dyn BatchHandler<E>>),
}
