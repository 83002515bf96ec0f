//! [`Store`]: the application's operations of protocol v1, and the
//! worker's (`WorkerProtocol`, implemented in `protocol.rs`). This file
//! holds the store itself (made from its settings, connect, migrate, close)
//! and the steps its operations share; each concern adds its own `impl`
//! block: `submit` (and `admit`, its backpressure), `reads`, `admin`
//! (cancel, retry, purge), `claim` (and `renew`), `settle`; waiting and
//! watching are in `crate::wait`.

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
use crate::settings::ConnectOptions;
use crate::signals::Signals;
use crate::statements::{run, run_opt, Binds};
use crate::task::Task;
use crate::value::Value;

mod admin;
mod admit;
mod claim;
mod held;
mod protocol;
mod reads;
mod renew;
mod settle;
mod steps;
mod submit;

pub use held::EVENT_RETENTION;
pub(crate) use steps::forget as forget_steps;

/// The queue, over any [`PgExecutor`]: the application's operations.
/// The worker's (claims, lease renewals, settlements) are
/// [`WorkerProtocol`]'s, implemented for every `Store`.
///
/// [`WorkerProtocol`]: crate::worker_protocol::WorkerProtocol
///
/// Each operation runs in autocommit on the executor; the `*_in` forms run
/// inside a transaction the caller opened with [`PgExecutor::begin`], so
/// they commit with the caller's own writes, or not at all: submits
/// ([`Store::submit_in`], [`Store::submit_batch_in`]), cancels and retries
/// (also by key), purges, and the reads of one task ([`Store::get_in`],
/// [`Store::get_by_key_in`]), which see the caller's uncommitted writes.
/// Waits, calls, watches, lists, counts and sweeps have none: a wait or a
/// sweep inside a transaction would hold it open while other sessions
/// work, and the counts are an operator's view of committed rows.
///
/// Made by [`Store::connect`] (or [`Store::with_options`], without I/O)
/// from [`ConnectOptions`], which holds every setting. Clones share the
/// settings, the LISTEN streams, the backpressure grants and the closed
/// flag.
#[derive(Debug, Clone)]
pub struct Store<E> {
    exec: E,
    schema: Option<Arc<str>>,
    migrate: bool,
    lock_timeout: String,
    migration_timeouts: MigrationTimeouts,
    pub(crate) signals: Arc<Signals>,
    pub(crate) life: Arc<Life>,
    pub(crate) gate: Option<Arc<Gate>>,
    pub(crate) observer: Option<Arc<dyn Observer>>,
}

impl<E: PgExecutor> crate::worker_protocol::sealed::Sealed for Store<E> {}

impl<E: PgExecutor> Store<E> {
    /// A store over `exec` with every setting at its default
    /// ([`ConnectOptions::new`]). No I/O: call [`Store::prepare`] (or
    /// [`Store::migrate`]) before first use on a new database, or make the
    /// store with [`Store::connect`], which does.
    pub fn new(exec: E) -> Self {
        Store::from_checked(exec, ConnectOptions::new(), None)
    }

    /// A store over `exec` with `options`. No I/O (see [`Store::new`]);
    /// [`Store::prepare`] runs the connect sequence with these options'
    /// schema and migration settings. Bad settings (a depth limit below 1)
    /// are refused here.
    pub fn with_options(exec: E, options: ConnectOptions) -> Result<Self> {
        let gate = match &options.backpressure {
            Some(limits) => Some(Arc::new(Gate::new(limits.clone())?)),
            None => None,
        };
        Ok(Store::from_checked(exec, options, gate))
    }

    fn from_checked(exec: E, options: ConnectOptions, gate: Option<Arc<Gate>>) -> Self {
        let at_least_1ms = |d: Duration| format_ms(d.max(Duration::from_millis(1)));
        Store {
            exec,
            schema: options.schema.map(Arc::from),
            migrate: options.migrate,
            lock_timeout: at_least_1ms(options.lock_timeout),
            migration_timeouts: MigrationTimeouts {
                lock: at_least_1ms(options.migration_lock_timeout),
                statement: at_least_1ms(options.migration_statement_timeout),
            },
            signals: Arc::default(),
            life: Arc::default(),
            gate,
            observer: options.observer,
        }
    }

    /// Makes a store over `exec` with `options` and runs the connect
    /// sequence of protocol v1 ([`Store::prepare`]): create the schema if
    /// one is asked for, the schema guard, migrations (unless
    /// [`ConnectOptions::migrate`] is off), then the protocol version
    /// check.
    pub async fn connect(exec: E, options: ConnectOptions) -> Result<Self> {
        let store = Store::with_options(exec, options)?;
        store.prepare().await?;
        // Step 5, LISTEN, starts with each channel's first user: the first
        // watch (`cairnq_queued`), the first wait (`cairnq_done`).
        Ok(store)
    }

    /// The connect sequence (see [`Store::connect`]) on this store, with
    /// the schema and migration settings it was made with, reporting which
    /// migrations it applied.
    pub async fn prepare(&self) -> Result<MigrationReport> {
        self.life.check()?;
        if let Some(schema) = &self.schema {
            migrate::create_schema(&self.exec, schema).await?;
        }
        migrate::guard_schema(&self.exec, self.schema.as_deref()).await?;
        let report = if self.migrate {
            migrate::migrate(&self.exec, &self.migration_timeouts).await?
        } else {
            MigrationReport::default()
        };
        migrate::check_protocol_version(&self.exec).await?;
        Ok(report)
    }

    /// The observer [`ConnectOptions::observer`] installed, if any.
    pub fn observer(&self) -> Option<&Arc<dyn Observer>> {
        self.observer.as_ref()
    }

    /// The executor.
    pub fn executor(&self) -> &E {
        &self.exec
    }

    /// The executor, handed back (the store never closes it): to close it
    /// yourself, or to make a store over it with other settings
    /// ([`Store::with_options`]).
    pub fn into_executor(self) -> E {
        self.exec
    }

    /// Applies pending migrations (see the ledger rules in PROTOCOL-V1),
    /// each bounded by [`ConnectOptions::migration_lock_timeout`] and
    /// [`ConnectOptions::migration_statement_timeout`].
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

    /// Closes the store: every later call of it (and of its clones) fails
    /// with [`Error::StoreClosed`], its LISTEN streams are dropped (a pool's
    /// listener hub is released with them), waits under way end with
    /// [`Error::StoreClosed`] at their next read, and its [`Sweeper`]s stop.
    /// Returns once no sweep is mid-purge. A call already running finishes
    /// as it would have. The executor is not closed. Closing twice is a
    /// no-op.
    ///
    /// [`Sweeper`]: crate::Sweeper
    pub async fn close(&self) {
        self.life.close();
        // Waiters and watchers re-read now, and meet the closed store.
        self.signals.wake_everyone();
        self.life.sweeps_ended().await;
    }

    /// Whether [`Store::close`] was called on this store or a clone.
    pub fn is_closed(&self) -> bool {
        self.life.check().is_err()
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
