//! [`Store`]: every queue operation of protocol v1. This file holds the
//! store itself (connect, migrate, settings) and the steps its operations
//! share; each concern adds its own `impl` block: `submit`, `reads` (and
//! admin), `claim` (and heartbeats), `settle`; waiting and watching are in
//! `crate::wait`.

use std::sync::Arc;
use std::time::Duration;

use waymark_protocol::Statement;

use crate::backpressure::Gate;
use crate::closing::Life;
use crate::error::{Error, Result};
use crate::executor::{Autocommit, Lane, PgExecutor, PgSession, PgTransaction};
use crate::lease::Lease;
use crate::migrate::{self, MigrationReport, MigrationState, MigrationTimeouts};
use crate::observe::Observer;
use crate::signals::Signals;
use crate::statements::{run, run_opt, Binds};
use crate::task::Task;
use crate::value::Value;

mod claim;
mod reads;
mod renew;
mod settle;
mod submit;

pub use settle::{Settlement, MAX_SNOOZE};

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
    pub(crate) life: Arc<Life>,
    pub(crate) gate: Option<Arc<Gate>>,
    pub(crate) observer: Option<Arc<dyn Observer>>,
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
            life: Arc::default(),
            gate: None,
            observer: None,
        }
    }

    /// Reports this store's submits, claims and settlements, and the runs
    /// of workers on it, to `observer` (see [`Observer`]; `waymark-otel`
    /// makes OpenTelemetry metrics and spans of them). Clones made after
    /// this share it.
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The observer [`Store::with_observer`] installed, if any.
    pub fn observer(&self) -> Option<&Arc<dyn Observer>> {
        self.observer.as_ref()
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

    /// The executor in autocommit, unless the store is closed.
    fn session(&self) -> Result<Autocommit<'_, E>> {
        self.life.check()?;
        Ok(Autocommit(&self.exec))
    }

    /// Opens a transaction in `lane` with the lock timeout set.
    async fn begin(&self, lane: Lane) -> Result<E::Transaction> {
        let bound = vec![("lock_timeout", self.lock_timeout.as_str().into())];
        self.begin_bounded(lane, Statement::SetLockTimeout, bound).await
    }

    /// Opens a transaction in `lane` and runs `setup` in it (one of the
    /// statements that set its timeouts); rolls back if that fails.
    async fn begin_bounded(&self, lane: Lane, setup: Statement, binds: Binds) -> Result<E::Transaction> {
        self.life.check()?;
        let mut tx = self.exec.begin_in_lane(lane).await?;
        if let Err(e) = run(&mut tx, setup, binds).await {
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
        self.life.check()?;
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
        self.life.check()?;
        migrate::migrate(&self.exec, &self.migration_timeouts).await
    }

    /// Each embedded migration and whether it is applied; changes nothing.
    pub async fn migration_status(&self) -> Result<Vec<MigrationState>> {
        self.life.check()?;
        migrate::status(&self.exec).await
    }

    /// Checks that the installation speaks protocol v1.
    pub async fn check_protocol_version(&self) -> Result<()> {
        self.life.check()?;
        migrate::check_protocol_version(&self.exec).await
    }
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

/// An owned write: adds the ownership binds, and maps "no row" to LostLease.
async fn owned<S: PgSession + ?Sized>(
    s: &mut S,
    stmt: Statement,
    mut binds: Binds,
    lease: &Lease,
) -> Result<Task> {
    lease.check()?;
    binds.extend([("id", Value::from(lease.task_id())), ("worker_id", Value::from(lease.worker_id()))]);
    task_opt(s, stmt, binds).await?.ok_or_else(|| Error::LostLease {
        task_id: lease.task_id().to_owned(),
        worker_id: lease.worker_id().to_owned(),
    })
}

async fn task_opt<S: PgSession + ?Sized>(s: &mut S, stmt: Statement, binds: Binds) -> Result<Option<Task>> {
    run_opt(s, stmt, binds).await?.map(Task::from_row).transpose()
}

async fn tasks<S: PgSession + ?Sized>(s: &mut S, stmt: Statement, binds: Binds) -> Result<Vec<Task>> {
    Task::from_rows(run(s, stmt, binds).await?)
}
