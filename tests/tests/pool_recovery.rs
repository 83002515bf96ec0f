//! The pool against a server that stops and comes back (a private cluster,
//! never the shared one): the breaker opens and fails calls in microseconds,
//! and the half-open trial closes it once the server is back, with no restart
//! of the process.

use std::sync::Arc;
use std::time::{Duration, Instant};

use waymark_pool::{BreakerState, PgPool};
use waymark_store::{ExecErrorKind, Lane, PgExecutor, Sql};
use waymark_tests::private_cluster::PrivateCluster;
use waymark_tests::until_some;

fn select_one() -> Sql<'static> {
    Sql { text: "select 1 as one", types: &[], lane: Lane::Ordinary, repeatable: true }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opens_on_a_dead_server_and_closes_when_it_returns() {
    let cluster =
        Arc::new(tokio::task::spawn_blocking(|| PrivateCluster::start("breaker")).await.expect("cluster"));
    let pool = PgPool::builder(cluster.url("postgres"))
        .max_size(2)
        .breaker_threshold(3)
        .breaker_open_for(Duration::from_secs(3))
        .retry_attempts(1)
        .retry_backoff(Duration::from_millis(5), Duration::from_millis(20))
        .build()
        .expect("pool");
    pool.query(select_one(), &[]).await.expect("server up");

    let stopped_at = Instant::now();
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.stop()).await.expect("stop");

    // Calls fail as connection errors until the breaker opens.
    let mut opened_after = None;
    for i in 0..20 {
        let err = pool.query(select_one(), &[]).await.expect_err("server down");
        if err.kind() == ExecErrorKind::CircuitOpen {
            opened_after = Some(i);
            assert!(err.to_string().contains("last failure"), "{err}");
            break;
        }
        assert_eq!(err.kind(), ExecErrorKind::Connection, "{err}");
    }
    let opened_after = opened_after.expect("the breaker opened");
    let detected_in = stopped_at.elapsed();
    assert_eq!(pool.stats().breaker, BreakerState::Open);

    // While open, calls fail without touching the network.
    let n = 1000;
    let started = Instant::now();
    for _ in 0..n {
        let err = pool.query(select_one(), &[]).await.expect_err("open");
        assert_eq!(err.kind(), ExecErrorKind::CircuitOpen);
    }
    let per_call = started.elapsed() / n;
    assert!(per_call < Duration::from_millis(1), "{per_call:?} per call while open");

    // Server back: after the open time, one trial closes the breaker.
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.start_again()).await.expect("start again");
    let back_at = Instant::now();
    let recovered_in = until_some(Duration::from_secs(10), "the pool to recover", || async {
        match pool.query(select_one(), &[]).await {
            Ok(_) => Some(back_at.elapsed()),
            Err(e) => {
                assert!(matches!(e.kind(), ExecErrorKind::CircuitOpen | ExecErrorKind::Connection), "{e}");
                None
            }
        }
    })
    .await;
    assert_eq!(pool.stats().breaker, BreakerState::Closed);
    println!(
        "breaker: opened after {opened_after} failed calls ({detected_in:?} after the stop); \
         {per_call:?} per call while open; work resumed {recovered_in:?} after the server came back"
    );
}
