//! One task's run: its handler, bounded in time and stopped at shutdown,
//! and the one settlement its end maps to.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use waymark_store::{Lease, PgExecutor, Task};

use crate::context::TaskContext;
use crate::handler::{BatchHandler, BatchOutcome, Handler, Kind};
use crate::limits::Units;
use crate::pace::Pace;
use crate::plan::Call;
use crate::settle::{release, GiveBack, HandlerEnd, Outcome, Settler};
use crate::shared::{panic_message, CancelReason, Hold, OneOrMany, Running, Shared, Slot, WorkerEvent};

/// How long a handler may take to stop by itself once shutdown fires its
/// token, before its future is dropped.
pub(crate) const STOP_GRACE: Duration = Duration::from_millis(500);

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
    /// Whether every task of the call lost its lease while it waited.
    pub(crate) fn all_lost(&self) -> bool {
        self.running.iter().all(|r| r.is_lost())
    }
}

/// Registers what one claim drew (see [`Registered`]), the running map
/// locked once for all of it; [`start_call`] runs each call.
pub(crate) fn register_calls<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    calls: Vec<Call>,
) -> Vec<Registered> {
    let observer = shared.store.observer();
    // The claim's own worker id, shared by the leases of its tasks (one
    // claim draws them all under one).
    let mut owner: Arc<str> = shared.settings.worker_id.clone();
    let registered: Vec<Registered> = calls
        .into_iter()
        .map(|Call { tasks, units, ahead }| {
            let running: OneOrMany<Arc<Running>> = tasks
                .iter()
                .map(|task| {
                    let scope = observer.and_then(|o| o.run(task));
                    if let Some(id) = task.worker_id.as_deref().filter(|id| *id != &*owner) {
                        owner = Arc::from(id);
                    }
                    let lease = Lease::shared(Arc::from(task.id.as_str()), owner.clone());
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

/// Starts one registered handler call: a task, or a batch of one name's
/// tasks, in a slot of its own, ready to queue for a runner
/// ([`Runs::start_all`](crate::runners::Runs::start_all)); `None` for a
/// call of no task.
pub(crate) fn start_call<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    call: Registered,
) -> Option<Started<E>> {
    let Registered { tasks, units, running, .. } = call;
    if tasks.is_empty() {
        return None;
    }
    let registration = shared.handlers.get(&tasks[0].name);
    let (handler, pace) = match registration.map(|r| (&r.kind, &r.pace)) {
        Some((Kind::One(handler), pace)) => (CallHandler::One(Some(handler.clone())), pace.clone()),
        Some((Kind::Batch(handler, _), _)) => (CallHandler::Batch(handler.clone()), None),
        None => (CallHandler::One(None), None),
    };
    // Units of nothing (no limits) need no holder: nothing to give back,
    // and the slot's own release wakes the claim loop.
    let units = units.hold_capacity().then(|| UnitsHold::new(shared, units) as Hold);
    let slot = Slot::new(shared, running, units);
    Some(Started { slot, tasks, handler, pace })
}

/// A call started and waiting for a runner: its slot (which holds its
/// runs), its tasks, and its handler.
pub(crate) struct Started<E> {
    slot: Slot<E>,
    tasks: OneOrMany<Arc<Task>>,
    handler: CallHandler<E>,
    /// The record of its handler's first polls: a quick handler's.
    pace: Option<Arc<Pace>>,
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
enum CallHandler<E> {
    /// A one-task call's; `None` when none is registered for the name (the
    /// call fails its task).
    One(Option<Arc<dyn Handler<E>>>),
    Batch(Arc<dyn BatchHandler<E>>),
}

/// Runs a started call to its end, on a runner.
pub(crate) async fn run_call<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    settler: &Settler<E>,
    call: Started<E>,
) {
    let Started { slot, tasks, handler, pace: _ } = call;
    let is_batch = matches!(handler, CallHandler::Batch(_));
    let handed = {
        let running = slot.runs();
        let body = async {
            match handler {
                // Boxed: a batch's state would widen every one-task run's
                // future (see `supervise`); it costs one allocation per batch.
                CallHandler::Batch(batch) => {
                    Box::pin(run_batch(shared, settler, batch, &tasks, running, &slot)).await;
                    None
                }
                CallHandler::One(handler) => {
                    let (task, run) = (&tasks[0], &running[0]);
                    let outcome = run_handler(shared, handler, task, run).await;
                    #[cfg(feature = "test-hooks")]
                    use std::sync::atomic::Ordering::SeqCst;
                    #[cfg(feature = "test-hooks")]
                    if shared
                        .state
                        .panics_past_handlers
                        .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                        .is_ok()
                    {
                        panic!("test hook: a panic in the worker's own code, past the handler");
                    }
                    slot.handler_ended();
                    if settler.is_batched() {
                        // Handed off below, with the slot.
                        return settler.settlement_for(task, run, outcome);
                    }
                    // Boxed, as the batch's run: only a worker without
                    // a batcher settles here.
                    Box::pin(settler.settle(task, run, outcome)).await;
                    None
                }
            }
        };
        let mut body = std::pin::pin!(body);
        // Marks each poll, so shutdown can tell a run stuck in blocking code.
        std::future::poll_fn(|cx| {
            running.iter().for_each(|r| r.set_in_poll(true));
            // A call of one task polls inside its run's observed context (a
            // batch's call belongs to no one run).
            let polled = match &running[..] {
                [one] if !is_batch => one.enter(|| body.as_mut().poll(cx)),
                _ => body.as_mut().poll(cx),
            };
            running.iter().for_each(|r| r.set_in_poll(false));
            polled
        })
        .await
    };
    drop(tasks);
    let Some(settlement) = handed else { return };
    // The call ends here; the flush that commits its settlement ends it.
    // A batcher closed meanwhile (at shutdown) gives it back to settle here.
    if let Some(rest) = settler.hand_off(settlement, slot) {
        rest.await;
    }
}

/// The units a call drew (resources, a handler's `max_running`). Given
/// back (and the claim loop woken) when the last holder lets go: the
/// call's [`Slot`] once its tasks are settled, so a limit counts the tasks
/// whose rows are still running, as a fleet limit does; or a blocking
/// closure that outlives its run.
pub(crate) struct UnitsHold<E> {
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

/// One batch call: payloads that do not fit fail alone; the handler gets
/// the rest; each task it did not settle itself settles by how the call
/// ended (its result from the map, null if not named, or the one error).
async fn run_batch<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    settler: &Settler<E>,
    handler: Arc<dyn BatchHandler<E>>,
    tasks: &[Arc<Task>],
    running: &[Arc<Running>],
    slot: &Slot<E>,
) {
    let items: Vec<_> = tasks.iter().zip(running).map(|(t, r)| (context(shared, t, r), &t.payload)).collect();
    let mut ends: HashMap<String, HandlerEnd> = HashMap::new();
    let started = Instant::now();
    // The call's synchronous part (the payloads' Deserialize, the
    // handler's own) may panic too.
    let outcome = match std::panic::catch_unwind(AssertUnwindSafe(|| handler.call(items))) {
        Ok((outcome, bad)) => {
            for (id, why) in bad {
                ends.insert(id, HandlerEnd::Handler(Outcome::BadPayload(why)));
            }
            supervise(shared, outcome).await
        }
        Err(panic) => Some(Err(HandlerEnd::Panicked(panic_message(&panic)))),
    };
    if matches!(outcome, Some(Err(HandlerEnd::TimedOut(_)))) {
        running.iter().for_each(|r| r.cancel(CancelReason::TimedOut));
    }
    let end_of = |task: &Task| -> Option<HandlerEnd> {
        if let Some(end) = ends.get(&task.id) {
            return Some(end.clone());
        }
        match &outcome {
            None => None, // stopped at shutdown: given back
            Some(Err(end)) => Some(end.clone()),
            Some(Ok(BatchOutcome::Failed(e))) => Some(HandlerEnd::Handler(Outcome::Failed(e.clone()))),
            Some(Ok(BatchOutcome::Done(results))) => Some(HandlerEnd::Handler(
                results.get(&task.id).cloned().unwrap_or(Outcome::Done(serde_json::Value::Null)),
            )),
        }
    };
    let took = started.elapsed();
    slot.handler_ended();
    futures::future::join_all(tasks.iter().zip(running).map(|(task, run)| {
        let end = end_of(task);
        if let Some(end) = &end {
            run.observe_return(took, || end.error_type());
        }
        settler.settle(task, run, end)
    }))
    .await;
}

fn context<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    task: &Arc<Task>,
    running: &Arc<Running>,
) -> TaskContext<E> {
    TaskContext::new(
        shared.store.clone(),
        task.clone(),
        shared.settings.lease,
        shared.settings.backoff,
        running.clone(),
    )
}

/// Runs a one-task call's handler (`None`: none is registered for its
/// name); answers how it ended (`None`: stopped at shutdown).
async fn run_handler<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    handler: Option<Arc<dyn Handler<E>>>,
    task: &Arc<Task>,
    running: &Arc<Running>,
) -> Option<HandlerEnd> {
    let Some(handler) = handler else { return Some(HandlerEnd::NoHandler) };
    let ctx = context(shared, task, running);
    // The call itself may panic too (its synchronous part, a payload's
    // Deserialize), not only the future it returns.
    let task = task.clone();
    let started = Instant::now();
    let end = match supervise(shared, async move { handler.call(ctx, &task.payload).await }).await? {
        Ok(outcome) => HandlerEnd::Handler(outcome),
        Err(end) => end,
    };
    if matches!(end, HandlerEnd::TimedOut(_)) {
        // A blocking closure outlives its dropped future: tell it to stop.
        running.cancel(CancelReason::TimedOut);
    }
    running.observe_return(started.elapsed(), || end.error_type());
    Some(end)
}

/// Runs a call's future with its panics caught, bounded by the worker's
/// `max_run_time`, and stopped past the shutdown grace: `None` when it was
/// stopped (shutdown gives its tasks back), a panic or the time limit as
/// their [`HandlerEnd`].
async fn supervise<E, T>(shared: &Shared<E>, fut: impl Future<Output = T>) -> Option<Result<T, HandlerEnd>> {
    let run = AssertUnwindSafe(fut).catch_unwind();
    // The timers here are boxed, made only when they are needed (a time
    // limit, a shutdown past its grace): inline, each would widen every
    // call's future, which is moved into its runner per call (a tokio timer
    // is large).
    let bounded = async {
        match shared.settings.max_run_time {
            Some(limit) => Box::pin(tokio::time::timeout(limit, run)).await.map_err(|_| limit),
            None => Ok(run.await),
        }
    };
    // The stop first: a call started under `stop_now` past the grace is
    // dropped before its handler is polled at all.
    if *shared.state.past_grace.borrow() && *shared.state.stop_now.borrow() {
        return None;
    }
    // Then one poll without the stop's watchers: most calls end in it, and
    // subscribing (and registering a waiter, and taking it out again) on
    // the worker-wide watches costs more than a short handler.
    let mut bounded = std::pin::pin!(bounded);
    if let std::task::Poll::Ready(r) = futures::poll!(bounded.as_mut()) {
        return Some(ended(r));
    }
    // Past the shutdown grace the token fires; the handler gets a moment to
    // stop by itself (none when told to stop now), then its future is
    // dropped and the task given back.
    // Boxed, as the timers above: only a call that outlives its first poll
    // pays for it, where inline every call's future would carry it.
    let (mut past_grace, mut now) = (shared.state.past_grace.subscribe(), shared.state.stop_now.subscribe());
    let mut stopped = Box::pin(async move {
        if past_grace.wait_for(|past| *past).await.is_err() {
            std::future::pending::<()>().await;
        }
        Box::pin(async move {
            tokio::select! {
                () = tokio::time::sleep(STOP_GRACE) => {}
                Ok(_) = now.wait_for(|now| *now) => {}
            }
        })
        .await;
    });
    // The stop first at every poll; the handler not again at once, since it
    // was polled just now (its waker, this task's, is registered).
    let mut polled = true;
    let r = std::future::poll_fn(|cx| {
        if stopped.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(None);
        }
        if std::mem::take(&mut polled) {
            return std::task::Poll::Pending;
        }
        bounded.as_mut().poll(cx).map(Some)
    })
    .await?;
    Some(ended(r))
}

/// A supervised call's end: its output, or its panic or time limit as a
/// [`HandlerEnd`].
fn ended<T>(r: Result<Result<T, Box<dyn std::any::Any + Send>>, Duration>) -> Result<T, HandlerEnd> {
    match r {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(panic)) => Err(HandlerEnd::Panicked(panic_message(&panic))),
        Err(limit) => Err(HandlerEnd::TimedOut(limit)),
    }
}
