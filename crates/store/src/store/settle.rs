//! Settlement: complete, fail and release, one by one or in a batch
//! (the bodies of `WorkerProtocol`'s settlements; see its docs).

use serde_json::Value as Json;
use waymark_protocol::Statement;

use super::{finish, held, owned, Store};
use crate::cells::text_array;
use crate::error::{Error, Result};
use crate::executor::{Lane, PgExecutor, PgSession};
use crate::lease::Lease;
use crate::observe;
use crate::options::{millis, Failure};
use crate::statements::{run, run_opt, Binds};
use crate::task::{Settled, Task, TaskStatus};
use crate::value::Value;
use crate::worker_protocol::{Settlement, MAX_SNOOZE};

/// `WorkerProtocol::succeed`.
pub(super) async fn succeed<E: PgExecutor>(
    store: &Store<E>,
    lease: &Lease,
    result: Json,
    message: Option<&str>,
) -> Result<Task> {
    store.observed_settle(1, settle_single(store, One::Succeed(lease, result, message))).await
}

/// `WorkerProtocol::complete`.
pub(super) async fn complete<E: PgExecutor>(store: &Store<E>, lease: &Lease, result: Json) -> Result<Task> {
    let item = Settlement::Complete { lease: lease.clone(), result };
    store.observed_settle(1, settle_single(store, One::Settle(&item))).await
}

/// `WorkerProtocol::complete_in`.
pub(super) async fn complete_in<E: PgExecutor>(
    store: &Store<E>,
    tx: &mut E::Transaction,
    lease: &Lease,
    result: Json,
) -> Result<Task> {
    store
        .observed_settle(1, async {
            store.life.check()?;
            let task = complete_owned(tx, lease, result).await?;
            pass_on(tx, lease, &task).await?;
            Ok(task)
        })
        .await
}

/// `WorkerProtocol::fail`.
pub(super) async fn fail<E: PgExecutor>(store: &Store<E>, lease: &Lease, failure: &Failure) -> Result<Task> {
    let item = Settlement::Fail { lease: lease.clone(), failure: failure.clone() };
    store.observed_settle(1, settle_single(store, One::Settle(&item))).await
}

/// `WorkerProtocol::release`.
pub(super) async fn release<E: PgExecutor>(store: &Store<E>, lease: &Lease) -> Result<Task> {
    let item = Settlement::Snooze { lease: lease.clone(), delay: std::time::Duration::ZERO };
    settle_single(store, One::Settle(&item)).await
}

/// `WorkerProtocol::snooze`.
pub(super) async fn snooze<E: PgExecutor>(
    store: &Store<E>,
    lease: &Lease,
    delay: std::time::Duration,
) -> Result<Task> {
    let item = Settlement::Snooze { lease: lease.clone(), delay };
    store.observed_settle(1, settle_single(store, One::Settle(&item))).await
}

/// `WorkerProtocol::settle`.
pub(super) async fn settle<E: PgExecutor>(store: &Store<E>, settlement: &Settlement) -> Result<Task> {
    store.observed_settle(1, settle_single(store, One::Settle(settlement))).await
}

/// One owned write of a settlement.
enum One<'a> {
    Settle(&'a Settlement),
    Succeed(&'a Lease, Json, Option<&'a str>),
}

impl One<'_> {
    fn lease(&self) -> &Lease {
        match self {
            One::Settle(item) => item.lease(),
            One::Succeed(lease, ..) => lease,
        }
    }

    async fn write<S: PgSession + ?Sized>(self, s: &mut S) -> Result<Task> {
        match self {
            One::Settle(item) => write_one(s, item).await,
            One::Succeed(lease, result, message) => {
                let binds: Binds = vec![("result", result.into()), ("message", message.into())];
                owned(s, Statement::Succeed, binds, lease).await
            }
        }
    }
}

/// One settlement, in autocommit; a task released from the held ledger
/// settles in a transaction that passes its end on (see [`pass_on`]).
async fn settle_single<E: PgExecutor>(store: &Store<E>, one: One<'_>) -> Result<Task> {
    if !one.lease().is_from_held() {
        return one.write(&mut store.session()?).await;
    }
    let lease = one.lease().clone();
    let mut tx = store.begin(Lane::Critical).await?;
    let out = async {
        let task = one.write(&mut tx).await?;
        pass_on(&mut tx, &lease, &task).await?;
        Ok(task)
    }
    .await;
    finish(tx, out, "settle").await
}

/// A task released from the held ledger that this settlement ended: the
/// ledger passes its end on (releases what waited for its success,
/// cancels what depended on it) in the settlement's transaction.
async fn pass_on<S: PgSession + ?Sized>(s: &mut S, lease: &Lease, task: &Task) -> Result<()> {
    if lease.is_from_held() && task.status.is_terminal() {
        held::settled(s, vec![task.id.clone()]).await?;
    }
    Ok(())
}

/// `WorkerProtocol::settle_batch`.
pub(super) async fn settle_batch<E: PgExecutor>(
    store: &Store<E>,
    items: &[Settlement],
) -> Result<Vec<Result<Settled>>> {
    store.observed_settle(items.len(), store.settle_planned(items)).await
}

impl<E: PgExecutor> Store<E> {
    async fn settle_planned(&self, items: &[Settlement]) -> Result<Vec<Result<Settled>>> {
        let plan = SettlePlan::new(items)?;
        let from_held = items.iter().any(|item| item.lease().is_from_held());
        if plan.statements() <= 1 && !from_held {
            return settle_all(&mut self.session()?, items, &plan).await;
        }
        let mut tx = self.begin(Lane::Critical).await?;
        let out = async {
            // Several statements: take every row lock first, in id order.
            let mut ids: Vec<String> = items.iter().map(|s| s.task_id().to_owned()).collect();
            ids.sort();
            ids.dedup();
            run(&mut tx, Statement::LockTasks, vec![("ids", ids.into())]).await?;
            let outcomes = settle_all(&mut tx, items, &plan).await?;
            let ended: Vec<String> = items
                .iter()
                .zip(&outcomes)
                .filter_map(|(item, out)| match out {
                    Ok(settled) if item.lease().is_from_held() && settled.status.is_terminal() => {
                        Some(settled.id.clone())
                    }
                    _ => None,
                })
                .collect();
            if !ended.is_empty() {
                held::settled(&mut tx, ended).await?;
            }
            Ok(outcomes)
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
        observe::within(observe::start(self.observer(), |o| o.settle(count)), write).await
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
                    // The first lease named for a task owns its place in
                    // the statement; another lease of it goes on its own.
                    let owner = *owner_of.entry(lease.task_id()).or_insert(lease.worker_id());
                    if owner == lease.worker_id() {
                        completes.push(i);
                    } else {
                        singles.push(i);
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
        let out = write_one(s, &items[i]).await;
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

async fn write_one<S: PgSession + ?Sized>(s: &mut S, item: &Settlement) -> Result<Task> {
    match item {
        Settlement::Complete { lease, result } => complete_owned(s, lease, result.clone()).await,
        Settlement::Fail { lease, failure } => fail_owned(s, lease, failure).await,
        Settlement::Snooze { lease, delay } => release_owned(s, lease, *delay).await,
    }
}

pub(super) async fn fail_owned<S: PgSession + ?Sized>(
    s: &mut S,
    lease: &Lease,
    failure: &Failure,
) -> Result<Task> {
    let binds: Binds = vec![
        ("retryable", failure.retryable.into()),
        ("error", failure.error.clone().into()),
        ("delay_ms", millis("failure delay", failure.delay)?.into()),
    ];
    owned(s, Statement::Fail, binds, lease).await
}

async fn release_owned<S: PgSession + ?Sized>(
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

async fn complete_owned<S: PgSession + ?Sized>(s: &mut S, lease: &Lease, result: Json) -> Result<Task> {
    owned(s, Statement::Complete, vec![("result", result.into())], lease).await
}
