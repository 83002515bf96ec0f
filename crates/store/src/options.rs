//! Arguments of the other operations (a claim, a failure, the filters of
//! `list` and `purge`), as builders whose docs state the defaults, and
//! the checks every operation shares.

use std::time::Duration;

use serde_json::Value as Json;

use crate::error::{Error, Result};
use crate::fleet::FleetLimit;
use crate::task::TaskStatus;

/// One claim pass. Made with [`ClaimRequest::new`] and its setters, so a
/// new setting is not a breaking change.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimRequest {
    /// The claiming worker.
    pub worker_id: String,
    /// Queues to claim from; none claims nothing.
    pub queues: Vec<String>,
    /// Handler names to claim; `None` means any, an empty list claims nothing.
    /// Defaults to `None`.
    pub names: Option<Vec<String>>,
    /// Lease length, at least 1 ms. Defaults to 30 s.
    pub lease: Duration,
    /// Most tasks to claim; 0 or less claims nothing. Defaults to 1.
    pub limit: i64,
    /// Whether the pass starts with the probe (and lease recovery when it
    /// finds an expired lease). Off, the pass is the claim statement alone:
    /// for a caller that knows work is due (its last claim came back full,
    /// or a task was just queued) and recovers leases on its own schedule.
    /// Defaults to true.
    pub probe: bool,
    /// A fleet-wide limit the claim keeps to (see [`FleetLimit`]): it
    /// claims only tasks the limit covers, and only into its free slots.
    /// Defaults to `None`.
    pub fleet_limit: Option<FleetLimit>,
}

impl ClaimRequest {
    /// A claim of one task for `worker_id` from `queues`, any name, 30 s lease.
    pub fn new<Q: Into<String>>(worker_id: impl Into<String>, queues: impl IntoIterator<Item = Q>) -> Self {
        ClaimRequest {
            worker_id: worker_id.into(),
            queues: queues.into_iter().map(Into::into).collect(),
            names: None,
            lease: Duration::from_secs(30),
            limit: 1,
            probe: true,
            fleet_limit: None,
        }
    }

    /// Claims only tasks with these names.
    pub fn names<N: Into<String>>(mut self, names: impl IntoIterator<Item = N>) -> Self {
        self.names = Some(names.into_iter().map(Into::into).collect());
        self
    }

    setters! {
        /// Sets the lease length.
        pub fn lease(lease: Duration) => lease = lease;

        /// Sets the most tasks to claim.
        pub fn limit(limit: i64) => limit = limit;

        /// Turns the probe (and the lease recovery it may start) on or off.
        pub fn probe(probe: bool) => probe = probe;

        /// Claims under a fleet-wide limit.
        pub fn fleet_limit(limit: FleetLimit) => fleet_limit = Some(limit);
    }
}

/// Filters for `list`; every filter defaults to off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListFilter {
    /// Only this status.
    pub status: Option<TaskStatus>,
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this handler name.
    pub name: Option<String>,
    /// Only this tree.
    pub root_id: Option<String>,
    /// Only this correlation id.
    pub correlation_id: Option<String>,
    /// Page size, at least 0. Defaults to 100.
    pub limit: i64,
    /// Rows to skip, at least 0. Defaults to 0.
    pub offset: i64,
}

impl Default for ListFilter {
    fn default() -> Self {
        ListFilter {
            status: None,
            queue: None,
            name: None,
            root_id: None,
            correlation_id: None,
            limit: 100,
            offset: 0,
        }
    }
}

/// Which terminal tasks `purge` deletes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeFilter {
    /// Only this queue. Defaults to any.
    pub queue: Option<String>,
    /// Only this terminal status. Defaults to all three.
    pub status: Option<TaskStatus>,
    /// Only this handler name. Defaults to any.
    pub name: Option<String>,
    /// Only tasks completed longer ago than this.
    pub older_than: Duration,
    /// Most rows per call, at least 1. Defaults to 1000.
    pub limit: i64,
}

impl PurgeFilter {
    /// Terminal tasks completed longer ago than `older_than`, 1000 at most.
    pub fn older_than(older_than: Duration) -> Self {
        PurgeFilter { queue: None, status: None, name: None, older_than, limit: 1000 }
    }
}

/// How a running task failed.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The envelope to store (see `ErrorEnvelope`).
    pub error: Json,
    /// Whether another attempt may run, if attempts remain. Defaults to true.
    pub retryable: bool,
    /// Delay before the retry is due. Defaults to none.
    pub delay: Duration,
}

impl Failure {
    /// A retryable failure with `error`, due again at once.
    pub fn new(error: Json) -> Self {
        Failure { error, retryable: true, delay: Duration::ZERO }
    }

    setters! {
        /// Sets whether it may be retried.
        pub fn retryable(retryable: bool) => retryable = retryable;

        /// Sets the retry delay.
        pub fn delay(delay: Duration) => delay = delay;
    }
}

/// `d` in whole milliseconds, as the protocol's int8 slots take it; an
/// error naming `what` past the slot's range.
pub(crate) fn millis(what: &str, d: Duration) -> Result<i64> {
    i64::try_from(d.as_millis())
        .map_err(|_| Error::invalid(format!("{what} of {d:?} is too long: at most i64::MAX ms")))
}

/// A lease length in ms: at least 1.
pub(crate) fn lease_millis(d: Duration) -> Result<i64> {
    match millis("lease", d)? {
        0 => Err(Error::invalid(format!("lease must be at least 1 ms, got {d:?}"))),
        ms => Ok(ms),
    }
}

pub(crate) fn non_empty(what: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        Err(Error::invalid(format!("{what} must not be empty")))
    } else {
        Ok(())
    }
}
