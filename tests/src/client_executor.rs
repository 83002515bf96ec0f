//! A second [`PgExecutor`], over one bare `tokio_postgres::Client`, written
//! here to prove the seam is open: the store needs nothing from waymark-pool's
//! pool, only these few dozen lines.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio_postgres::{Client, NoTls};
use waymark_pool::codec::{decode_rows, map_error, typed_params};
use waymark_store::{ExecError, PgExecutor, PgSession, PgTransaction, Row, Sql, Value};

/// One connection shared by every call; a transaction holds it exclusively.
#[derive(Debug, Clone)]
pub struct ClientExecutor {
    client: Arc<Mutex<Client>>,
}

impl ClientExecutor {
    /// Connects to `url`; with `schema`, sets `search_path` to it.
    pub async fn connect(url: &str, schema: Option<&str>) -> Result<Self, ExecError> {
        let (client, conn) = tokio_postgres::connect(url, NoTls).await.map_err(map_error)?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        if let Some(schema) = schema {
            let script = waymark_store::protocol::set_search_path_script(schema)
                .expect("test schemas have valid names");
            client.batch_execute(&script).await.map_err(map_error)?;
        }
        Ok(ClientExecutor { client: Arc::new(Mutex::new(client)) })
    }
}

async fn query(client: &Client, sql: Sql<'_>, params: &[Value]) -> Result<Vec<Row>, ExecError> {
    let typed = typed_params(sql.types, params);
    let refs: Vec<_> =
        typed.iter().map(|(p, t)| (p as &(dyn tokio_postgres::types::ToSql + Sync), t.clone())).collect();
    let rows = client.query_typed(sql.text, &refs).await.map_err(map_error)?;
    decode_rows(&rows)
}

#[async_trait]
impl PgExecutor for ClientExecutor {
    type Transaction = ClientTransaction;

    async fn query(&self, sql: Sql<'_>, params: &[Value]) -> Result<Vec<Row>, ExecError> {
        query(&*self.client.lock().await, sql, params).await
    }

    async fn execute_script(&self, script: &str) -> Result<(), ExecError> {
        self.client.lock().await.batch_execute(script).await.map_err(map_error)
    }

    async fn begin(&self) -> Result<ClientTransaction, ExecError> {
        let guard = self.client.clone().lock_owned().await;
        guard.batch_execute("begin").await.map_err(map_error)?;
        Ok(ClientTransaction { guard: Some(guard) })
    }
}

/// A transaction holding the shared client until it ends.
#[derive(Debug)]
pub struct ClientTransaction {
    guard: Option<OwnedMutexGuard<Client>>,
}

impl ClientTransaction {
    /// The client, inside the transaction.
    pub fn client(&self) -> &Client {
        self.guard.as_ref().expect("open transaction")
    }

    async fn end(mut self, command: &str) -> Result<(), ExecError> {
        let guard = self.guard.take().expect("open transaction");
        guard.batch_execute(command).await.map_err(map_error)
    }
}

#[async_trait]
impl PgSession for ClientTransaction {
    async fn query(&mut self, sql: Sql<'_>, params: &[Value]) -> Result<Vec<Row>, ExecError> {
        query(self.client(), sql, params).await
    }

    async fn execute_script(&mut self, script: &str) -> Result<(), ExecError> {
        self.client().batch_execute(script).await.map_err(map_error)
    }
}

#[async_trait]
impl PgTransaction for ClientTransaction {
    async fn commit(self) -> Result<(), ExecError> {
        self.end("commit").await
    }

    async fn rollback(self) -> Result<(), ExecError> {
        self.end("rollback").await
    }
}

impl Drop for ClientTransaction {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            // The lock is released only after the rollback ran.
            tokio::spawn(async move {
                let _ = guard.batch_execute("rollback").await;
            });
        }
    }
}
