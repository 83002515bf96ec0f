//! The pool: a bb8 pool of connections with the admission gate, the
//! breaker and the counters around it, and the lease that holds one
//! connection for one call. Making one from its builder is `build.rs`;
//! a call's way through the pool (admission, retries, timeouts) `call.rs`.

mod build;
mod call;

use std::sync::Arc;
use std::time::Duration;

use waymark_store::{ExecError, ExecErrorKind};

use crate::admission::{Gate, Permit};
use crate::breaker::{Breaker, Pass};
use crate::config::PgPoolBuilder;
use crate::manager::Manager;
use crate::stats::{Counters, PoolStats};
use crate::tls::SslMode;

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

    /// The LISTEN hub's connector: direct sessions with the pool's TLS.
    pub(crate) fn listen_connector(&self) -> &waymark_notify::Connector {
        &self.inner.listen
    }
}
