//! The pool and its builder.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use bb8::{CustomizeConnection, RunError};
use bb8_postgres::PostgresConnectionManager;
use tokio_postgres::NoTls;
use waymark_store::{ExecError, ExecErrorKind, PgExecutor, Row, Sql, Value};

use crate::codec::{decode_row, map_error, typed_params};
use crate::transaction::PoolTransaction;

pub(crate) type Manager = PostgresConnectionManager<NoTls>;

/// Why a pool could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The URL did not parse.
    #[error("invalid database url: {0}")]
    InvalidUrl(String),
    /// A setting is out of range.
    #[error("invalid pool setting: {0}")]
    InvalidSetting(String),
}

/// Hard ceiling on `max_size`: a queue that needs more connections than this
/// per process needs batching, not connections.
pub const MAX_POOL_SIZE: u32 = 32;

/// Builds a [`PgPool`].
#[derive(Debug, Clone)]
pub struct PgPoolBuilder {
    url: String,
    max_size: u32,
    connect_timeout: Duration,
    schema: Option<String>,
    application_name: String,
}

impl PgPoolBuilder {
    /// Most connections. Defaults to 8; at most [`MAX_POOL_SIZE`].
    pub fn max_size(mut self, n: u32) -> Self {
        self.max_size = n;
        self
    }

    /// How long to wait for a connection. Defaults to 10 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets `search_path` to this schema on every connection. Defaults to none.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// `application_name` of each connection. Defaults to `waymark`.
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = name.into();
        self
    }

    /// Builds the pool. Does not connect: the first query does.
    pub fn build(self) -> Result<PgPool, PoolError> {
        if self.max_size == 0 || self.max_size > MAX_POOL_SIZE {
            return Err(PoolError::InvalidSetting(format!(
                "max_size must be within 1..={MAX_POOL_SIZE}, got {}",
                self.max_size
            )));
        }
        let set_search_path = match &self.schema {
            Some(schema) => {
                Some(waymark_store::protocol::set_search_path_script(schema).ok_or_else(|| {
                    PoolError::InvalidSetting(format!(
                        "schema name {schema:?} must match ^[A-Za-z_][A-Za-z0-9_$]*$"
                    ))
                })?)
            }
            None => None,
        };
        let mut config: tokio_postgres::Config =
            self.url.parse().map_err(|e: tokio_postgres::Error| PoolError::InvalidUrl(e.to_string()))?;
        if config.get_application_name().is_none() {
            config.application_name(&self.application_name);
        }
        config.connect_timeout(self.connect_timeout);
        let manager = PostgresConnectionManager::new(config, NoTls);
        let pool = bb8::Pool::builder()
            .max_size(self.max_size)
            .connection_timeout(self.connect_timeout)
            .connection_customizer(Box::new(SessionSetup { set_search_path }))
            .build_unchecked(manager);
        Ok(PgPool { pool, schema: self.schema })
    }
}

/// Runs per-connection setup (the schema's `search_path`) once, on connect.
#[derive(Debug)]
struct SessionSetup {
    set_search_path: Option<String>,
}

impl CustomizeConnection<tokio_postgres::Client, tokio_postgres::Error> for SessionSetup {
    fn on_acquire<'a>(
        &'a self,
        client: &'a mut tokio_postgres::Client,
    ) -> Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send + 'a>> {
        Box::pin(async move {
            if let Some(script) = &self.set_search_path {
                client.batch_execute(script).await?;
            }
            Ok(())
        })
    }
}

/// A pool of PostgreSQL connections that implements [`PgExecutor`].
/// Cloning shares the pool.
#[derive(Clone)]
pub struct PgPool {
    pool: bb8::Pool<Manager>,
    schema: Option<String>,
}

impl std::fmt::Debug for PgPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.pool.state();
        f.debug_struct("PgPool")
            .field("connections", &state.connections)
            .field("idle", &state.idle_connections)
            .field("schema", &self.schema)
            .finish()
    }
}

impl PgPool {
    /// A builder for a pool on `url` (a `postgres://` URL or key=value string).
    pub fn builder(url: impl Into<String>) -> PgPoolBuilder {
        PgPoolBuilder {
            url: url.into(),
            max_size: 8,
            connect_timeout: Duration::from_secs(10),
            schema: None,
            application_name: "waymark".to_owned(),
        }
    }

    /// The schema this pool puts on each connection's `search_path`.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    pub(crate) async fn checkout(&self) -> Result<bb8::PooledConnection<'static, Manager>, ExecError> {
        self.pool.get_owned().await.map_err(|e| match e {
            RunError::User(e) => map_error(e),
            RunError::TimedOut => {
                ExecError::new(ExecErrorKind::Timeout, "timed out waiting for a pooled connection")
            }
        })
    }
}

/// Runs one statement on a client. Shared by the pool and its transactions.
pub(crate) async fn query_on(
    client: &tokio_postgres::Client,
    sql: Sql<'_>,
    params: &[Value],
) -> Result<Vec<Row>, ExecError> {
    let typed = typed_params(sql.types, params);
    let refs: Vec<(&(dyn tokio_postgres::types::ToSql + Sync), tokio_postgres::types::Type)> =
        typed.iter().map(|(p, t)| (p as &(dyn tokio_postgres::types::ToSql + Sync), t.clone())).collect();
    let rows = client.query_typed(sql.text, &refs).await.map_err(map_error)?;
    rows.iter().map(decode_row).collect()
}

#[async_trait]
impl PgExecutor for PgPool {
    type Transaction = PoolTransaction;

    async fn query(&self, sql: Sql<'_>, params: &[Value]) -> Result<Vec<Row>, ExecError> {
        let conn = self.checkout().await?;
        query_on(&conn, sql, params).await
    }

    async fn execute_script(&self, script: &str) -> Result<(), ExecError> {
        let conn = self.checkout().await?;
        conn.batch_execute(script).await.map_err(map_error)
    }

    async fn begin(&self) -> Result<PoolTransaction, ExecError> {
        PoolTransaction::begin(self.checkout().await?).await
    }
}
