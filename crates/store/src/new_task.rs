//! A task to submit ([`NewTask`]) and what a keyed submit does when its
//! key is taken ([`Conflict`]): builders whose docs state the defaults,
//! checked before any I/O.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde_json::Value as Json;

use crate::error::{Error, Result};
use crate::options::{millis, non_empty};

/// What a keyed submit does when the key already names a task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Conflict {
    /// Return the live (queued or running) task; a finished one frees the key.
    #[default]
    Reuse,
    /// Like `Reuse`, and a succeeded task is returned as a cached result.
    ReuseSucceeded,
    /// Fail with `AlreadyExists` whatever the named task's state.
    Reject,
    /// Cancel the live task, if any, and submit a new one under the key.
    Replace,
}

impl Conflict {
    /// The protocol spelling: `reuse`, `reuse-succeeded`, `reject`, `replace`.
    pub fn as_str(self) -> &'static str {
        match self {
            Conflict::Reuse => "reuse",
            Conflict::ReuseSucceeded => "reuse-succeeded",
            Conflict::Reject => "reject",
            Conflict::Replace => "replace",
        }
    }
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Conflict {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        [Conflict::Reuse, Conflict::ReuseSucceeded, Conflict::Reject, Conflict::Replace]
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown conflict strategy {s:?}: expected reuse, reuse-succeeded, reject or replace"
                ))
            })
    }
}

/// A task to submit.
///
/// ```
/// use waymark_store::{Conflict, NewTask};
/// let task = NewTask::new("email.send", serde_json::json!({"to": "a@b.c"}))
///     .queue("mail")
///     .key("welcome:42")
///     .conflict(Conflict::Reject)
///     .max_attempts(5);
/// assert_eq!(task.name, "email.send");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct NewTask {
    /// Handler name; must not be empty.
    pub name: String,
    /// Input: any JSON value, written and read back as it is.
    pub payload: Json,
    /// Deduplication key. Defaults to none.
    pub key: Option<String>,
    /// What to do when `key` is taken. Defaults to [`Conflict::Reuse`].
    pub conflict: Conflict,
    /// Queue. Defaults to `default`.
    pub queue: String,
    /// Runs allowed, at least 1. Defaults to 3.
    pub max_attempts: i32,
    /// Higher runs first. Defaults to 0.
    pub priority: i32,
    /// Any JSON value, written and read back as it is (as cairnq's SDKs
    /// do); an object by convention. Defaults to `{}`.
    pub metadata: Json,
    /// Delay before the task is due, in whole milliseconds (rounded down).
    /// Defaults to none.
    pub delay: Duration,
    /// The submitting task. Defaults to none.
    pub parent_id: Option<String>,
    /// The tree's root. Defaults to the task's own id.
    pub root_id: Option<String>,
    /// Caller's correlation id. Defaults to none.
    pub correlation_id: Option<String>,
}

impl NewTask {
    /// A task named `name` with `payload` and every default.
    pub fn new(name: impl Into<String>, payload: Json) -> Self {
        NewTask {
            name: name.into(),
            payload,
            key: None,
            conflict: Conflict::Reuse,
            queue: "default".to_owned(),
            max_attempts: 3,
            priority: 0,
            metadata: Json::Object(Default::default()),
            delay: Duration::ZERO,
            parent_id: None,
            root_id: None,
            correlation_id: None,
        }
    }

    setters! {
        /// Sets the deduplication key.
        pub fn key(key: impl Into<String>) => key = Some(key.into());

        /// Sets the conflict strategy for the key.
        pub fn conflict(conflict: Conflict) => conflict = conflict;

        /// Sets the queue.
        pub fn queue(queue: impl Into<String>) => queue = queue.into();

        /// Sets the number of runs allowed.
        pub fn max_attempts(n: i32) => max_attempts = n;

        /// Sets the priority.
        pub fn priority(p: i32) => priority = p;

        /// Sets the metadata: any JSON value, kept as it is.
        pub fn metadata(metadata: Json) => metadata = metadata;

        /// Delays the task by `delay`.
        pub fn delay(delay: Duration) => delay = delay;

        /// Sets the parent task.
        pub fn parent_id(id: impl Into<String>) => parent_id = Some(id.into());

        /// Sets the root task.
        pub fn root_id(id: impl Into<String>) => root_id = Some(id.into());

        /// Sets the correlation id.
        pub fn correlation_id(id: impl Into<String>) => correlation_id = Some(id.into());
    }

    pub(crate) fn validate(&self) -> Result<()> {
        non_empty("task name", &self.name)?;
        non_empty("queue", &self.queue)?;
        if let Some(key) = &self.key {
            non_empty("key", key)?;
        }
        let texts = [
            ("task name", Some(&self.name)),
            ("queue", Some(&self.queue)),
            ("key", self.key.as_ref()),
            ("parent_id", self.parent_id.as_ref()),
            ("root_id", self.root_id.as_ref()),
            ("correlation_id", self.correlation_id.as_ref()),
        ];
        for (what, text) in texts {
            if text.is_some_and(|t| t.contains('\0')) {
                return Err(Error::invalid(format!(
                    "{what} holds a NUL character, which PostgreSQL text cannot"
                )));
            }
        }
        for (what, json) in [("payload", &self.payload), ("metadata", &self.metadata)] {
            if holds_nul(json) {
                return Err(Error::invalid(format!(
                    "{what} holds a NUL character (\\u0000) in a string or a key, which PostgreSQL's jsonb cannot"
                )));
            }
        }
        if self.max_attempts < 1 {
            return Err(Error::invalid(format!(
                "max_attempts must be at least 1, got {}",
                self.max_attempts
            )));
        }
        if millis("delay", self.delay)? > MAX_DELAY_MS {
            return Err(Error::invalid(format!(
                "delay of {:?} is too long: at most 10,000 years",
                self.delay
            )));
        }
        Ok(())
    }
}

/// The longest delay a task may be submitted with, and the longest deadline
/// or event retention of a held task: 10,000 years, so that now plus it (in
/// ms) stays far inside bigint.
pub(crate) const MAX_DELAY_MS: i64 = 10_000 * MS_PER_YEAR;

/// Milliseconds in a year of 365.25 days.
const MS_PER_YEAR: i64 = 31_557_600_000;

/// Whether `json` holds a NUL character in a string or a key.
fn holds_nul(json: &Json) -> bool {
    match json {
        Json::String(s) => s.contains('\0'),
        Json::Array(items) => items.iter().any(holds_nul),
        Json::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || holds_nul(v)),
        _ => false,
    }
}
