//! The pool as the store's executor.

use async_trait::async_trait;
use waymark_store::{ExecError, Lane, NotificationStream, PgExecutor, Row, Sql, Value};

use crate::codec::map_error;
use crate::pool::PgPool;
use crate::transaction::PoolTransaction;

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
        crate::listen::listen(self.listen_connector(), channels)
    }

    async fn begin_in_lane(&self, lane: Lane) -> Result<PoolTransaction, ExecError> {
        // Nothing is committed by a failed BEGIN, so it is always safe to retry.
        self.with_retries(lane, true, |lease| PoolTransaction::begin(self.clone(), lease)).await
    }
}
