//! A store's settings, in one builder: [`ConnectOptions`].
//!
//! Every setting a store has is set here and only here, each with its
//! default in its docs, and [`Store::connect`](crate::Store::connect) takes
//! them all ([`Store::with_options`](crate::Store::with_options) too, for
//! a store made without I/O).

use std::sync::Arc;
use std::time::Duration;

use crate::backpressure::Backpressure;
use crate::observe::Observer;

/// The default of [`ConnectOptions::lock_timeout`]: 5 s.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// The default of [`ConnectOptions::migration_lock_timeout`]: 30 s.
pub const DEFAULT_MIGRATION_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// The default of [`ConnectOptions::migration_statement_timeout`]: 5 min.
pub const DEFAULT_MIGRATION_STATEMENT_TIMEOUT: Duration = Duration::from_secs(300);

/// How a store is set up: where its installation lives, what
/// [`Store::connect`](crate::Store::connect) does to it, the bounds on the
/// store's lock waits, backpressure, and an observer.
///
/// A builder: start from [`ConnectOptions::new`] (every default) and
/// change what you need. Each setter's docs give its default.
///
/// ```no_run
/// use std::time::Duration;
/// use waymark_store::{Backpressure, ConnectOptions, PgExecutor, Store};
///
/// # async fn demo<E: PgExecutor>(exec: E) -> waymark_store::Result<()> {
/// let options = ConnectOptions::new()
///     .schema("tenant_a")
///     .lock_timeout(Duration::from_secs(2))
///     .backpressure(Backpressure::max_depth(50_000));
/// let store = Store::connect(exec, options).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub(crate) schema: Option<String>,
    pub(crate) migrate: bool,
    pub(crate) lock_timeout: Duration,
    pub(crate) migration_lock_timeout: Duration,
    pub(crate) migration_statement_timeout: Duration,
    pub(crate) backpressure: Option<Backpressure>,
    pub(crate) observer: Option<Arc<dyn Observer>>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            schema: None,
            migrate: true,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            migration_lock_timeout: DEFAULT_MIGRATION_LOCK_TIMEOUT,
            migration_statement_timeout: DEFAULT_MIGRATION_STATEMENT_TIMEOUT,
            backpressure: None,
            observer: None,
        }
    }
}

impl ConnectOptions {
    /// Every setting at its default.
    pub fn new() -> Self {
        ConnectOptions::default()
    }

    setters! {
        /// The schema the installation lives in: connecting creates it if it
        /// is missing, and the schema guard checks that the executor's
        /// connections see it (the executor must set `search_path` to it on
        /// every connection; the built-in pool's `PgPoolBuilder::schema` does).
        /// Defaults to none: the connection's current schema.
        pub fn schema(schema: impl Into<String>) => schema = Some(schema.into());

        /// Whether connecting applies pending migrations. Off, the schema
        /// guard and the protocol version check still run, so a store never
        /// works against an installation it does not speak. Defaults to true.
        pub fn migrate(migrate: bool) => migrate = migrate;

        /// Bounds each lock wait inside the store's transactions (a keyed
        /// submit's key lock, a claim after lease recovery, a keyed cancel or
        /// retry): past it the operation fails with
        /// [`Error::LockTimeout`](crate::Error::LockTimeout) and commits
        /// nothing. Set per transaction, so it never leaks to other users of a
        /// connection; the `*_in` forms run under the caller's transaction's
        /// own setting. At least 1 ms. Defaults to 5 s
        /// ([`DEFAULT_LOCK_TIMEOUT`]).
        pub fn lock_timeout(timeout: Duration) => lock_timeout = timeout;

        /// Bounds how long a migration waits for the ledger lock (another
        /// migrator) or a lock on a table it alters. Past it, migrating fails
        /// with [`Error::MigrationTimeout`](crate::Error::MigrationTimeout)
        /// naming the migration, having committed nothing of it; migrating
        /// again resumes there. Transaction-local. At least 1 ms. Defaults to
        /// 30 s ([`DEFAULT_MIGRATION_LOCK_TIMEOUT`]).
        pub fn migration_lock_timeout(timeout: Duration) => migration_lock_timeout = timeout;

        /// Bounds one statement of a migration, as
        /// [`ConnectOptions::migration_lock_timeout`] bounds its lock waits.
        /// Transaction-local. At least 1 ms. Defaults to 5 min
        /// ([`DEFAULT_MIGRATION_STATEMENT_TIMEOUT`]).
        pub fn migration_statement_timeout(timeout: Duration) => migration_statement_timeout = timeout;

        /// Gates the store's submits (those of its clones and of workers'
        /// child submits too, and those of the `*_in` forms, inside the
        /// caller's transaction) by depth limits: a submit to a queue at its
        /// limit waits for room, up to the maximum wait, then fails with
        /// [`Error::QueueFull`](crate::Error::QueueFull), having submitted
        /// nothing. The limit is soft across producers; see
        /// [`MAX_GRANT`](crate::MAX_GRANT). Bad limits are refused when the
        /// store is made. Defaults to none: no queue is limited.
        pub fn backpressure(limits: Backpressure) => backpressure = Some(limits);

        /// Reports the store's submits, claims and settlements, and the runs
        /// of workers on it, to `observer` (see [`Observer`]; `waymark-otel`
        /// makes OpenTelemetry metrics and spans of them). Defaults to none,
        /// which costs one `Option` check per operation.
        pub fn observer(observer: Arc<dyn Observer>) => observer = Some(observer);
    }
}
