//! A transaction that holds its pooled connection (and admission permit)
//! until it ends.

use async_trait::async_trait;
use waymark_store::{ExecError, PgSession, PgTransaction, Row, Sql, Value};

use crate::codec::map_error;
use crate::pool::{Lease, PgPool};
use crate::query::query_on;

/// An open transaction on one pooled connection. Use [`PoolTransaction::client`]
/// for your own statements: they commit or roll back with the store's.
///
/// Statements inside a transaction are never retried. Dropped without
/// `commit`, it rolls back before the connection goes back to the pool; a
/// connection that failed mid-transaction is discarded.
pub struct PoolTransaction {
    pool: PgPool,
    lease: Option<Lease>,
}

impl std::fmt::Debug for PoolTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolTransaction").field("open", &self.lease.is_some()).finish()
    }
}

impl PoolTransaction {
    /// Sends BEGIN; the bool says whether anything reached the server.
    pub(crate) async fn begin(pool: PgPool, mut lease: Lease) -> (Result<Self, ExecError>, bool) {
        let client = &lease.conn.client;
        let result = pool
            .timed(client.cancel_token(), async {
                client.batch_execute("begin isolation level read committed").await.map_err(map_error)
            })
            .await;
        // The breaker's pass (a half-open trial, maybe) is decided by the
        // BEGIN's answer: held for the transaction's life, a trial would
        // fence every other call of the process out until it ended.
        lease.settle(&pool, result.as_ref().map(|_| ()));
        match result {
            Ok(()) => (Ok(PoolTransaction { pool, lease: Some(lease) }), true),
            Err(e) => (Err(e), true),
        }
    }

    /// The connection, inside the transaction.
    pub fn client(&self) -> &tokio_postgres::Client {
        &self.lease.as_ref().expect("a live transaction holds its connection").conn.client
    }

    fn lease(&mut self) -> &mut Lease {
        self.lease.as_mut().expect("a live transaction holds its connection")
    }

    /// Runs `script` on the connection, bounded and counted as any call.
    async fn batch(&mut self, script: &str) -> Result<(), ExecError> {
        let pool = self.pool.clone();
        let lease = self.lease();
        let client = &lease.conn.client;
        let result = pool
            .timed(client.cancel_token(), async { client.batch_execute(script).await.map_err(map_error) })
            .await;
        lease.settle(&pool, result.as_ref().map(|_| ()));
        result
    }

    async fn end(mut self, command: &'static str) -> Result<(), ExecError> {
        let result = self.batch(command).await;
        self.lease = None;
        result
    }
}

#[async_trait]
impl PgSession for PoolTransaction {
    async fn query(&mut self, sql: Sql<'_>, params: &[Value]) -> Result<Vec<Row>, ExecError> {
        let pool = self.pool.clone();
        let lease = self.lease();
        let token = lease.conn.client.cancel_token();
        let result = pool.timed(token, query_on(&mut lease.conn, sql, params)).await;
        // Counted as any call's failure (the breaker hears a lost
        // connection even if the transaction is then dropped); a connection
        // that failed or timed out here is never reused.
        lease.settle(&pool, result.as_ref().map(|_| ()));
        result
    }

    async fn execute_script(&mut self, script: &str) -> Result<(), ExecError> {
        self.batch(script).await
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
        let Some(mut lease) = self.lease.take() else { return };
        match tokio::runtime::Handle::try_current() {
            // Roll back before the connection (and its permit) are released.
            // Not counted toward the breaker: it has no deadline, and a
            // failure heard long after the server came back must not open
            // it again (a statement that failed inside was counted then).
            Ok(handle) => {
                // Broken until the rollback is heard: a runtime shutting
                // down drops the task unrun, and the connection, still
                // inside the transaction, must then go, not back to the pool.
                // (A mark it had already, from a statement that timed out
                // inside, stays.)
                let was_broken = std::mem::replace(&mut lease.conn.broken, true);
                handle.spawn(async move {
                    match lease.conn.client.batch_execute("rollback").await {
                        Ok(()) => lease.conn.broken = was_broken,
                        Err(e) => tracing::warn!(
                            error = %e,
                            "rollback of a dropped transaction failed; discarding the connection"
                        ),
                    }
                });
            }
            // Nothing can roll back here: never reuse a connection still
            // inside a transaction.
            Err(_) => lease.conn.broken = true,
        }
    }
}
