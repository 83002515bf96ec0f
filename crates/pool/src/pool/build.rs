//! Making a pool from its builder's checked settings.

use std::sync::Arc;

use super::{Inner, PgPool};
use crate::admission::Gate;
use crate::breaker::Breaker;
use crate::config::{Parts, PgPoolBuilder};
use crate::error::PoolError;
use crate::manager::Manager;
use crate::stats::Counters;

impl PgPoolBuilder {
    /// Builds the pool. Does not connect: the first call does.
    ///
    /// A pool belongs to the runtime it is built in: its idle reaper runs
    /// there, and each connection is driven by the runtime of the call that
    /// opened it. Build it inside the runtime that uses it, and one per
    /// runtime if a program has several: when a runtime ends, the
    /// connections it drove close (the pool notices and opens new ones),
    /// and a pool whose own runtime ended closes idle connections no more.
    /// LISTEN is not affected: its hubs run on a thread of their own.
    pub fn build(self) -> Result<PgPool, PoolError> {
        let parts = self.parts()?;
        Ok(PgPool::from_parts(self, parts))
    }
}

impl PgPool {
    fn from_parts(b: PgPoolBuilder, parts: Parts) -> Self {
        let Parts { endpoint, setup, listen_url, listen } = parts;
        let pool = bb8::Pool::builder()
            .max_size(b.max_size)
            .connection_timeout(b.connect_timeout)
            .idle_timeout(b.idle_timeout)
            // Fail a connect at once (the breaker and our retries decide);
            // bb8's own retry loop would hide a dead server for the whole
            // connection timeout.
            .retry_connection(false)
            // No ping per checkout (a round trip on every call): a socket the
            // server closed is seen by `is_closed` in `checkout`, and a
            // statement that fails on a dead connection is retried where
            // that is safe.
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Outside a runtime a clear error, not tokio's panic (bb8 spawns its
    /// reaper where the pool is built).
    #[test]
    fn a_pool_built_outside_a_runtime_is_refused() {
        let err = PgPool::builder("postgres://u@db/app").build().expect_err("no runtime");
        assert!(matches!(err, PoolError::NoRuntime), "{err}");
        assert!(err.to_string().contains("inside a tokio runtime"), "{err}");
    }

    #[tokio::test]
    async fn the_listen_url_is_the_direct_host_behind_a_pooler_or_as_given() {
        let pooled = PgPool::builder("postgres://u@ep-1-pooler.eu.example.tech/db?sslmode=require")
            .build()
            .expect("pool");
        assert_eq!(pooled.listen_url(), "postgres://u@ep-1.eu.example.tech/db?sslmode=require");
        let explicit = PgPool::builder("postgres://u@pgbouncer:6432/db")
            .listen_url("postgres://u@primary:5432/db")
            .build()
            .expect("pool");
        assert_eq!(explicit.listen_url(), "postgres://u@primary:5432/db");
        let plain = PgPool::builder("postgres://u@db/app").build().expect("pool");
        assert_eq!(plain.listen_url(), "postgres://u@db/app");
        let bad =
            PgPool::builder("postgres://u@db/app").listen_url("postgres://u@db/app?sslmode=bogus").build();
        assert!(bad.unwrap_err().to_string().contains("listen url"));
    }
}
