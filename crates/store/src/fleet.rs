//! Fleet-wide concurrency limits: how many tasks of a queue, of a name, or
//! of each group within them may run at once across every worker that
//! claims under the same limit.
//!
//! A limit lives in no table: the running rows are the count. A limited
//! claim takes the limit's advisory lock (transaction-scoped, so a crashed
//! claimer never holds it), counts the running rows in the limit's scope
//! and claims only into the free slots (`claim_limited.sql`). Claims under
//! one limit thus run one at a time across the fleet; claims under other
//! limits, and unlimited claims, do not wait for them. A claim waits for
//! its turn [`FLEET_LIMIT_TURN_WAIT`] at most, so a claimer frozen inside
//! its turn (a stalled process, a lost network) holds the others up that
//! long per try, never for a query timeout; the claim that gave up its turn
//! fails with [`Error::LockTimeout`] and is tried again.
//!
//! Workers that do not know a limit (a cairnq SDK's, or a waymark worker
//! built without it) claim past it; their running tasks still count
//! against it.

use std::time::Duration;

use crate::error::{Error, Result};

/// How long a claim under a fleet limit waits for its turn (the limit's
/// lock) before it gives the turn up and fails with [`Error::LockTimeout`],
/// having claimed nothing. A turn lasts one claim statement and its commit,
/// milliseconds, so this covers a queue of claimers; a claimer that held
/// its turn longer has stalled inside it.
pub const FLEET_LIMIT_TURN_WAIT: Duration = Duration::from_millis(100);

/// Where a group key is read from: a path into the task's payload or its
/// metadata. A task without a value there is in the group of tasks without
/// one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GroupKey {
    /// A path into the payload, such as `["tenant"]` or `["account", "id"]`.
    Payload(Vec<String>),
    /// A path into the metadata.
    Metadata(Vec<String>),
}

impl GroupKey {
    /// A path into the payload.
    pub fn payload<S: Into<String>>(path: impl IntoIterator<Item = S>) -> Self {
        GroupKey::Payload(path.into_iter().map(Into::into).collect())
    }

    /// A path into the metadata.
    pub fn metadata<S: Into<String>>(path: impl IntoIterator<Item = S>) -> Self {
        GroupKey::Metadata(path.into_iter().map(Into::into).collect())
    }

    pub(crate) fn column(&self) -> &'static str {
        match self {
            GroupKey::Payload(_) => "payload",
            GroupKey::Metadata(_) => "metadata",
        }
    }

    pub(crate) fn path(&self) -> &[String] {
        match self {
            GroupKey::Payload(p) | GroupKey::Metadata(p) => p,
        }
    }
}

/// A limit on running tasks across the fleet: of one queue, of one task
/// name, or of both; with [`FleetLimit::per_group`], of each group within
/// that scope.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FleetLimit {
    queue: Option<String>,
    name: Option<String>,
    group: Option<GroupKey>,
    max_running: i64,
}

impl FleetLimit {
    /// At most `max_running` tasks of `queue` run at once, whatever their
    /// names.
    pub fn queue(queue: impl Into<String>, max_running: i64) -> Self {
        FleetLimit { queue: Some(queue.into()), name: None, group: None, max_running }
    }

    /// At most `max_running` tasks named `name` run at once, in any queue.
    pub fn name(name: impl Into<String>, max_running: i64) -> Self {
        FleetLimit { queue: None, name: Some(name.into()), group: None, max_running }
    }

    setters! {
        /// Narrows a limit to the tasks of `name` in its queue (or widens a
        /// name limit's scope to one queue).
        pub fn in_queue(queue: impl Into<String>) => queue = Some(queue.into());

        /// Narrows a queue limit to the tasks named `name`.
        pub fn named(name: impl Into<String>) => name = Some(name.into());

        /// Applies the limit to each group on its own: with
        /// `GroupKey::payload(["tenant"])` and a limit of 1, one task per tenant
        /// runs at once.
        pub fn per_group(key: GroupKey) => group = Some(key);
    }

    /// The queue the limit is on, if it is on one.
    pub fn scope_queue(&self) -> Option<&str> {
        self.queue.as_deref()
    }

    /// The task name the limit is on, if it is on one.
    pub fn scope_name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The group key, if the limit holds per group.
    pub fn group(&self) -> Option<&GroupKey> {
        self.group.as_ref()
    }

    /// The most tasks that run at once (in each group, with one).
    pub fn max_running(&self) -> i64 {
        self.max_running
    }

    /// Whether a task of `queue` and `name` is under this limit.
    pub fn covers(&self, queue: &str, name: &str) -> bool {
        self.queue.as_deref().is_none_or(|q| q == queue) && self.name.as_deref().is_none_or(|n| n == name)
    }

    /// Checks the limit, naming what is wrong.
    pub fn check(&self) -> Result<()> {
        if self.queue.is_none() && self.name.is_none() {
            return Err(Error::invalid("a fleet limit needs a queue, a task name, or both"));
        }
        if self.queue.as_deref() == Some("") || self.name.as_deref() == Some("") {
            return Err(Error::invalid(format!("a fleet limit's queue and name must not be empty: {self}")));
        }
        if self.max_running < 1 {
            return Err(Error::invalid(format!(
                "a fleet limit must let at least 1 task run, got {} for {self}",
                self.max_running
            )));
        }
        if self.group.as_ref().is_some_and(|g| g.path().is_empty() || g.path().iter().any(String::is_empty)) {
            return Err(Error::invalid(format!("a fleet limit's group path must name fields: {self}")));
        }
        Ok(())
    }

    /// The advisory lock key that serialises claims under this limit: its
    /// scope and group, not its number, so workers that disagree on the
    /// number still take turns. The prefix keeps it apart from task keys in
    /// practice (a clash would only serialise, never break).
    pub(crate) fn lock_key(&self) -> String {
        format!("waymark.fleet_limit:{}", self.scope())
    }

    fn scope(&self) -> String {
        let mut s = format!(
            "queue={} name={}",
            self.queue.as_deref().unwrap_or("*"),
            self.name.as_deref().unwrap_or("*")
        );
        if let Some(g) = &self.group {
            s.push_str(&format!(" group={}:{}", g.column(), g.path().join(".")));
        }
        s
    }
}

impl std::fmt::Display for FleetLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} max={}", self.scope(), self.max_running)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_limits_say_what_is_wrong() {
        let no_scope = FleetLimit { queue: None, name: None, group: None, max_running: 1 };
        assert!(no_scope.check().unwrap_err().to_string().contains("needs a queue"));
        assert!(FleetLimit::queue("q", 0).check().unwrap_err().to_string().contains("at least 1"));
        assert!(FleetLimit::name("", 2).check().unwrap_err().to_string().contains("must not be empty"));
        let empty_path = FleetLimit::name("n", 1).per_group(GroupKey::payload(Vec::<String>::new()));
        assert!(empty_path.check().unwrap_err().to_string().contains("group path"));
        FleetLimit::name("n", 1).in_queue("q").per_group(GroupKey::metadata(["tenant"])).check().unwrap();
    }

    #[test]
    fn a_limit_covers_its_scope_only() {
        let l = FleetLimit::queue("mail", 5);
        assert!(l.covers("mail", "send") && l.covers("mail", "bounce") && !l.covers("other", "send"));
        let l = FleetLimit::name("sync", 1).in_queue("a");
        assert!(l.covers("a", "sync") && !l.covers("b", "sync") && !l.covers("a", "other"));
    }

    #[test]
    fn equal_limits_share_a_lock_and_different_ones_do_not() {
        let a = FleetLimit::name("sync", 1).per_group(GroupKey::payload(["tenant"]));
        assert_eq!(a.lock_key(), a.clone().lock_key());
        assert_ne!(a.lock_key(), FleetLimit::name("sync", 1).lock_key());
        let wider = FleetLimit::name("sync", 3).per_group(GroupKey::payload(["tenant"]));
        assert_eq!(a.lock_key(), wider.lock_key(), "the number is not the scope");
        assert_eq!(a.lock_key(), "waymark.fleet_limit:queue=* name=sync group=payload:tenant");
    }
}
