//! [`Store`]: every queue operation of protocol v1.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value as Json;
use waymark_protocol::Statement;

use crate::error::{Error, Result};
use crate::executor::{Autocommit, Lane, PgExecutor, PgSession, PgTransaction};
use crate::id::new_task_id;
use crate::migrate::{self, MigrationReport, MigrationState, MigrationTimeouts};
use crate::options::{non_empty, ClaimRequest, Conflict, Failure, ListFilter, NewTask, PurgeFilter};
use crate::signals::Signals;
use crate::statements::{run, run_opt, Binds};
use crate::task::{
    int8, opt_int8, opt_text, status, text, Beat, ErrorEnvelope, Settled, StatusCounts, Task, TaskState,
    TaskStatus,
};
use crate::value::Value;

/// How [`Store::connect`] prepares the database.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectOptions {
    /// The schema the installation lives in. The executor must set
    /// `search_path` to it on every connection; the schema guard checks that
    /// it did. Defaults to none (the connection's current schema).
    pub schema: Option<String>,
    /// Skip migrating (the schema guard and version check still run).
    /// Defaults to false.
    pub skip_migrate: bool,
}

impl ConnectOptions {
    /// Options for an installation in `schema`.
    pub fn schema(schema: impl Into<String>) -> Self {
        ConnectOptions { schema: Some(schema.into()), skip_migrate: false }
    }
}

/// The queue, over any [`PgExecutor`].
///
/// Each operation runs in autocommit on the executor; the `*_in` forms run
/// inside a transaction the caller opened with [`PgExecutor::begin`], so a
/// submit commits with the caller's own writes, and so does a settlement.
#[derive(Debug, Clone)]
pub struct Store<E> {
    exec: E,
    lock_timeout: String,
    migration_timeouts: MigrationTimeouts,
    pub(crate) signals: Arc<Signals>,
}

/// The default bound on a migration's wait for its locks.
pub const DEFAULT_MIGRATION_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// The default bound on one statement of a migration.
pub const DEFAULT_MIGRATION_STATEMENT_TIMEOUT: Duration = Duration::from_secs(300);

/// The default bound on a lock wait inside a store transaction.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

impl<E: PgExecutor> Store<E> {
    /// A store over `exec`. No I/O: call [`Store::connect`] (or
    /// [`Store::migrate`]) before first use on a new database.
    pub fn new(exec: E) -> Self {
        Store {
            exec,
            lock_timeout: format_ms(DEFAULT_LOCK_TIMEOUT),
            migration_timeouts: MigrationTimeouts {
                lock: format_ms(DEFAULT_MIGRATION_LOCK_TIMEOUT),
                statement: format_ms(DEFAULT_MIGRATION_STATEMENT_TIMEOUT),
            },
            signals: Arc::default(),
        }
    }

    /// Bounds each migration: how long it may wait for the ledger lock (or
    /// a lock on a table it alters), and how long one of its statements may
    /// run. Past either, `migrate` fails with [`Error::MigrationTimeout`]
    /// naming the migration, and commits nothing of it. Default 30 s and
    /// 5 min. Both are transaction-local.
    pub fn with_migration_timeouts(mut self, lock_wait: Duration, statement: Duration) -> Self {
        self.migration_timeouts = MigrationTimeouts {
            lock: format_ms(lock_wait.max(Duration::from_millis(1))),
            statement: format_ms(statement.max(Duration::from_millis(1))),
        };
        self
    }

    /// Bounds each lock wait inside the store's transactions (a keyed
    /// submit's key lock, a claim, a keyed cancel or retry): past it the
    /// operation fails with [`Error::LockTimeout`] and commits nothing.
    /// Defaults to 5 s. Set per transaction, so it never leaks to other users
    /// of a connection.
    pub fn with_lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = format_ms(timeout.max(Duration::from_millis(1)));
        self
    }

    /// Opens a transaction in `lane` with the lock timeout set.
    async fn begin(&self, lane: Lane) -> Result<E::Transaction> {
        let mut tx = self.exec.begin_in_lane(lane).await?;
        if let Err(e) =
            run(&mut tx, Statement::SetLockTimeout, vec![("lock_timeout", self.lock_timeout.as_str().into())])
                .await
        {
            let _ = tx.rollback().await;
            return Err(e);
        }
        Ok(tx)
    }

    /// Runs the connect sequence of protocol v1 and returns the store:
    /// create the schema if one is asked for, the schema guard, migrations,
    /// then the protocol version check.
    pub async fn connect(exec: E, options: ConnectOptions) -> Result<Self> {
        let store = Store::new(exec);
        store.prepare(&options).await?;
        // Step 5, LISTEN, starts with each channel's first user: the first
        // watch (`cairnq_queued`), the first wait (`cairnq_done`).
        Ok(store)
    }

    /// The connect sequence on an existing store (see [`Store::connect`]),
    /// reporting which migrations it applied.
    pub async fn prepare(&self, options: &ConnectOptions) -> Result<MigrationReport> {
        if let Some(schema) = &options.schema {
            migrate::create_schema(&self.exec, schema).await?;
        }
        migrate::guard_schema(&self.exec, options.schema.as_deref()).await?;
        let report = if options.skip_migrate {
            MigrationReport::default()
        } else {
            migrate::migrate(&self.exec, &self.migration_timeouts).await?
        };
        migrate::check_protocol_version(&self.exec).await?;
        Ok(report)
    }

    /// The executor.
    pub fn executor(&self) -> &E {
        &self.exec
    }

    /// Applies pending migrations (see the ledger rules in PROTOCOL-V1).
    pub async fn migrate(&self) -> Result<MigrationReport> {
        migrate::migrate(&self.exec, &self.migration_timeouts).await
    }

    /// Each embedded migration and whether it is applied; changes nothing.
    pub async fn migration_status(&self) -> Result<Vec<MigrationState>> {
        migrate::status(&self.exec).await
    }

    /// Checks that the installation speaks protocol v1.
    pub async fn check_protocol_version(&self) -> Result<()> {
        migrate::check_protocol_version(&self.exec).await
    }

    // ----- submit -----

    /// Submits a task. With a key, the whole decision (reuse, reject, replace)
    /// happens in one transaction under the key's advisory lock.
    pub async fn submit(&self, task: NewTask) -> Result<Task> {
        task.validate()?;
        if task.key.is_none() {
            let id = new_task_id();
            return match insert(&mut Autocommit(&self.exec), &task, &id).await {
                // The executor resent an insert whose first run committed
                // (the connection was lost before the answer): the id is ours,
                // so the row there is this submit's task, not a second one.
                Err(e) if e.sqlstate() == Some("23505") => self.fetch(&id).await,
                other => other,
            };
        }
        let mut tx = self.begin(Lane::Ordinary).await?;
        let out = submit_keyed(&mut tx, &task).await;
        finish(tx, out, "submit").await
    }

    /// Submits many tasks in one statement and one commit, and returns
    /// their ids in the order given (read a task back with [`Store::get`]).
    /// Keyed tasks are refused (each key needs its own lock and check:
    /// submit those one by one). At most 10,000 tasks per call.
    ///
    /// The tasks are taken by value: their payloads and names move into the
    /// statement's arrays instead of being copied (a batch of small tasks
    /// spends most of its client time on copies).
    pub async fn submit_batch(&self, tasks: impl IntoIterator<Item = NewTask>) -> Result<Vec<String>> {
        let batch = Batch::new(tasks)?;
        if batch.ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = batch.ids.clone();
        match insert_batch(&mut Autocommit(&self.exec), batch).await {
            Ok(()) => Ok(ids),
            // Resent after its commit (see `submit`): the ids are ours and
            // the insert is one statement, so if one row is there, all are.
            Err(e) if e.sqlstate() == Some("23505") => {
                self.fetch(&ids[0]).await?;
                Ok(ids)
            }
            Err(e) => Err(e),
        }
    }

    /// [`Store::submit_batch`] inside the caller's transaction.
    pub async fn submit_batch_in(
        &self,
        tx: &mut E::Transaction,
        tasks: impl IntoIterator<Item = NewTask>,
    ) -> Result<Vec<String>> {
        let batch = Batch::new(tasks)?;
        if batch.ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = batch.ids.clone();
        insert_batch(tx, batch).await?;
        Ok(ids)
    }

    /// Submits a task inside the caller's transaction: it exists only if the
    /// caller commits.
    pub async fn submit_in(&self, tx: &mut E::Transaction, task: NewTask) -> Result<Task> {
        task.validate()?;
        if task.key.is_none() {
            insert(tx, &task, &new_task_id()).await
        } else {
            submit_keyed(tx, &task).await
        }
    }

    // ----- reads -----

    /// The task, or `None`.
    pub async fn get(&self, id: &str) -> Result<Option<Task>> {
        task_opt(&mut Autocommit(&self.exec), Statement::Get, vec![("id", id.into())]).await
    }

    /// The task, or [`Error::NotFound`].
    pub async fn fetch(&self, id: &str) -> Result<Task> {
        self.get(id).await?.ok_or_else(|| Error::NotFound { what: format!("task {id}") })
    }

    /// The task a key names, or `None`.
    pub async fn get_by_key(&self, key: &str) -> Result<Option<Task>> {
        task_opt(&mut Autocommit(&self.exec), Statement::GetByKey, vec![("key", key.into())]).await
    }

    /// The id and status of a task, or `None`: the cheap probe.
    pub async fn get_status(&self, id: &str) -> Result<Option<TaskState>> {
        let row = run_opt(&mut Autocommit(&self.exec), Statement::GetStatus, vec![("id", id.into())]).await?;
        row.map(TaskState::from_row).transpose()
    }

    /// The id and status of the task a key names, or `None`.
    pub async fn get_status_by_key(&self, key: &str) -> Result<Option<TaskState>> {
        let row = run_opt(&mut Autocommit(&self.exec), Statement::GetStatusByKey, vec![("key", key.into())])
            .await?;
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
        tasks(&mut Autocommit(&self.exec), Statement::List, binds).await
    }

    /// Counts by queue and status, every status present (zero-filled). With
    /// `queue`, only that queue, and it is present even when empty.
    pub async fn stats(&self, queue: Option<&str>) -> Result<BTreeMap<String, StatusCounts>> {
        let rows = run(&mut Autocommit(&self.exec), Statement::Stats, vec![("queue", queue.into())]).await?;
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
            &mut Autocommit(&self.exec),
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
        cancel(&mut Autocommit(&self.exec), id).await
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
        retry(&mut Autocommit(&self.exec), id, reset_attempt).await
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
        if filter.older_than_ms < 0 {
            return Err(Error::invalid(format!(
                "purge older_than_ms must not be negative, got {}",
                filter.older_than_ms
            )));
        }
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
            ("older_than_ms", filter.older_than_ms.into()),
            ("limit", filter.limit.into()),
        ];
        run(&mut Autocommit(&self.exec), Statement::Purge, binds)
            .await?
            .into_iter()
            .map(|mut row| text(&mut row, "id"))
            .collect()
    }

    // ----- the worker's side -----

    /// One claim pass: a cheap probe outside any transaction; if it finds an
    /// expired lease, one transaction that recovers expired leases and then
    /// claims (so the pass that recovers a task has the first pick of it);
    /// if it finds only due work, the claim statement alone in autocommit,
    /// which skips locked rows and so never waits on a lock. With
    /// [`ClaimRequest::probe`] off, the pass is that claim statement alone.
    /// Rows come back in no particular order.
    ///
    /// A claimed task whose payload or metadata cannot be read
    /// ([`Task::input_unreadable`]) is never handed out: it fails for good,
    /// and the pass claims again in its place (up to `limit` more such rows,
    /// within a quarter of the lease), so a short answer means the queues
    /// ran dry, short of a run of unreadable rows longer than that.
    pub async fn claim(&self, req: &ClaimRequest) -> Result<Vec<Task>> {
        non_empty("worker_id", &req.worker_id)?;
        if req.lease_ms < 1 {
            return Err(Error::invalid(format!("lease_ms must be at least 1, got {}", req.lease_ms)));
        }
        if req.limit <= 0 || req.queues.is_empty() || req.names.as_ref().is_some_and(Vec::is_empty) {
            return Ok(Vec::new());
        }
        let started = std::time::Instant::now();
        let mut claimed = self.claim_pass(req).await?;
        let (mut readable, mut failed) = self.fail_unreadable(claimed, &req.worker_id).await;
        // Claim again in place of what was failed, while the leases already
        // taken are young (nobody renews them until this returns): at most
        // `limit` more unreadable rows, within a quarter of the lease. A
        // failure that did not land is not replaced.
        let budget = Duration::from_millis(u64::try_from(req.lease_ms / 4).unwrap_or(0));
        let mut refilled = 0i64;
        while failed > 0
            && readable.len() < usize::try_from(req.limit).unwrap_or(usize::MAX)
            && refilled < req.limit
            && started.elapsed() < budget
        {
            let want = req.limit - i64::try_from(readable.len()).unwrap_or(req.limit);
            let want = want.min(i64::try_from(failed).unwrap_or(i64::MAX)).min(req.limit - refilled);
            refilled += want;
            let refill = ClaimRequest { limit: want, probe: false, ..req.clone() };
            claimed = match claim_draw(&mut Autocommit(&self.exec), &refill).await {
                Ok(more) => more,
                // The tasks already claimed are this caller's now: hand them
                // out rather than strand them until their leases expire.
                Err(e) => {
                    tracing::warn!(error = %e, "claiming in place of unreadable tasks failed");
                    break;
                }
            };
            let (more, more_failed) = self.fail_unreadable(claimed, &req.worker_id).await;
            readable.extend(more);
            failed = more_failed;
        }
        Ok(readable)
    }

    async fn claim_pass(&self, req: &ClaimRequest) -> Result<Vec<Task>> {
        if req.probe {
            let binds: Binds =
                vec![("queues", req.queues.clone().into()), ("names", req.names.clone().into())];
            let (due, expired) =
                match run_opt(&mut Autocommit(&self.exec), Statement::ClaimableProbe, binds).await? {
                    Some(mut row) => (
                        crate::task::opt_bool(&mut row, "due")?.unwrap_or(false),
                        crate::task::opt_bool(&mut row, "expired")?.unwrap_or(false),
                    ),
                    None => (false, false),
                };
            if expired {
                let mut tx = self.begin(Lane::Ordinary).await?;
                let out = async {
                    recover_leases(&mut tx).await?;
                    claim_draw(&mut tx, req).await
                }
                .await;
                return finish(tx, out, "claim").await;
            }
            if !due {
                return Ok(Vec::new());
            }
        }
        claim_draw(&mut Autocommit(&self.exec), req).await
    }

    /// Fails for good each claimed task whose input cannot be read (no
    /// handler could see its payload as written), with an envelope naming
    /// the column. Returns the rest and how many were failed. If that write
    /// fails too, the task is left to its lease, which expires and brings it
    /// back here; it is not counted, so the caller does not claim again.
    async fn fail_unreadable(&self, claimed: Vec<Task>, worker_id: &str) -> (Vec<Task>, usize) {
        if !claimed.iter().any(Task::input_unreadable) {
            return (claimed, 0);
        }
        let mut readable = Vec::with_capacity(claimed.len());
        let mut failed = 0;
        for task in claimed {
            if !task.input_unreadable() {
                readable.push(task);
                continue;
            }
            let why = task.unreadable.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
            let envelope = ErrorEnvelope {
                details: serde_json::json!({ "unreadable": task.unreadable }),
                ..ErrorEnvelope::new(
                    "UnreadableTask",
                    crate::task::codes::TASK_ERROR,
                    format!("waymark cannot read this task's row: {why}"),
                    false,
                )
            };
            let failure = Failure::new(envelope.to_json()).retryable(false).on_attempt(task.attempt);
            tracing::warn!(task = %task.id, reason = %why, "claimed a task whose input cannot be read; failing it");
            match fail(&mut Autocommit(&self.exec), &task.id, worker_id, &failure).await {
                Ok(_) => failed += 1,
                Err(e) => {
                    tracing::warn!(task = %task.id, error = %e, "failing an unreadable task failed; its lease will expire");
                }
            }
        }
        (readable, failed)
    }

    /// Extends a lease; [`Error::LostLease`] if the worker no longer holds it.
    pub async fn heartbeat(&self, id: &str, worker_id: &str, lease_ms: i64) -> Result<Task> {
        positive_lease(lease_ms)?;
        let binds: Binds = vec![("lease_ms", lease_ms.into())];
        owned(&mut Autocommit(&self.exec), Statement::Heartbeat, binds, id, worker_id).await
    }

    /// Extends every lease in `ids` at once. Returns the tasks still owned,
    /// in the order of `ids`; a missing id is a lost lease.
    pub async fn heartbeat_batch(&self, ids: &[String], worker_id: &str, lease_ms: i64) -> Result<Vec<Beat>> {
        non_empty("worker_id", worker_id)?;
        positive_lease(lease_ms)?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let binds: Binds = vec![
            ("lease_ms", lease_ms.into()),
            ("ids", ids.to_vec().into()),
            ("worker_id", worker_id.into()),
        ];
        let mut beats: Vec<Beat> = run(&mut Autocommit(&self.exec), Statement::HeartbeatBatch, binds)
            .await?
            .into_iter()
            .map(|mut row| {
                Ok(Beat {
                    id: text(&mut row, "id")?,
                    cancel_requested_at_ms: opt_int8(&mut row, "cancel_requested_at_ms")?,
                })
            })
            .collect::<Result<_>>()?;
        let position: std::collections::HashMap<&str, usize> =
            ids.iter().enumerate().map(|(i, id)| (id.as_str(), i)).collect();
        beats.sort_by_key(|b| position.get(b.id.as_str()).copied());
        Ok(beats)
    }

    /// Records progress (`[0, 1]`) and/or a message; `None` keeps a field.
    pub async fn progress(
        &self,
        id: &str,
        worker_id: &str,
        progress: Option<f64>,
        message: Option<&str>,
    ) -> Result<Task> {
        if let Some(p) = progress.filter(|p| !(0.0..=1.0).contains(p)) {
            return Err(Error::invalid(format!("progress must be within [0, 1], got {p}")));
        }
        let binds: Binds = vec![("progress", progress.into()), ("message", message.into())];
        owned(&mut Autocommit(&self.exec), Statement::Progress, binds, id, worker_id).await
    }

    /// Marks an owned task succeeded with `result` (a requested cancel does
    /// not win here; workers settle with [`Store::complete`]).
    pub async fn succeed(
        &self,
        id: &str,
        worker_id: &str,
        result: Json,
        message: Option<&str>,
    ) -> Result<Task> {
        let binds: Binds = vec![("result", result.into()), ("message", message.into())];
        owned(&mut Autocommit(&self.exec), Statement::Succeed, binds, id, worker_id).await
    }

    /// Settles an owned task: canceled if a cancel was requested, else
    /// succeeded with `result`.
    pub async fn complete(&self, id: &str, worker_id: &str, result: Json) -> Result<Task> {
        complete(&mut Autocommit(&self.exec), id, worker_id, result).await
    }

    /// [`Store::complete`] inside the caller's transaction: the settlement
    /// commits with the caller's other writes, or neither does. A lost lease
    /// is reported before the caller commits.
    pub async fn complete_in(
        &self,
        tx: &mut E::Transaction,
        id: &str,
        worker_id: &str,
        result: Json,
    ) -> Result<Task> {
        complete(tx, id, worker_id, result).await
    }

    /// Records a failure: canceled if a cancel was requested; queued again
    /// after `delay_ms` if retryable with attempts left; else failed.
    pub async fn fail(&self, id: &str, worker_id: &str, failure: &Failure) -> Result<Task> {
        fail(&mut Autocommit(&self.exec), id, worker_id, failure).await
    }

    /// Gives an owned task back (at shutdown): queued and due now, its
    /// attempt not spent; canceled instead if a cancel was requested.
    /// A waymark addition to the protocol (`release.sql`).
    pub async fn release(&self, id: &str, worker_id: &str) -> Result<Task> {
        self.release_attempt(id, worker_id, None).await
    }

    /// [`Store::release`] fenced to one claim: with `Some(n)` it gives the
    /// task back only while it is on attempt `n` (see [`Failure::attempt`]).
    pub async fn release_attempt(&self, id: &str, worker_id: &str, attempt: Option<i32>) -> Result<Task> {
        let binds: Binds = vec![("attempt", attempt.into())];
        owned(&mut Autocommit(&self.exec), Statement::Release, binds, id, worker_id).await
    }

    /// Settles several owned tasks with one commit for all: each settlement
    /// is still ownership-checked and answered on its own (a lost lease
    /// fails only that one). `Err` means the commit failed and none of them
    /// is known to have committed.
    ///
    /// The completes of each worker go in one `complete_batch` statement;
    /// failures run one statement each. When that makes one statement (the
    /// usual case: one worker's completes), it runs in autocommit, with no
    /// transaction around it.
    pub async fn settle_batch(&self, items: &[Settlement]) -> Result<Vec<Result<Settled>>> {
        let plan = SettlePlan::new(items)?;
        if plan.statements() <= 1 {
            return settle_all(&mut Autocommit(&self.exec), items, &plan).await;
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

/// One settlement of [`Store::settle_batch`].
#[derive(Debug, Clone)]
pub enum Settlement {
    /// As [`Store::complete`].
    Complete {
        /// The task.
        id: String,
        /// The owning worker.
        worker_id: String,
        /// The handler's result.
        result: Json,
    },
    /// As [`Store::fail`].
    Fail {
        /// The task.
        id: String,
        /// The owning worker.
        worker_id: String,
        /// The failure.
        failure: Failure,
    },
}

impl Settlement {
    /// The task this settlement is for.
    pub fn task_id(&self) -> &str {
        match self {
            Settlement::Complete { id, .. } | Settlement::Fail { id, .. } => id,
        }
    }
}

/// The completes of a settlement batch grouped by worker (one statement
/// each), checked before anything is sent.
struct SettlePlan<'a> {
    completes: BTreeMap<&'a str, Vec<usize>>,
    fails: usize,
}

impl<'a> SettlePlan<'a> {
    fn new(items: &'a [Settlement]) -> Result<Self> {
        let mut completes: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        let mut fails = 0;
        for (i, item) in items.iter().enumerate() {
            match item {
                Settlement::Complete { id, worker_id, .. } => {
                    non_empty("task id", id)?;
                    non_empty("worker_id", worker_id)?;
                    completes.entry(worker_id.as_str()).or_default().push(i);
                }
                Settlement::Fail { .. } => fails += 1,
            }
        }
        Ok(SettlePlan { completes, fails })
    }

    fn statements(&self) -> usize {
        self.completes.len() + self.fails
    }
}

async fn settle_all<S: PgSession + ?Sized>(
    s: &mut S,
    items: &[Settlement],
    plan: &SettlePlan<'_>,
) -> Result<Vec<Result<Settled>>> {
    let mut outcomes: Vec<Option<Result<Settled>>> = (0..items.len()).map(|_| None).collect();
    for (&worker_id, members) in &plan.completes {
        let mut results = serde_json::Map::new();
        let mut ids = Vec::with_capacity(members.len());
        for &i in members {
            let Settlement::Complete { id, result, .. } = &items[i] else {
                unreachable!("grouped completes")
            };
            // The first settlement of an id is the one that counts.
            if !results.contains_key(id) {
                results.insert(id.clone(), result.clone());
                ids.push(id.clone());
            }
        }
        let binds: Binds = vec![
            ("results", Value::Jsonb(Json::Object(results))),
            ("ids", Value::TextArray(ids)),
            ("worker_id", worker_id.into()),
        ];
        let mut settled = BTreeMap::new();
        for mut row in run(s, Statement::CompleteBatch, binds).await? {
            let id = text(&mut row, "id")?;
            settled.insert(id.clone(), Settled { id, status: status(&mut row, "status")? });
        }
        for &i in members {
            let Settlement::Complete { id, .. } = &items[i] else { unreachable!("grouped completes") };
            // A duplicate id finds its row taken by the first: a lost lease.
            outcomes[i] =
                Some(settled.remove(id).ok_or_else(|| Error::LostLease {
                    task_id: id.clone(),
                    worker_id: worker_id.to_owned(),
                }));
        }
    }
    for (i, item) in items.iter().enumerate() {
        if let Settlement::Fail { id, worker_id, failure } = item {
            let out = fail(s, id, worker_id, failure).await;
            // A lost lease or a bad argument answers that one settlement; any
            // other error has aborted the transaction.
            if let Err(e) = &out {
                if !e.is_lost_lease() && !matches!(e, Error::InvalidArgument(_)) {
                    return Err(out.unwrap_err());
                }
            }
            outcomes[i] = Some(out.map(|t| Settled::from(&t)));
        }
    }
    Ok(outcomes.into_iter().map(|o| o.expect("every settlement answered")).collect())
}

async fn fail<S: PgSession + ?Sized>(
    s: &mut S,
    id: &str,
    worker_id: &str,
    failure: &Failure,
) -> Result<Task> {
    if failure.delay_ms < 0 {
        return Err(Error::invalid(format!("delay_ms must not be negative, got {}", failure.delay_ms)));
    }
    let binds: Binds = vec![
        ("retryable", failure.retryable.into()),
        ("error", failure.error.clone().into()),
        ("delay_ms", failure.delay_ms.into()),
        ("attempt", failure.attempt.into()),
    ];
    owned(s, Statement::Fail, binds, id, worker_id).await
}

// ----- shared steps, each written once for autocommit and transactions -----

/// Commits on success, rolls back on error, and returns the outcome; a lock
/// timeout (SQLSTATE 55P03) becomes [`Error::LockTimeout`] naming `operation`.
async fn finish<T, X: PgTransaction>(tx: X, out: Result<T>, operation: &'static str) -> Result<T> {
    match out {
        Ok(v) => {
            tx.commit().await?;
            Ok(v)
        }
        Err(e) => {
            // The operation's error is the one to report.
            let _ = tx.rollback().await;
            Err(if e.sqlstate() == Some("55P03") { Error::LockTimeout { operation } } else { e })
        }
    }
}

fn format_ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

async fn insert<S: PgSession + ?Sized>(s: &mut S, t: &NewTask, id: &str) -> Result<Task> {
    let root_id = t.root_id.clone().unwrap_or_else(|| id.to_owned());
    let binds: Binds = vec![
        ("id", id.into()),
        ("name", t.name.as_str().into()),
        ("queue", t.queue.as_str().into()),
        ("payload", t.payload.clone().into()),
        ("metadata", t.metadata.clone().into()),
        ("max_attempts", t.max_attempts.into()),
        ("priority", t.priority.into()),
        ("delay_ms", t.delay_ms.into()),
        ("parent_id", t.parent_id.as_deref().into()),
        ("root_id", root_id.into()),
        ("correlation_id", t.correlation_id.as_deref().into()),
    ];
    task_opt(s, Statement::InsertTask, binds)
        .await?
        .ok_or_else(|| Error::Decode("insert_task returned no row".to_owned()))
}

/// Most tasks in one batched submit.
const MAX_BATCH: usize = 10_000;

/// Validates a batch and makes its ids and its JSON rows.
/// A batched submit's columns, one array each, checked and with fresh ids.
struct Batch {
    ids: Vec<String>,
    names: Vec<String>,
    queues: Vec<String>,
    payloads: Vec<Json>,
    metadata: Vec<Json>,
    max_attempts: Vec<i32>,
    priorities: Vec<i32>,
    delays_ms: Vec<i64>,
    parent_ids: Vec<Option<String>>,
    root_ids: Vec<Option<String>>,
    correlation_ids: Vec<Option<String>>,
}

impl Batch {
    fn new(tasks: impl IntoIterator<Item = NewTask>) -> Result<Batch> {
        let tasks: Vec<NewTask> = tasks.into_iter().collect();
        if tasks.len() > MAX_BATCH {
            return Err(Error::invalid(format!(
                "a batch holds at most {MAX_BATCH} tasks, got {}",
                tasks.len()
            )));
        }
        let n = tasks.len();
        let mut b = Batch {
            ids: Vec::with_capacity(n),
            names: Vec::with_capacity(n),
            queues: Vec::with_capacity(n),
            payloads: Vec::with_capacity(n),
            metadata: Vec::with_capacity(n),
            max_attempts: Vec::with_capacity(n),
            priorities: Vec::with_capacity(n),
            delays_ms: Vec::with_capacity(n),
            parent_ids: Vec::with_capacity(n),
            root_ids: Vec::with_capacity(n),
            correlation_ids: Vec::with_capacity(n),
        };
        for (i, t) in tasks.into_iter().enumerate() {
            t.validate().map_err(|e| match e {
                Error::InvalidArgument(why) => Error::invalid(format!("task {i} of the batch: {why}")),
                other => other,
            })?;
            if t.key.is_some() {
                return Err(Error::invalid(format!(
                    "task {i} of the batch has a key; keyed tasks are submitted one by one"
                )));
            }
            b.ids.push(new_task_id());
            b.names.push(t.name);
            b.queues.push(t.queue);
            b.payloads.push(t.payload);
            b.metadata.push(t.metadata);
            b.max_attempts.push(t.max_attempts);
            b.priorities.push(t.priority);
            b.delays_ms.push(t.delay_ms);
            b.parent_ids.push(t.parent_id);
            // NULL: the statement makes a top-level task its own root.
            b.root_ids.push(t.root_id);
            b.correlation_ids.push(t.correlation_id);
        }
        Ok(b)
    }

    fn binds(self) -> Binds {
        vec![
            ("ids", Value::TextArray(self.ids)),
            ("names", Value::TextArray(self.names)),
            ("queues", Value::TextArray(self.queues)),
            ("payloads", Value::JsonbArray(self.payloads)),
            ("metadata", Value::JsonbArray(self.metadata)),
            ("max_attempts", Value::Int4Array(self.max_attempts)),
            ("priorities", Value::Int4Array(self.priorities)),
            ("delays_ms", Value::Int8Array(self.delays_ms)),
            ("parent_ids", Value::NullableTextArray(self.parent_ids)),
            ("root_ids", Value::NullableTextArray(self.root_ids)),
            ("correlation_ids", Value::NullableTextArray(self.correlation_ids)),
        ]
    }
}

/// Runs a batched insert and checks that every row went in.
async fn insert_batch<S: PgSession + ?Sized>(s: &mut S, batch: Batch) -> Result<()> {
    let expected = batch.ids.len();
    let inserted = match run_opt(s, Statement::InsertTaskBatch, batch.binds()).await? {
        Some(mut row) => int8(&mut row, "inserted")?,
        None => 0,
    };
    if inserted != expected as i64 {
        return Err(Error::Decode(format!("a batched submit of {expected} tasks inserted {inserted} rows")));
    }
    Ok(())
}

async fn submit_keyed<S: PgSession + ?Sized>(s: &mut S, t: &NewTask) -> Result<Task> {
    let key = t.key.as_deref().unwrap_or_default();
    let existing = match key_target(s, key).await? {
        Some(id) => task_opt(s, Statement::Get, vec![("id", id.into())]).await?,
        None => None,
    };
    if let Some(current) = existing {
        let live = !current.status.is_terminal();
        match t.conflict {
            Conflict::Reject => {
                return Err(Error::AlreadyExists { key: key.to_owned(), task_id: current.id });
            }
            Conflict::Reuse | Conflict::ReuseSucceeded if live => return Ok(current),
            Conflict::ReuseSucceeded if current.status == TaskStatus::Succeeded => return Ok(current),
            _ if live => {
                cancel(s, &current.id).await?;
            }
            _ => {}
        }
    }
    let task = insert(s, t, &new_task_id()).await?;
    run(s, Statement::UpsertKey, vec![("key", key.into()), ("task_id", task.id.as_str().into())]).await?;
    Ok(task)
}

/// Takes the key's transaction lock and returns the task id it names.
async fn key_target<S: PgSession + ?Sized>(s: &mut S, key: &str) -> Result<Option<String>> {
    run(s, Statement::LockKey, vec![("key", key.into())]).await?;
    match run_opt(s, Statement::GetKey, vec![("key", key.into())]).await? {
        Some(mut row) => opt_text(&mut row, "task_id"),
        None => Ok(None),
    }
}

async fn cancel<S: PgSession + ?Sized>(s: &mut S, id: &str) -> Result<Option<Task>> {
    task_opt(s, Statement::Cancel, vec![("id", id.into())]).await
}

async fn retry<S: PgSession + ?Sized>(s: &mut S, id: &str, reset_attempt: bool) -> Result<Option<Task>> {
    task_opt(s, Statement::Retry, vec![("reset_attempt", reset_attempt.into()), ("id", id.into())]).await
}

async fn recover_leases<S: PgSession + ?Sized>(s: &mut S) -> Result<usize> {
    let envelope = ErrorEnvelope::lease_expired().to_json();
    let rows = run(s, Statement::RecoverLeases, vec![("lease_expired_error", envelope.into())]).await?;
    if !rows.is_empty() {
        tracing::info!(recovered = rows.len(), "recovered expired leases");
    }
    Ok(rows.len())
}

/// The claim draw, using the variant whose equality predicates let an index
/// serve the claim order.
async fn claim_draw<S: PgSession + ?Sized>(s: &mut S, req: &ClaimRequest) -> Result<Vec<Task>> {
    let one_queue = match req.queues.as_slice() {
        [q] => Some(q.as_str()),
        _ => None,
    };
    let one_name = match req.names.as_deref() {
        Some([n]) => Some(n.as_str()),
        _ => None,
    };
    let mut binds: Binds = vec![
        ("worker_id", req.worker_id.as_str().into()),
        ("lease_ms", req.lease_ms.into()),
        ("limit", req.limit.into()),
    ];
    let stmt = match (one_queue, one_name) {
        (Some(q), Some(n)) => {
            binds.extend([("queue", q.into()), ("name", n.into())]);
            Statement::ClaimOneQueueOneName
        }
        (Some(q), None) => {
            binds.extend([("queue", q.into()), ("names", req.names.clone().into())]);
            Statement::ClaimOneQueue
        }
        (None, Some(n)) => {
            binds.extend([("queues", req.queues.clone().into()), ("name", n.into())]);
            Statement::ClaimOneName
        }
        (None, None) => {
            binds.extend([("queues", req.queues.clone().into()), ("names", req.names.clone().into())]);
            Statement::Claim
        }
    };
    tasks(s, stmt, binds).await
}

async fn complete<S: PgSession + ?Sized>(s: &mut S, id: &str, worker_id: &str, result: Json) -> Result<Task> {
    owned(s, Statement::Complete, vec![("result", result.into())], id, worker_id).await
}

/// An owned write: adds the ownership binds, and maps "no row" to LostLease.
async fn owned<S: PgSession + ?Sized>(
    s: &mut S,
    stmt: Statement,
    mut binds: Binds,
    id: &str,
    worker_id: &str,
) -> Result<Task> {
    non_empty("task id", id)?;
    non_empty("worker_id", worker_id)?;
    binds.extend([("id", Value::from(id)), ("worker_id", Value::from(worker_id))]);
    task_opt(s, stmt, binds)
        .await?
        .ok_or_else(|| Error::LostLease { task_id: id.to_owned(), worker_id: worker_id.to_owned() })
}

fn positive_lease(lease_ms: i64) -> Result<()> {
    if lease_ms < 1 {
        Err(Error::invalid(format!("lease_ms must be at least 1, got {lease_ms}")))
    } else {
        Ok(())
    }
}

async fn task_opt<S: PgSession + ?Sized>(s: &mut S, stmt: Statement, binds: Binds) -> Result<Option<Task>> {
    run_opt(s, stmt, binds).await?.map(Task::from_row).transpose()
}

async fn tasks<S: PgSession + ?Sized>(s: &mut S, stmt: Statement, binds: Binds) -> Result<Vec<Task>> {
    run(s, stmt, binds).await?.into_iter().map(Task::from_row).collect()
}
