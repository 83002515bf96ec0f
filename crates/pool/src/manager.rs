//! The bb8 connection manager: bb8-postgres underneath, plus a `broken` mark
//! so that a connection whose socket failed or whose query timed out is
//! dropped when it is returned, never handed out again.

use bb8::ManageConnection;
use bb8_postgres::PostgresConnectionManager;
use std::collections::HashMap;

use tokio_postgres::{Client, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::tls::Endpoint;

/// A pooled connection.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) client: Client,
    /// Set when the connection must not be reused.
    pub(crate) broken: bool,
    /// Statements prepared on this connection, by SQL text, when the pool
    /// prepares statements; `None` binds each call with `query_typed`.
    pub(crate) statements: Option<HashMap<String, Statement>>,
}

#[derive(Debug)]
pub(crate) struct Manager {
    inner: PostgresConnectionManager<MakeRustlsConnect>,
    /// Run once on each new connection (the schema's `search_path`).
    setup: Option<String>,
    prepared_statements: bool,
}

impl Manager {
    pub(crate) fn new(endpoint: Endpoint, setup: Option<String>, prepared_statements: bool) -> Self {
        Manager {
            inner: PostgresConnectionManager::new(endpoint.config, endpoint.tls),
            setup,
            prepared_statements,
        }
    }
}

impl ManageConnection for Manager {
    type Connection = Conn;
    type Error = tokio_postgres::Error;

    async fn connect(&self) -> Result<Conn, tokio_postgres::Error> {
        let client = self.inner.connect().await?;
        if let Some(setup) = &self.setup {
            client.batch_execute(setup).await?;
        }
        Ok(Conn { client, broken: false, statements: self.prepared_statements.then(HashMap::new) })
    }

    async fn is_valid(&self, conn: &mut Conn) -> Result<(), tokio_postgres::Error> {
        conn.client.simple_query("").await.map(|_| ())
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.broken || conn.client.is_closed()
    }
}
