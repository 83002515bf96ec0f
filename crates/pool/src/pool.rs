//! The pool: admission, breaker, retries and timeouts around bb8.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bb8::{ManageConnection, RunError};
use rand::Rng;
use waymark_store::{ExecError, ExecErrorKind, Lane, NotificationStream, PgExecutor, Row, Sql, Value};

use crate::admission::{Gate, Permit, Refusal};
use crate::breaker::{Breaker, Pass};
use crate::codec::{map_error, typed_params, RowDecoder};
use crate::config::PgPoolBuilder;
use crate::manager::{Conn, Manager};
use crate::stats::{Counters, PoolStats};
use crate::tls::{Endpoint, SslMode};
use crate::transaction::PoolTransaction;
use tokio_postgres::types::{ToSql, Type};

pub(crate) type Pooled = bb8::PooledConnection<'static, Manager>;

/// A pool of PostgreSQL connections that implements
/// [`PgExecutor`](waymark_store::PgExecutor). Cloning shares the pool.
#[derive(Clone)]
pub struct PgPool {
    inner: Arc<Inner>,
}

struct Inner {
    pool: bb8::Pool<Manager>,
    /// Opens connections outside bb8 so that a failed connect is seen at
    /// once, with its cause (bb8 hides it behind its connection timeout).
    direct: Manager,
    max_size: u32,
    gate: Gate,
    breaker: Breaker,
    counters: Counters,
    query_timeout: Option<Duration>,
    retry_attempts: u32,
    backoff_min: Duration,
    backoff_max: Duration,
    schema: Option<String>,
    /// Cancels statements past the query timeout, over the same TLS.
    cancel_tls: tokio_postgres_rustls::MakeRustlsConnect,
    ssl_mode: SslMode,
    listen_url: String,
    /// Opens the LISTEN hub's direct sessions, with the pool's TLS.
    listen: waymark_notify::Connector,
}

impl std::fmt::Debug for PgPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgPool").field("stats", &self.stats()).field("schema", &self.inner.schema).finish()
    }
}

/// A connection held for one call: the admission permit, the connection and
/// the breaker's pass, released together.
pub(crate) struct Lease {
    pub(crate) conn: Pooled,
    pass: Option<Pass>,
    _permit: Permit,
}

impl Lease {
    /// Settles the breaker pass and the counters for the call's outcome, and
    /// marks the connection broken when it must not be reused.
    pub(crate) fn settle(&mut self, pool: &PgPool, outcome: Result<(), &ExecError>) {
        let pass = self.pass.take();
        let c = &pool.inner.counters;
        match outcome {
            Ok(()) => {
                if let Some(p) = pass {
                    p.success()
                }
            }
            Err(e) => match e.kind() {
                // A connection counts its first failure only: a statement
                // inside a transaction failed, and its ROLLBACK fails again.
                ExecErrorKind::Connection => {
                    let first = !std::mem::replace(&mut self.conn.broken, true);
                    if first {
                        Counters::bump(&c.connection_errors);
                    }
                    match pass {
                        Some(p) => p.connection_failure(&e.to_string()),
                        // A statement inside a transaction, whose pass the
                        // BEGIN settled: the failure still counts.
                        None if first => pool.inner.breaker.record_failure(&e.to_string()),
                        None => {}
                    }
                }
                ExecErrorKind::Timeout => {
                    if !std::mem::replace(&mut self.conn.broken, true) {
                        Counters::bump(&c.timeouts);
                    }
                    if let Some(p) = pass {
                        p.neutral()
                    };
                }
                ExecErrorKind::Capacity => {
                    Counters::bump(&c.capacity_errors);
                    if let Some(p) = pass {
                        p.neutral()
                    };
                }
                _ => {
                    // The server answered: the path to it works. A session
                    // that found it read-only (a failover) is not kept.
                    self.conn.broken |= crate::refusal::ends_session(e);
                    Counters::bump(&c.query_errors);
                    if let Some(p) = pass {
                        p.success()
                    };
                }
            },
        }
    }
}

impl PgPool {
    /// A builder for a pool on `url` (a `postgres://` URL or key=value string).
    pub fn builder(url: impl Into<String>) -> PgPoolBuilder {
        PgPoolBuilder::new(url.into())
    }

    pub(crate) fn from_parts(
        b: PgPoolBuilder,
        endpoint: Endpoint,
        setup: Option<String>,
        listen_url: String,
        listen: Endpoint,
    ) -> Self {
        let pool = bb8::Pool::builder()
            .max_size(b.max_size)
            .connection_timeout(b.connect_timeout)
            .idle_timeout(b.idle_timeout)
            // Fail a connect at once (the breaker and our retries decide);
            // bb8's own retry loop would hide a dead server for the whole
            // connection timeout.
            .retry_connection(false)
            // No ping per checkout (a round trip on every call): a socket the
            // server closed is seen by `is_closed` below, and a statement
            // that fails on a dead connection is retried where that is safe.
            .test_on_check_out(false)
            .build_unchecked(Manager::new(endpoint.clone(), setup.clone(), b.prepared_statements));
        PgPool {
            inner: Arc::new(Inner {
                pool,
                cancel_tls: endpoint.tls.clone(),
                ssl_mode: endpoint.ssl_mode,
                direct: Manager::new(endpoint, setup, b.prepared_statements),
                max_size: b.max_size,
                gate: Gate::new(b.max_size as usize, b.max_waiting, b.acquire_timeout),
                breaker: Breaker::new(b.breaker_threshold, b.breaker_open_for),
                counters: Counters::default(),
                query_timeout: b.query_timeout,
                retry_attempts: b.retry_attempts,
                backoff_min: b.backoff_min,
                backoff_max: b.backoff_max,
                schema: b.schema,
                listen_url,
                listen: waymark_notify::Connector::new(listen.config, listen.tls),
            }),
        }
    }

    /// The schema this pool puts on each connection's `search_path`.
    pub fn schema(&self) -> Option<&str> {
        self.inner.schema.as_deref()
    }

    /// How connections use TLS, from the URL's `sslmode`.
    pub fn ssl_mode(&self) -> SslMode {
        self.inner.ssl_mode
    }

    /// The URL of direct sessions (LISTEN); see
    /// [`PgPoolBuilder::listen_url`](crate::PgPoolBuilder::listen_url).
    pub fn listen_url(&self) -> &str {
        &self.inner.listen_url
    }

    /// A snapshot of the pool's statistics.
    pub fn stats(&self) -> PoolStats {
        let c = &self.inner.counters;
        let (p50, p95) = c.wait_percentiles();
        let (in_use, waiting, peak_in_use, peak_waiting) = self.inner.gate.snapshot();
        PoolStats {
            acquires: Counters::get(&c.acquires),
            acquire_wait_p50: p50,
            acquire_wait_p95: p95,
            saturated: Counters::get(&c.saturated),
            capacity_errors: Counters::get(&c.capacity_errors),
            breaker_rejections: Counters::get(&c.breaker_rejections),
            connection_errors: Counters::get(&c.connection_errors),
            query_errors: Counters::get(&c.query_errors),
            timeouts: Counters::get(&c.timeouts),
            retries: Counters::get(&c.retries),
            in_use,
            waiting,
            peak_in_use,
            peak_waiting,
            breaker: self.inner.breaker.state(),
        }
    }

    /// Logs the statistics through `tracing` at info level.
    pub fn log_stats(&self) {
        let s = self.stats();
        tracing::info!(
            acquires = s.acquires,
            acquire_wait_p50_us = s.acquire_wait_p50.as_micros() as u64,
            acquire_wait_p95_us = s.acquire_wait_p95.as_micros() as u64,
            saturated = s.saturated,
            capacity_errors = s.capacity_errors,
            breaker_rejections = s.breaker_rejections,
            connection_errors = s.connection_errors,
            query_errors = s.query_errors,
            timeouts = s.timeouts,
            retries = s.retries,
            peak_in_use = s.peak_in_use,
            peak_waiting = s.peak_waiting,
            breaker = ?s.breaker,
            "waymark pool stats"
        );
    }

    /// Admission, the breaker, then a connection. Nothing has been sent to
    /// the server when this fails, so any caller may retry it.
    pub(crate) async fn acquire(&self, lane: Lane) -> Result<Lease, ExecError> {
        let inner = &self.inner;
        let started = Instant::now();
        let permit = inner.gate.admit(lane).await.map_err(|refusal| {
            Counters::bump(&inner.counters.saturated);
            let (waiting, why) = match refusal {
                Refusal::QueueFull { waiting } => (waiting, "the wait queue is full"),
                Refusal::TimedOut { waiting } => {
                    (waiting, "no connection came free within the acquire timeout")
                }
            };
            ExecError::new(
                ExecErrorKind::Saturated,
                format!("pool saturated: {why} ({waiting} callers waiting)"),
            )
        })?;
        let pass = inner.breaker.check().map_err(|cause| {
            Counters::bump(&inner.counters.breaker_rejections);
            ExecError::new(ExecErrorKind::CircuitOpen, format!("circuit breaker open; last failure: {cause}"))
        })?;
        match self.checkout().await {
            Ok(conn) => {
                inner.counters.record_wait(started.elapsed());
                Ok(Lease { conn, pass: Some(pass), _permit: permit })
            }
            Err(e) => {
                let err = match e {
                    RunError::User(e) => map_error(e),
                    RunError::TimedOut => {
                        ExecError::new(ExecErrorKind::Connection, "timed out opening a connection")
                    }
                };
                match err.kind() {
                    ExecErrorKind::Capacity => {
                        Counters::bump(&inner.counters.capacity_errors);
                        pass.neutral();
                    }
                    ExecErrorKind::Connection => {
                        Counters::bump(&inner.counters.connection_errors);
                        pass.connection_failure(&err.to_string());
                    }
                    _ => pass.success(),
                }
                Err(err)
            }
        }
    }

    /// A pooled connection; when none is idle and there is room, one is
    /// opened here first and handed to the pool, so a connect failure comes
    /// back at once with its cause.
    async fn checkout(&self) -> Result<Pooled, RunError<tokio_postgres::Error>> {
        let inner = &self.inner;
        // Each pass either returns or discards one closed connection, so
        // this ends after at most max_size + 1 passes.
        loop {
            let state = inner.pool.state();
            if state.idle_connections == 0 && state.connections < inner.max_size {
                let conn = inner.direct.connect().await.map_err(RunError::User)?;
                // Full meanwhile (another caller added one): this one just closes.
                let _ = inner.pool.add(conn);
            }
            let mut conn = inner.pool.get_owned().await?;
            if !conn.client.is_closed() {
                return Ok(conn);
            }
            conn.broken = true;
        }
    }

    /// Runs `attempt` with retries: connection failures before anything was
    /// sent always retry; after sending, only when `repeatable`. 40001,
    /// 40P01, 55P03 and 25006 retry when `repeatable` (`retried_refusal`),
    /// without counting toward the breaker (they never do).
    pub(crate) async fn with_retries<T, F, Fut>(
        &self,
        lane: Lane,
        repeatable: bool,
        mut attempt: F,
    ) -> Result<T, ExecError>
    where
        F: FnMut(Lease) -> Fut,
        Fut: std::future::Future<Output = (Result<T, ExecError>, bool)>,
    {
        let mut tries = 0u32;
        loop {
            let (result, sent) = match self.acquire(lane).await {
                Ok(lease) => attempt(lease).await,
                Err(e) => (Err(e), false),
            };
            let err = match result {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let transient = match err.kind() {
                ExecErrorKind::Connection => !sent || repeatable,
                ExecErrorKind::Query => repeatable && crate::refusal::retried_refusal(&err),
                _ => false,
            };
            if !transient || tries >= self.inner.retry_attempts {
                return Err(err);
            }
            tries += 1;
            Counters::bump(&self.inner.counters.retries);
            let delay = self.backoff(tries);
            tracing::debug!(error = %err, tries, delay_ms = delay.as_millis() as u64, "retrying");
            tokio::time::sleep(delay).await;
        }
    }

    /// Full jitter: uniform in [min, min(max, min * 2^tries)].
    fn backoff(&self, tries: u32) -> Duration {
        let (min, max) = (self.inner.backoff_min, self.inner.backoff_max);
        let ceiling = min.saturating_mul(1u32 << tries.min(20)).min(max);
        if ceiling <= min {
            return min;
        }
        rand::thread_rng().gen_range(min..=ceiling)
    }

    /// Runs `fut` under the query timeout; on expiry the server is asked to
    /// cancel the statement.
    pub(crate) async fn timed<T>(
        &self,
        token: tokio_postgres::CancelToken,
        fut: impl std::future::Future<Output = Result<T, ExecError>>,
    ) -> Result<T, ExecError> {
        let Some(limit) = self.inner.query_timeout else { return fut.await };
        match tokio::time::timeout(limit, fut).await {
            Ok(r) => r,
            Err(_) => {
                let tls = self.inner.cancel_tls.clone();
                tokio::spawn(async move {
                    let _ = token.cancel_query(tls).await;
                });
                Err(ExecError::new(ExecErrorKind::Timeout, format!("query timed out after {limit:?}")))
            }
        }
    }

    async fn run_query(
        &self,
        mut lease: Lease,
        sql: Sql<'_>,
        params: &[Value],
    ) -> (Result<Vec<Row>, ExecError>, bool) {
        let token = lease.conn.client.cancel_token();
        let result = self.timed(token, query_on(&mut lease.conn, sql, params)).await;
        lease.settle(self, result.as_ref().map(|_| ()));
        (result, true)
    }
}

/// Runs one statement on a connection: bound in one round trip with
/// `query_typed`, or, when the connection caches statements, prepared once
/// and reused. Shared by the pool and its transactions.
pub(crate) async fn query_on(conn: &mut Conn, sql: Sql<'_>, params: &[Value]) -> Result<Vec<Row>, ExecError> {
    let typed = typed_params(sql.types, params);
    let refs = typed.iter().map(|(p, t)| (p as &(dyn ToSql + Sync), t));
    match conn.statements.as_mut() {
        None => {
            let stream = conn.client.query_typed_raw(sql.text, refs.map(|(p, t)| (p, t.clone())));
            decode_stream(stream.await).await.map_err(map_error)?
        }
        Some(cache) => {
            let stmt = match cache.get(sql.text) {
                Some(stmt) => stmt.clone(),
                None => {
                    let types: Vec<Type> = typed.iter().map(|(_, t)| t.clone()).collect();
                    let stmt = conn.client.prepare_typed(sql.text, &types).await.map_err(map_error)?;
                    cache.insert(sql.text.to_owned(), stmt.clone());
                    stmt
                }
            };
            let rows = decode_stream(conn.client.query_raw(&stmt, refs.map(|(p, _)| p)).await).await;
            if rows.is_err() {
                // A statement the server failed may be stale (a migration
                // changed a table under its plan): prepare it afresh next
                // time. (A row we could not decode is no reason to.)
                cache.remove(sql.text);
            }
            rows.map_err(map_error)?
        }
    }
}

/// A statement's rows, decoded as they arrive: a claim's hundreds of rows
/// are never all held twice, as the driver's and as ours. The outer error
/// is the driver's; a row we cannot decode is the inner one, answered only
/// once the statement has ended, so that the server's own outcome (an
/// error after the rows, a lost connection) wins, as it did when all rows
/// were collected before decoding, and the connection goes back idle.
async fn decode_stream(
    stream: Result<tokio_postgres::RowStream, tokio_postgres::Error>,
) -> Result<Result<Vec<Row>, ExecError>, tokio_postgres::Error> {
    use futures::TryStreamExt;
    let mut stream = std::pin::pin!(stream?);
    let mut decoder = RowDecoder::default();
    let mut rows = Ok(Vec::new());
    while let Some(row) = stream.try_next().await? {
        if let Ok(decoded) = &mut rows {
            match decoder.decode(&row) {
                Ok(r) => decoded.push(r),
                Err(e) => rows = Err(e),
            }
        }
    }
    Ok(rows)
}

#[async_trait]
impl PgExecutor for PgPool {
    type Transaction = PoolTransaction;

    async fn query(&self, sql: Sql<'_>, params: &[Value]) -> Result<Vec<Row>, ExecError> {
        self.with_retries(sql.lane, sql.repeatable, |lease| self.run_query(lease, sql, params)).await
    }

    async fn execute_script(&self, script: &str) -> Result<(), ExecError> {
        self.with_retries(Lane::Ordinary, false, |mut lease| async move {
            let client = &lease.conn.client;
            let result = self
                .timed(client.cancel_token(), async { client.batch_execute(script).await.map_err(map_error) })
                .await;
            lease.settle(self, result.as_ref().map(|_| ()));
            (result, true)
        })
        .await
    }

    async fn begin(&self) -> Result<PoolTransaction, ExecError> {
        self.begin_in_lane(Lane::Ordinary).await
    }

    /// LISTEN through the process's hub for the pool's session URL
    /// ([`PgPoolBuilder::listen_url`](crate::PgPoolBuilder::listen_url)).
    async fn listen(&self, channels: &[&str]) -> Result<Option<NotificationStream>, ExecError> {
        crate::listen::listen(&self.inner.listen, channels)
    }

    async fn begin_in_lane(&self, lane: Lane) -> Result<PoolTransaction, ExecError> {
        // Nothing is committed by a failed BEGIN, so it is always safe to retry.
        self.with_retries(lane, true, |lease| PoolTransaction::begin(self.clone(), lease)).await
    }
}
