//! Settlement: complete, fail and release, one by one or in a batch.

use serde_json::Value as Json;
use waymark_protocol::Statement;

use super::{finish, owned, Store};
use crate::error::{Error, Result};
use crate::executor::{Lane, PgExecutor, PgSession};
use crate::lease::Lease;
use crate::observe;
use crate::options::{millis, Failure};
use crate::statements::{run, run_opt, Binds};
use crate::task::{text_array, Settled, Task, TaskStatus};
use crate::value::Value;

impl<E: PgExecutor> Store<E> {
    /// Marks an owned task succeeded with `result` (a requested cancel does
    /// not win here; workers settle with [`Store::complete`]).
    pub async fn succeed(&self, lease: &Lease, result: Json, message: Option<&str>) -> Result<Task> {
        let binds: Binds = vec![("result", result.into()), ("message", message.into())];
        self.observed_settle(1, async { owned(&mut self.session()?, Statement::Succeed, binds, lease).await })
            .await
    }

    /// Settles an owned task: canceled if a cancel was requested, else
    /// succeeded with `result`.
    pub async fn complete(&self, lease: &Lease, result: Json) -> Result<Task> {
        self.observed_settle(1, async { complete(&mut self.session()?, lease, result).await }).await
    }

    /// [`Store::complete`] inside the caller's transaction: the settlement
    /// commits with the caller's other writes, or neither does. A lost lease
    /// is reported before the caller commits.
    pub async fn complete_in(&self, tx: &mut E::Transaction, lease: &Lease, result: Json) -> Result<Task> {
        self.observed_settle(1, async {
            self.life.check()?;
            complete(tx, lease, result).await
        })
        .await
    }

    /// Records a failure: canceled if a cancel was requested; queued again
    /// after its delay if retryable with attempts left; else failed.
    pub async fn fail(&self, lease: &Lease, failure: &Failure) -> Result<Task> {
        self.observed_settle(1, async { fail(&mut self.session()?, lease, failure).await }).await
    }

    /// Gives an owned task back (at shutdown): queued and due now, its
    /// attempt not spent; canceled instead if a cancel was requested.
    /// A waymark addition to the protocol (`release.sql`).
    pub async fn release(&self, lease: &Lease) -> Result<Task> {
        release(&mut self.session()?, lease, std::time::Duration::ZERO).await
    }

    /// Snoozes an owned task: queued again, due after `delay`, its attempt
    /// not spent and its error left as it was (a handler's "not yet");
    /// canceled instead if a cancel was requested. The same statement as
    /// [`Store::release`] (`release.sql`), with a delay.
    pub async fn snooze(&self, lease: &Lease, delay: std::time::Duration) -> Result<Task> {
        self.observed_settle(1, async { release(&mut self.session()?, lease, delay).await }).await
    }

    /// Makes one settlement on its own, as [`Store::complete`],
    /// [`Store::fail`] or [`Store::snooze`].
    pub async fn settle(&self, settlement: &Settlement) -> Result<Task> {
        match settlement {
            Settlement::Complete { lease, result } => self.complete(lease, result.clone()).await,
            Settlement::Fail { lease, failure } => self.fail(lease, failure).await,
            Settlement::Snooze { lease, delay } => self.snooze(lease, *delay).await,
        }
    }

    /// Settles several owned tasks with one commit for all: each settlement
    /// is still ownership-checked and answered on its own (a lost lease
    /// fails only that one). `Err` means the batch failed as a whole: it did
    /// not commit, or its answer was lost or unreadable, so none of them is
    /// known to have committed (a settlement made again then finds its task
    /// settled and answers a lost lease; the rows are right either way).
    ///
    /// The completes go in one `complete_batch` statement, each row checked
    /// against its own lease; failures and snoozes run one statement each.
    /// When that makes one statement (the usual case: completes only), it
    /// runs in autocommit, with no transaction around it.
    pub async fn settle_batch(&self, items: &[Settlement]) -> Result<Vec<Result<Settled>>> {
        self.observed_settle(items.len(), self.settle_planned(items)).await
    }

    async fn settle_planned(&self, items: &[Settlement]) -> Result<Vec<Result<Settled>>> {
        let plan = SettlePlan::new(items)?;
        if plan.statements() <= 1 {
            return settle_all(&mut self.session()?, items, &plan).await;
        }
        let mut tx = self.begin(Lane::Critical).await?;
        let out = async {
            // Several statements: take every row lock first, in id order.
            let mut ids: Vec<String> = items.iter().map(|s| s.task_id().to_owned()).collect();
            ids.sort();
            ids.dedup();
            run(&mut tx, Statement::LockTasks, vec![("ids", ids.into())]).await?;
            settle_all(&mut tx, items, &plan).await
        }
        .await;
        finish(tx, out, "settle").await
    }
}

impl<E: PgExecutor> Store<E> {
    /// Runs a settlement write inside the observer's scope, if any.
    async fn observed_settle<T>(
        &self,
        count: usize,
        write: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let scope = observe::start(self.observer(), |o| o.settle(count));
        let out = write.await;
        observe::end(scope, out.as_ref().map(|_| &()));
        out
    }
}

/// One settlement of [`Store::settle_batch`].
#[derive(Debug, Clone)]
pub enum Settlement {
    /// As [`Store::complete`].
    Complete {
        /// The task's lease.
        lease: Lease,
        /// The handler's result.
        result: Json,
    },
    /// As [`Store::fail`].
    Fail {
        /// The task's lease.
        lease: Lease,
        /// The failure.
        failure: Failure,
    },
    /// As [`Store::snooze`].
    Snooze {
        /// The task's lease.
        lease: Lease,
        /// How long until the task is due again.
        delay: std::time::Duration,
    },
}

impl Settlement {
    /// The task this settlement is for.
    pub fn task_id(&self) -> &str {
        self.lease().task_id()
    }

    /// The lease it settles.
    pub fn lease(&self) -> &Lease {
        match self {
            Settlement::Complete { lease, .. }
            | Settlement::Fail { lease, .. }
            | Settlement::Snooze { lease, .. } => lease,
        }
    }
}

/// The completes of a settlement batch (one statement for all, each row
/// checked against its own lease), checked before anything is sent; the
/// rest run one by one: failures, snoozes, and a complete of a task the
/// batch already completes under another lease (one statement cannot tell
/// the two apart in its answer, which names lost tasks by id).
struct SettlePlan {
    completes: Vec<usize>,
    singles: Vec<usize>,
}

impl SettlePlan {
    fn new(items: &[Settlement]) -> Result<Self> {
        let mut completes = Vec::new();
        let mut singles = Vec::new();
        let mut owner_of: foldhash::HashMap<&str, &str> = foldhash::HashMap::default();
        for (i, item) in items.iter().enumerate() {
            match item {
                Settlement::Complete { lease, .. } => {
                    lease.check()?;
                    match owner_of.insert(lease.task_id(), lease.worker_id()) {
                        Some(owner) if owner != lease.worker_id() => {
                            owner_of.insert(lease.task_id(), owner);
                            singles.push(i);
                        }
                        _ => completes.push(i),
                    }
                }
                Settlement::Fail { .. } | Settlement::Snooze { .. } => singles.push(i),
            }
        }
        Ok(SettlePlan { completes, singles })
    }

    fn statements(&self) -> usize {
        usize::from(!self.completes.is_empty()) + self.singles.len()
    }
}

async fn settle_all<S: PgSession + ?Sized>(
    s: &mut S,
    items: &[Settlement],
    plan: &SettlePlan,
) -> Result<Vec<Result<Settled>>> {
    let mut outcomes: Vec<Option<Result<Settled>>> = (0..items.len()).map(|_| None).collect();
    if let Some(members) = Some(&plan.completes).filter(|c| !c.is_empty()) {
        // The first settlement of an id under one lease is the one that
        // counts; a later one finds its row taken by the first and answers
        // a lost lease.
        let mut first: foldhash::HashMap<&str, usize> =
            foldhash::HashMap::with_capacity_and_hasher(members.len(), Default::default());
        let mut results = serde_json::Map::new();
        let mut ids = Vec::with_capacity(members.len());
        let mut owners = Vec::with_capacity(members.len());
        let lost_lease = |i: usize| Error::LostLease {
            task_id: items[i].task_id().to_owned(),
            worker_id: items[i].lease().worker_id().to_owned(),
        };
        for &i in members {
            let Settlement::Complete { lease, result } = &items[i] else { unreachable!("grouped completes") };
            let id = lease.task_id();
            let std::collections::hash_map::Entry::Vacant(entry) = first.entry(id) else {
                outcomes[i] = Some(Err(lost_lease(i)));
                continue;
            };
            entry.insert(i);
            if !result.is_null() {
                results.insert(id.to_owned(), result.clone());
            }
            ids.push(id.to_owned());
            owners.push(lease.worker_id().to_owned());
        }
        let binds: Binds = vec![
            ("results", Value::Jsonb(Json::Object(results))),
            ("ids", Value::TextArray(ids)),
            ("worker_ids", Value::TextArray(owners)),
        ];
        // One row, naming the exceptions: every other id succeeded.
        let mut row = run_opt(s, Statement::CompleteBatch, binds)
            .await?
            .ok_or_else(|| Error::Decode("complete_batch answered no row".to_owned()))?;
        let lost = text_array(&mut row, "lost")?;
        let canceled = text_array(&mut row, "canceled")?;
        for id in &lost {
            if let Some(&i) = first.get(id.as_str()) {
                outcomes[i] = Some(Err(lost_lease(i)));
            }
        }
        for id in canceled {
            if let Some(&i) = first.get(id.as_str()) {
                outcomes[i] = Some(Ok(Settled { id, status: TaskStatus::Canceled }));
            }
        }
        for &i in members {
            outcomes[i].get_or_insert_with(|| {
                Ok(Settled { id: items[i].task_id().to_owned(), status: TaskStatus::Succeeded })
            });
        }
    }
    for &i in &plan.singles {
        let out = match &items[i] {
            Settlement::Complete { lease, result } => complete(s, lease, result.clone()).await,
            Settlement::Fail { lease, failure } => fail(s, lease, failure).await,
            Settlement::Snooze { lease, delay } => release(s, lease, *delay).await,
        };
        // A lost lease or a bad argument answers that one settlement; any
        // other error has aborted the transaction.
        if let Err(e) = &out {
            if !e.is_lost_lease() && !matches!(e, Error::InvalidArgument(_)) {
                return Err(out.unwrap_err());
            }
        }
        outcomes[i] = Some(out.map(|t| Settled::from(&t)));
    }
    Ok(outcomes.into_iter().map(|o| o.expect("every settlement answered")).collect())
}

pub(super) async fn fail<S: PgSession + ?Sized>(s: &mut S, lease: &Lease, failure: &Failure) -> Result<Task> {
    let binds: Binds = vec![
        ("retryable", failure.retryable.into()),
        ("error", failure.error.clone().into()),
        ("delay_ms", millis("failure delay", failure.delay)?.into()),
    ];
    owned(s, Statement::Fail, binds, lease).await
}

/// The longest snooze: a delay past it would overflow the due time's
/// milliseconds in the statement, and no real "not yet" is that long.
pub const MAX_SNOOZE: std::time::Duration = std::time::Duration::from_secs(10 * 365 * 24 * 3600);

async fn release<S: PgSession + ?Sized>(
    s: &mut S,
    lease: &Lease,
    delay: std::time::Duration,
) -> Result<Task> {
    if delay > MAX_SNOOZE {
        return Err(Error::invalid(format!("a snooze of {delay:?} is longer than the most, {MAX_SNOOZE:?}")));
    }
    let binds: Binds = vec![("delay_ms", millis("snooze delay", delay)?.into())];
    owned(s, Statement::Release, binds, lease).await
}

async fn complete<S: PgSession + ?Sized>(s: &mut S, lease: &Lease, result: Json) -> Result<Task> {
    owned(s, Statement::Complete, vec![("result", result.into())], lease).await
}
