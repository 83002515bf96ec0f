//! One task's run: its handler, bounded in time and stopped at shutdown,
//! and the one settlement its end maps to.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::task::JoinSet;
use waymark_store::{codes, Error, Failure, Lease, PgExecutor, Settlement, Task};

use crate::context::{CancelReason, Running, TaskContext};
use crate::error::envelope;
use crate::events::WorkerEvent;
use crate::handler::Outcome;
use crate::settle::Settler;
use crate::worker::Shared;

/// How long a handler may take to stop by itself once shutdown fires its
/// token, before its future is dropped.
pub(crate) const STOP_GRACE: Duration = Duration::from_millis(500);

pub(crate) fn start_run<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    settler: &Settler,
    runs: &mut JoinSet<()>,
    task: Task,
) {
    let lease = Lease::new(task.id.clone(), &*shared.settings.worker_id).on_attempt(task.attempt);
    let running = Running::new(lease, shared.state.events.clone());
    shared.state.busy.fetch_add(1, Ordering::SeqCst);
    let previous =
        shared.state.running.lock().expect("running lock").insert(task.id.clone(), running.clone());
    // From here, whatever happens (a panic, a spawn refused while the
    // runtime shuts down, which drops the future), the slot comes free.
    let slot = Slot { shared: shared.clone(), running: running.clone() };
    if let Some(old) = previous {
        // Our own earlier run of this task lost its lease (the claim just
        // recovered and re-took it): that run must write nothing more.
        old.mark_lost();
    }
    shared.state.events.emit(|| WorkerEvent::Claimed {
        task_id: task.id.clone(),
        name: task.name.clone(),
        attempt: task.attempt,
    });
    let shared = shared.clone();
    let settler = settler.clone();
    let task = Arc::new(task);
    runs.spawn(async move {
        let _slot = slot;
        let body = async {
            let outcome = run_handler(&shared, &task, &running).await;
            settle(&shared, &settler, &task, &running, outcome).await;
        };
        let mut body = std::pin::pin!(body);
        // Marks each poll, so shutdown can tell a run stuck in blocking code.
        std::future::poll_fn(|cx| {
            running.set_in_poll(true);
            let polled = body.as_mut().poll(cx);
            running.set_in_poll(false);
            polled
        })
        .await;
    });
}

/// Frees a run's slot when the run ends, however it ends, and wakes the
/// claim loop. Its entry leaves the running map (if it is still this
/// run's), except past the shutdown grace: shutdown owns the map then, and
/// a run it stopped ends unsettled, its lease renewed until shutdown gives
/// the task back.
pub(crate) struct Slot<E> {
    shared: Arc<Shared<E>>,
    running: Arc<Running>,
}

impl<E> Drop for Slot<E> {
    fn drop(&mut self) {
        self.running.mark_ended();
        let mut map = self.shared.state.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let past_grace = *self.shared.state.past_grace.borrow();
        if !past_grace && map.get(self.running.id()).is_some_and(|r| Arc::ptr_eq(r, &self.running)) {
            map.remove(self.running.id());
        }
        drop(map);
        self.shared.state.busy.fetch_sub(1, Ordering::SeqCst);
        self.shared.state.slot_freed.notify_one();
    }
}

/// How a run ended, including the ends the worker decides itself. A run
/// stopped at shutdown has no end of its own (`None` where one is
/// expected): shutdown gives its task back.
pub(crate) enum RunEnd {
    Handler(Outcome),
    Panicked(String),
    TimedOut(Duration),
    NoHandler,
}

pub(crate) async fn run_handler<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    task: &Arc<Task>,
    running: &Arc<Running>,
) -> Option<RunEnd> {
    let Some(handler) = shared.handlers.get(&task.name) else { return Some(RunEnd::NoHandler) };
    let ctx = TaskContext::new(
        shared.store.clone(),
        task.clone(),
        shared.settings.lease,
        shared.settings.backoff,
        running.clone(),
    );
    // The call itself may panic too (its synchronous part, a payload's
    // Deserialize), not only the future it returns.
    let payload = task.payload.clone();
    let run = AssertUnwindSafe(async move { handler.call(ctx, payload).await }).catch_unwind();
    let bounded = async {
        match shared.settings.max_run_time {
            Some(limit) => tokio::time::timeout(limit, run).await.map_err(|_| limit),
            None => Ok(run.await),
        }
    };
    // Past the shutdown grace the token fires; the handler gets a moment to
    // stop by itself, then its future is dropped and the task given back.
    let mut past_grace = shared.state.past_grace.subscribe();
    let stopped = async move {
        if past_grace.wait_for(|past| *past).await.is_err() {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(STOP_GRACE).await;
    };
    let result = tokio::select! {
        r = bounded => match r {
            Ok(r) => r,
            Err(limit) => return Some(RunEnd::TimedOut(limit)),
        },
        _ = stopped => return None,
    };
    match result {
        Ok(outcome) => Some(RunEnd::Handler(outcome)),
        Err(panic) => Some(RunEnd::Panicked(panic_message(&panic))),
    }
}

pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "the handler panicked".to_owned()
    }
}

pub(crate) async fn settle<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    settler: &Settler,
    task: &Task,
    running: &Running,
    end: Option<RunEnd>,
) {
    let Some(settlement) = settlement_for(shared, task, running, end) else { return };
    let first = settler.settle(&shared.store, settlement.clone()).await;
    match first {
        Err(e) if passing(&e) => {
            // Rare, and kept out of line: every run's future holds this
            // function's state, so its size is paid per task.
            Box::pin(settle_again(shared, settler, running, settlement, e)).await;
        }
        other => settled(shared, running, &settlement, other),
    }
}

/// What a run's end settles, or `None` when it settles nothing (a lost
/// lease, a stop at shutdown, a settlement already made).
pub(crate) fn settlement_for<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    task: &Task,
    running: &Running,
    end: Option<RunEnd>,
) -> Option<Settlement> {
    if running.is_lost() {
        tracing::debug!(task = %task.id, "lease lost; the late settlement is dropped");
        return None;
    }
    // Shutdown gives it back, however the handler answered its token: an
    // Err must not spend an attempt, an Ok of a run told to stop must not
    // count as done.
    let end = end.filter(|_| running.reason() != Some(CancelReason::Shutdown))?;
    if !running.take_settlement() {
        return None; // settled by complete_in, or given back at shutdown
    }
    let lease = || running.lease.clone();
    let fail = |error: serde_json::Value, retryable: bool| {
        let delay = if retryable { shared.settings.backoff.delay(task.attempt) } else { Duration::ZERO };
        Settlement::Fail { lease: lease(), failure: Failure::new(error).retryable(retryable).delay(delay) }
    };
    Some(match end {
        RunEnd::Handler(Outcome::Done(result)) => Settlement::Complete { lease: lease(), result },
        RunEnd::Handler(Outcome::Failed(e)) => fail(e.envelope(), e.is_retryable()),
        RunEnd::Handler(Outcome::BadPayload(why)) => fail(
            envelope(
                "InvalidPayload",
                codes::TASK_ERROR,
                format!("payload does not fit the handler of {:?}: {why}", task.name),
                false,
            ),
            false,
        ),
        RunEnd::Handler(Outcome::Unserializable(why)) => fail(
            envelope(
                "UnserializableResult",
                codes::UNSERIALIZABLE_RESULT,
                format!("the result does not serialise to JSON: {why}"),
                false,
            ),
            false,
        ),
        RunEnd::Panicked(message) => fail(
            envelope("Panic", codes::HANDLER_ERROR, format!("the handler panicked: {message}"), true),
            true,
        ),
        RunEnd::TimedOut(limit) => fail(
            envelope(
                "HandlerTimeout",
                codes::HANDLER_TIMEOUT,
                format!("the handler ran longer than {limit:?}"),
                true,
            ),
            true,
        ),
        RunEnd::NoHandler => fail(
            envelope(
                "NoHandler",
                codes::NO_HANDLER,
                format!("no handler registered for {:?}", task.name),
                false,
            ),
            false,
        ),
    })
}

/// Counts or reports a settlement's final answer.
pub(crate) fn settled<E>(
    shared: &Shared<E>,
    running: &Running,
    settlement: &Settlement,
    answer: Result<waymark_store::Settled, Error>,
) {
    match answer {
        Ok(s) => {
            shared.state.settled.fetch_add(1, Ordering::Relaxed);
            running.report_settled(s.status);
        }
        Err(e) if e.is_lost_lease() => {
            tracing::debug!(task = %settlement.task_id(), "lease lost before settlement");
        }
        Err(e) => shared.report(format!("settle {}", settlement.task_id()), e),
    }
}

/// A passing failure (the pool saturated, its breaker open, a lost
/// connection) is tried again while the lease lasts; a resent settlement
/// that had committed answers "lost lease", and the row is right.
pub(crate) async fn settle_again<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    settler: &Settler,
    running: &Running,
    settlement: Settlement,
    error: Error,
) {
    let deadline = Instant::now() + shared.settings.lease / 2;
    let again = || settler.settle(&shared.store, settlement.clone());
    let out = while_passing(Err(error), deadline, || running.is_lost(), settlement.task_id(), again).await;
    if out.is_err() && running.is_lost() {
        tracing::debug!(task = %settlement.task_id(), "lease lost while a settlement was retried");
        return;
    }
    settled(shared, running, &settlement, out);
}

/// Tries a write again after a passing failure, waiting 20 ms doubling to
/// 1 s in between, while the next try would start before `deadline` and
/// `stop` says nothing changed; answers the last outcome.
pub(crate) async fn while_passing<T, Fut>(
    mut out: Result<T, Error>,
    deadline: Instant,
    stop: impl Fn() -> bool,
    task: &str,
    mut again: impl FnMut() -> Fut,
) -> Result<T, Error>
where
    Fut: Future<Output = Result<T, Error>>,
{
    let mut pause = Duration::from_millis(20);
    while let Err(error) = &out {
        if !passing(error) || Instant::now() + pause >= deadline || stop() {
            break;
        }
        tracing::debug!(task, error = %error, "a worker write failed; trying again");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
        if stop() {
            break; // the lease went meanwhile: a resend could only do harm
        }
        out = again().await;
    }
    out
}

/// A failure that may pass: worth another try.
pub(crate) fn passing(e: &Error) -> bool {
    use waymark_store::ExecErrorKind::*;
    matches!(e.exec_kind(), Some(Saturated | CircuitOpen | Connection | Timeout | Capacity))
        || e.is_lock_timeout()
}
