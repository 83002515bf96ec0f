//! The built-in pool under the failures production databases produce, on a
//! real PostgreSQL: killed backends, capacity limits, slow queries, bursts,
//! lock contention.

use std::time::{Duration, Instant};

use futures::FutureExt;
use serde_json::json;
use waymark_pool::{BreakerState, PgPool};
use waymark_store::{ExecErrorKind, Lane, NewTask, PgExecutor, Sql, Store, Value};
use waymark_tests::cluster::server_url;
use waymark_tests::db::admin_client;
use waymark_tests::{eventually, pool_store, TestSchema};

fn sql(text: &str, lane: Lane, repeatable: bool) -> Sql<'_> {
    Sql { text, types: &[], lane, repeatable }
}

async fn backend_pid(pool: &PgPool) -> i32 {
    let rows =
        pool.query(sql("select pg_backend_pid() as pid", Lane::Ordinary, true), &[]).await.expect("pid");
    match rows[0].get("pid") {
        Some(Value::Int4(pid)) => *pid,
        other => panic!("pid: {other:?}"),
    }
}

/// Kills backend `pid` once it is running its `pg_sleep`.
async fn kill_while_sleeping(pid: i32) {
    let admin = admin_client(&server_url()).await;
    eventually(Duration::from_secs(10), "the backend inside its pg_sleep", || async {
        let q = "select count(*) from pg_stat_activity where pid = $1 and state = 'active' and query like '%pg_sleep%'";
        admin.query_one(q, &[&pid]).await.expect("activity").get::<_, i64>(0) == 1
    })
    .await;
    admin.execute("select pg_terminate_backend($1)", &[&pid]).await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_backend_is_replaced_and_the_call_retried() {
    let pool = PgPool::builder(server_url()).max_size(1).build().expect("pool");
    let old = backend_pid(&pool).await;

    // Kill the backend while a repeatable call runs on it (a sleep long
    // enough for a loaded machine's killer to find it).
    let killer = tokio::spawn(kill_while_sleeping(old));
    let started = Instant::now();
    pool.query(sql("select pg_sleep(2)", Lane::Ordinary, true), &[])
        .await
        .expect("retried on a new connection");
    killer.await.expect("killer");
    let recovered_in = started.elapsed();

    let new = backend_pid(&pool).await;
    assert_ne!(new, old, "the dead connection was not reused");
    let stats = pool.stats();
    assert!(stats.retries >= 1 && stats.connection_errors >= 1, "{stats:?}");
    assert_eq!(stats.breaker, BreakerState::Closed);
    println!(
        "killed backend: call completed {recovered_in:?} after it started (2 s of it is the retried sleep)"
    );

    // A statement that is not safe to repeat is not resent: its error surfaces.
    let pid = backend_pid(&pool).await;
    let killer = tokio::spawn(kill_while_sleeping(pid));
    let err =
        pool.query(sql("select pg_sleep(2)", Lane::Ordinary, false), &[]).await.expect_err("not retried");
    killer.await.expect("killer");
    assert_eq!(err.kind(), ExecErrorKind::Connection, "{err}");
    assert_ne!(backend_pid(&pool).await, pid, "and the dead connection is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_at_its_connection_limit_is_capacity_not_an_outage() {
    let admin = admin_client(&server_url()).await;
    let role = format!("wm_cap_{}", std::process::id());
    admin
        .batch_execute(&format!("drop role if exists {role}; create role {role} login connection limit 1"))
        .await
        .expect("role");
    let url = server_url().replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    let (holder, conn) =
        tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("hold the one slot");
    let driver = tokio::spawn(conn);

    let pool = PgPool::builder(&url).max_size(2).breaker_threshold(2).build().expect("pool");
    for _ in 0..5 {
        let err = pool.query(sql("select 1", Lane::Ordinary, true), &[]).await.expect_err("no slot");
        assert_eq!(err.kind(), ExecErrorKind::Capacity, "{err}");
        assert_eq!(err.sqlstate(), Some("53300"), "{err}");
    }
    let stats = pool.stats();
    assert_eq!(stats.capacity_errors, 5, "{stats:?}");
    assert_eq!(stats.breaker, BreakerState::Closed, "capacity never opens the breaker");

    let sessions_of = |role: String| {
        let admin = &admin;
        async move {
            let q = "select count(*) from pg_stat_activity where usename = $1";
            admin.query_one(q, &[&role]).await.expect("activity").get::<_, i64>(0)
        }
    };
    drop(holder);
    driver.abort();
    eventually(Duration::from_secs(10), "the held slot free", || sessions_of(role.clone()).map(|n| n == 0))
        .await;
    // The server frees the slot a moment after the session leaves
    // pg_stat_activity: capacity may answer until then.
    eventually(Duration::from_secs(10), "a slot free again", || async {
        match pool.query(sql("select 1", Lane::Ordinary, true), &[]).await {
            Ok(_) => true,
            Err(e) if e.kind() == ExecErrorKind::Capacity => false,
            Err(e) => panic!("a slot free again: {e}"),
        }
    })
    .await;
    drop(pool);
    eventually(Duration::from_secs(10), "the pool's session gone", || {
        sessions_of(role.clone()).map(|n| n == 0)
    })
    .await;
    let _ = admin.batch_execute(&format!("drop role if exists {role}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_past_its_timeout_fails_and_its_connection_is_dropped() {
    let pool = PgPool::builder(server_url())
        .max_size(1)
        // Long enough that a loaded machine answers the pid query within it.
        .query_timeout(Some(Duration::from_secs(1)))
        .build()
        .expect("pool");
    let pid = backend_pid(&pool).await;
    let started = Instant::now();
    let err = pool.query(sql("select pg_sleep(10)", Lane::Ordinary, true), &[]).await.expect_err("timeout");
    let took = started.elapsed();
    assert_eq!(err.kind(), ExecErrorKind::Timeout, "{err}");
    assert!(took < Duration::from_secs(4), "timed out in {took:?}");
    assert_ne!(backend_pid(&pool).await, pid, "the connection was not reused mid-query");
    assert_eq!(pool.stats().timeouts, 1);
    assert_eq!(pool.stats().retries, 0, "a timeout is not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_callers_on_four_connections_are_bounded() {
    let pool = PgPool::builder(server_url())
        .max_size(4)
        .max_waiting(100)
        .acquire_timeout(Duration::from_secs(20))
        .build()
        .expect("pool");
    let calls = (0..1000).map(|_| {
        let pool = pool.clone();
        tokio::spawn(async move { pool.query(sql("select pg_sleep(0.01)", Lane::Ordinary, true), &[]).await })
    });
    let results = futures::future::join_all(calls).await;
    let (mut ok, mut saturated) = (0u64, 0u64);
    for r in results {
        match r.expect("join") {
            Ok(_) => ok += 1,
            Err(e) if e.kind() == ExecErrorKind::Saturated => saturated += 1,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    let stats = pool.stats();
    println!("1000 callers on 4 connections: {ok} served, {saturated} saturated, {stats:?}");
    assert_eq!(ok + saturated, 1000);
    assert!(saturated > 0 && ok >= 104, "ok {ok}, saturated {saturated}");
    assert_eq!(stats.saturated, saturated);
    assert_eq!(stats.acquires, ok);
    assert!(stats.peak_waiting <= 100 && stats.peak_in_use <= 4, "{stats:?}");
    assert_eq!((stats.in_use, stats.waiting), (0, 0), "everything released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn critical_work_keeps_its_latency_under_an_ordinary_burst() {
    let pool = PgPool::builder(server_url())
        .max_size(2)
        .max_waiting(1000)
        .acquire_timeout(Duration::from_secs(60))
        .build()
        .expect("pool");
    backend_pid(&pool).await;
    let burst: Vec<_> = (0..200)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.query(sql("select pg_sleep(0.01)", Lane::Ordinary, false), &[]).await.expect("ordinary")
            })
        })
        .collect();
    eventually(Duration::from_secs(10), "150 callers waiting", || async { pool.stats().waiting >= 150 })
        .await;
    // One ordinary call and a series of critical calls join the queue now.
    let started = Instant::now();
    let ordinary = {
        let pool = pool.clone();
        tokio::spawn(async move {
            pool.query(sql("select 1", Lane::Ordinary, true), &[]).await.expect("late ordinary");
            started.elapsed()
        })
    };
    let mut critical = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        pool.query(sql("select 1", Lane::Critical, true), &[]).await.expect("critical");
        critical.push(t.elapsed());
    }
    let ordinary_wait = ordinary.await.expect("join");
    for b in burst {
        b.await.expect("join");
    }
    let (total, worst) =
        (critical.iter().sum::<Duration>(), critical.iter().max().copied().unwrap_or_default());
    println!(
        "critical calls: {total:?} for 10, worst {worst:?}; an ordinary call queued at the same time waited {ordinary_wait:?}"
    );
    // The ten together: in one queue, the first alone would wait behind
    // the burst as long as the ordinary call; a stalled moment on a loaded
    // machine adds far less than that.
    assert!(
        total * 2 < ordinary_wait,
        "critical calls took {total:?} in all, not far below the ordinary wait {ordinary_wait:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_submits_behind_a_held_key_lock_time_out_and_commit_nothing() {
    let schema = TestSchema::new().await;
    let options = waymark_store::ConnectOptions::new().lock_timeout(Duration::from_millis(200));
    let store = Store::with_options(pool_store(&schema).await.into_executor(), options).expect("store");
    let holder = admin_client(&schema.url).await;
    holder
        .batch_execute("begin; select pg_advisory_xact_lock(hashtextextended('K', 0))")
        .await
        .expect("hold the key lock");

    let submit = || store.submit(NewTask::new("x", json!({})).key("K"));
    let started = Instant::now();
    let (a, b) = tokio::join!(submit(), submit());
    let took = started.elapsed();
    for r in [a, b] {
        let err = r.expect_err("lock timeout");
        assert!(err.is_lock_timeout(), "{err}");
        assert_eq!(
            err.to_string(),
            "lock timeout in submit: another transaction held the lock too long; nothing was committed"
        );
    }
    assert!(took < Duration::from_secs(3), "{took:?}");
    holder.batch_execute("rollback").await.expect("release");
    assert_eq!(store.get_by_key("K").await.expect("get"), None, "no task committed");
    assert!(store.list(&Default::default()).await.expect("list").is_empty());
    // The pool's connections carry no leftover lock_timeout (it was local).
    let rows = store
        .executor()
        .query(sql("select current_setting('lock_timeout') as lt", Lane::Ordinary, true), &[])
        .await
        .expect("setting");
    assert_eq!(rows[0].get("lt"), Some(&Value::Text("0".to_owned())));
    let t = store.submit(NewTask::new("x", json!({})).key("K")).await.expect("after release");
    assert_eq!(store.get_by_key("K").await.expect("get").map(|x| x.id), Some(t.id));
    drop::<Store<PgPool>>(store);
    schema.drop().await;
}
