//! The connect sequence of protocol v1 on a real PostgreSQL: schema creation,
//! the schema guard, the migration ledger under concurrency, and the protocol
//! version check.

use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, Error, Store};
use waymark_tests::db::admin_client;
use waymark_tests::{TestDatabase, TestSchema};

/// cairnq's ten migration files and waymark's ledger files.
fn all_files() -> usize {
    10 + waymark_protocol::ledger_migrations().len()
}

fn pool(url: &str, schema: Option<&str>) -> PgPool {
    let builder = PgPool::builder(url).max_size(4);
    match schema {
        Some(s) => builder.schema(s),
        None => builder,
    }
    .build()
    .expect("pool")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_creates_the_schema_and_installs_into_it() {
    let db = TestDatabase::new().await;
    let store = Store::connect(pool(&db.url, Some("Tenant_A")), ConnectOptions::new().schema("Tenant_A"))
        .await
        .expect("connect");
    let admin = admin_client(&db.url).await;
    let row = admin
        .query_one("select count(*) from \"Tenant_A\".cairnq_migrations", &[])
        .await
        .expect("ledger in the schema");
    assert_eq!(row.get::<_, i64>(0), 10);
    let meta = admin
        .query_one("select value from \"Tenant_A\".cairnq_meta where key = 'schema_version'", &[])
        .await
        .expect("meta");
    assert_eq!(meta.get::<_, String>(0), "10");
    let public =
        admin.query_opt("select to_regclass('public.cairnq_tasks')::text", &[]).await.expect("query");
    assert_eq!(public.and_then(|r| r.get::<_, Option<String>>(0)), None, "nothing installed in public");
    drop(store);
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_schema_name_is_refused_before_any_io() {
    for bad in ["1abc", "a-b", "x\"; drop table t; --", ""] {
        let store = Store::connect(
            pool("postgres://nobody@127.0.0.1:1/none", None),
            ConnectOptions::new().schema(bad),
        );
        match store.await {
            Err(Error::InvalidArgument(msg)) => {
                assert!(msg.contains("must match ^[A-Za-z_][A-Za-z0-9_$]*$"), "{msg}")
            }
            other => panic!("{bad:?}: expected InvalidArgument, got {other:?}"),
        }
        let built = PgPool::builder("postgres://x@127.0.0.1/db").schema(bad).build();
        assert!(built.is_err(), "the pool refuses {bad:?} too");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_guard_refuses_a_split_installation() {
    let installed = TestSchema::new().await;
    Store::connect(
        pool(&installed.url, Some(&installed.schema)),
        ConnectOptions::new().schema(&installed.schema),
    )
    .await
    .expect("first installation");

    // Asked for one schema while connections resolve to another.
    let elsewhere = TestSchema::new().await;
    let err = Store::connect(
        pool(&elsewhere.url, Some(&elsewhere.schema)),
        ConnectOptions::new().schema(&installed.schema),
    )
    .await
    .expect_err("mismatch");
    assert!(matches!(err, Error::SchemaMismatch(_)), "{err}");
    assert!(err.to_string().contains(&installed.schema), "{err}");

    // No schema asked, none installed here, one installed elsewhere.
    let err = Store::connect(pool(&elsewhere.url, Some(&elsewhere.schema)), ConnectOptions::default())
        .await
        .expect_err("installation elsewhere");
    assert!(matches!(err, Error::SchemaMismatch(_)), "{err}");
    assert!(err.to_string().contains(&installed.schema), "names where it found one: {err}");

    // A search_path that names nothing that exists.
    let err = Store::connect(pool(&elsewhere.url, Some("no_such_schema_x")), ConnectOptions::default())
        .await
        .expect_err("no current schema");
    assert!(err.to_string().contains("names no existing schema"), "{err}");

    installed.drop().await;
    elsewhere.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrators_apply_each_file_once() {
    let db = TestDatabase::new().await;
    let runs = (0..4).map(|_| {
        let url = db.url.clone();
        tokio::spawn(async move { Store::new(pool(&url, None)).migrate().await })
    });
    let reports: Vec<_> = futures::future::join_all(runs)
        .await
        .into_iter()
        .map(|r| r.expect("join").expect("migrate"))
        .collect();
    let applied: usize = reports.iter().map(|r| r.applied.len()).sum();
    assert_eq!(applied, all_files(), "each file applied exactly once across migrators: {reports:?}");
    let admin = admin_client(&db.url).await;
    let n: i64 = admin.query_one("select count(*) from cairnq_migrations", &[]).await.expect("count").get(0);
    assert_eq!(n, 10, "cairnq's ledger holds cairnq's files only");
    let n: i64 = admin.query_one("select count(*) from waymark_migrations", &[]).await.expect("count").get(0);
    assert_eq!(n as usize, waymark_protocol::ledger_migrations().len(), "waymark's in its own");
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_migration_names_the_file_and_commits_nothing_of_it() {
    let db = TestDatabase::new().await;
    let admin = admin_client(&db.url).await;
    // A table in the way of 0001's index makes that migration fail.
    admin.batch_execute("create table cairnq_tasks (id text)").await.expect("blocker");
    let err = Store::new(pool(&db.url, None)).migrate().await.expect_err("must fail");
    let text = err.to_string();
    assert!(text.starts_with("applying migration 0001_init.sql: "), "{text}");
    assert!(err.sqlstate().is_some(), "keeps the sqlstate: {text}");
    let n: i64 = admin.query_one("select count(*) from cairnq_migrations", &[]).await.expect("count").get(0);
    assert_eq!(n, 0, "the failed file is not recorded");
    let meta = admin.query_opt("select to_regclass('cairnq_meta')::text", &[]).await.expect("meta");
    assert_eq!(meta.and_then(|r| r.get::<_, Option<String>>(0)), None, "nothing of 0001 committed");
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_protocol_version_is_refused() {
    let db = TestDatabase::new().await;
    Store::connect(pool(&db.url, None), ConnectOptions::default()).await.expect("install");
    let admin = admin_client(&db.url).await;
    admin
        .batch_execute("update cairnq_meta set value = '2' where key = 'protocol_version'")
        .await
        .expect("bump");
    match Store::connect(pool(&db.url, None), ConnectOptions::default()).await {
        Err(Error::ProtocolVersionMismatch { found: 2, expected: 1 }) => {}
        other => panic!("expected a mismatch, got {other:?}"),
    }
    admin.batch_execute("delete from cairnq_meta where key = 'protocol_version'").await.expect("remove");
    match Store::connect(pool(&db.url, None), ConnectOptions::new().migrate(false)).await {
        Err(e @ Error::ProtocolVersionMismatch { found: 0, .. }) => {
            assert_eq!(e.to_string(), "protocol version mismatch: the database speaks 0, waymark speaks 1")
        }
        other => panic!("a missing row reads as 0, got {other:?}"),
    }
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_status_reads_a_fresh_database_as_all_pending() {
    let db = TestDatabase::new().await;
    let store = Store::new(pool(&db.url, None));
    let status = store.migration_status().await.expect("status");
    assert_eq!(status.len(), all_files());
    assert!(status.iter().all(|m| m.applied_at_ms.is_none()));
    let admin = admin_client(&db.url).await;
    for ledger in ["cairnq_migrations", "waymark_migrations"] {
        let sql = format!("select to_regclass('{ledger}')::text");
        let found = admin.query_opt(&sql, &[]).await.expect("q");
        assert_eq!(found.and_then(|r| r.get::<_, Option<String>>(0)), None, "status changes nothing");
    }
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_that_waits_too_long_names_itself_and_commits_nothing() {
    use std::time::{Duration, Instant};
    let db = TestDatabase::new().await;
    // One connection, so the leak check below sees the one that migrated.
    let one = PgPool::builder(&db.url).max_size(1).build().expect("pool");
    let store = Store::connect(one, ConnectOptions::default()).await.expect("connect");

    // Another session holds the ledger, like a migrator that hangs.
    let holder = admin_client(&db.url).await;
    holder.batch_execute("begin; lock table cairnq_migrations in exclusive mode").await.expect("hold");

    let started = Instant::now();
    let bounded =
        |options: ConnectOptions| Store::with_options(store.executor().clone(), options).expect("store");
    let lock_bound = bounded(ConnectOptions::new().migration_lock_timeout(Duration::from_millis(200)));
    match lock_bound.migrate().await {
        Err(e @ Error::MigrationTimeout { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("0001_init.sql") && msg.contains("200ms") && msg.contains("lock"), "{msg}");
        }
        other => panic!("expected MigrationTimeout, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5), "bounded: {:?}", started.elapsed());

    // A statement bound shorter than the lock bound fires first and says so.
    let statement_bound = bounded(
        ConnectOptions::new()
            .migration_lock_timeout(Duration::from_secs(60))
            .migration_statement_timeout(Duration::from_millis(200)),
    );
    match statement_bound.migrate().await {
        Err(Error::MigrationTimeout { name, waited_for_lock, limit }) => {
            assert_eq!((name.as_str(), waited_for_lock, limit.as_str()), ("0001_init.sql", false, "200ms"));
        }
        other => panic!("expected MigrationTimeout, got {other:?}"),
    }

    // Released: migrate goes through, and the ledger is as it was.
    holder.batch_execute("commit").await.expect("release");
    let report = store.migrate().await.expect("migrate after release");
    assert_eq!((report.applied.len(), report.skipped), (0, all_files()));
    use waymark_store::PgExecutor;
    let tx = store.executor().begin().await.expect("begin");
    let row = tx
        .client()
        .query_one("select current_setting('lock_timeout'), current_setting('statement_timeout')", &[])
        .await
        .expect("settings");
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, String>(1)),
        ("0".into(), "0".into()),
        "no bound leaked"
    );
    db.drop().await;
}
