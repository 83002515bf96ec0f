//! The fault-test harness itself, against real servers: a private cluster
//! that starts, stops, starts again and cleans up after itself, and a
//! PgBouncer that really pools by transaction.

use std::time::Instant;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};
use waymark_tests::cluster::{port_open, server_url};
use waymark_tests::pgbouncer::{host_and_port, PgBouncer};
use waymark_tests::private_cluster::PrivateCluster;

async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// The first column of the first row of `sql`, through the simple query
/// protocol (the one PgBouncer's admin console speaks, and that never
/// depends on a prepared statement surviving between transactions).
async fn value(client: &Client, sql: &str) -> Option<String> {
    let messages = client.simple_query(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    messages.into_iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => Some(row.get(0).map(str::to_owned)),
        _ => None,
    })?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_cluster_starts_stops_starts_again_and_cleans_up() {
    let started = Instant::now();
    let pg = PrivateCluster::builder().max_connections(12).setting("work_mem", "7MB").start("harness");
    eprintln!("private cluster started in {:?}", started.elapsed());
    let port = pg.port();
    let dir = pg.dir().to_owned();
    let url = pg.url("postgres");
    assert!(pg.is_running());
    assert!(dir.join("data/PG_VERSION").exists());

    let client = connect(&url).await.expect("connect to the private cluster");
    let one: i32 = client.query_one("select 1", &[]).await.expect("select 1").get(0);
    assert_eq!(one, 1);
    assert_eq!(value(&client, "show max_connections").await.as_deref(), Some("12"));
    assert_eq!(value(&client, "show work_mem").await.as_deref(), Some("7MB"));
    assert_eq!(value(&client, "show fsync").await.as_deref(), Some("off"));
    client
        .batch_execute("create table marker (v int); insert into marker values (42)")
        .await
        .expect("write a marker");

    let stopping = Instant::now();
    pg.stop();
    eprintln!("private cluster stopped (immediate) in {:?}", stopping.elapsed());
    assert!(!pg.is_running());
    assert!(!port_open(port), "the port is closed while stopped");
    assert!(client.simple_query("select 1").await.is_err(), "the open connection broke");
    assert!(client.is_closed());
    assert!(connect(&url).await.is_err(), "new connections fail while stopped");

    let restarting = Instant::now();
    pg.start_again();
    eprintln!("private cluster started again in {:?}", restarting.elapsed());
    assert!(pg.is_running());
    assert_eq!(pg.port(), port, "same port");
    assert_eq!(pg.url("postgres"), url);
    let client = connect(&url).await.expect("connect after the restart");
    let v: i32 = client.query_one("select v from marker", &[]).await.expect("the marker").get(0);
    assert_eq!(v, 42, "a commit acknowledged before an immediate stop survives it");

    // restart() from running: the crash-and-recover cycle in one call.
    pg.restart();
    let client = connect(&url).await.expect("connect after restart()");
    assert_eq!(value(&client, "select count(*) from marker").await.as_deref(), Some("1"));

    drop(pg);
    assert!(!dir.exists(), "dropping removes {}", dir.display());
    assert!(!port_open(port), "dropping stops the server");
    assert!(client.simple_query("select 1").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_cluster_refuses_connections_past_max_connections() {
    let pg = PrivateCluster::builder().max_connections(5).start("exhaust");
    let url = pg.url("postgres");
    let mut clients = Vec::new();
    for i in 0..5 {
        clients.push(connect(&url).await.unwrap_or_else(|e| panic!("connection {i}: {e}")));
    }
    let err = connect(&url).await.expect_err("a sixth connection is refused");
    assert_eq!(err.code(), Some(&SqlState::TOO_MANY_CONNECTIONS), "{err}");
    drop(clients.pop());
    // The server notices the closed connection asynchronously.
    waymark_tests::until_some(
        std::time::Duration::from_secs(10),
        "a slot freed by a closed connection",
        || async {
            match connect(&url).await {
                Ok(client) => Some(client),
                Err(e) if e.code() == Some(&SqlState::TOO_MANY_CONNECTIONS) => None,
                Err(e) => panic!("a slot freed by a closed connection: {e}"),
            }
        },
    )
    .await;
}

#[test]
fn private_clusters_start_side_by_side() {
    let started = Instant::now();
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| PrivateCluster::start("side-a"));
        let b = s.spawn(|| PrivateCluster::start("side-b"));
        (a.join().expect("side a"), b.join().expect("side b"))
    });
    eprintln!("two private clusters started concurrently in {:?}", started.elapsed());
    assert_ne!(a.port(), b.port());
    assert_ne!(a.dir(), b.dir());
    a.stop();
    assert!(b.is_running(), "stopping one leaves the other running");
    assert!(port_open(b.port()));
}

#[test]
fn a_cluster_whose_owner_died_is_swept_by_the_next_start() {
    let orphan = PrivateCluster::start("orphan");
    let (port, dir) = (orphan.port(), orphan.dir().to_owned());
    // Pretend its owner was killed before it could drop the cluster.
    let mut dead = std::process::Command::new("true").spawn().expect("spawn true");
    let dead_pid = dead.id();
    dead.wait().expect("wait for true");
    std::fs::write(dir.join("owner.pid"), dead_pid.to_string()).expect("rewrite the owner");
    std::mem::forget(orphan);

    let next = PrivateCluster::start("sweeper");
    assert!(!dir.exists(), "the orphan's folder is removed");
    assert!(!port_open(port), "the orphan's server is stopped");
    assert!(next.is_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_in_transaction_mode_shares_one_backend_between_open_clients() {
    let (host, port) = host_and_port(&server_url());
    let started = Instant::now();
    // One server connection: in transaction mode every client's transaction
    // runs on it, in turn; in session mode a second client could not even
    // run a query while the first stays connected.
    let bouncer = PgBouncer::builder().default_pool_size(1).start(&host, port, "transaction");
    eprintln!("pgbouncer started in {:?}", started.elapsed());

    let a = connect(&bouncer.url("postgres")).await.expect("client a through pgbouncer");
    let b = connect(&bouncer.url("postgres")).await.expect("client b through pgbouncer");
    assert_eq!(value(&a, "select 1").await.as_deref(), Some("1"));
    // What waymark-pool sends: query_typed, one round trip, no named
    // prepared statement, so nothing that must survive between transactions.
    for client in [&a, &b, &a] {
        let row =
            client.query_typed("select $1::int4 + 1", &[(&41i32, Type::INT4)]).await.expect("query_typed");
        assert_eq!(row[0].get::<_, i32>(0), 42);
    }

    // Both clients are connected at once and get the same backend.
    let pid_a = value(&a, "select pg_backend_pid()").await;
    let pid_b = value(&b, "select pg_backend_pid()").await;
    assert!(pid_a.is_some());
    assert_eq!(pid_a, pid_b, "two open clients, one backend");

    // Session state set by one client outlives its transaction, on the
    // backend the other client gets next: the classic transaction-pooling leak.
    a.simple_query("set waymark.probe = 'from-a'").await.expect("set");
    assert_eq!(value(&b, "select current_setting('waymark.probe', true)").await.as_deref(), Some("from-a"));

    // And PgBouncer says so itself.
    let admin = connect(&bouncer.url("pgbouncer")).await.expect("admin console");
    let config = admin.simple_query("show config").await.expect("show config");
    let pool_mode = config.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) if row.get(0) == Some("pool_mode") => row.get(1).map(str::to_owned),
        _ => None,
    });
    assert_eq!(pool_mode.as_deref(), Some("transaction"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_in_session_mode_keeps_a_backend_per_client() {
    // The control for the test above: the same probes tell session pooling
    // apart.
    let (host, port) = host_and_port(&server_url());
    let bouncer = PgBouncer::builder().default_pool_size(2).start(&host, port, "session");
    let a = connect(&bouncer.url("postgres")).await.expect("client a through pgbouncer");
    let b = connect(&bouncer.url("postgres")).await.expect("client b through pgbouncer");
    let pid_a = value(&a, "select pg_backend_pid()").await;
    let pid_b = value(&b, "select pg_backend_pid()").await;
    assert_ne!(pid_a, pid_b, "a backend per client");
    a.simple_query("set waymark.probe = 'from-a'").await.expect("set");
    assert_eq!(value(&b, "select current_setting('waymark.probe', true)").await.as_deref(), None);
    assert_eq!(value(&a, "select current_setting('waymark.probe', true)").await.as_deref(), Some("from-a"));
}

#[test]
fn dropping_pgbouncer_kills_it_and_removes_its_folder() {
    let (host, port) = host_and_port(&server_url());
    let bouncer = PgBouncer::start(&host, port, "transaction");
    let (pid, listen) = (bouncer.pid(), bouncer.port());
    assert!(port_open(listen));
    drop(bouncer);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "pgbouncer {pid} is gone");
    assert!(!port_open(listen));
}
