//! The worker's promises on its fault paths, on a real PostgreSQL: shutdown
//! gives back what it says it gives back, in bounded time, also past a
//! handler stuck in blocking code or a release that fails at first; a claim
//! task that panics frees its slots; a re-claim of a task still winding
//! down counts against the concurrency; and a `complete_in` whose COMMIT
//! the server refused records that error.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, NewTask, PgExecutor, Store, Task, TaskStatus};
use waymark_tests::fault_executor::PanicOnce;
use waymark_tests::proxy::{proxy_for, url_through};
use waymark_tests::{eventually, pool_store, TestSchema};
use waymark_worker::{CancelReason, TaskError, Worker};

async fn status_of<E: PgExecutor>(store: &Store<E>, id: &str) -> (TaskStatus, i32) {
    let t = store.fetch(id).await.expect("fetch");
    (t.status, t.attempt)
}

async fn all_running<E: PgExecutor>(store: &Store<E>, ids: &[String]) -> bool {
    for id in ids {
        if status_of(store, id).await.0 != TaskStatus::Running {
            return false;
        }
    }
    true
}

/// A given-back task: queued, its attempt unspent, nothing recorded.
fn assert_given_back(t: &Task) {
    assert_eq!((t.status, t.attempt), (TaskStatus::Queued, 0), "{} given back unspent", t.id);
    assert_eq!((&t.error, &t.result, &t.worker_id), (&None, &None, &None), "{}", t.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_obeys_shutdown_gives_its_task_back_unspent() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let answers = ["err", "ok"];
    let mut ids = Vec::new();
    for answer in answers {
        let task = NewTask::new("obeys", json!({ "answer": answer })).max_attempts(1);
        ids.push(store.submit(task).await.expect("submit").id);
    }
    let worker = Worker::builder(store.clone())
        .concurrency(4)
        .shutdown_grace(Duration::from_millis(100))
        .task("obeys", |ctx, p: serde_json::Value| async move {
            let reason = ctx.cancelled().await;
            assert_eq!(reason, CancelReason::Shutdown);
            if p["answer"] == "err" {
                Err(TaskError::new("stopped by shutdown"))
            } else {
                Ok(json!({"stopped": true}))
            }
        })
        .build()
        .expect("worker");
    let handle = worker.handle();
    let run = tokio::spawn(worker.run());
    let s = store.clone();
    let running_ids = ids.clone();
    eventually(Duration::from_secs(10), "both tasks running", || {
        let (s, ids) = (s.clone(), running_ids.clone());
        async move { all_running(&s, &ids).await }
    })
    .await;
    handle.shutdown();
    run.await.expect("worker ends");
    for id in &ids {
        assert_given_back(&store.fetch(id).await.expect("fetch"));
    }
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_handler_stuck_in_blocking_code_cannot_hold_shutdown() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let stuck = store.submit(NewTask::new("stuck", json!({}))).await.expect("submit").id;
    let polite = store.submit(NewTask::new("polite", json!({}))).await.expect("submit").id;
    let grace = Duration::from_millis(200);
    // Real time is under test here: the handler blocks its thread for
    // longer than shutdown may take.
    let blocked_for = Duration::from_secs(8);
    let worker = Worker::builder(store.clone())
        .concurrency(4)
        .shutdown_grace(grace)
        .task("stuck", move |_ctx, _p: serde_json::Value| async move {
            std::thread::sleep(blocked_for);
            Ok(json!({}))
        })
        .task("polite", |ctx, _p: serde_json::Value| async move {
            ctx.cancelled().await;
            Ok(json!({}))
        })
        .build()
        .expect("worker");
    let handle = worker.handle();
    let run = tokio::spawn(worker.run());
    let s = store.clone();
    let both = vec![stuck.clone(), polite.clone()];
    eventually(Duration::from_secs(10), "both tasks running", || {
        let (s, ids) = (s.clone(), both.clone());
        async move { all_running(&s, &ids).await }
    })
    .await;
    let asked = Instant::now();
    handle.shutdown();
    run.await.expect("worker ends");
    let took = asked.elapsed();
    assert!(took < grace + Duration::from_secs(4), "shutdown took {took:?} behind a blocked handler");
    assert!(took < blocked_for, "shutdown did not wait for the blocked handler");
    assert_given_back(&store.fetch(&polite).await.expect("fetch"));
    assert_given_back(&store.fetch(&stuck).await.expect("fetch"));
    println!("shutdown past a blocked handler took {took:?} (grace {grace:?})");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_fails_is_tried_again_while_the_lease_lasts() {
    let schema = TestSchema::new().await;
    let proxy = proxy_for(&schema.url).await;
    let pool = PgPool::builder(url_through(&proxy, &schema.url))
        .max_size(4)
        .schema(&schema.schema)
        .build()
        .expect("pool");
    let store =
        Arc::new(Store::connect(pool, ConnectOptions::schema(&schema.schema)).await.expect("connect"));
    let id = store.submit(NewTask::new("deaf", json!({}))).await.expect("submit").id;
    let worker = Worker::builder(store.clone())
        .lease(Duration::from_secs(30))
        .shutdown_grace(Duration::from_millis(100))
        // Ignores its token: shutdown drops it after its short stop grace.
        .task("deaf", |_ctx, _p: serde_json::Value| async move {
            std::future::pending::<()>().await;
            Ok(json!({}))
        })
        .build()
        .expect("worker");
    let handle = worker.handle();
    let run = tokio::spawn(worker.run());
    let s = store.clone();
    let ids = vec![id.clone()];
    eventually(Duration::from_secs(10), "the task running", || {
        let (s, ids) = (s.clone(), ids.clone());
        async move { all_running(&s, &ids).await }
    })
    .await;
    // The server is away when the release is first tried (after the grace
    // and the stop grace, about 0.6 s), and back a little later: real time
    // is what this outage is made of.
    proxy.set_down(true);
    handle.shutdown();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    proxy.set_down(false);
    run.await.expect("worker ends");
    assert_given_back(&store.fetch(&id).await.expect("fetch"));
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_task_that_panics_gives_its_slots_back() {
    let schema = TestSchema::new().await;
    let pool = PgPool::builder(&schema.url).max_size(4).schema(&schema.schema).build().expect("pool");
    let exec = PanicOnce::new(pool);
    let store = Arc::new(
        Store::connect(exec.clone(), ConnectOptions::schema(&schema.schema)).await.expect("connect"),
    );
    exec.arm("attempt = t.attempt + 1");
    let id = store.submit(NewTask::new("after.panic", json!({}))).await.expect("submit").id;
    let worker = Worker::builder(store.clone())
        .concurrency(2)
        .poll_interval(Duration::from_millis(50))
        .task("after.panic", |_ctx, _p: serde_json::Value| async move { Ok(json!({"ran": true})) })
        .build()
        .expect("worker");
    let handle = worker.handle();
    let run = tokio::spawn(worker.run());
    let s = store.clone();
    let done = id.clone();
    eventually(Duration::from_secs(10), "the task to run after the claim that panicked", || {
        let (s, id) = (s.clone(), done.clone());
        async move { status_of(&s, &id).await.0 == TaskStatus::Succeeded }
    })
    .await;
    assert!(!exec.armed(), "the claim did panic");
    handle.shutdown();
    run.await.expect("worker ends");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaimed_task_still_winding_down_counts_against_the_concurrency() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let held = store.submit(NewTask::new("held", json!({}))).await.expect("submit").id;
    let release = Arc::new(tokio::sync::Notify::new());
    let starts = Arc::new(AtomicUsize::new(0));
    let (r, n) = (release.clone(), starts.clone());
    let worker = Worker::builder(store.clone())
        .concurrency(2)
        .lease(Duration::from_millis(300))
        .heartbeat_interval(Duration::from_millis(100))
        .poll_interval(Duration::from_millis(50))
        // Both runs of the task hold on, the lost one included.
        .task("held", move |_ctx, _p: serde_json::Value| {
            let (r, n) = (r.clone(), n.clone());
            async move {
                n.fetch_add(1, Ordering::SeqCst);
                r.notified().await;
                Ok(json!({}))
            }
        })
        .task("other", |_ctx, _p: serde_json::Value| async move { Ok(json!({})) })
        .build()
        .expect("worker");
    let handle = worker.handle();
    let run = tokio::spawn(worker.run());
    let s = store.clone();
    let id = held.clone();
    eventually(Duration::from_secs(10), "the task claimed", || {
        let (s, id) = (s.clone(), id.clone());
        async move { status_of(&s, &id).await == (TaskStatus::Running, 1) }
    })
    .await;
    // The lease runs out while the run goes on; this worker's own claim
    // recovers the task and runs it again.
    handle.pause_heartbeats(true);
    let s = store.clone();
    let id = held.clone();
    eventually(Duration::from_secs(10), "the task re-claimed by the same worker", || {
        let (s, id) = (s.clone(), id.clone());
        async move { status_of(&s, &id).await == (TaskStatus::Running, 2) }
    })
    .await;
    handle.pause_heartbeats(false);
    assert_eq!(handle.running(), 2, "two runs in flight, one of them lost");
    let other = store.submit(NewTask::new("other", json!({}))).await.expect("submit").id;
    // A negative check needs time: several poll intervals and queued
    // signals pass without a claim beyond the two slots.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(status_of(&store, &other).await, (TaskStatus::Queued, 0), "no third run with 2 slots");
    release.notify_waiters();
    let s = store.clone();
    eventually(Duration::from_secs(10), "the other task runs once a slot frees", || {
        let (s, other) = (s.clone(), other.clone());
        async move { status_of(&s, &other).await.0 == TaskStatus::Succeeded }
    })
    .await;
    assert_eq!(status_of(&store, &held).await, (TaskStatus::Succeeded, 2));
    assert_eq!(starts.load(Ordering::SeqCst), 2);
    handle.shutdown();
    run.await.expect("worker ends");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_the_server_refused_is_recorded_as_the_failure() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    store
        .executor()
        .execute_script(
            "create table side (n int, constraint side_once unique (n) deferrable initially deferred)",
        )
        .await
        .expect("side table");
    let id = store.submit(NewTask::new("refused", json!({}))).await.expect("submit").id;
    let worker = Worker::builder(store.clone())
        .retry_backoff(Duration::from_secs(60), Duration::from_secs(60))
        .task("refused", |ctx, _p: serde_json::Value| async move {
            let tx = ctx.begin().await?;
            // The deferred check fails the COMMIT, not the insert.
            tx.client().batch_execute("insert into side values (1), (1)").await.expect("inserts");
            let err = ctx.complete_in(tx, json!({"done": true})).await.expect_err("the commit is refused");
            assert_eq!(err.sqlstate(), Some("23505"), "{err}");
            // A handler that answers Ok anyway must not make it succeed.
            Ok(json!({"ignored": true}))
        })
        .build()
        .expect("worker");
    let handle = worker.handle();
    let run = tokio::spawn(worker.run());
    let s = store.clone();
    let done = id.clone();
    eventually(Duration::from_secs(10), "the failure recorded", || {
        let (s, id) = (s.clone(), done.clone());
        async move { status_of(&s, &id).await == (TaskStatus::Queued, 1) }
    })
    .await;
    handle.shutdown();
    run.await.expect("worker ends");
    let t = store.fetch(&id).await.expect("fetch");
    let envelope = t.error_envelope().expect("the commit's error recorded");
    assert_eq!((envelope.kind.as_str(), envelope.retryable), ("CommitFailed", true));
    assert!(envelope.message.contains("side_once"), "{}", envelope.message);
    assert!(t.result.is_none() && t.run_at_ms > t.updated_at_ms, "retried after the backoff");
    schema.drop().await;
}
