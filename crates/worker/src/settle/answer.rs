//! A settlement's answer: recorded (counted, reported to the observer and
//! the events), or, on the rare paths, followed up: a passing failure sent
//! again, data PostgreSQL refused replaced by a failure that says so, a
//! lost lease's row read for the observer. Each path ends the call it
//! answers by dropping what is left of it.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use waymark_store::{codes, Error, Failure, PgExecutor, Settled, Settlement, Task};

use super::outcome::HandlerEnd;
use super::resend::while_passing;
use super::settler::{FollowUp, Settler};
use crate::shared::{envelope, Ended, Running, Shared, Slot};

impl<E: PgExecutor + 'static> Settler<E> {
    /// Settles a run's end and waits for its answer, and for what the
    /// answer leaves to do.
    pub(crate) async fn settle(&self, task: &Task, running: &Arc<Running>, end: Option<HandlerEnd>) {
        let Some(settlement) = self.settlement_for(task, running, end) else { return };
        let answer = self.write(&settlement).await;
        if let Some(rest) = answered(&self.shared, || self.clone(), running, settlement, answer) {
            rest.await;
        }
    }

    /// Hands a one-task call's settlement off to the batcher with what is
    /// left of the call (its slot, which holds its run), and returns: the
    /// flush that commits the settlement records its answer and ends the
    /// call ([`handed_answer`]). A batcher closed meanwhile (at shutdown),
    /// or none, gives it back: the work of settling it here comes back, to
    /// be awaited by the caller, and ends the call as it ends.
    pub(crate) fn hand_off(&self, settlement: Settlement, slot: Slot<E>) -> Option<FollowUp> {
        let (settlement, slot) = self.send_handoff(settlement, slot)?;
        // Boxed (by `within`): rare, and inline it would widen every
        // call's future.
        let run = slot.runs()[0].clone();
        let settler = self.clone();
        Some(within(run, async move {
            let run = &slot.runs()[0];
            let answer = settler.write(&settlement).await;
            if let Some(rest) = answered(&settler.shared, || settler.clone(), run, settlement, answer) {
                rest.await;
            }
        }))
    }
}

/// Finishes a handed-off call with its settlement's answer: recorded here,
/// the call ended with the others of the flush (`ended`), or a follow-up
/// for the rare paths, which ends the call when it ends. `settler` is
/// asked for only on those paths.
pub(super) fn handed_answer<E: PgExecutor + 'static>(
    slot: Slot<E>,
    settlement: Settlement,
    answer: Result<Settled, Error>,
    settler: impl FnOnce(&Arc<Shared<E>>) -> Settler<E>,
    ended: &mut Ended<E>,
) -> Option<FollowUp> {
    let shared = slot.shared();
    let Some(rest) = answered(shared, || settler(shared), &slot.runs()[0], settlement, answer) else {
        ended.push(slot);
        return None;
    };
    Some(Box::pin(async move {
        rest.await;
        drop(slot);
    }))
}

/// Records a settlement's first answer, or, on the rare paths (its data
/// refused, a passing failure, a lost lease), answers the rest of the work
/// as a future of its own: boxed, so that no call's future carries it (a
/// handed-off call's runs in the batcher, apart from its flushes).
/// `settler` is asked for only on those paths.
fn answered<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    settler: impl FnOnce() -> Settler<E>,
    running: &Arc<Running>,
    settlement: Settlement,
    answer: Result<Settled, Error>,
) -> Option<FollowUp> {
    let refused = refused_data_failure(&settlement, &answer);
    let passing_or_lost = answer.as_ref().is_err_and(|e| e.is_transient() || e.is_lost_lease());
    if refused.is_none() && !passing_or_lost {
        settled(shared, running, &settlement, answer);
        return None;
    }
    let (shared, settler, run) = (shared.clone(), settler(), running.clone());
    Some(within(running.clone(), async move {
        let running = run;
        let (settlement, answer) = match refused {
            Some(instead) => {
                let answer = settler.write(&instead).await;
                (instead, answer)
            }
            None => (settlement, answer),
        };
        match answer {
            Err(e) if e.is_transient() => settle_again(&shared, &settler, &running, settlement, e).await,
            Err(e) if e.is_lost_lease() => lost_answer(&shared, &running, &settlement).await,
            other => settled(&shared, &running, &settlement, other),
        }
    }))
}

/// Polls `fut` inside `run`'s observed context, as its handler was polled:
/// a settlement's statements and logs belong to the run. Boxed: it is a
/// rare path's, kept out of the futures that carry it.
fn within(run: Arc<Running>, fut: impl Future<Output = ()> + Send + 'static) -> FollowUp {
    Box::pin(async move {
        let mut fut = std::pin::pin!(fut);
        std::future::poll_fn(|cx| run.enter(|| fut.as_mut().poll(cx))).await;
    })
}

/// What a settlement whose data PostgreSQL refused becomes: a class-22
/// error (a NUL character in a string, which jsonb cannot hold; a number
/// past its range) means it can never land as it is, and left alone the
/// task would run again each time its lease ran out, to end as
/// `lease_expired` with the cause lost. The task fails instead, with an
/// envelope that says why and carries none of the refused data: for good
/// when it was a result, as retryable as the handler said when it was an
/// error. `None` for any other answer. The refusal is logged.
fn refused_data_failure(settlement: &Settlement, answer: &Result<Settled, Error>) -> Option<Settlement> {
    let error = answer.as_ref().err()?;
    let state = error.sqlstate().filter(|s| s.starts_with("22"))?;
    let refused = |what: &str| {
        format!(
            "PostgreSQL refused to store the handler's {what} (SQLSTATE {state}: a NUL character in a \
             string, or a number past jsonb's range?): {error}"
        )
    };
    let failure = match settlement {
        Settlement::Complete { .. } => Failure::new(envelope(
            "UnserializableResult",
            codes::UNSERIALIZABLE_RESULT,
            refused("result"),
            false,
        ))
        .retryable(false),
        Settlement::Fail { failure, .. } => Failure {
            error: envelope("UnstorableError", codes::HANDLER_ERROR, refused("error"), failure.retryable),
            ..failure.clone()
        },
        _ => return None,
    };
    tracing::warn!(task = %settlement.task_id(), error = %error, "the settlement's data was refused; the task fails instead");
    Some(Settlement::Fail { lease: settlement.lease().clone(), failure })
}

/// A settlement answered "lost lease": the row tells the observer what
/// became of the run (out of line, as `settle_again`).
async fn lost_answer<E: PgExecutor + 'static>(
    shared: &Shared<E>,
    running: &Running,
    settlement: &Settlement,
) {
    tracing::debug!(task = %settlement.task_id(), "lease lost before settlement");
    running.observe_lost_answer(&shared.store).await;
}

/// Counts or reports a settlement's final answer.
fn settled<E>(
    shared: &Shared<E>,
    running: &Running,
    settlement: &Settlement,
    answer: Result<Settled, Error>,
) {
    match answer {
        Ok(s) => {
            shared.state.settled.add_one();
            running.report_settled(s.status);
        }
        Err(e) if e.is_lost_lease() => {
            // The caller reads the row for the observer (`lost_answer`).
            tracing::debug!(task = %settlement.task_id(), "lease lost before settlement");
        }
        Err(e) => shared.report(format!("settle {}", settlement.task_id()), e),
    }
}

/// A passing failure (the pool saturated, its breaker open, a lost
/// connection) is tried again for up to half the lease, and not past
/// shutdown's grace or after `stop_now` (the lease decides then); a resent
/// settlement that had committed answers "lost lease", and the row is right.
async fn settle_again<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    settler: &Settler<E>,
    running: &Running,
    mut settlement: Settlement,
    error: Error,
) {
    let deadline = Instant::now() + shared.settings.lease / 2;
    // Past shutdown's grace no more tries: the lease decides.
    let stop = || running.is_lost() || shared.state.settlements_given_up();
    let again = || settler.write(&settlement);
    let mut out = while_passing(Err(error), deadline, stop, settlement.task_id(), again).await;
    // Its data refused once it reached the server: it fails instead, as in
    // `settle`, unless the lease went meanwhile (nothing of this run may
    // land then; reported below).
    let refused = if running.is_lost() { None } else { refused_data_failure(&settlement, &out) };
    if let Some(instead) = refused {
        settlement = instead;
        let first = settler.write(&settlement).await;
        let again = || settler.write(&settlement);
        out = while_passing(first, deadline, stop, settlement.task_id(), again).await;
    }
    if out.is_err() && running.is_lost() {
        tracing::debug!(task = %settlement.task_id(), "lease lost while a settlement was retried");
        return;
    }
    match out {
        Err(e) if e.is_lost_lease() => lost_answer(shared, running, &settlement).await,
        other => settled(shared, running, &settlement, other),
    }
}
