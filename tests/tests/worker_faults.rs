//! The worker's promises on its fault paths, on a real PostgreSQL: shutdown
//! gives back what it says it gives back, in bounded time, also past a
//! handler stuck in blocking code or a release that fails at first; a claim
//! task that panics frees its slots; a re-claim of a task still winding
//! down counts against the concurrency; a `complete_in` whose COMMIT
//! the server refused records that error; and a settlement flush stuck on
//! a row lock does not hold the worker's claims back.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::protocol::Statement;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{NewTask, PgExecutor, Store, Task, TaskStatus};
use waymark_tests::fault_executor::hooked;
use waymark_tests::proxy::{proxy_for, store_behind, AnswerCuttingProxy};
use waymark_tests::{eventually, pool_store, test_worker, TestSchema, TestWorker};
use waymark_worker::{CancelReason, TaskError};

async fn status_of<E: PgExecutor>(store: &Store<E>, id: &str) -> (TaskStatus, i32) {
    let t = store.fetch(id).await.expect("fetch");
    (t.status, t.attempt)
}

/// Waits, 10 s at most, until every task in `ids` has a status and attempt
/// that `ok` accepts.
async fn until_each<E: PgExecutor>(
    store: &Store<E>,
    ids: &[&str],
    what: &str,
    ok: impl Fn((TaskStatus, i32)) -> bool,
) {
    let ok = &ok;
    eventually(Duration::from_secs(10), what, || async move {
        for id in ids {
            if !ok(status_of(store, id).await) {
                return false;
            }
        }
        true
    })
    .await;
}

/// A store whose statements go through a proxy that can take the server
/// away, with no retries inside the pool (each connection the proxy refuses
/// is one try of the worker's own), and LISTEN straight to the server (so
/// signals still arrive, and nothing else talks through the proxy).
async fn behind_a_proxy(schema: &TestSchema) -> (AnswerCuttingProxy, Arc<Store<PgPool>>) {
    let proxy = proxy_for(&schema.url).await;
    let store = Arc::new(store_behind(&proxy, schema).await);
    (proxy, store)
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
    // The reasons are checked after the run: a panic in the handler would
    // be given back like any other answer, and prove nothing.
    let reasons = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = reasons.clone();
    let worker = test_worker(&store, "default")
        .concurrency(4)
        .shutdown_grace(Duration::from_millis(100))
        .task("obeys", move |ctx, p: serde_json::Value| {
            let seen = seen.clone();
            async move {
                let reason = ctx.cancelled().await;
                seen.lock().expect("reasons").push(reason);
                if p["answer"] == "err" {
                    Err(TaskError::new("stopped by shutdown"))
                } else {
                    Ok(json!({"stopped": true}))
                }
            }
        })
        .start();
    until_each(
        &store,
        &ids.iter().map(String::as_str).collect::<Vec<_>>(),
        "both tasks running",
        |(st, _)| st == TaskStatus::Running,
    )
    .await;
    worker.stop().await;
    for id in &ids {
        assert_given_back(&store.fetch(id).await.expect("fetch"));
    }
    assert_eq!(
        *reasons.lock().expect("reasons"),
        [CancelReason::Shutdown; 2],
        "both answered a shutdown token"
    );
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
    let lease = Duration::from_secs(2);
    let worker = test_worker(&store, "default")
        .concurrency(4)
        .lease(lease)
        .shutdown_grace(grace)
        .task("stuck", move |_ctx, _p: serde_json::Value| async move {
            std::thread::sleep(blocked_for);
            Ok(json!({}))
        })
        .task("polite", |ctx, _p: serde_json::Value| async move {
            ctx.cancelled().await;
            Ok(json!({}))
        })
        .start();
    until_each(&store, &[stuck.as_str(), polite.as_str()], "both tasks running", |(st, _)| {
        st == TaskStatus::Running
    })
    .await;
    let asked = Instant::now();
    worker.stop().await;
    let took = asked.elapsed();
    // The bound: grace, then 0.5 s stop grace, 2 s settle bound, 0.1 s for
    // aborted runs, the releases; far below the 8 s block.
    assert!(took < grace + Duration::from_secs(5), "shutdown took {took:?} behind a blocked handler");
    assert!(took < blocked_for, "shutdown did not wait for the blocked handler");
    assert_given_back(&store.fetch(&polite).await.expect("fetch"));
    // The stuck run may still be running its task: it is not given back
    // for another worker to start meanwhile, and its lease is no longer
    // renewed, so the task returns when the lease runs out.
    let left = store.fetch(&stuck).await.expect("fetch");
    assert_eq!((left.status, left.attempt), (TaskStatus::Running, 1), "the stuck task stays with its run");
    let claim = waymark_store::ClaimRequest::new("another", ["default"])
        .names(vec!["stuck".to_owned()])
        .lease(Duration::from_millis(30_000));
    let again = eventually(Duration::from_secs(10), "the stuck task back on its lease's expiry", || {
        let (store, claim) = (&store, &claim);
        async move { !store.claim(claim).await.expect("claim").is_empty() }
    });
    again.await;
    assert_eq!(status_of(&store, &stuck).await, (TaskStatus::Running, 2), "claimed again after expiry");
    println!("shutdown past a blocked handler took {took:?} (grace {grace:?})");
    schema.drop().await;
}

/// The calls of one claim share the worker's runners: a handler that
/// blocks its thread (a bug, but a common one) must not hold up the calls
/// started beside it, which the other thread runs meanwhile, nor what their
/// ends woke (their settlements' batcher), whether it is taken first or
/// after quick ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_blocking_its_thread_first_holds_up_no_other_call() {
    blocking_among_quick_calls(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_blocking_its_thread_after_quick_ones_holds_up_no_other_call() {
    blocking_among_quick_calls(false).await;
}

async fn blocking_among_quick_calls(blocking_first: bool) {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    // One claim takes them all, the blocking one submitted first at a
    // higher priority, or last at a lower one. A claim answers in no set
    // order, in practice the order the rows were written, so its calls
    // start in that order as a rule, not for certain.
    let quick = (0..40).map(|i| NewTask::new("quick", json!({ "i": i })));
    let batch: Vec<NewTask> = if blocking_first {
        std::iter::once(NewTask::new("blocks", json!({})).priority(10)).chain(quick).collect()
    } else {
        quick.chain(std::iter::once(NewTask::new("blocks", json!({})).priority(-1))).collect()
    };
    let ids = store.submit_batch(batch).await.expect("submit");
    let (blocking, quick) = match blocking_first {
        true => (&ids[0], &ids[1..]),
        false => (&ids[ids.len() - 1], &ids[..ids.len() - 1]),
    };
    // Real time is under test: the quick calls must all end (settled, and
    // so their batcher not held) while the blocking one still holds its
    // thread.
    let blocked_for = Duration::from_secs(4);
    let worker = test_worker(&store, "default")
        .concurrency(64)
        .task("blocks", move |_ctx, _p: serde_json::Value| async move {
            std::thread::sleep(blocked_for);
            Ok(json!({}))
        })
        .task("quick", |_ctx, _p: serde_json::Value| async move { Ok(json!({})) });
    let started = Instant::now();
    let worker = worker.start();
    let quick: Vec<&str> = quick.iter().map(String::as_str).collect();
    until_each(&store, &quick, "every quick task done", |(st, _)| st == TaskStatus::Succeeded).await;
    let took = started.elapsed();
    assert!(took < blocked_for, "the quick calls waited {took:?}, behind the blocked handler");
    assert_eq!(status_of(&store, blocking).await.0, TaskStatus::Running, "the blocking call still runs");
    worker.stop().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_fails_is_tried_again_while_the_lease_lasts() {
    let schema = TestSchema::new().await;
    let (proxy, store) = behind_a_proxy(&schema).await;
    let id = store.submit(NewTask::new("deaf", json!({}))).await.expect("submit").id;
    let worker = test_worker(&store, "default")
        .lease(Duration::from_secs(30))
        .shutdown_grace(Duration::from_millis(100))
        // Ignores its token: shutdown drops it after its short stop grace.
        .task("deaf", |_ctx, _p: serde_json::Value| async move {
            std::future::pending::<()>().await;
            Ok(json!({}))
        })
        .start();
    until_each(&store, &[id.as_str()], "the task running", |(st, _)| st == TaskStatus::Running).await;
    // The server is away when the release is first tried (after the grace
    // and the stop grace), and back once the worker has tried three times
    // (nothing else talks to it through the proxy meanwhile: claims
    // stopped, LISTEN goes around it, and the next heartbeat is 10 s away).
    proxy.set_down(true);
    worker.shutdown();
    eventually(Duration::from_secs(10), "the release tried again while the server is away", || async {
        proxy.refused() >= 3
    })
    .await;
    assert!(!worker.is_finished(), "the worker still tries to give its task back");
    proxy.set_down(false);
    worker.stop().await;
    assert_given_back(&store.fetch(&id).await.expect("fetch"));
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_task_that_panics_gives_its_slots_back() {
    let schema = TestSchema::new().await;
    let plain = pool_store(&schema).await;
    let panicked = Arc::new(AtomicBool::new(false));
    let flag = panicked.clone();
    // The worker's first claim (one queue, one name) panics in the executor.
    let (store, _answered) = hooked(&plain, Statement::ClaimOneQueueOneName, 1, async move {
        flag.store(true, Ordering::SeqCst);
        panic!("the claim panics, as this fault test asked");
    });
    let store = Arc::new(store);
    let id = store.submit(NewTask::new("after.panic", json!({}))).await.expect("submit").id;
    let worker = test_worker(&store, "default")
        .concurrency(2)
        .poll_interval(Duration::from_millis(50))
        .task("after.panic", |_ctx, _p: serde_json::Value| async move { Ok(json!({"ran": true})) })
        .start();
    until_each(&store, &[id.as_str()], "the task to run after the claim that panicked", |(st, _)| {
        st == TaskStatus::Succeeded
    })
    .await;
    assert!(panicked.load(Ordering::SeqCst), "the claim did panic");
    worker.stop().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaimed_task_still_winding_down_counts_against_the_concurrency() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let held = store.submit(NewTask::new("held", json!({}))).await.expect("submit").id;
    // Every run holds on until released, a run that starts late included.
    let (release, released) = tokio::sync::watch::channel(false);
    let starts = Arc::new(AtomicUsize::new(0));
    let n = starts.clone();
    let worker = test_worker(&store, "default")
        .concurrency(2)
        // Long enough that the second run's lease never runs out on a
        // loaded machine: the first run's is ended by hand below.
        .beating_lease(Duration::from_secs(5))
        .poll_interval(Duration::from_millis(50))
        // Both runs of the task hold on, the lost one included.
        .task("held", move |_ctx, _p: serde_json::Value| {
            let (mut released, n) = (released.clone(), n.clone());
            async move {
                n.fetch_add(1, Ordering::SeqCst);
                let _ = released.wait_for(|go| *go).await;
                Ok(json!({}))
            }
        })
        .task("other", |_ctx, _p: serde_json::Value| async move { Ok(json!({})) })
        .start();
    until_each(&store, &[held.as_str()], "the task claimed", |st| st == (TaskStatus::Running, 1)).await;
    // The lease runs out while the run goes on (its heartbeats paused, its
    // deadline moved to the past); this worker's own claim recovers the
    // task and runs it again.
    worker.pause_heartbeats(true);
    store
        .executor()
        .execute_script(&format!(
            "update cairnq_tasks set lease_until_ms = 0 where id = '{held}' and attempt = 1"
        ))
        .await
        .expect("end the first lease");
    // Started, not only claimed: the row says running before the run is.
    eventually(
        Duration::from_secs(20),
        "the task re-claimed and started again by the same worker",
        || async { starts.load(Ordering::SeqCst) == 2 && worker.running() == 2 },
    )
    .await;
    assert_eq!(status_of(&store, &held).await, (TaskStatus::Running, 2));
    worker.pause_heartbeats(false);
    let other = store.submit(NewTask::new("other", json!({}))).await.expect("submit").id;
    // A negative check needs time: several poll intervals and queued
    // signals pass without a claim beyond the two slots.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(status_of(&store, &other).await, (TaskStatus::Queued, 0), "no third run with 2 slots");
    release.send_replace(true);
    until_each(&store, &[other.as_str()], "the other task runs once a slot frees", |(st, _)| {
        st == TaskStatus::Succeeded
    })
    .await;
    assert_eq!(status_of(&store, &held).await, (TaskStatus::Succeeded, 2));
    assert_eq!(starts.load(Ordering::SeqCst), 2);
    worker.stop().await;
    schema.drop().await;
}

/// A store beside a table `side` whose unique check is deferred: inserting
/// the same `n` twice fails the COMMIT, not the insert.
async fn with_a_deferred_constraint() -> (TestSchema, Arc<Store<PgPool>>) {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    store
        .executor()
        .execute_script(
            "create table side (n int, constraint side_once unique (n) deferrable initially deferred)",
        )
        .await
        .expect("side table");
    (schema, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_the_server_refused_is_recorded_as_the_failure() {
    let (schema, store) = with_a_deferred_constraint().await;
    let id = store.submit(NewTask::new("refused", json!({}))).await.expect("submit").id;
    let worker = test_worker(&store, "default")
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
        .start();
    until_each(&store, &[id.as_str()], "the failure recorded", |st| st == (TaskStatus::Queued, 1)).await;
    worker.stop().await;
    let t = store.fetch(&id).await.expect("fetch");
    let envelope = t.error_envelope().expect("the commit's error recorded");
    assert_eq!((envelope.kind.as_str(), envelope.retryable), ("CommitFailed", true));
    assert!(envelope.message.contains("side_once"), "{}", envelope.message);
    assert!(t.result.is_none() && t.run_at_ms > t.updated_at_ms, "retried after the backoff");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_refused_after_the_shutdown_token_gives_the_task_back_unspent() {
    let (schema, store) = with_a_deferred_constraint().await;
    let id = store.submit(NewTask::new("late", json!({})).max_attempts(1)).await.expect("submit").id;
    let refused = Arc::new(AtomicBool::new(false));
    let seen = refused.clone();
    // The handler's writes done: shutdown comes after them (a running row
    // says only that the task was claimed).
    let (written_tx, mut written) = tokio::sync::mpsc::unbounded_channel::<()>();
    let worker = test_worker(&store, "default")
        .shutdown_grace(Duration::from_millis(100))
        .task("late", move |ctx, _p: serde_json::Value| {
            let (seen, written_tx) = (seen.clone(), written_tx.clone());
            async move {
                // The writes come first: after the token, the handler has
                // half a second before it is dropped.
                let tx = ctx.begin().await?;
                tx.client().batch_execute("insert into side values (1), (1)").await.expect("inserts");
                let _ = written_tx.send(());
                let reason = ctx.cancelled().await;
                let err = ctx.complete_in(tx, json!({})).await.expect_err("the commit is refused");
                seen.store(
                    reason == CancelReason::Shutdown && err.sqlstate() == Some("23505"),
                    Ordering::SeqCst,
                );
                Ok(json!({}))
            }
        })
        .start();
    tokio::time::timeout(Duration::from_secs(20), written.recv())
        .await
        .expect("the handler writes within 20 s")
        .expect("the handler is alive");
    worker.stop().await;
    assert!(refused.load(Ordering::SeqCst), "the commit was refused after a shutdown token");
    assert_given_back(&store.fetch(&id).await.expect("fetch"));
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_claim_is_tried_again_soon_not_at_the_next_poll() {
    let schema = TestSchema::new().await;
    let direct = pool_store(&schema).await;
    let (proxy, store) = behind_a_proxy(&schema).await;
    // A queue of its own: `cairnq_queued` is the database's channel, and
    // another test's submit to a shared queue name would wake a claim that
    // the retry under test must bring.
    let queue = "failed-claim-retry";
    let (failed_tx, mut failed) = tokio::sync::mpsc::unbounded_channel();
    let worker = test_worker(&store, queue)
        .poll_interval(Duration::from_secs(120))
        // A hook that panics, too: the worker catches it and goes on.
        .on_error(move |e| {
            if e.during == "claim" {
                let _ = failed_tx.send(());
                panic!("an on_error hook that panics");
            }
        })
        .task("x", |_ctx, _p: serde_json::Value| async move { Ok(json!({})) })
        .start();
    // Settled in: listening (whose first "may have missed" sends a claim
    // of its own), and a first task claimed and run by its signal.
    eventually(Duration::from_secs(10), "the worker listening", || async { store.is_watching() }).await;
    let warm = direct.submit(NewTask::new("x", json!({})).queue(queue)).await.expect("submit").id;
    until_each(&direct, &[warm.as_str()], "a first task run", |(st, _)| st == TaskStatus::Succeeded).await;
    // Every pooled connection cut before the task exists: a claim that
    // reached the server while it was "away" would hold the task, its
    // answer lost, until its lease ran out.
    proxy.take_down().await;
    let id = direct.submit(NewTask::new("x", json!({})).queue(queue)).await.expect("submit").id;
    // Up again only once a claim has failed in the worker (the pool's own
    // wait for a connection would otherwise outlast a short outage, and the
    // claim succeed without any retry).
    tokio::time::timeout(Duration::from_secs(30), failed.recv())
        .await
        .expect("a claim fails while the server is away")
        .expect("the worker is alive");
    proxy.set_down(false);
    // The next poll is two minutes away: only a retry of the failed claim
    // runs the task within this wait.
    until_each(&direct, &[id.as_str()], "the task run after the failed claim", |(st, _)| {
        st == TaskStatus::Succeeded
    })
    .await;
    worker.stop().await;
    schema.drop().await;
}

/// `stop_now` cuts shutdown's grace: a handler that ignores its token is
/// dropped at once, not after the grace (30 s here), and its task given
/// back unspent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_now_drops_a_handler_deaf_to_its_token_and_gives_its_task_back() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let task = store.submit(NewTask::new("deaf", json!({}))).await.expect("submit");
    let started = Arc::new(tokio::sync::Notify::new());
    let s = started.clone();
    let worker = test_worker(&store, "default")
        .shutdown_grace(Duration::from_secs(30))
        .task("deaf", move |_ctx, _p: serde_json::Value| {
            s.notify_one();
            async move {
                // Far past the test, deaf to its token.
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(())
            }
        })
        .start();
    tokio::time::timeout(Duration::from_secs(10), started.notified()).await.expect("the handler starts");
    let stopping = std::time::Instant::now();
    worker.shutdown();
    worker.stop_now();
    worker.ended(Duration::from_secs(20)).await;
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(3), "stop_now took {took:?}");
    assert_given_back(&store.fetch(&task.id).await.expect("fetch"));
    schema.drop().await;
}

/// Claims and settlement flushes share the worker's statement budget; a
/// flush that waits on a row lock gives its place up after a second, so a
/// worker with one place still claims and runs new work while the flush
/// waits (here, for as long as the test holds the lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_waiting_on_a_row_lock_does_not_stop_the_claims() {
    use tokio::sync::{mpsc, Notify};
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let (started, mut starts) = mpsc::unbounded_channel::<String>();
    let go = Arc::new(Notify::new());
    let worker = test_worker(&store, "budget")
        .statement_concurrency(1)
        .poll_interval(Duration::from_millis(100))
        .task("held", {
            let (started, go) = (started.clone(), go.clone());
            move |ctx, _p: serde_json::Value| {
                let (started, go) = (started.clone(), go.clone());
                async move {
                    let _ = started.send(ctx.task().id.clone());
                    go.notified().await;
                    Ok(())
                }
            }
        })
        .task("next", move |ctx, _p: serde_json::Value| {
            let started = started.clone();
            async move {
                let _ = started.send(ctx.task().id.clone());
                Ok(())
            }
        })
        .start();

    let held = store.submit(NewTask::new("held", json!({})).queue("budget")).await.expect("submit").id;
    let first = tokio::time::timeout(Duration::from_secs(10), starts.recv()).await.expect("held starts");
    assert_eq!(first.as_deref(), Some(held.as_str()));
    // Lock the claimed row, then let its handler end: its settlement's
    // flush takes the worker's one place and waits on the lock.
    let locker = raw_client(&schema.url).await;
    locker.batch_execute(&format!("set search_path to \"{}\"; begin", schema.schema)).await.expect("begin");
    locker
        .execute("select 1 from cairnq_tasks where id = $1 for update", &[&held])
        .await
        .expect("lock the row");
    go.notify_one();
    let pid: i32 = locker.query_one("select pg_backend_pid()", &[]).await.expect("pid").get(0);
    let watcher = raw_client(&schema.url).await;
    eventually(Duration::from_secs(10), "the flush to wait on the lock", || {
        let watcher = &watcher;
        async move {
            let sql = "select count(*) from pg_stat_activity where $1 = any(pg_blocking_pids(pid))";
            let blocked: i64 = watcher.query_one(sql, &[&pid]).await.expect("pg_stat_activity").get(0);
            blocked > 0
        }
    })
    .await;

    let next = store.submit(NewTask::new("next", json!({})).queue("budget")).await.expect("submit").id;
    let second = tokio::time::timeout(Duration::from_secs(8), starts.recv())
        .await
        .expect("the next task starts while the flush still waits on the lock");
    assert_eq!(second.as_deref(), Some(next.as_str()));
    assert_eq!(status_of(&store, &held).await, (TaskStatus::Running, 1), "the lock still holds the flush");

    locker.batch_execute("rollback").await.expect("release the lock");
    until_each(&store, &[held.as_str(), next.as_str()], "both settled", |st| {
        st == (TaskStatus::Succeeded, 1)
    })
    .await;
    worker.stop().await;
    schema.drop().await;
}

async fn raw_client(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
}

/// A worker with one place in its statement budget never has two of its
/// claims and settlement flushes under way at once, through a whole drain
/// where both run all the time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_and_flushes_keep_within_the_statement_budget() {
    use waymark_tests::fault_executor::{sql_of, tapped, Tap};
    let schema = TestSchema::new().await;
    let plain = pool_store(&schema).await;
    let ids: Vec<String> = plain
        .submit_batch((0..2000).map(|i| NewTask::new("n", json!({ "i": i })).queue("budget")))
        .await
        .expect("submit");
    let kinds = [
        (Statement::Claim, 0),
        (Statement::ClaimOneName, 0),
        (Statement::ClaimOneQueue, 0),
        (Statement::ClaimOneQueueOneName, 0),
        (Statement::CompleteBatch, 1),
    ];
    let watched: Vec<(String, usize)> = kinds.iter().map(|&(s, kind)| (sql_of(s, &[]), kind)).collect();
    // Under way now, the most at once, and how many of each kind began.
    let counts =
        Arc::new([AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)]);
    let c = counts.clone();
    let store = Arc::new(tapped(&plain, move |text, at, _run| {
        let (_, kind) = watched.iter().find(|(sql, _)| sql == text)?;
        match at {
            Tap::Before => {
                let now = c[0].fetch_add(1, Ordering::SeqCst) + 1;
                c[1].fetch_max(now, Ordering::SeqCst);
                c[2 + kind].fetch_add(1, Ordering::SeqCst);
            }
            Tap::After => {
                c[0].fetch_sub(1, Ordering::SeqCst);
            }
        }
        None
    }));
    let worker = test_worker(&store, "budget")
        .concurrency(64)
        .settle_batch(32, Duration::from_millis(2))
        .statement_concurrency(1)
        .task("n", |_ctx, _p: serde_json::Value| async move { Ok(()) })
        .start();
    tokio::time::timeout(Duration::from_secs(60), worker.until_settled(ids.len() as u64))
        .await
        .expect("the drain ends");
    worker.stop().await;
    let succeeded = plain.fetch(&ids[ids.len() - 1]).await.expect("fetch").status;
    assert_eq!(succeeded, TaskStatus::Succeeded);
    let (claims, flushes) = (counts[2].load(Ordering::SeqCst), counts[3].load(Ordering::SeqCst));
    // Both kinds ran many times over: there was every chance to overlap.
    assert!(claims >= 2 && flushes >= 10, "claims {claims}, flushes {flushes}");
    assert_eq!(counts[1].load(Ordering::SeqCst), 1, "statements under way at once");
    schema.drop().await;
}
