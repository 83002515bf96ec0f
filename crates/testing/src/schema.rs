//! A schema of its own for each test, in one shared database of the server.

use rand::Rng;
use tokio_postgres::NoTls;
use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, Store};

/// The database, on the test server, that holds every test's schema.
pub const SHARED_DATABASE: &str = "waymark_test";

/// A fresh, empty schema in [`SHARED_DATABASE`] on a test server. Tests
/// that each take one run side by side without seeing each other's tasks.
#[derive(Debug, Clone)]
pub struct TestSchema {
    /// URL of the shared database.
    pub url: String,
    /// The schema's name.
    pub schema: String,
}

impl TestSchema {
    /// A schema on the server `DATABASE_URL` names (a user who may create
    /// databases and schemas). Panics, saying so, when it is not set.
    pub async fn new() -> TestSchema {
        match std::env::var("DATABASE_URL") {
            Ok(url) if !url.is_empty() => TestSchema::on_server(&url).await,
            _ => panic!(
                "waymark-testing: set DATABASE_URL to a PostgreSQL server the tests may create \
                 schemas on (for example postgres://postgres@127.0.0.1:5432/postgres)"
            ),
        }
    }

    /// A schema on the server of `server_url` (its database part is
    /// replaced by [`SHARED_DATABASE`], created on first use).
    pub async fn on_server(server_url: &str) -> TestSchema {
        let admin = admin_client(server_url).await;
        let exists = admin
            .query_opt("select 1 from pg_database where datname = $1", &[&SHARED_DATABASE])
            .await
            .expect("checking the shared test database");
        if exists.is_none() {
            if let Err(e) = admin.batch_execute(&format!("create database {SHARED_DATABASE}")).await {
                // Another test created it first.
                let code = e.code().map(|c| c.code().to_owned());
                assert!(
                    matches!(code.as_deref(), Some("42P04") | Some("23505")),
                    "creating {SHARED_DATABASE}: {e}"
                );
            }
        }
        let url = url_with_database(server_url, SHARED_DATABASE);
        let schema = unique("t");
        admin_client(&url)
            .await
            .batch_execute(&format!("create schema {schema}"))
            .await
            .expect("create schema");
        TestSchema { url, schema }
    }

    /// A store on the built-in pool, connected (migrated) in this schema.
    pub async fn pool_store(&self) -> Store<PgPool> {
        let pool = PgPool::builder(&self.url).max_size(4).schema(&self.schema).build().expect("pool");
        Store::connect(pool, ConnectOptions::new().schema(&self.schema)).await.expect("connect")
    }

    /// Drops the schema and everything in it.
    pub async fn drop(self) {
        let client = admin_client(&self.url).await;
        let _ = client.batch_execute(&format!("drop schema if exists {} cascade", self.schema)).await;
    }
}

/// Replaces the database name in a `postgres://` URL.
pub fn url_with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[scheme_end..].find('/').map(|i| scheme_end + i);
    let host = path_start.map_or(base, |i| &base[..i]);
    match query {
        Some(q) => format!("{host}/{database}?{q}"),
        None => format!("{host}/{database}"),
    }
}

/// A connection for admin statements on `url` (no TLS: a test server).
pub async fn admin_client(url: &str) -> tokio_postgres::Client {
    let (client, conn) =
        tokio_postgres::connect(url, NoTls).await.unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// `prefix` and 64 random bits: a name no other test picks.
pub fn unique(prefix: &str) -> String {
    let n: u64 = rand::thread_rng().gen();
    format!("{prefix}_{n:016x}")
}

#[cfg(test)]
mod tests {
    use super::url_with_database;

    #[test]
    fn database_is_replaced_in_urls() {
        assert_eq!(url_with_database("postgres://u@h:1/postgres", "x"), "postgres://u@h:1/x");
        assert_eq!(url_with_database("postgres://u@h:1", "x"), "postgres://u@h:1/x");
        assert_eq!(
            url_with_database("postgres://u@h/db?sslmode=disable", "x"),
            "postgres://u@h/x?sslmode=disable"
        );
    }
}
