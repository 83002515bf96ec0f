//! The breaker's half-open trial is decided when its call is answered, also
//! when that call is a BEGIN: a long transaction taken as the trial must not
//! fence the rest of the process out (heartbeats, settlements and claims
//! would get `CircuitOpen` and leases would run out), and dropping it later
//! must not reopen a healthy breaker. The server "goes away" behind a proxy
//! that cuts every connection and refuses new ones.

use std::time::Duration;

use serde_json::json;
use waymark_pool::{BreakerState, PgPool};
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::Lease;
use waymark_store::{ClaimRequest, ExecErrorKind, NewTask, PgExecutor, PgSession, PgTransaction, Store};
use waymark_tests::proxy::{pool_through, proxy_for, AnswerCuttingProxy};
use waymark_tests::{connect_in, eventually, until_some, TestSchema};

/// A store through `proxy` whose pool has no retries of its own and a
/// breaker that opens on the second failure, for `open_for`.
async fn breaker_store(proxy: &AnswerCuttingProxy, schema: &TestSchema, open_for: Duration) -> Store<PgPool> {
    let pool = pool_through(proxy, schema)
        .max_size(4)
        .breaker_threshold(2)
        .breaker_open_for(open_for)
        .retry_attempts(0)
        .build()
        .expect("pool");
    connect_in(pool, schema).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_taken_as_the_trial_does_not_fence_heartbeats() {
    let schema = TestSchema::new().await;
    let proxy = proxy_for(&schema.url).await;
    let store = breaker_store(&proxy, &schema, Duration::from_millis(200)).await;
    let task = store.submit(NewTask::new("trial", json!({}))).await.expect("submit");
    let claimed = store.claim(&ClaimRequest::new("w1", ["default"]).limit(1)).await.expect("claim");
    assert_eq!(claimed.len(), 1);

    // The server goes away: calls fail until the breaker opens.
    proxy.set_down(true);
    let mut opened = false;
    for _ in 0..20 {
        let err = store
            .heartbeat(&Lease::new(&task.id, "w1"), Duration::from_secs(30))
            .await
            .expect_err("server away");
        if err.exec_kind() == Some(ExecErrorKind::CircuitOpen) {
            opened = true;
            break;
        }
    }
    assert!(opened, "the breaker opened");
    proxy.set_down(false);

    // The first call let through after the open time is a BEGIN: the trial.
    let tx = until_some(Duration::from_secs(10), "a BEGIN let through", || async {
        match store.executor().begin().await {
            Ok(tx) => Some(tx),
            Err(e) if e.kind() == ExecErrorKind::CircuitOpen => None,
            Err(e) => panic!("begin after the server came back: {e}"),
        }
    })
    .await;
    assert_eq!(store.executor().stats().breaker, BreakerState::Closed, "the answered BEGIN closed it");

    // While that transaction stays open, the rest of the process works.
    for _ in 0..3 {
        store
            .heartbeat(&Lease::new(&task.id, "w1"), Duration::from_secs(30))
            .await
            .expect("a heartbeat beside the open transaction");
    }
    let beats = store
        .heartbeat_batch(std::slice::from_ref(&task.id), "w1", Duration::from_secs(30))
        .await
        .expect("batch");
    assert_eq!(beats.len(), 1);

    // Dropped without an outcome, the transaction does not reopen it.
    drop(tx);
    store.heartbeat(&Lease::new(&task.id, "w1"), Duration::from_secs(30)).await.expect("after the drop");
    assert_eq!(store.executor().stats().breaker, BreakerState::Closed);

    // A transaction that is committed is fine too.
    let tx = store.executor().begin().await.expect("begin");
    tx.commit().await.expect("commit");
    schema.drop().await;
}

/// A connection lost under a statement inside a transaction counts toward
/// the breaker when it happens, so a transaction then dropped (not ended)
/// still counts: before, only a failed COMMIT or ROLLBACK was heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_lost_inside_dropped_transactions_open_the_breaker() {
    let schema = TestSchema::new().await;
    let proxy = proxy_for(&schema.url).await;
    let store = breaker_store(&proxy, &schema, Duration::from_secs(30)).await;
    let mut first = store.executor().begin().await.expect("begin");
    let mut second = store.executor().begin().await.expect("begin");
    let before = store.executor().stats().connection_errors;
    proxy.set_down(true);
    // The proxy cuts the connections on its own tasks: wait until both
    // clients have seen their connection end.
    eventually(Duration::from_secs(10), "both connections cut", || async {
        first.client().is_closed() && second.client().is_closed()
    })
    .await;
    for tx in [&mut first, &mut second] {
        let err = tx.execute_script("select 1").await.expect_err("the server is away");
        assert_eq!(err.kind(), ExecErrorKind::Connection, "{err}");
    }
    let stats = store.executor().stats();
    assert_eq!(stats.connection_errors - before, 2, "each lost connection counted: {stats:?}");
    assert_eq!(stats.breaker, BreakerState::Open, "two failures in a row open it");
    drop((first, second));
    schema.drop().await;
}
