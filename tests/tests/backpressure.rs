//! Backpressure on a real PostgreSQL: a producer held by a full queue goes
//! on when a worker drains it, `QueueFull` after the maximum wait, a
//! worker's child submits gated too, and the overshoot of several
//! producers measured against its documented bound.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::protocol::Statement;
use waymark_store::{Backpressure, ConnectOptions, NewTask, PgExecutor, Store, TaskStatus, MAX_GRANT};
use waymark_tests::fault_executor::counted;
use waymark_tests::{pool_store, test_worker, TestSchema, TestWorker};
use waymark_worker::TaskError;

async fn gated(schema: &TestSchema, limits: Backpressure) -> Arc<Store<PgPool>> {
    let options = ConnectOptions::new().backpressure(limits);
    Arc::new(Store::with_options(pool_store(schema).await.into_executor(), options).expect("limits"))
}

async fn queued<E: PgExecutor>(store: &Store<E>, queue: &str) -> i64 {
    store.stats(Some(queue)).await.expect("stats")[queue].queued
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_held_by_a_full_queue_goes_on_when_a_worker_drains_it() {
    let schema = TestSchema::new().await;
    // Counts the reads of a queue's depth, which a held submit makes each
    // time its pause ends.
    let (store, mut depth_reads) = counted(&pool_store(&schema).await, Statement::QueueDepth);
    let options = ConnectOptions::new().backpressure(Backpressure::per_queue([("bp", 5)]));
    let store = Arc::new(Store::with_options(store.into_executor(), options).expect("limits"));
    for i in 0..5 {
        store.submit(NewTask::new("bp.job", json!({ "i": i })).queue("bp")).await.expect("room");
    }
    // Another queue has no limit.
    for _ in 0..20 {
        store.submit(NewTask::new("bp.job", json!({})).queue("free")).await.expect("unlimited");
    }
    let reads_before = depth_reads.so_far();
    let producer = {
        let store = store.clone();
        tokio::spawn(async move {
            let t = store.submit(NewTask::new("bp.job", json!({ "i": 5 })).queue("bp")).await;
            (t, Instant::now())
        })
    };
    // The submit found the queue full, waited out its first pause (250 ms)
    // and found it full again: it waits on (500 ms, then 1 s, ...).
    depth_reads.reach(reads_before + 2).await;
    assert!(!producer.is_finished(), "a full queue holds the producer");
    assert_eq!(queued(&store, "bp").await, 5, "and nothing went past the limit");

    let drained_from = Instant::now();
    let worker =
        test_worker(&store, "bp").task("bp.job", |_ctx, p: serde_json::Value| async move { Ok(p) }).start();
    let (task, resumed) = tokio::time::timeout(Duration::from_secs(20), producer)
        .await
        .expect("the producer goes on")
        .expect("join");
    let task = task.expect("submitted once there was room");
    // At most one longest pause (5 s) after the room came, and far less here.
    assert!(resumed - drained_from < Duration::from_secs(6), "resumed after {:?}", resumed - drained_from);
    let done = store.wait(&task.id, Duration::from_secs(20)).await.expect("run");
    assert_eq!(done.status, TaskStatus::Succeeded);
    worker.stop().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_full_past_the_maximum_wait_fails_with_queue_full_and_submits_nothing() {
    let schema = TestSchema::new().await;
    // Pauses of 250, 500, 1,000 and 2,000 ms would end an untruncated wait
    // at 3.75 s: a 3 s maximum shows the cut, with room for a loaded machine.
    let wait = Duration::from_secs(3);
    let store = gated(&schema, Backpressure::max_depth(2).max_wait(wait)).await;
    store
        .submit_batch([NewTask::new("x", json!({})), NewTask::new("x", json!({}))])
        .await
        .expect("room for 2");
    let started = Instant::now();
    let err = store.submit(NewTask::new("x", json!({}))).await.expect_err("full");
    let waited = started.elapsed();
    match &err {
        waymark_store::Error::QueueFull { queue, limit, waited } => {
            assert_eq!((queue.as_str(), *limit), ("default", 2));
            assert!(*waited >= wait, "waited {waited:?}");
        }
        other => panic!("expected QueueFull, got {other}"),
    }
    assert!(err.is_queue_full() && err.class_name() == "QueueFull");
    assert!(err.to_string().contains("queue \"default\" stayed at its depth limit of 2"), "{err}");
    // Real time under test: the wait ends at the maximum, not a pause later.
    assert!(waited < Duration::from_millis(3600), "gave up after {waited:?}");
    assert_eq!(queued(&store, "default").await, 2, "nothing submitted");

    // A batch waits the same way; one that can never fit fails at once.
    let err = store.submit_batch([NewTask::new("x", json!({}))]).await.expect_err("full");
    assert!(err.is_queue_full(), "{err}");
    let started = Instant::now();
    let err = store.submit_batch((0..3).map(|_| NewTask::new("x", json!({})))).await.expect_err("too big");
    assert!(err.is_invalid_argument() && started.elapsed() < Duration::from_millis(200), "{err}");
    assert!(err.to_string().contains("a batch of 3 tasks for queue \"default\" can never fit"), "{err}");

    // A keyed submit that hands back its key's live task needs no room.
    let full = gated(&schema, Backpressure::per_queue([("keyed", 1)]).max_wait(wait)).await;
    let first =
        full.submit(NewTask::new("x", json!({})).queue("keyed").key("k-1")).await.expect("room for one");
    let started = Instant::now();
    let again = full.submit(NewTask::new("x", json!({})).queue("keyed").key("k-1")).await.expect("reused");
    assert_eq!(again.id, first.id);
    assert!(started.elapsed() < wait, "a reuse waits for no room: {:?}", started.elapsed());
    let e = full
        .submit(NewTask::new("x", json!({})).queue("keyed").key("k-2"))
        .await
        .expect_err("a new key needs room");
    assert!(e.is_queue_full(), "{e}");
    // A batch over two full queues waits one maximum wait, not two.
    let two = gated(&schema, Backpressure::per_queue([("a", 1), ("b", 1)]).max_wait(wait)).await;
    two.submit_batch([NewTask::new("x", json!({})).queue("a"), NewTask::new("x", json!({})).queue("b")])
        .await
        .expect("room in both");
    let started = Instant::now();
    let e = two
        .submit_batch([NewTask::new("x", json!({})).queue("a"), NewTask::new("x", json!({})).queue("b")])
        .await
        .expect_err("both full");
    assert!(e.is_queue_full(), "{e}");
    assert!(started.elapsed() < wait * 2, "one wait for the batch: {:?}", started.elapsed());

    // Limits that make no sense are refused when set.
    for bad in [Backpressure::max_depth(0), Backpressure::per_queue([("q", -1)])] {
        let options = ConnectOptions::new().backpressure(bad);
        let e = Store::with_options(pool_store(&schema).await.into_executor(), options).expect_err("refused");
        assert!(e.to_string().contains("must be at least 1"), "{e}");
    }
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_child_submits_are_gated_by_the_stores_limits() {
    let schema = TestSchema::new().await;
    let store =
        gated(&schema, Backpressure::per_queue([("kids", 1)]).max_wait(Duration::from_millis(300))).await;
    store.submit(NewTask::new("kid", json!({})).queue("kids")).await.expect("the one place");
    let parent = store.submit(NewTask::new("parent", json!({})).queue("parents")).await.expect("submit");
    let worker = test_worker(&store, "parents")
        .task("parent", |ctx, _p: serde_json::Value| async move {
            ctx.submit(NewTask::new("kid", json!({})).queue("kids")).await.map_err(TaskError::from)?;
            Ok(())
        })
        .retry_backoff(Duration::from_millis(1), Duration::from_millis(1))
        .start();
    let done = store.wait(&parent.id, Duration::from_secs(30)).await.expect("the parent ends");
    assert_eq!(done.status, TaskStatus::Failed, "every attempt met a full queue");
    let envelope = done.error_envelope().expect("an envelope");
    assert_eq!(envelope.kind, "QueueFull");
    assert!(
        envelope.message.contains("queue \"kids\" stayed at its depth limit of 1"),
        "{}",
        envelope.message
    );
    assert_eq!(queued(&store, "kids").await, 1, "no child went past the limit");
    worker.stop().await;
    schema.drop().await;
}

/// Several producers, each its own store (so its own grant), fill one
/// queue until it is full. The limit is soft: the documented bound on the
/// overshoot is (producers - 1) x MAX_GRANT; the test prints the overshoot
/// it saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_producers_overshoot_a_limit_by_no_more_than_the_documented_bound() {
    let schema = TestSchema::new().await;
    const PRODUCERS: i64 = 4;
    const LIMIT: i64 = 300;
    let mut worst = 0;
    for round in 0..3 {
        let queue = format!("race{round}");
        let mut producers = Vec::new();
        for _ in 0..PRODUCERS {
            let limits =
                Backpressure::per_queue([(queue.clone(), LIMIT)]).max_wait(Duration::from_millis(300));
            let store = gated(&schema, limits).await;
            let queue = queue.clone();
            producers.push(tokio::spawn(async move {
                // Eight submitters per producer share its grant.
                let mut lanes = Vec::new();
                for _ in 0..8 {
                    let (store, queue) = (store.clone(), queue.clone());
                    lanes.push(tokio::spawn(async move {
                        loop {
                            match store.submit(NewTask::new("x", json!({})).queue(&queue)).await {
                                Ok(_) => {}
                                Err(e) if e.is_queue_full() => return,
                                Err(e) => panic!("submit: {e}"),
                            }
                        }
                    }));
                }
                for lane in lanes {
                    lane.await.expect("lane");
                }
            }));
        }
        for p in producers {
            p.await.expect("producer");
        }
        let store = pool_store(&schema).await;
        let depth = queued(&store, &queue).await;
        assert!(depth >= LIMIT, "the queue filled: {depth}");
        worst = worst.max(depth - LIMIT);
    }
    let bound = (PRODUCERS - 1) * MAX_GRANT;
    eprintln!("backpressure overshoot: {worst} tasks past a limit of {LIMIT} with {PRODUCERS} producers (bound {bound})");
    assert!(worst <= bound, "overshot by {worst}, past the documented {bound}");
    schema.drop().await;
}
