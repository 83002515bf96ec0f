//! One call, run: its handler (a task's, or a batch's), supervised, and
//! each task's end handed to the settle stage.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use waymark_store::{PgExecutor, Task};

use super::context::TaskContext;
use super::handler::{BatchHandler, BatchOutcome, Handler};
use super::start::{CallHandler, Started};
use super::supervise::supervise;
use crate::settle::{HandlerEnd, Outcome, Settler};
use crate::shared::{panic_message, CancelReason, Running, Shared, Slot};

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
