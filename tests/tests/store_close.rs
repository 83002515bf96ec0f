//! Closing a store on a real PostgreSQL: its LISTEN streams and sweeper
//! stop, a wait under way and every later call fail with `StoreClosed`, and
//! the pool it was handed goes on serving. (One test in this binary: it
//! counts the process's LISTEN hub leases.)

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use waymark_notify::Registry;
use waymark_pool::PgPool;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{ClaimRequest, NewTask, PgExecutor, PgTransaction, Retention, Store, Sweeper};
use waymark_tests::eventually;
use waymark_tests::TestSchema;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_store_stops_its_background_work_and_refuses_calls_but_its_pool_goes_on() {
    let schema = TestSchema::new().await;
    let pool = PgPool::builder(&schema.url).schema(&schema.schema).max_size(4).build().expect("pool");
    let store = Arc::new(waymark_tests::connect_in(pool.clone(), &schema).await);

    // Background work of every kind: a wait (LISTEN cairnq_done), a watch
    // (cairnq_queued), a sweeper.
    let task = store.submit(NewTask::new("close.me", json!({}))).await.expect("submit");
    let waiter = {
        let (store, id) = (store.clone(), task.id.clone());
        tokio::spawn(async move { store.wait(&id, Duration::from_secs(60)).await })
    };
    let mut watch = store.watch_queues(["default"], Duration::from_secs(60));
    let _ = watch.next().await;
    eventually(Duration::from_secs(10), "both streams live", || async {
        store.is_listening() && store.is_watching()
    })
    .await;
    assert!(Registry::global().stats().leased >= 1, "the store holds a hub lease");
    let (tx, mut reports) = tokio::sync::mpsc::unbounded_channel();
    let _sweeper = Sweeper::start(
        store.clone(),
        Retention::older_than(Duration::from_secs(3600)).interval(Duration::from_millis(50)),
        Arc::new(move |out| drop(tx.send(out.map_err(|e| e.to_string())))),
    )
    .expect("sweeper");
    assert_eq!(reports.recv().await.expect("a first sweep"), Ok(0));

    store.close().await;
    assert!(store.is_closed());

    // The wait under way ends at its next read, not at its timeout.
    let ended =
        tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("the wait ends").expect("join");
    assert!(ended.as_ref().is_err_and(|e| e.is_store_closed()), "the wait ends closed: {ended:?}");
    // The sweeper stops: its hook (and the sender in it) is dropped; a
    // sweep that was under way may report StoreClosed first.
    while let Some(out) = tokio::time::timeout(Duration::from_secs(5), reports.recv()).await.expect("stops") {
        assert!(matches!(&out, Err(e) if e.contains("closed")) || out == Ok(0), "{out:?}");
    }
    // The streams are dropped: no hub lease is left, no stream consumed.
    eventually(Duration::from_secs(5), "the hub leases released", || async {
        Registry::global().stats().leased == 0
    })
    .await;
    // A stream's consumer lets go of its lease just before it marks its
    // channel not live, so the two are seen apart.
    eventually(Duration::from_secs(5), "neither stream live", || async {
        !store.is_listening() && !store.is_watching()
    })
    .await;

    // Every later call fails with StoreClosed, naming it.
    let closed = |out: Result<(), waymark_store::Error>, what: &str| {
        let e = out.expect_err(what);
        assert!(e.is_store_closed(), "{what}: {e}");
        assert!(e.to_string().contains("the store is closed"), "{what}: {e}");
        assert_eq!(e.class_name(), "StoreClosed");
    };
    closed(store.submit(NewTask::new("x", json!({}))).await.map(drop), "submit");
    closed(store.submit_batch([NewTask::new("x", json!({}))]).await.map(drop), "submit_batch");
    closed(store.get(&task.id).await.map(drop), "get");
    closed(store.claim(&ClaimRequest::new("w", ["default"])).await.map(drop), "claim");
    closed(store.stats(None).await.map(drop), "stats");
    closed(store.migrate().await.map(drop), "migrate");
    closed(store.wait(&task.id, Duration::from_secs(1)).await.map(drop), "wait");
    let mut tx = pool.begin().await.expect("the pool still opens transactions");
    closed(store.submit_in(&mut tx, NewTask::new("x", json!({}))).await.map(drop), "submit_in");
    tx.rollback().await.expect("rollback");
    // Closing again is a no-op; a clone is closed too.
    store.close().await;
    assert!(Store::clone(&*store).is_closed());

    // The pool was the caller's: untouched, and a new store over it works.
    let again = Store::new(pool.clone());
    let t = again.submit(NewTask::new("after.close", json!({}))).await.expect("a new store submits");
    assert_eq!(again.fetch(&t.id).await.expect("fetch").name, "after.close");
    assert!(!again.is_closed());
    drop(again);
    drop(store);
    schema.drop().await;
}
