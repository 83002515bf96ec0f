//! A call's way through the pool: admission, the breaker's pass, a
//! connection, the statement under the query timeout, and retries where
//! they are safe.

use std::time::{Duration, Instant};

use bb8::{ManageConnection, RunError};
use rand::Rng;
use waymark_store::{ExecError, ExecErrorKind, Lane, Row, Sql, Value};

use super::{Lease, PgPool, Pooled};
use crate::admission::Refusal;
use crate::codec::map_error;
use crate::query::query_on;
use crate::stats::Counters;

impl PgPool {
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

    pub(crate) async fn run_query(
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
