//! How a run ended ([`Outcome`], the handler's answer; [`HandlerEnd`], with
//! the ends the worker decides itself), and the one settlement each end
//! maps to ([`settlement_for`]).

use std::time::Duration;

use serde_json::Value as Json;
use waymark_store::{codes, Failure, RetryBackoff, Settlement, Task};

use crate::shared::{envelope, CancelReason, Running, TaskError};

/// How one run of a handler ended, before settlement.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// The result, serialised.
    Done(Json),
    /// The handler returned an error.
    Failed(TaskError),
    /// The payload did not deserialise into the handler's type.
    BadPayload(String),
    /// The result did not serialise.
    Unserializable(String),
}

/// How a run ended, including the ends the worker decides itself. A run
/// stopped at shutdown has no end of its own (`None` where one is
/// expected): shutdown gives its task back.
#[derive(Clone)]
pub(crate) enum HandlerEnd {
    Handler(Outcome),
    Panicked(String),
    TimedOut(Duration),
    NoHandler,
}

impl HandlerEnd {
    /// The envelope `type` a run's end fails with, if it fails.
    pub(crate) fn error_type(&self) -> Option<String> {
        Some(match self {
            HandlerEnd::Handler(Outcome::Done(_)) => return None,
            HandlerEnd::Handler(Outcome::Failed(e)) => e.kind_name().to_owned(),
            HandlerEnd::Handler(Outcome::BadPayload(_)) => "InvalidPayload".to_owned(),
            HandlerEnd::Handler(Outcome::Unserializable(_)) => "UnserializableResult".to_owned(),
            HandlerEnd::Panicked(_) => "Panic".to_owned(),
            HandlerEnd::TimedOut(_) => "HandlerTimeout".to_owned(),
            HandlerEnd::NoHandler => "NoHandler".to_owned(),
        })
    }
}

/// What a run's end settles, or `None` when it settles nothing (a lost
/// lease, a stop at shutdown, a settlement already made).
pub(crate) fn settlement_for(
    backoff: RetryBackoff,
    task: &Task,
    running: &Running,
    end: Option<HandlerEnd>,
) -> Option<Settlement> {
    if running.is_lost() {
        tracing::debug!(task = %task.id, "lease lost; the late settlement is dropped");
        return None;
    }
    // Shutdown gives it back, however the handler answered its token: an
    // Err must not spend an attempt, an Ok of a run told to stop must not
    // count as done. A snooze spends none either, and keeps its delay.
    let snoozed = matches!(&end, Some(HandlerEnd::Handler(Outcome::Failed(e))) if e.snoozed().is_some());
    let end = end.filter(|_| snoozed || running.reason() != Some(CancelReason::Shutdown))?;
    if !running.take_settlement() {
        return None; // settled by the handler, or given back at shutdown
    }
    // The handler's own settlement whose write never answered wins over
    // what its return maps to.
    if let Some(pending) = running.take_pending() {
        return Some(pending);
    }
    let lease = || running.lease.clone();
    let fail = |error: serde_json::Value, retryable: bool| {
        let delay = if retryable { backoff.delay(task.attempt) } else { Duration::ZERO };
        Settlement::Fail { lease: lease(), failure: Failure::new(error).retryable(retryable).delay(delay) }
    };
    Some(match end {
        HandlerEnd::Handler(Outcome::Done(result)) => Settlement::Complete { lease: lease(), result },
        HandlerEnd::Handler(Outcome::Failed(e)) => match e.snoozed() {
            Some(delay) => Settlement::Snooze { lease: lease(), delay },
            None => fail(e.envelope(), e.is_retryable()),
        },
        HandlerEnd::Handler(Outcome::BadPayload(why)) => fail(
            envelope(
                "InvalidPayload",
                codes::TASK_ERROR,
                format!("payload does not fit the handler of {:?}: {why}", task.name),
                false,
            ),
            false,
        ),
        HandlerEnd::Handler(Outcome::Unserializable(why)) => fail(
            envelope(
                "UnserializableResult",
                codes::UNSERIALIZABLE_RESULT,
                format!("the result does not serialise to JSON: {why}"),
                false,
            ),
            false,
        ),
        HandlerEnd::Panicked(message) => fail(
            envelope("Panic", codes::HANDLER_ERROR, format!("the handler panicked: {message}"), true),
            true,
        ),
        HandlerEnd::TimedOut(limit) => fail(
            envelope(
                "HandlerTimeout",
                codes::HANDLER_TIMEOUT,
                format!("the handler ran longer than {limit:?}"),
                true,
            ),
            true,
        ),
        HandlerEnd::NoHandler => fail(
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
