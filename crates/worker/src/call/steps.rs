//! A handler's durable steps and sleeps (`TaskContext::step`,
//! `TaskContext::sleep`): each has a place in the run, in call order, and
//! a name; what a run finished is recorded in waymark's ledger, and the run
//! that comes again (a crash, a lost lease, a retry, the end of a sleep)
//! reads it back and goes past it.

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value as Json;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::PgTransaction;
use waymark_store::{Error, EventWait, PgExecutor, StepKind, StepRecord, MAX_SNOOZE};

use super::context::{HandBack, TaskContext};
use crate::shared::TaskError;

/// The run's places so far, and the history read at its first step.
#[derive(Debug, Default)]
pub(crate) struct StepLog {
    state: tokio::sync::Mutex<Places>,
}

#[derive(Debug, Default)]
struct Places {
    /// What earlier runs recorded, read once, at the first step.
    history: Option<Vec<StepRecord>>,
    /// The database's clock at that read.
    now_ms: Option<i64>,
    next: i32,
    names: HashSet<String>,
}

/// A place taken: its number, and what an earlier run recorded there.
struct Place {
    seq: i32,
    recorded: Option<StepRecord>,
    now_ms: Option<i64>,
}

impl<E: PgExecutor> TaskContext<E> {
    /// Runs `work` once for the task, whatever happens to its runs: its
    /// result is recorded (one statement, fenced to this run's lease), and
    /// a later run of the task (after a crash, a lost lease, a retry, a
    /// durable sleep) gets the recorded result back without running `work`.
    /// Steps are told apart by their place in the run (call order) and
    /// their name, which must be unique in the run; a later run whose code
    /// calls a different step at a recorded place fails for good, naming
    /// both. A `work` that fails fails the run by the task's own retry
    /// policy (nothing is recorded, so the next run runs it again); one that
    /// ran but whose record did not land (the lease was lost) may run again
    /// in the run that takes over: its effect is at least once, unless it
    /// commits with the task's own writes ([`TaskContext::complete_in`]).
    /// A run's steps go one after another, not at once.
    pub async fn step<T, F, Fut>(&self, name: &str, work: F) -> Result<T, TaskError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, TaskError>>,
    {
        let place = self.take_place(name, StepKind::Step).await?;
        if let Some(recorded) = place.recorded {
            return recorded_result(name, recorded);
        }
        let value = work().await?;
        let json = serde_json::to_value(&value).map_err(|e| {
            TaskError::permanent(format!("step {name:?}: its result does not serialise to JSON: {e}"))
        })?;
        self.store()
            .record_step(self.lease(), place.seq, name, StepKind::Step, Some(json), Duration::ZERO)
            .await?;
        Ok(value)
    }

    /// [`TaskContext::step`] whose effect commits with its record: `work`
    /// writes in the transaction it is handed, and the step's record joins
    /// it, so the effect happens exactly once for the task (a run that
    /// lost its lease rolls both back). A later run gets the recorded
    /// result without running `work`.
    pub async fn step_in<T, F>(&self, name: &str, work: F) -> Result<T, TaskError>
    where
        T: Serialize + DeserializeOwned,
        F: for<'t> FnOnce(&'t mut E::Transaction) -> BoxFuture<'t, Result<T, TaskError>>,
    {
        let place = self.take_place(name, StepKind::Step).await?;
        if let Some(recorded) = place.recorded {
            return recorded_result(name, recorded);
        }
        let mut tx = self.store().executor().begin().await.map_err(waymark_store::Error::from)?;
        let out = async {
            let value = work(&mut tx).await?;
            let json = serde_json::to_value(&value).map_err(|e| {
                TaskError::permanent(format!("step {name:?}: its result does not serialise to JSON: {e}"))
            })?;
            let recorded = self.store().record_step_in(&mut tx, self.lease(), place.seq, name, json);
            recorded.await.map_err(|e| self.step_error(e))?;
            Ok::<T, TaskError>(value)
        }
        .await;
        match out {
            Ok(value) => {
                tx.commit().await.map_err(waymark_store::Error::from)?;
                Ok(value)
            }
            Err(e) => {
                let _ = tx.rollback().await;
                Err(e)
            }
        }
    }

    /// A durable sleep: the run gives its slot back (an error to return
    /// with `?`, a snooze of its attempt, as [`TaskError::snooze`]) and the
    /// sleep is recorded, so the run that resumes after `duration` goes
    /// past it without sleeping again. A zero sleep is recorded and goes on
    /// at once. Longer than [`MAX_SNOOZE`] fails the run for good, with
    /// nothing written. Named and placed as [`TaskContext::step`].
    pub async fn sleep(&self, name: &str, duration: Duration) -> Result<(), TaskError> {
        if duration > MAX_SNOOZE {
            return Err(TaskError::permanent(format!(
                "sleep {name:?} of {duration:?} is longer than the most, {MAX_SNOOZE:?}"
            )));
        }
        let place = self.take_place(name, StepKind::Sleep).await?;
        let (wake_at, now) = match (place.recorded, place.now_ms) {
            (Some(recorded), Some(now)) => (recorded.wake_at_ms.unwrap_or(now), now),
            _ => {
                let (record, now) = self
                    .store()
                    .record_step(self.lease(), place.seq, name, StepKind::Sleep, None, duration)
                    .await
                    .map_err(|e| self.step_error(e))?;
                (record.wake_at_ms.unwrap_or(now), now)
            }
        };
        match u64::try_from(wake_at - now) {
            Ok(left) if left > 0 => Err(TaskError::snooze(Duration::from_millis(left))),
            _ => Ok(()),
        }
    }

    /// Waits for the event `event` ([`Store::emit`](waymark_store::Store::emit)),
    /// at most `timeout` from when the run first reached this wait:
    /// `Some(payload)` when it came (an event emitted earlier and still
    /// kept counts), `None` when the time passed first. While it waits,
    /// the run is parked: its task is snoozed in the same transaction that
    /// records the wait (this returns the snooze as an error to return with
    /// `?`), and holds no slot, connection or lease; an emit makes it due
    /// at once, and the run that resumes goes past the wait with its
    /// answer. Waiting twice for one event in a run, an empty name, or a
    /// timeout past [`MAX_SNOOZE`] fails the run for good with nothing
    /// written. Placed as [`TaskContext::step`], named by the event.
    pub async fn wait_for_event(&self, event: &str, timeout: Duration) -> Result<Option<Json>, TaskError> {
        if timeout > MAX_SNOOZE {
            return Err(TaskError::permanent(format!(
                "wait for {event:?} of {timeout:?} is longer than the most, {MAX_SNOOZE:?}"
            )));
        }
        let place = self.take_place(event, StepKind::Wait).await?;
        if let Some(recorded) = &place.recorded {
            // Only a closed wait answers from the history; an open one asks
            // again under the event's lock, where a deadline that passed
            // closes it for every later run.
            if recorded.done {
                return Ok((!recorded.timed_out).then(|| recorded.result.clone().unwrap_or(Json::Null)));
            }
        }
        // Parking settles the run (a snooze): it takes the run's settlement,
        // and gives it back when the wait ends without parking, or when this
        // future is dropped before the transaction answers.
        if !self.running.take_settlement() {
            return Err(TaskError::from(self.lost()));
        }
        let mut hand_back = HandBack(Some(&self.running));
        let out = self.store().wait_for_event(self.lease(), place.seq, event, timeout).await;
        match out {
            Ok(EventWait::Parked { left, status }) => {
                hand_back.0 = None;
                self.running.report_settled(status);
                Err(TaskError::snooze(left))
            }
            Ok(EventWait::Received(payload)) => Ok(Some(payload)),
            Ok(EventWait::TimedOut) => Ok(None),
            // Committed or not, unknown: the worker settles by the
            // handler's return, a write the snooze, if it landed, leaves
            // no lease for.
            Err(e) => Err(self.step_error(e)),
        }
    }

    /// A store error of a step, for the handler: a lost lease marks the run
    /// lost; bad input (a history the code does not match) fails the run
    /// for good rather than spending attempts on it.
    fn step_error(&self, e: Error) -> TaskError {
        if e.is_lost_lease() {
            self.running.mark_lost();
        }
        match e {
            Error::InvalidArgument(why) => TaskError::permanent(why),
            e => TaskError::from(e),
        }
    }

    /// The next place of the run for `name`: the history read at the first
    /// one, the name checked unique in the run and against what is recorded
    /// there.
    async fn take_place(&self, name: &str, kind: StepKind) -> Result<Place, TaskError> {
        self.check_owned()?;
        if name.is_empty() || name.contains('\0') {
            return Err(TaskError::permanent(format!(
                "step name {name:?} must be non-empty text without NUL"
            )));
        }
        let mut places = self.steps.state.lock().await;
        if places.history.is_none() {
            let history = self.store().steps(self.id()).await?;
            places.history = Some(history.records);
            places.now_ms = history.now_ms;
        }
        if !places.names.insert(name.to_owned()) {
            return Err(TaskError::permanent(format!("step name {name:?} is used twice in one run")));
        }
        let seq = places.next;
        places.next += 1;
        let recorded = places.history.as_ref().and_then(|h| h.iter().find(|r| r.seq == seq)).cloned();
        if let Some(r) = &recorded {
            if r.name != name || r.kind != kind {
                return Err(TaskError::permanent(format!(
                    "the task's history does not match its code: place {seq} of the run recorded {} {:?}, \
                     and the code now calls {} {name:?} there",
                    r.kind.as_str(),
                    r.name,
                    kind.as_str()
                )));
            }
        }
        Ok(Place { seq, recorded, now_ms: places.now_ms })
    }
}

/// A recorded step's result, as the step's type.
fn recorded_result<T: DeserializeOwned>(name: &str, recorded: StepRecord) -> Result<T, TaskError> {
    let result = recorded.result.unwrap_or(Json::Null);
    serde_json::from_value(result).map_err(|e| {
        TaskError::permanent(format!("step {name:?}: its recorded result does not fit the step's type: {e}"))
    })
}
