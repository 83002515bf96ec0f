//! The pool's builder. Every setting's doc states its default.

use std::time::Duration;

use crate::conninfo::ConnInfo;
use crate::error::PoolError;
use crate::tls::Endpoint;

/// Hard ceiling on `max_size`: a queue that needs more connections than this
/// per process needs batching, not connections.
pub const MAX_POOL_SIZE: u32 = 32;

/// Builds a [`PgPool`](crate::PgPool). Building validates and never connects.
#[derive(Debug, Clone)]
pub struct PgPoolBuilder {
    pub(crate) url: String,
    pub(crate) max_size: u32,
    pub(crate) connect_timeout: Duration,
    pub(crate) acquire_timeout: Duration,
    pub(crate) query_timeout: Option<Duration>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) max_waiting: usize,
    pub(crate) retry_attempts: u32,
    pub(crate) backoff_min: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) breaker_threshold: u32,
    pub(crate) breaker_open_for: Duration,
    pub(crate) application_name: String,
    pub(crate) schema: Option<String>,
    pub(crate) keepalive_idle: Option<Duration>,
    pub(crate) listen_url: Option<String>,
    pub(crate) prepared_statements: bool,
}

impl PgPoolBuilder {
    pub(crate) fn new(url: String) -> Self {
        PgPoolBuilder {
            url,
            max_size: 8,
            connect_timeout: Duration::from_secs(5),
            acquire_timeout: Duration::from_secs(10),
            query_timeout: Some(Duration::from_secs(30)),
            idle_timeout: Some(Duration::from_secs(600)),
            max_waiting: 1024,
            retry_attempts: 3,
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_secs(1),
            breaker_threshold: 5,
            breaker_open_for: Duration::from_secs(2),
            application_name: "waymark".to_owned(),
            schema: None,
            keepalive_idle: Some(Duration::from_secs(30)),
            listen_url: None,
            prepared_statements: false,
        }
    }

    /// Most connections. Defaults to 8; at most [`MAX_POOL_SIZE`].
    pub fn max_size(mut self, n: u32) -> Self {
        self.max_size = n;
        self
    }

    /// How long opening one connection may take. Defaults to 5 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a caller may wait for admission (a free connection) before
    /// it gets a `Saturated` error. Defaults to 10 s.
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// Client-side bound on one statement; past it the call fails with a
    /// timeout, the server is asked to cancel, and the connection is dropped.
    /// `None` disables it. Defaults to 30 s. (Client-side because a
    /// server-side `SET statement_timeout` leaks through a pooler.)
    pub fn query_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.query_timeout = timeout;
        self
    }

    /// Idle connections are closed after this long. Defaults to 10 min.
    pub fn idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Most callers waiting for admission; past it a caller gets `Saturated`
    /// at once. Defaults to 1024.
    pub fn max_waiting(mut self, n: usize) -> Self {
        self.max_waiting = n;
        self
    }

    /// Retries after a retryable failure (see the crate docs for which).
    /// Defaults to 3.
    pub fn retry_attempts(mut self, n: u32) -> Self {
        self.retry_attempts = n;
        self
    }

    /// Bounds of the jittered exponential backoff between retries.
    /// Defaults to 20 ms and 1 s.
    pub fn retry_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = max;
        self
    }

    /// Consecutive connection failures that open the breaker. Defaults to 5.
    pub fn breaker_threshold(mut self, n: u32) -> Self {
        self.breaker_threshold = n;
        self
    }

    /// How long the breaker stays open before a half-open trial.
    /// Defaults to 2 s.
    pub fn breaker_open_for(mut self, d: Duration) -> Self {
        self.breaker_open_for = d;
        self
    }

    /// `application_name` of each connection, unless the URL sets one.
    /// Defaults to `waymark`.
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = name.into();
        self
    }

    /// Sets `search_path` to this schema on every connection. Defaults to none.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// TCP keepalive idle time; `None` disables keepalives. Defaults to 30 s.
    pub fn tcp_keepalive(mut self, idle: Option<Duration>) -> Self {
        self.keepalive_idle = idle;
        self
    }

    /// The URL of a direct session to the same database, for work a pooler
    /// in transaction mode cannot carry (LISTEN). Defaults to the pool's
    /// URL, except that a host named `*-pooler.*` (the convention of hosted
    /// poolers) becomes the same name without `-pooler`.
    pub fn listen_url(mut self, url: impl Into<String>) -> Self {
        self.listen_url = Some(url.into());
        self
    }

    /// Prepare each statement once per connection and reuse it, instead of
    /// binding every call in one round trip with `query_typed` (an unnamed
    /// statement, parsed and planned per call). Defaults to false, because
    /// the default must work behind any pooler: a pooler in transaction mode
    /// (PgBouncer before 1.21, or without `max_prepared_statements`) moves a
    /// session's prepared statements out from under it. On a direct
    /// connection, preparing saves the server's parse and plan per call:
    /// `cargo xtask bench binding` measures both.
    pub fn prepared_statements(mut self, on: bool) -> Self {
        self.prepared_statements = on;
        self
    }

    /// The session URL the built pool will use for LISTEN (see
    /// [`PgPoolBuilder::listen_url`]).
    pub(crate) fn resolved_listen_url(&self) -> String {
        self.listen_url
            .clone()
            .or_else(|| ConnInfo::new(&self.url).without_pooler_host())
            .unwrap_or_else(|| self.url.clone())
    }

    /// Parses `url` with this builder's connection settings applied.
    pub(crate) fn endpoint(&self, url: &str) -> Result<Endpoint, PoolError> {
        let mut endpoint = Endpoint::parse(url)?;
        let config = &mut endpoint.config;
        if config.get_application_name().is_none() {
            config.application_name(&self.application_name);
        }
        config.connect_timeout(self.connect_timeout);
        match self.keepalive_idle {
            Some(idle) => {
                config.keepalives(true).keepalives_idle(idle);
            }
            None => {
                config.keepalives(false);
            }
        }
        Ok(endpoint)
    }

    /// Checks every setting and parses both URLs: what
    /// [`build`](Self::build) makes a pool from.
    pub(crate) fn parts(&self) -> Result<Parts, PoolError> {
        let bad = |msg: String| Err(PoolError::InvalidSetting(msg));
        if self.max_size == 0 || self.max_size > MAX_POOL_SIZE {
            return bad(format!("max_size must be within 1..={MAX_POOL_SIZE}, got {}", self.max_size));
        }
        if self.connect_timeout.is_zero() || self.acquire_timeout.is_zero() {
            return bad("connect_timeout and acquire_timeout must be positive".to_owned());
        }
        if self.query_timeout.is_some_and(|t| t.is_zero()) {
            return bad("query_timeout must be positive (or None to disable it)".to_owned());
        }
        if self.backoff_min > self.backoff_max {
            return bad(format!(
                "retry backoff min {:?} is greater than max {:?}",
                self.backoff_min, self.backoff_max
            ));
        }
        if self.breaker_threshold == 0 {
            return bad("breaker_threshold must be at least 1".to_owned());
        }
        let setup = match &self.schema {
            Some(schema) => {
                Some(waymark_store::protocol::set_search_path_script(schema).ok_or_else(|| {
                    PoolError::InvalidSetting(format!(
                        "schema name {schema:?} must match ^[A-Za-z_][A-Za-z0-9_$]*$"
                    ))
                })?)
            }
            None => None,
        };
        let endpoint = self.endpoint(&self.url)?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(PoolError::NoRuntime);
        }
        let listen_url = self.resolved_listen_url();
        let listen = self.endpoint(&listen_url).map_err(|e| match e {
            PoolError::InvalidUrl(why) => PoolError::InvalidUrl(format!("listen url: {why}")),
            other => other,
        })?;
        Ok(Parts { endpoint, setup, listen_url, listen })
    }
}

/// A builder's checked settings that are not plain values.
pub(crate) struct Parts {
    /// Where the pool's connections go.
    pub(crate) endpoint: Endpoint,
    /// Run on each new connection (the schema's `search_path`).
    pub(crate) setup: Option<String>,
    /// The direct session URL, for LISTEN.
    pub(crate) listen_url: String,
    pub(crate) listen: Endpoint,
}
