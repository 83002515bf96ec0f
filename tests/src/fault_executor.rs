//! An executor over a real one that panics, once, in the call whose SQL
//! holds a marker: the fault a buggy executor or store path produces, for
//! the tests of what a worker does when a task of its own panics. Every
//! other call goes to the real executor untouched.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use waymark_store::{ExecError, Lane, NotificationStream, PgExecutor, Row, Sql, Value};

/// See the module docs.
#[derive(Debug, Clone)]
pub struct PanicOnce<E> {
    inner: E,
    marker: Arc<Mutex<Option<String>>>,
}

impl<E> PanicOnce<E> {
    /// Wraps `inner`; nothing panics until [`PanicOnce::arm`].
    pub fn new(inner: E) -> Self {
        PanicOnce { inner, marker: Arc::default() }
    }

    /// Panics in the next autocommit query whose SQL contains `marker`.
    pub fn arm(&self, marker: &str) {
        *self.marker.lock().expect("marker") = Some(marker.to_owned());
    }

    /// Whether the armed panic is still to come.
    pub fn armed(&self) -> bool {
        self.marker.lock().expect("marker").is_some()
    }
}

#[async_trait]
impl<E: PgExecutor> PgExecutor for PanicOnce<E> {
    type Transaction = E::Transaction;

    async fn query(&self, sql: Sql<'_>, params: &[Value]) -> Result<Vec<Row>, ExecError> {
        let hit = {
            let mut marker = self.marker.lock().expect("marker");
            let hit = marker.as_deref().is_some_and(|m| sql.text.contains(m));
            if hit {
                *marker = None;
            }
            hit
        };
        if hit {
            panic!("PanicOnce: the armed query panics, as a fault test asked");
        }
        self.inner.query(sql, params).await
    }

    async fn execute_script(&self, script: &str) -> Result<(), ExecError> {
        self.inner.execute_script(script).await
    }

    async fn begin(&self) -> Result<Self::Transaction, ExecError> {
        self.inner.begin().await
    }

    async fn begin_in_lane(&self, lane: Lane) -> Result<Self::Transaction, ExecError> {
        self.inner.begin_in_lane(lane).await
    }

    async fn listen(&self, channels: &[&str]) -> Result<Option<NotificationStream>, ExecError> {
        self.inner.listen(channels).await
    }
}
