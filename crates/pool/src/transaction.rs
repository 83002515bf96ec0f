//! A transaction that owns its pooled connection.

use async_trait::async_trait;
use waymark_store::{ExecError, PgSession, PgTransaction, Row, Sql, Value};

use crate::codec::map_error;
use crate::pool::{query_on, Manager};

/// An open transaction on one pooled connection. Use [`PoolTransaction::client`]
/// for your own statements: they commit or roll back with the store's.
///
/// Dropped without `commit`, it rolls back before the connection goes back to
/// the pool.
pub struct PoolTransaction {
    conn: Option<bb8::PooledConnection<'static, Manager>>,
}

impl std::fmt::Debug for PoolTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolTransaction").field("open", &self.conn.is_some()).finish()
    }
}

impl PoolTransaction {
    pub(crate) async fn begin(conn: bb8::PooledConnection<'static, Manager>) -> Result<Self, ExecError> {
        conn.batch_execute("begin isolation level read committed").await.map_err(map_error)?;
        Ok(PoolTransaction { conn: Some(conn) })
    }

    /// The connection, inside the transaction.
    pub fn client(&self) -> &tokio_postgres::Client {
        self.conn.as_ref().expect("a live transaction holds its connection")
    }

    async fn end(mut self, command: &str) -> Result<(), ExecError> {
        let conn = self.conn.take().expect("a live transaction holds its connection");
        conn.batch_execute(command).await.map_err(map_error)
    }
}

#[async_trait]
impl PgSession for PoolTransaction {
    async fn query(&mut self, sql: Sql<'_>, params: &[Value]) -> Result<Vec<Row>, ExecError> {
        query_on(self.client(), sql, params).await
    }

    async fn execute_script(&mut self, script: &str) -> Result<(), ExecError> {
        self.client().batch_execute(script).await.map_err(map_error)
    }
}

#[async_trait]
impl PgTransaction for PoolTransaction {
    async fn commit(self) -> Result<(), ExecError> {
        self.end("commit").await
    }

    async fn rollback(self) -> Result<(), ExecError> {
        self.end("rollback").await
    }
}

impl Drop for PoolTransaction {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        // Roll back before the connection can be handed out again; it stays
        // checked out until the rollback has run.
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err(e) = conn.batch_execute("rollback").await {
                        tracing::warn!(error = %e, "rollback of a dropped transaction failed");
                    }
                });
            }
            Err(_) => {
                // Without a runtime nothing can roll back; never hand out a
                // connection that is still inside a transaction.
                tracing::warn!(
                    "transaction dropped outside a tokio runtime; its connection is leaked, not reused"
                );
                std::mem::forget(conn);
            }
        }
    }
}
