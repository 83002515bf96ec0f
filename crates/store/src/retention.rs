//! Retention: terminal tasks purged by rules, once ([`Store::sweep`]) or on
//! an interval in the background ([`Sweeper`]).
//!
//! Each rule is one `purge` repeated until a batch comes back short, as
//! cairnq's SDKs sweep. The purge deletes only terminal rows and skips
//! locked ones, so a sweep beside another SDK's sweeper, or racing a
//! `retry` that requeues a task, never deletes a live task.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::executor::PgExecutor;
use crate::options::PurgeFilter;
use crate::store::Store;
use crate::task::TaskStatus;

/// Which terminal tasks a rule deletes: completed longer ago than
/// `older_than`, optionally only of one queue, status or name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionRule {
    /// How long a terminal task is kept.
    pub older_than: Duration,
    /// Only this queue. Defaults to any.
    pub queue: Option<String>,
    /// Only this terminal status. Defaults to all three.
    pub status: Option<TaskStatus>,
    /// Only this handler name. Defaults to any.
    pub name: Option<String>,
}

impl RetentionRule {
    /// Every terminal task completed longer ago than `older_than`.
    pub fn older_than(older_than: Duration) -> Self {
        RetentionRule { older_than, queue: None, status: None, name: None }
    }

    setters! {
        /// Only tasks of `queue`.
        pub fn queue(queue: impl Into<String>) => queue = Some(queue.into());

        /// Only tasks that ended `status` (succeeded, failed or canceled).
        pub fn status(status: TaskStatus) => status = Some(status);

        /// Only tasks named `name`.
        pub fn name(name: impl Into<String>) => name = Some(name.into());
    }
}

/// What to keep, and how the sweeper runs.
///
/// ```
/// use std::time::Duration;
/// use waymark_store::{Retention, TaskStatus};
/// const DAY: Duration = Duration::from_secs(24 * 3600);
/// let retention = Retention::per_status([(TaskStatus::Succeeded, DAY), (TaskStatus::Failed, 30 * DAY)])
///     .interval(Duration::from_secs(600));
/// assert_eq!(retention.rules().len(), 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    rules: Vec<RetentionRule>,
    interval: Duration,
    batch: i64,
}

impl Retention {
    /// One age for every terminal task.
    pub fn older_than(older_than: Duration) -> Self {
        Retention::rules_of([RetentionRule::older_than(older_than)])
    }

    /// An age per terminal status; a status not named is kept.
    pub fn per_status(ages: impl IntoIterator<Item = (TaskStatus, Duration)>) -> Self {
        Retention::rules_of(ages.into_iter().map(|(st, age)| RetentionRule::older_than(age).status(st)))
    }

    /// Rules of their own; a task any rule matches is deleted.
    pub fn rules_of(rules: impl IntoIterator<Item = RetentionRule>) -> Self {
        Retention { rules: rules.into_iter().collect(), interval: Duration::from_secs(3600), batch: 1000 }
    }

    setters! {
        /// Time between sweeps of a [`Sweeper`]; the first comes one interval
        /// after it starts. Defaults to one hour.
        pub fn interval(interval: Duration) => interval = interval;

        /// Most rows one purge statement deletes. Defaults to 1000.
        pub fn batch(batch: i64) => batch = batch;
    }

    /// The rules.
    pub fn rules(&self) -> &[RetentionRule] {
        &self.rules
    }

    fn check(&self) -> Result<()> {
        if self.interval.is_zero() {
            return Err(Error::invalid("retention interval must be positive"));
        }
        if self.batch < 1 {
            return Err(Error::invalid(format!("retention batch must be at least 1, got {}", self.batch)));
        }
        for rule in &self.rules {
            if let Some(st) = rule.status.filter(|st| !st.is_terminal()) {
                return Err(Error::invalid(format!(
                    "retention status must be succeeded, failed or canceled, got {st}"
                )));
            }
        }
        Ok(())
    }
}

impl<E: PgExecutor> Store<E> {
    /// One sweep: each rule's purge, repeated until a batch comes back
    /// short, then the held ledger's ended rows older than the longest
    /// rule's age ([`Store::purge_held`]), so a ledger row outlives its
    /// task. Returns how many tasks it deleted. A failure stops the sweep
    /// there; what was deleted before it stays deleted.
    pub async fn sweep(&self, retention: &Retention) -> Result<u64> {
        retention.check()?;
        let mut deleted = 0u64;
        for rule in &retention.rules {
            let filter = PurgeFilter {
                queue: rule.queue.clone(),
                status: rule.status,
                name: rule.name.clone(),
                older_than: rule.older_than,
                limit: retention.batch,
            };
            loop {
                let ids = self.purge(&filter).await?;
                deleted += ids.len() as u64;
                // Their runs' recorded steps go with them (42P01: the
                // ledger was never migrated).
                match crate::store::forget_steps(self, &ids).await {
                    Err(e) if e.sqlstate() == Some("42P01") => {}
                    other => other?,
                }
                if (ids.len() as i64) < retention.batch {
                    break;
                }
            }
        }
        if let Some(longest) = retention.rules.iter().map(|r| r.older_than).max() {
            loop {
                let ids = match self.purge_held(longest, retention.batch).await {
                    // 42P01: the ledger was never migrated; nothing to forget.
                    Err(e) if e.sqlstate() == Some("42P01") => break,
                    other => other?,
                };
                if (ids.len() as i64) < retention.batch {
                    break;
                }
            }
        }
        Ok(deleted)
    }
}

/// A background sweep every interval, until [`Sweeper::stop`], drop, or
/// [`Store::close`] (which waits for a sweep under way).
#[derive(Debug)]
pub struct Sweeper {
    task: tokio::task::JoinHandle<()>,
}

/// What a background sweep reports: its count, or the error that
/// stopped it (the next sweep runs at the next interval all the same).
pub type SweepHook = Arc<dyn Fn(Result<u64>) + Send + Sync>;

impl Sweeper {
    /// Starts sweeping `store` by `retention` on the current runtime,
    /// handing each sweep's outcome to `hook`. Bad retention settings are
    /// refused here, before anything runs.
    pub fn start<E: PgExecutor + 'static>(
        store: Arc<Store<E>>,
        retention: Retention,
        hook: SweepHook,
    ) -> Result<Sweeper> {
        retention.check()?;
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(
                tokio::time::Instant::now() + retention.interval,
                retention.interval,
            );
            // A sweep that outlasts its interval is not followed by a burst.
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut closed = std::pin::pin!(store.life.closed());
            loop {
                tokio::select! {
                    _ = ticks.tick() => {}
                    () = &mut closed => return,
                }
                // Held through the sweep, so `Store::close` waits for it.
                let Some(_sweeping) = store.life.sweeping().await else { return };
                let out = store.sweep(&retention).await;
                match &out {
                    // Closed mid-sweep: its next purge found the store shut.
                    Err(e) if e.is_store_closed() => return hook(out),
                    Err(e) => {
                        tracing::warn!(error = %e, "retention sweep failed; the next runs at its interval")
                    }
                    Ok(_) => {}
                }
                hook(out);
            }
        });
        Ok(Sweeper { task })
    }

    /// Stops sweeping. A sweep under way stops where it waits; each purge
    /// is one statement that commits whole or not at all.
    pub fn stop(self) {}
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}
