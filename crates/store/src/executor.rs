//! The seam between the store and a connection: [`PgExecutor`].
//!
//! The store owns the SQL (texts, `$n` order, parameter types, migrations);
//! an executor owns the connection. Implement these traits over the pool you
//! already run and the store joins your sessions instead of opening its own.
//! `waymark-testing` ships a contract kit (`store_contract!`) that runs the
//! whole store contract against any executor.

use std::fmt;
use std::pin::Pin;

use async_trait::async_trait;
use futures::Stream;
use waymark_protocol::ParamType;

use crate::value::{Row, Value};

/// What kind of failure an executor hit. The pool decides on retries and the
/// circuit breaker from this; the store reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExecErrorKind {
    /// The connection failed or was lost (SQLSTATE class 08, 57P01-57P03,
    /// I/O errors, connect timeouts). The outcome of an in-flight write is
    /// unknown.
    Connection,
    /// The server or a pooler is out of connection slots (53300 and kin).
    Capacity,
    /// A client-side deadline passed (acquire or query timeout).
    Timeout,
    /// The server rejected or failed the statement.
    Query,
    /// The executor refused to queue the call: too many callers were waiting
    /// already, or none became free within the acquire timeout.
    Saturated,
    /// The executor's circuit breaker is open after repeated connection
    /// failures; the call was not attempted.
    CircuitOpen,
}

impl fmt::Display for ExecErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ExecErrorKind::Connection => "connection",
            ExecErrorKind::Capacity => "capacity",
            ExecErrorKind::Timeout => "timeout",
            ExecErrorKind::Query => "query",
            ExecErrorKind::Saturated => "saturated",
            ExecErrorKind::CircuitOpen => "circuit open",
        })
    }
}

/// An executor's error: a kind, the SQLSTATE when the server sent one, and a
/// message. Anyone can build one, unlike a driver's own error type.
#[derive(Debug)]
pub struct ExecError {
    kind: ExecErrorKind,
    sqlstate: Option<String>,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl ExecError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ExecErrorKind, message: impl Into<String>) -> Self {
        ExecError { kind, sqlstate: None, message: message.into(), source: None }
    }

    /// Attaches the five-character SQLSTATE.
    pub fn with_sqlstate(mut self, code: impl Into<String>) -> Self {
        self.sqlstate = Some(code.into());
        self
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// The failure's kind.
    pub fn kind(&self) -> ExecErrorKind {
        self.kind
    }

    /// The SQLSTATE, when the server sent one.
    pub fn sqlstate(&self) -> Option<&str> {
        self.sqlstate.as_deref()
    }

    /// The message, without the kind prefix.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the server refused the statement for a condition that
    /// passes with time, having done nothing of it: see
    /// [`sqlstate_passes`].
    pub fn is_passing_refusal(&self) -> bool {
        self.sqlstate().is_some_and(sqlstate_passes)
    }
}

/// Whether a SQLSTATE names a refusal that passes with time, nothing of
/// the statement done, so that the same call made again later may
/// succeed: a read-only transaction (25006: a standby, or a primary just
/// demoted, as in a failover), disk full (53100), out of memory (53200), a
/// serialization failure or a deadlock (40001, 40P01), a lock not
/// available (55P03), a statement cancelled (57014: a statement timeout,
/// or an operator's cancel). Whether to make the call again, and when, is
/// the caller's: only a statement safe to repeat may be repeated blind.
pub fn sqlstate_passes(code: &str) -> bool {
    matches!(code, "25006" | "53100" | "53200" | "40001" | "40P01" | "55P03" | "57014")
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} error: {}", self.kind, self.message)?;
        if let Some(code) = &self.sqlstate {
            write!(f, " (sqlstate {code})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ExecError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Which admission lane a call belongs to. An executor with admission
/// control lets critical work (lease renewal, settlement) pass ordinary work
/// (submits, claims, reads) so that running tasks keep their leases under a
/// burst; an executor without it ignores the lane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Submits, claims, reads.
    #[default]
    Ordinary,
    /// Heartbeats and settlements.
    Critical,
}

/// A statement ready to send: `$n` SQL, the type of each slot, and how the
/// store wants it run.
#[derive(Debug, Clone, Copy)]
pub struct Sql<'a> {
    /// SQL with `$1..$n` placeholders.
    pub text: &'a str,
    /// The type of `$i` at index `i - 1`, so an executor can bind in one round
    /// trip without preparing (`query_typed` in tokio-postgres).
    pub types: &'a [ParamType],
    /// The admission lane.
    pub lane: Lane,
    /// Whether running the statement again after an unknown outcome (a
    /// connection lost mid-call) is safe: the store answers correctly either
    /// way. Only such statements may be retried after they were sent.
    pub repeatable: bool,
}

/// One session: a connection checked out for one call, or an open transaction.
#[async_trait]
pub trait PgSession: Send {
    /// Runs one statement with parameters and returns every row.
    async fn query(&mut self, sql: Sql<'_>, params: &[Value]) -> Result<Vec<Row>, ExecError>;

    /// Runs a parameterless script with the simple query protocol (several
    /// statements allowed). Used for migrations.
    async fn execute_script(&mut self, script: &str) -> Result<(), ExecError>;
}

/// An open transaction. It is the executor's own type, so code given one (a
/// task handler in `complete_in`, say) can use the driver's native API on it.
///
/// Dropping a transaction without `commit` must roll it back.
#[async_trait]
pub trait PgTransaction: PgSession + Sized {
    /// Commits; an error means the outcome may be unknown.
    async fn commit(self) -> Result<(), ExecError>;

    /// Rolls back.
    async fn rollback(self) -> Result<(), ExecError>;
}

/// A notification delivered by `LISTEN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The channel, such as `cairnq_done`.
    pub channel: String,
    /// The payload, such as a task id.
    pub payload: String,
}

/// What a LISTEN stream delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenEvent {
    /// One notification.
    Notification(Notification),
    /// Notifications may have been missed (listening just began or began
    /// again after a reconnect, or the consumer fell behind): re-read.
    MayHaveMissed,
}

/// A stream of LISTEN events. It ends when listening stops for good (the
/// path cannot deliver, or the executor closed); the store then polls and
/// asks again later.
pub type NotificationStream = Pin<Box<dyn Stream<Item = ListenEvent> + Send>>;

/// A source of sessions: the trait to implement over your own pool.
///
/// `query` and `execute_script` run in autocommit on any connection; `begin`
/// opens a READ COMMITTED transaction that holds one connection until it ends.
/// The store never closes an executor it was handed.
#[async_trait]
pub trait PgExecutor: Send + Sync {
    /// The executor's transaction type.
    type Transaction: PgTransaction + Send;

    /// Runs one statement in autocommit.
    async fn query(&self, sql: Sql<'_>, params: &[Value]) -> Result<Vec<Row>, ExecError>;

    /// Runs a parameterless script in autocommit (simple query protocol).
    async fn execute_script(&self, script: &str) -> Result<(), ExecError>;

    /// Opens a READ COMMITTED transaction.
    async fn begin(&self) -> Result<Self::Transaction, ExecError>;

    /// Opens a READ COMMITTED transaction for work of `lane`. Defaults to
    /// [`PgExecutor::begin`]; executors with admission lanes override it.
    async fn begin_in_lane(&self, lane: Lane) -> Result<Self::Transaction, ExecError> {
        let _ = lane;
        self.begin().await
    }

    /// Starts listening on `channels` on a session of its own, if the executor
    /// can. `Ok(None)` (the default) means it cannot, and callers poll:
    /// slower, never wrong. The stream should begin with
    /// [`ListenEvent::MayHaveMissed`] once listening works, and send it again
    /// after every reconnect.
    async fn listen(&self, channels: &[&str]) -> Result<Option<NotificationStream>, ExecError> {
        let _ = channels;
        Ok(None)
    }
}

/// Runs statements on an executor in autocommit, as a [`PgSession`], so that
/// every store operation is written once for both places it can run.
#[derive(Debug)]
pub(crate) struct Autocommit<'a, E>(pub &'a E);

#[async_trait]
impl<E: PgExecutor> PgSession for Autocommit<'_, E> {
    async fn query(&mut self, sql: Sql<'_>, params: &[Value]) -> Result<Vec<Row>, ExecError> {
        self.0.query(sql, params).await
    }

    async fn execute_script(&mut self, script: &str) -> Result<(), ExecError> {
        self.0.execute_script(script).await
    }
}
