//! A place of its own for each test: a fresh schema (cheap) or a fresh
//! database (for code that must own the default schema).

use rand::Rng;
use tokio_postgres::NoTls;

use crate::cluster::server_url;

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

/// A connection for admin statements on `url`.
pub async fn admin_client(url: &str) -> tokio_postgres::Client {
    let (client, conn) =
        tokio_postgres::connect(url, NoTls).await.unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

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

fn unique(prefix: &str) -> String {
    let n: u64 = rand::thread_rng().gen();
    format!("{prefix}_{n:016x}")
}

/// The shared database that holds the per-test schemas.
pub const SHARED_DATABASE: &str = "waymark_test";

/// A fresh, empty schema in the shared test database.
#[derive(Debug, Clone)]
pub struct TestSchema {
    /// URL of the shared database.
    pub url: String,
    /// The schema's name.
    pub schema: String,
}

impl TestSchema {
    /// Creates the schema (and the shared database on first use).
    pub async fn new() -> TestSchema {
        let server = server_url();
        let admin = admin_client(&server).await;
        let exists = admin
            .query_opt("select 1 from pg_database where datname = $1", &[&SHARED_DATABASE])
            .await
            .expect("checking the shared database");
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
        let url = url_with_database(&server, SHARED_DATABASE);
        let schema = unique("t");
        admin_client(&url)
            .await
            .batch_execute(&format!("create schema {schema}"))
            .await
            .expect("create schema");
        TestSchema { url, schema }
    }

    /// Drops the schema and everything in it.
    pub async fn drop(self) {
        let client = admin_client(&self.url).await;
        let _ = client.batch_execute(&format!("drop schema if exists {} cascade", self.schema)).await;
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
