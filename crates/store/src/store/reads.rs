//! Reads and admin: get, list, stats, queue depth, cancel, retry, purge.

use std::collections::BTreeMap;

use waymark_protocol::Statement;

use super::submit::key_target;
use super::{finish, task_opt, tasks, Store};
use crate::error::{Error, Result};
use crate::executor::{Lane, PgExecutor, PgSession};
use crate::options::{millis, non_empty, ListFilter, PurgeFilter};
use crate::statements::{run, run_opt, Binds};
use crate::task::{int8, status, text, StatusCounts, Task, TaskState, TaskStatus};

impl<E: PgExecutor> Store<E> {
    /// The task, or `None`.
    pub async fn get(&self, id: &str) -> Result<Option<Task>> {
        task_opt(&mut self.session()?, Statement::Get, vec![("id", id.into())]).await
    }

    /// The task, or [`Error::NotFound`].
    pub async fn fetch(&self, id: &str) -> Result<Task> {
        self.get(id).await?.ok_or_else(|| Error::NotFound { what: format!("task {id}") })
    }

    /// The task a key names, or `None`.
    pub async fn get_by_key(&self, key: &str) -> Result<Option<Task>> {
        task_opt(&mut self.session()?, Statement::GetByKey, vec![("key", key.into())]).await
    }

    /// The id and status of a task, or `None`: the cheap probe.
    pub async fn get_status(&self, id: &str) -> Result<Option<TaskState>> {
        let row = run_opt(&mut self.session()?, Statement::GetStatus, vec![("id", id.into())]).await?;
        row.map(TaskState::from_row).transpose()
    }

    /// The id and status of the task a key names, or `None`.
    pub async fn get_status_by_key(&self, key: &str) -> Result<Option<TaskState>> {
        let row = run_opt(&mut self.session()?, Statement::GetStatusByKey, vec![("key", key.into())]).await?;
        row.map(TaskState::from_row).transpose()
    }

    /// Tasks matching `filter`, newest first.
    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<Task>> {
        if filter.limit < 0 {
            return Err(Error::invalid(format!("list limit must not be negative, got {}", filter.limit)));
        }
        if filter.offset < 0 {
            return Err(Error::invalid(format!("list offset must not be negative, got {}", filter.offset)));
        }
        let binds: Binds = vec![
            ("status", filter.status.map(TaskStatus::as_str).into()),
            ("queue", filter.queue.as_deref().into()),
            ("name", filter.name.as_deref().into()),
            ("root_id", filter.root_id.as_deref().into()),
            ("correlation_id", filter.correlation_id.as_deref().into()),
            ("limit", filter.limit.into()),
            ("offset", filter.offset.into()),
        ];
        tasks(&mut self.session()?, Statement::List, binds).await
    }

    /// The database's clock, in epoch milliseconds: the clock that stamps
    /// every row (a waymark addition, `clock.sql`).
    pub async fn database_time_ms(&self) -> Result<i64> {
        let mut row = run_opt(&mut self.session()?, Statement::Clock, Vec::new())
            .await?
            .ok_or_else(|| Error::Internal("the clock statement answered no row".to_owned()))?;
        int8(&mut row, "now_ms")
    }

    /// Counts by queue and status, every status present (zero-filled). With
    /// `queue`, only that queue, and it is present even when empty.
    pub async fn stats(&self, queue: Option<&str>) -> Result<BTreeMap<String, StatusCounts>> {
        let rows = run(&mut self.session()?, Statement::Stats, vec![("queue", queue.into())]).await?;
        let mut out: BTreeMap<String, StatusCounts> = BTreeMap::new();
        if let Some(q) = queue {
            out.entry(q.to_owned()).or_default();
        }
        for mut row in rows {
            let q = text(&mut row, "queue")?;
            let st = status(&mut row, "status")?;
            let n = int8(&mut row, "count")?;
            out.entry(q).or_default().add(st, n);
        }
        Ok(out)
    }

    /// Room left in `queue` under `max_depth` queued tasks (never negative).
    pub async fn queue_depth(&self, queue: &str, max_depth: i64) -> Result<i64> {
        non_empty("queue", queue)?;
        if max_depth < 0 {
            return Err(Error::invalid(format!("max_depth must not be negative, got {max_depth}")));
        }
        let row = run_opt(
            &mut self.session()?,
            Statement::QueueDepth,
            vec![("max_depth", max_depth.into()), ("queue", queue.into())],
        )
        .await?;
        match row {
            Some(mut row) => int8(&mut row, "headroom"),
            None => Ok(max_depth),
        }
    }

    // ----- cancel, retry, purge -----

    /// Cancels a queued task at once, or asks a running one to stop. `None`
    /// when the task is missing or already finished.
    pub async fn cancel(&self, id: &str) -> Result<Option<Task>> {
        cancel(&mut self.session()?, id).await
    }

    /// Cancels the task a key names (see [`Store::cancel`]).
    pub async fn cancel_by_key(&self, key: &str) -> Result<Option<Task>> {
        non_empty("key", key)?;
        let mut tx = self.begin(Lane::Ordinary).await?;
        let out = async {
            match key_target(&mut tx, key).await? {
                Some(id) => cancel(&mut tx, &id).await,
                None => Ok(None),
            }
        }
        .await;
        finish(tx, out, "cancel_by_key").await
    }

    /// Puts a failed or canceled task back in the queue, due now. `None` when
    /// the task is missing or in another status.
    pub async fn retry(&self, id: &str, reset_attempt: bool) -> Result<Option<Task>> {
        retry(&mut self.session()?, id, reset_attempt).await
    }

    /// Retries the task a key names (see [`Store::retry`]).
    pub async fn retry_by_key(&self, key: &str, reset_attempt: bool) -> Result<Option<Task>> {
        non_empty("key", key)?;
        let mut tx = self.begin(Lane::Ordinary).await?;
        let out = async {
            match key_target(&mut tx, key).await? {
                Some(id) => retry(&mut tx, &id, reset_attempt).await,
                None => Ok(None),
            }
        }
        .await;
        finish(tx, out, "retry_by_key").await
    }

    /// Deletes up to `filter.limit` terminal tasks completed before the
    /// cutoff, oldest first, and returns their ids. Their keys go with them.
    pub async fn purge(&self, filter: &PurgeFilter) -> Result<Vec<String>> {
        let older_than_ms = millis("purge older_than", filter.older_than)?;
        if filter.limit < 1 {
            return Err(Error::invalid(format!("purge limit must be at least 1, got {}", filter.limit)));
        }
        if let Some(st) = filter.status.filter(|st| !st.is_terminal()) {
            return Err(Error::invalid(format!(
                "purge status must be succeeded, failed or canceled, got {st}"
            )));
        }
        let binds: Binds = vec![
            ("queue", filter.queue.as_deref().into()),
            ("status", filter.status.map(TaskStatus::as_str).into()),
            ("name", filter.name.as_deref().into()),
            ("older_than_ms", older_than_ms.into()),
            ("limit", filter.limit.into()),
        ];
        run(&mut self.session()?, Statement::Purge, binds)
            .await?
            .into_iter()
            .map(|mut row| text(&mut row, "id"))
            .collect()
    }

    /// How many tasks [`Store::purge`] would delete with `filter`, however
    /// many batches that takes (`filter.limit` is not read): a count to show
    /// before deleting (a waymark addition, `purge_count.sql`).
    pub async fn purge_count(&self, filter: &PurgeFilter) -> Result<i64> {
        let older_than_ms = millis("purge older_than", filter.older_than)?;
        if let Some(st) = filter.status.filter(|st| !st.is_terminal()) {
            return Err(Error::invalid(format!(
                "purge status must be succeeded, failed or canceled, got {st}"
            )));
        }
        let binds: Binds = vec![
            ("queue", filter.queue.as_deref().into()),
            ("status", filter.status.map(TaskStatus::as_str).into()),
            ("name", filter.name.as_deref().into()),
            ("older_than_ms", older_than_ms.into()),
        ];
        let mut row = run_opt(&mut self.session()?, Statement::PurgeCount, binds)
            .await?
            .ok_or_else(|| Error::Internal("the purge count answered no row".to_owned()))?;
        int8(&mut row, "count")
    }
}

pub(super) async fn cancel<S: PgSession + ?Sized>(s: &mut S, id: &str) -> Result<Option<Task>> {
    task_opt(s, Statement::Cancel, vec![("id", id.into())]).await
}

async fn retry<S: PgSession + ?Sized>(s: &mut S, id: &str, reset_attempt: bool) -> Result<Option<Task>> {
    task_opt(s, Statement::Retry, vec![("reset_attempt", reset_attempt.into()), ("id", id.into())]).await
}
