//! Acting on tasks an application or an operator names: cancel, retry
//! (each by id or by key) and purge, in autocommit or, as `*_in`, inside
//! the caller's transaction.
//!
//! A keyed form takes the key's advisory lock first; in autocommit it runs
//! in a transaction of its own, bounded by the store's lock timeout, and
//! inside the caller's transaction it holds the lock until the caller ends
//! it, under that transaction's own lock timeout.

use waymark_protocol::Statement;

use super::submit::key_target;
use super::{finish, task_opt, Store};
use crate::cells::{int8, text};
use crate::error::{Error, Result};
use crate::executor::{Lane, PgExecutor, PgSession};
use crate::options::{millis, non_empty, PurgeFilter};
use crate::statements::{run, run_opt, Binds};
use crate::task::{Task, TaskStatus};

impl<E: PgExecutor> Store<E> {
    /// Cancels a queued task at once, or asks a running one to stop. `None`
    /// when the task is missing or already finished.
    pub async fn cancel(&self, id: &str) -> Result<Option<Task>> {
        cancel(&mut self.session()?, id).await
    }

    /// [`Store::cancel`] inside the caller's transaction: the cancel
    /// commits with the caller's other writes, or neither does.
    pub async fn cancel_in(&self, tx: &mut E::Transaction, id: &str) -> Result<Option<Task>> {
        self.life.check()?;
        cancel(tx, id).await
    }

    /// Cancels the task a key names (see [`Store::cancel`]).
    pub async fn cancel_by_key(&self, key: &str) -> Result<Option<Task>> {
        non_empty("key", key)?;
        let mut tx = self.begin(Lane::Ordinary).await?;
        let out = cancel_by_key(&mut tx, key).await;
        finish(tx, out, "cancel_by_key").await
    }

    /// [`Store::cancel_by_key`] inside the caller's transaction, which
    /// holds the key's lock until it ends.
    pub async fn cancel_by_key_in(&self, tx: &mut E::Transaction, key: &str) -> Result<Option<Task>> {
        non_empty("key", key)?;
        self.life.check()?;
        cancel_by_key(tx, key).await
    }

    /// Puts a failed or canceled task back in the queue, due now. `None` when
    /// the task is missing or in another status.
    pub async fn retry(&self, id: &str, reset_attempt: bool) -> Result<Option<Task>> {
        retry(&mut self.session()?, id, reset_attempt).await
    }

    /// [`Store::retry`] inside the caller's transaction: the task is queued
    /// again only if the caller commits.
    pub async fn retry_in(
        &self,
        tx: &mut E::Transaction,
        id: &str,
        reset_attempt: bool,
    ) -> Result<Option<Task>> {
        self.life.check()?;
        retry(tx, id, reset_attempt).await
    }

    /// Retries the task a key names (see [`Store::retry`]).
    pub async fn retry_by_key(&self, key: &str, reset_attempt: bool) -> Result<Option<Task>> {
        non_empty("key", key)?;
        let mut tx = self.begin(Lane::Ordinary).await?;
        let out = retry_by_key(&mut tx, key, reset_attempt).await;
        finish(tx, out, "retry_by_key").await
    }

    /// [`Store::retry_by_key`] inside the caller's transaction, which holds
    /// the key's lock until it ends.
    pub async fn retry_by_key_in(
        &self,
        tx: &mut E::Transaction,
        key: &str,
        reset_attempt: bool,
    ) -> Result<Option<Task>> {
        non_empty("key", key)?;
        self.life.check()?;
        retry_by_key(tx, key, reset_attempt).await
    }

    /// Deletes up to `filter.limit` terminal tasks completed before the
    /// cutoff, oldest first, and returns their ids. Their keys go with them.
    pub async fn purge(&self, filter: &PurgeFilter) -> Result<Vec<String>> {
        let binds = purge_binds(filter)?;
        purge(&mut self.session()?, binds).await
    }

    /// [`Store::purge`] inside the caller's transaction: the tasks are
    /// gone only if the caller commits (their rows stay locked until then,
    /// and a concurrent purge skips them).
    pub async fn purge_in(&self, tx: &mut E::Transaction, filter: &PurgeFilter) -> Result<Vec<String>> {
        let binds = purge_binds(filter)?;
        self.life.check()?;
        purge(tx, binds).await
    }

    /// How many tasks [`Store::purge`] would delete with `filter`, however
    /// many batches that takes (`filter.limit` is not read): a count to show
    /// before deleting (a waymark addition, `purge_count.sql`).
    pub async fn purge_count(&self, filter: &PurgeFilter) -> Result<i64> {
        let binds = purge_scope(filter)?;
        let mut row = run_opt(&mut self.session()?, Statement::PurgeCount, binds)
            .await?
            .ok_or_else(|| Error::Internal("the purge count answered no row".to_owned()))?;
        int8(&mut row, "count")
    }
}

pub(super) async fn cancel<S: PgSession + ?Sized>(s: &mut S, id: &str) -> Result<Option<Task>> {
    task_opt(s, Statement::Cancel, vec![("id", id.into())]).await
}

async fn cancel_by_key<S: PgSession + ?Sized>(s: &mut S, key: &str) -> Result<Option<Task>> {
    match key_target(s, key).await? {
        Some(id) => cancel(s, &id).await,
        None => Ok(None),
    }
}

async fn retry<S: PgSession + ?Sized>(s: &mut S, id: &str, reset_attempt: bool) -> Result<Option<Task>> {
    task_opt(s, Statement::Retry, vec![("reset_attempt", reset_attempt.into()), ("id", id.into())]).await
}

async fn retry_by_key<S: PgSession + ?Sized>(
    s: &mut S,
    key: &str,
    reset_attempt: bool,
) -> Result<Option<Task>> {
    match key_target(s, key).await? {
        Some(id) => retry(s, &id, reset_attempt).await,
        None => Ok(None),
    }
}

/// The binds of which tasks a purge takes (all but its limit), its filter
/// checked (a status must be terminal).
fn purge_scope(filter: &PurgeFilter) -> Result<Binds> {
    let older_than_ms = millis("purge older_than", filter.older_than)?;
    if let Some(st) = filter.status.filter(|st| !st.is_terminal()) {
        return Err(Error::invalid(format!("purge status must be succeeded, failed or canceled, got {st}")));
    }
    Ok(vec![
        ("queue", filter.queue.as_deref().into()),
        ("status", filter.status.map(TaskStatus::as_str).into()),
        ("name", filter.name.as_deref().into()),
        ("older_than_ms", older_than_ms.into()),
    ])
}

/// A purge's binds, its filter checked before any I/O.
fn purge_binds(filter: &PurgeFilter) -> Result<Binds> {
    if filter.limit < 1 {
        millis("purge older_than", filter.older_than)?;
        return Err(Error::invalid(format!("purge limit must be at least 1, got {}", filter.limit)));
    }
    let mut binds = purge_scope(filter)?;
    binds.push(("limit", filter.limit.into()));
    Ok(binds)
}

async fn purge<S: PgSession + ?Sized>(s: &mut S, binds: Binds) -> Result<Vec<String>> {
    run(s, Statement::Purge, binds).await?.into_iter().map(|mut row| text(&mut row, "id")).collect()
}
