//! Reads: one task (by id or key, whole or its status), lists, counts, the
//! room in a queue, the database's clock.

use std::collections::BTreeMap;

use waymark_protocol::Statement;

use super::{task_opt, tasks, Store};
use crate::cells::{int8, status, text};
use crate::error::{Error, Result};
use crate::executor::{PgExecutor, PgSession};
use crate::options::{non_empty, ListFilter};
use crate::statements::{run, run_opt, Binds};
use crate::task::{StatusCounts, Task, TaskState, TaskStatus};

impl<E: PgExecutor> Store<E> {
    /// The task, or `None`.
    pub async fn get(&self, id: &str) -> Result<Option<Task>> {
        get(&mut self.session()?, id).await
    }

    /// [`Store::get`] inside the caller's transaction: it sees what the
    /// transaction wrote and has not committed (a task [`Store::submit_in`]
    /// made, a cancel [`Store::cancel_in`] made).
    pub async fn get_in(&self, tx: &mut E::Transaction, id: &str) -> Result<Option<Task>> {
        self.life.check()?;
        get(tx, id).await
    }

    /// The task, or [`Error::NotFound`].
    pub async fn fetch(&self, id: &str) -> Result<Task> {
        self.get(id).await?.ok_or_else(|| Error::NotFound { what: format!("task {id}") })
    }

    /// The task a key names, or `None`.
    pub async fn get_by_key(&self, key: &str) -> Result<Option<Task>> {
        get_by_key(&mut self.session()?, key).await
    }

    /// [`Store::get_by_key`] inside the caller's transaction: it sees the
    /// keys the transaction took and has not committed.
    pub async fn get_by_key_in(&self, tx: &mut E::Transaction, key: &str) -> Result<Option<Task>> {
        self.life.check()?;
        get_by_key(tx, key).await
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
}

async fn get<S: PgSession + ?Sized>(s: &mut S, id: &str) -> Result<Option<Task>> {
    task_opt(s, Statement::Get, vec![("id", id.into())]).await
}

async fn get_by_key<S: PgSession + ?Sized>(s: &mut S, key: &str) -> Result<Option<Task>> {
    task_opt(s, Statement::GetByKey, vec![("key", key.into())]).await
}
