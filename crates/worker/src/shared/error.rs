//! What a handler returns when it fails, and the error envelopes of
//! protocol v1 that the worker writes for every way a run can end badly.

use std::fmt;
use std::time::Duration;

use serde_json::{json, Value as Json};
use waymark_store::codes;

/// A handler's failure. Retryable unless made with [`TaskError::permanent`]
/// or marked so; stored as the task's error envelope with code
/// `task_error` unless given another.
///
/// [`TaskError::snooze`] is not a failure but a "not yet": the task goes
/// back to its queue, due after the delay, with its attempt unspent and its
/// error left as it was.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskError {
    // Boxed strings: the error is returned by value from every handler,
    // and these two are set once.
    kind: Box<str>,
    code: Box<str>,
    message: String,
    retryable: bool,
    details: Json,
    snooze: Option<Duration>,
}

impl TaskError {
    /// A retryable failure.
    pub fn new(message: impl Into<String>) -> Self {
        TaskError {
            kind: "TaskError".into(),
            code: codes::TASK_ERROR.into(),
            message: message.into(),
            retryable: true,
            details: json!({}),
            snooze: None,
        }
    }

    /// "Not yet, try in `delay`": the task is queued again, due after
    /// `delay`, without spending an attempt and without touching its error
    /// (a rate-limited API, a resource not ready). A cancel request still
    /// wins. A delay past [`waymark_store::MAX_SNOOZE`] (ten years) is cut
    /// to it.
    pub fn snooze(delay: Duration) -> Self {
        let delay = delay.min(waymark_store::MAX_SNOOZE);
        TaskError { snooze: Some(delay), ..TaskError::new(format!("snoozed for {delay:?}")).kind("Snooze") }
    }

    /// The delay of a [`TaskError::snooze`], `None` for a failure.
    pub fn snoozed(&self) -> Option<Duration> {
        self.snooze
    }

    /// A failure no retry can fix: the task fails for good.
    pub fn permanent(message: impl Into<String>) -> Self {
        TaskError::new(message).retryable(false)
    }

    /// Sets whether another attempt may run.
    pub fn retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    /// Sets the envelope's `code` (defaults to `task_error`).
    pub fn code(mut self, code: impl Into<String>) -> Self {
        self.code = code.into().into_boxed_str();
        self
    }

    /// Sets the envelope's `type`, the error's class name (defaults to
    /// `TaskError`).
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = kind.into().into_boxed_str();
        self
    }

    /// Sets the envelope's `details` (a JSON value; defaults to `{}`).
    pub fn details(mut self, details: Json) -> Self {
        self.details = details;
        self
    }

    /// Whether another attempt may run.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// The envelope's `type`.
    pub(crate) fn kind_name(&self) -> &str {
        &self.kind
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The error envelope as stored on the task.
    pub fn envelope(&self) -> Json {
        json!({
            "type": self.kind,
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable,
            "details": self.details,
        })
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for TaskError {}

impl From<String> for TaskError {
    fn from(message: String) -> Self {
        TaskError::new(message)
    }
}

impl From<&str> for TaskError {
    fn from(message: &str) -> Self {
        TaskError::new(message)
    }
}

/// A store error inside a handler: retryable, unless it is a bad argument.
impl From<waymark_store::Error> for TaskError {
    fn from(e: waymark_store::Error) -> Self {
        let permanent = matches!(e, waymark_store::Error::InvalidArgument(_));
        TaskError::new(e.to_string()).kind(e.class_name()).retryable(!permanent)
    }
}

impl From<serde_json::Error> for TaskError {
    fn from(e: serde_json::Error) -> Self {
        TaskError::permanent(e.to_string()).kind("JsonError")
    }
}

/// The envelopes the worker writes itself.
pub(crate) fn envelope(kind: &str, code: &str, message: String, retryable: bool) -> Json {
    json!({"type": kind, "code": code, "message": message, "retryable": retryable, "details": {}})
}

/// What a caught panic says.
pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "the handler panicked".to_owned()
    }
}
