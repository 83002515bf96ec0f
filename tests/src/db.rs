//! A place of its own for each test: a fresh schema (cheap) or a fresh
//! database (for code that must own the default schema).

pub use waymark_testing::schema::{admin_client, unique, url_with_database, SHARED_DATABASE};

use crate::cluster::server_url;

/// Drops the database `name` on `server` (ending its sessions) and creates
/// it again, empty; answers its URL. For the demo and the bench, which
/// want a database of their own per run.
pub async fn recreate_database(server: &str, name: &str) -> Result<String, String> {
    let admin = admin_client(server).await;
    // Two calls: a multi-statement string would run as one transaction,
    // which DROP/CREATE DATABASE refuse.
    for sql in [format!("drop database if exists {name} with (force)"), format!("create database {name}")] {
        admin.batch_execute(&sql).await.map_err(|e| format!("{sql}: {e}"))?;
    }
    Ok(url_with_database(server, name))
}

/// The server's value of the setting `name`, as `current_setting` gives it.
pub async fn server_setting(server: &str, name: &str) -> Result<String, String> {
    let row = admin_client(server)
        .await
        .query_one("select current_setting($1)", &[&name])
        .await
        .map_err(|e| format!("reading setting {name}: {e}"))?;
    Ok(row.get(0))
}

/// A fresh, empty schema of waymark-testing's, on the server the tests use
/// (`DATABASE_URL`, else the throwaway cluster; see [`server_url`]).
#[derive(Debug, Clone)]
pub struct TestSchema(pub waymark_testing::TestSchema);

impl TestSchema {
    /// Creates the schema (and the shared database on first use).
    pub async fn new() -> TestSchema {
        TestSchema(waymark_testing::TestSchema::on_server(&server_url()).await)
    }

    /// Drops the schema and everything in it.
    pub async fn drop(self) {
        self.0.drop().await;
    }

    /// Does to running task `id` what its lease running out and a claim by
    /// worker `thief` would, in one write: attempt spent, `thief` holding
    /// it for a minute. One write, so the robbed worker's own recovery can
    /// never take the task back in between (as it could after a bare
    /// expiry, at any poll the notifier happens to send).
    pub async fn steal_lease(&self, id: &str, thief: &str) {
        let sql = format!(
            "update \"{}\".cairnq_tasks set worker_id = $2, attempt = attempt + 1, \
             lease_until_ms = (extract(epoch from now()) * 1000)::bigint + 60000 \
             where id = $1 and status = 'running'",
            self.schema
        );
        let updated =
            admin_client(&self.url).await.execute(&sql, &[&id, &thief]).await.expect("steal the lease");
        assert_eq!(updated, 1, "running task {id} to steal");
    }
}

impl TestSchema {
    /// The rows of `table` in the schema, counted.
    pub async fn count(&self, table: &str) -> i64 {
        let sql = format!("select count(*) from \"{}\".{table}", self.schema);
        admin_client(&self.url).await.query_one(&sql, &[]).await.expect("count").get(0)
    }

    /// Runs `sql` in the schema (its search path), as another client would.
    pub async fn execute(&self, sql: &str) {
        let script = format!("set search_path to \"{}\"; {sql}", self.schema);
        admin_client(&self.url).await.batch_execute(&script).await.expect("execute");
    }
}

impl std::ops::Deref for TestSchema {
    type Target = waymark_testing::TestSchema;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// A fresh, empty database.
#[derive(Debug, Clone)]
pub struct TestDatabase {
    /// URL of the new database.
    pub url: String,
    /// Its name.
    pub name: String,
}

impl TestDatabase {
    /// Creates the database.
    pub async fn new() -> TestDatabase {
        let server = server_url();
        let name = unique("wmdb");
        admin_client(&server)
            .await
            .batch_execute(&format!("create database {name}"))
            .await
            .unwrap_or_else(|e| panic!("creating database {name}: {e}"));
        TestDatabase { url: url_with_database(&server, &name), name }
    }

    /// Drops the database, ending any session still in it.
    pub async fn drop(self) {
        let client = admin_client(&server_url()).await;
        let _ = client.batch_execute(&format!("drop database if exists {} with (force)", self.name)).await;
    }
}

/// The task table's footprint and churn, as the server's statistics give
/// them (`cargo xtask bench soak` samples it every minute).
#[derive(Debug, Clone, Copy, Default)]
pub struct TableHealth {
    /// The heap (with its TOAST and maps), in bytes.
    pub table_bytes: i64,
    /// Every index of the table together, in bytes.
    pub index_bytes: i64,
    pub live_rows: i64,
    pub dead_rows: i64,
    /// Autovacuum runs on the table since the statistics were reset.
    pub autovacuums: i64,
}

/// [`TableHealth`] of `cairnq_tasks` in the installation `client` sees.
pub async fn table_health(client: &tokio_postgres::Client) -> Result<TableHealth, String> {
    let row = client
        .query_one(
            "select pg_table_size(s.relid), pg_indexes_size(s.relid), s.n_live_tup, s.n_dead_tup, \
                    s.autovacuum_count \
               from pg_stat_user_tables s \
              where s.relid = 'cairnq_tasks'::regclass",
            &[],
        )
        .await
        .map_err(|e| format!("reading the task table's statistics: {e}"))?;
    Ok(TableHealth {
        table_bytes: row.get(0),
        index_bytes: row.get(1),
        live_rows: row.get(2),
        dead_rows: row.get(3),
        autovacuums: row.get(4),
    })
}
