//! The worker on a real PostgreSQL: draining, every way a run can end,
//! leases kept and lost, cancellation, `complete_in`, and shutdown.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{codes, ClaimRequest, NewTask, Store, Task, TaskStatus};
use waymark_tests::{
    eventually, pool_store, test_worker, until_some, until_status, Running, TestSchema, TestWorker,
};
use waymark_worker::{CancelReason, TaskError, Worker, WorkerBuilder};

type S = Store<PgPool>;

async fn fetch(store: &S, id: &str) -> Task {
    store.fetch(id).await.expect("fetch")
}

#[derive(Debug, Deserialize)]
struct Square {
    n: i64,
}

#[derive(Debug, Serialize)]
struct Squared {
    n2: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_drains_typed_tasks_and_settles_each_once() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let mut ids = Vec::new();
    for n in 0..200 {
        ids.push(
            store.submit(NewTask::new("square", json!({ "n": n })).queue("math")).await.expect("submit").id,
        );
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let worker = test_worker(&store, "math")
        .concurrency(8)
        .task("square", move |_ctx, p: Square| {
            let r = r.clone();
            async move {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(Squared { n2: p.n * p.n })
            }
        })
        .start();
    // Woken by the 200th settlement; the rows agree.
    tokio::time::timeout(Duration::from_secs(30), worker.until_settled(200))
        .await
        .expect("200 tasks settled");
    assert_eq!(store.stats(Some("math")).await.expect("stats")["math"].succeeded, 200);
    let handle = worker.handle();
    worker.stop().await;
    assert_eq!(runs.load(Ordering::SeqCst), 200, "each task ran once");
    assert_eq!(handle.settled(), 200);
    let t = fetch(&store, &ids[7]).await;
    assert_eq!((t.status, t.result, t.attempt), (TaskStatus::Succeeded, Some(json!({"n2": 49})), 1));
    schema.drop().await;
}

/// Submits one task of `name`, runs a worker until it settles, returns it.
async fn run_one(
    store: &Arc<S>,
    worker: WorkerBuilder<PgPool>,
    name: &str,
    payload: serde_json::Value,
    attempts: i32,
) -> Task {
    let task =
        store.submit(NewTask::new(name, payload).queue("ends").max_attempts(attempts)).await.expect("submit");
    let worker = worker.start();
    let s = store.clone();
    let id = task.id.clone();
    eventually(Duration::from_secs(20), "the run to settle", || {
        let (s, id) = (s.clone(), id.clone());
        async move {
            let t = s.fetch(&id).await.expect("fetch");
            t.status.is_terminal() || (t.status == TaskStatus::Queued && t.attempt >= 1)
        }
    })
    .await;
    worker.stop().await;
    fetch(store, &task.id).await
}

fn ends_worker(store: &Arc<S>) -> WorkerBuilder<PgPool> {
    test_worker(store, "ends").retry_backoff(Duration::from_secs(60), Duration::from_secs(60))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_way_a_run_ends_writes_its_envelope() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);

    // A panic: caught, retryable handler_error, and the worker lives on.
    let w = ends_worker(&store).task("panics", |_ctx, _p: serde_json::Value| async move {
        if true {
            panic!("boom at the handler");
        }
        Ok(())
    });
    let t = run_one(&store, w, "panics", json!({}), 3).await;
    let e = t.error_envelope().expect("envelope");
    assert_eq!((t.status, e.code.as_str(), e.retryable), (TaskStatus::Queued, codes::HANDLER_ERROR, true));
    assert!(e.message.contains("boom at the handler"), "{e:?}");
    assert!(t.run_at_ms >= t.updated_at_ms + 30_000, "the retry waits its backoff");

    // A panic in the handler function itself, before it returns its
    // future: caught the same way, and the slot comes free.
    let w = ends_worker(&store).task("panics.early", |_ctx, _p: serde_json::Value| {
        if true {
            panic!("boom before the future");
        }
        async move { Ok(()) }
    });
    let t = run_one(&store, w, "panics.early", json!({}), 3).await;
    let e = t.error_envelope().expect("envelope");
    assert_eq!((t.status, e.code.as_str()), (TaskStatus::Queued, codes::HANDLER_ERROR));
    assert!(e.message.contains("boom before the future"), "{e:?}");

    // Past max_run_time: retryable handler_timeout.
    let w = ends_worker(&store).max_run_time(Duration::from_millis(200)).task(
        "slow",
        |_ctx, _p: serde_json::Value| async move {
            std::future::pending::<()>().await;
            Ok(())
        },
    );
    let t = run_one(&store, w, "slow", json!({}), 3).await;
    let e = t.error_envelope().expect("envelope");
    assert_eq!((t.status, e.code.as_str(), e.retryable), (TaskStatus::Queued, codes::HANDLER_TIMEOUT, true));

    // A payload that does not fit: failed for good.
    let w = ends_worker(&store).task("typed", |_ctx, p: Square| async move { Ok(p.n) });
    let t = run_one(&store, w, "typed", json!({"n": "not a number"}), 3).await;
    let e = t.error_envelope().expect("envelope");
    assert_eq!((t.status, e.kind.as_str(), e.retryable), (TaskStatus::Failed, "InvalidPayload", false));
    assert_eq!(t.attempt, 1, "not retried");

    // A result that does not serialise: failed for good.
    let w = ends_worker(&store).task("unserialisable", |_ctx, _p: serde_json::Value| async move {
        let mut bad = std::collections::HashMap::new();
        bad.insert(vec![1u8], 1); // a map with non-string keys is not JSON
        Ok(bad)
    });
    let t = run_one(&store, w, "unserialisable", json!({}), 3).await;
    let e = t.error_envelope().expect("envelope");
    assert_eq!((t.status, e.code.as_str()), (TaskStatus::Failed, codes::UNSERIALIZABLE_RESULT));

    // The handler's own error: permanent, with its own code and details.
    let w = ends_worker(&store).task("refuses", |_ctx, _p: serde_json::Value| async move {
        Err::<(), _>(
            TaskError::permanent("card declined").code("card_declined").details(json!({"last4": "4242"})),
        )
    });
    let t = run_one(&store, w, "refuses", json!({}), 3).await;
    let e = t.error_envelope().expect("envelope");
    assert_eq!((t.status, e.code.as_str(), e.retryable), (TaskStatus::Failed, "card_declined", false));
    assert_eq!(e.details, json!({"last4": "4242"}));

    // A retryable error on the last attempt: failed.
    let w = ends_worker(&store).task("flaky", |_ctx, _p: serde_json::Value| async move {
        Err::<(), _>(TaskError::new("try later"))
    });
    let t = run_one(&store, w, "flaky", json!({}), 1).await;
    assert_eq!(t.status, TaskStatus::Failed);
    assert_eq!(t.error_envelope().expect("envelope").code, codes::TASK_ERROR);
    schema.drop().await;
}

/// A result or an error PostgreSQL cannot store (a NUL character, which
/// jsonb refuses) fails the task at once with an envelope that says so,
/// rather than leaving it to run again each time its lease runs out and
/// end as `lease_expired`. The result's failure is for good; the error's is
/// as retryable as the handler said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_or_error_postgres_cannot_store_fails_the_task_at_once() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let w = ends_worker(&store)
        .lease(Duration::from_secs(60))
        .task("nul.result", |_ctx, _p: serde_json::Value| async move { Ok(json!({ "s": "a\u{0}b" })) });
    let t = run_one(&store, w, "nul.result", json!({}), 3).await;
    let e = t.error_envelope().expect("envelope");
    assert_eq!(
        (t.status, t.attempt, e.kind.as_str(), e.code.as_str(), e.retryable),
        (TaskStatus::Failed, 1, "UnserializableResult", codes::UNSERIALIZABLE_RESULT, false),
        "{e:?}"
    );
    assert!(e.message.contains("22P05"), "{}", e.message);

    let w =
        ends_worker(&store)
            .lease(Duration::from_secs(60))
            .task("nul.error", |_ctx, _p: serde_json::Value| async move {
                Err::<(), _>(TaskError::new("a\u{0}b"))
            });
    let t = run_one(&store, w, "nul.error", json!({}), 3).await;
    let e = t.error_envelope().expect("envelope");
    // Retryable, as the handler said: queued again, due after the backoff.
    assert_eq!(
        (t.status, t.attempt, e.kind.as_str(), e.code.as_str(), e.retryable),
        (TaskStatus::Queued, 1, "UnstorableError", codes::HANDLER_ERROR, true),
        "{e:?}"
    );
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_with_no_handler_is_never_claimed_by_this_worker() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let orphan = store.submit(NewTask::new("nobody.handles", json!({})).queue("ends")).await.expect("submit");
    let w = ends_worker(&store).task("known", |_ctx, _p: serde_json::Value| async move { Ok(()) });
    let known = run_one(&store, w, "known", json!({}), 3).await;
    assert_eq!(known.status, TaskStatus::Succeeded);
    let t = fetch(&store, &orphan.id).await;
    assert_eq!((t.status, t.attempt), (TaskStatus::Queued, 0), "left for a worker that can run it");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_slow_task_and_a_paused_heartbeat_loses_it() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let reasons = Arc::new(Mutex::new(Vec::new()));
    let seen = reasons.clone();
    let worker = test_worker(&store, "lease")
        // One slot, full while a task runs: no claim (and no probe, which
        // a Poll from another test's ended hub would send) takes the
        // expired lease back before the thief.
        .concurrency(1)
        // Fifteen heartbeats per lease: a loaded machine may stall a few.
        .beating_lease(Duration::from_millis(1500))
        // No poll in the test's span: a probe of this worker's would find
        // the expired lease and take the task back before the thief.
        .no_poll()
        .task("slow", move |ctx, p: serde_json::Value| {
            let seen = seen.clone();
            async move {
                let ms = p["ms"].as_u64().unwrap_or(0);
                // Real time is what is under test: work that outlasts the
                // lease several times over, kept by heartbeats.
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                    reason = ctx.cancelled() => { seen.lock().unwrap().push(reason); }
                }
                Ok(json!("done"))
            }
        })
        .start();

    // 4 s of work on a 1.5 s lease: kept by heartbeats, one attempt.
    let kept = store.submit(NewTask::new("slow", json!({"ms": 4000})).queue("lease")).await.expect("submit");
    let done = store.wait(&kept.id, Duration::from_secs(20)).await.expect("wait");
    assert_eq!((done.status, done.attempt), (TaskStatus::Succeeded, 1));

    // Paused: the lease runs out and another worker takes the task.
    worker.pause_heartbeats(true);
    let lost = store.submit(NewTask::new("slow", json!({"ms": 6000})).queue("lease")).await.expect("submit");
    until_status(Duration::from_secs(10), "the first run to start", &store, &lost.id, TaskStatus::Running)
        .await;
    // Real time is what is under test: with heartbeats paused, the 1.5 s
    // lease runs out by the server's clock.
    let admin = waymark_tests::db::admin_client(&schema.url).await;
    let passed = format!(
        "select lease_until_ms < (extract(epoch from clock_timestamp()) * 1000)::int8 from \"{}\".cairnq_tasks where id = $1",
        schema.schema
    );
    eventually(Duration::from_secs(10), "the paused lease to run out", || async {
        admin.query_one(&passed, &[&lost.id]).await.expect("lease").get::<_, bool>(0)
    })
    .await;
    let stolen = store
        .claim(&ClaimRequest::new("thief", ["lease"]).limit(1).lease(Duration::from_millis(60_000)))
        .await
        .expect("claim after expiry");
    assert_eq!(stolen.len(), 1);
    assert_eq!((stolen[0].id.as_str(), stolen[0].attempt), (lost.id.as_str(), 2));
    worker.pause_heartbeats(false);
    // The next beat misses the task: its token fires as LeaseLost, and the
    // handler's late settlement writes nothing.
    let r = reasons.clone();
    eventually(Duration::from_secs(5), "the token to fire", || {
        let r = r.clone();
        async move { r.lock().unwrap().contains(&CancelReason::LeaseLost) }
    })
    .await;
    eventually(Duration::from_secs(5), "the lost run to end", || async { worker.running() == 0 }).await;
    let t = fetch(&store, &lost.id).await;
    assert_eq!((t.status, t.worker_id.as_deref(), t.attempt), (TaskStatus::Running, Some("thief"), 2));
    assert_eq!(t.result, None, "the late settlement was a no-op");
    worker.stop().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_from_another_client_fires_the_token_and_ends_canceled() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let reasons = Arc::new(Mutex::new(Vec::new()));
    let seen = reasons.clone();
    let worker = test_worker(&store, "c")
        .beating_lease(Duration::from_secs(3))
        .task("long", move |ctx, _p: serde_json::Value| {
            let seen = seen.clone();
            async move {
                let reason = ctx.cancelled().await;
                seen.lock().unwrap().push(reason);
                Ok(json!("stopped"))
            }
        })
        .start();
    let task = store.submit(NewTask::new("long", json!({})).queue("c")).await.expect("submit");
    until_status(Duration::from_secs(10), "the run to start", &store, &task.id, TaskStatus::Running).await;
    store.cancel(&task.id).await.expect("cancel");
    let done = store.wait(&task.id, Duration::from_secs(10)).await.expect("wait");
    assert_eq!(done.status, TaskStatus::Canceled);
    assert_eq!(done.result, None, "cancel wins over the result");
    assert_eq!(*reasons.lock().unwrap(), vec![CancelReason::Requested]);
    worker.stop().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_in_commits_the_handlers_rows_with_the_settlement_or_neither() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let admin = waymark_tests::db::admin_client(&schema.url).await;
    let table = format!("\"{}\".receipts", schema.schema);
    admin.batch_execute(&format!("create table {table} (task_id text primary key)")).await.expect("table");
    let insert = format!("insert into {table} (task_id) values ($1)");
    // A task with "wait" holds until the test has stolen its lease.
    let stolen_now = Arc::new(tokio::sync::Notify::new());
    let gate = stolen_now.clone();
    // Handler calls that have returned: the robbed run's end is told by
    // this, not by the worker's count of running calls (zero, too, before
    // the run has started).
    let returned = Arc::new(AtomicUsize::new(0));
    let counted = returned.clone();
    let worker = test_worker(&store, "tx")
        .task("receipt", move |ctx, p: serde_json::Value| {
            let (insert, gate, counted) = (insert.clone(), gate.clone(), counted.clone());
            async move {
                if p["wait"] == true {
                    gate.notified().await;
                }
                let out = async {
                    let tx = ctx.begin().await?;
                    tx.client()
                        .execute(&insert, &[&ctx.id()])
                        .await
                        .map_err(|e| TaskError::new(e.to_string()))?;
                    ctx.complete_in(tx, json!({"receipt": true})).await?;
                    Ok::<(), TaskError>(())
                }
                .await;
                counted.fetch_add(1, Ordering::SeqCst);
                out
            }
        })
        .start();
    let ok = store.submit(NewTask::new("receipt", json!({})).queue("tx")).await.expect("submit");
    let done = store.wait(&ok.id, Duration::from_secs(10)).await.expect("wait");
    assert_eq!((done.status, done.result), (TaskStatus::Succeeded, Some(json!({"receipt": true}))));
    let count = |id: String| {
        let sql = format!("select count(*) from {table} where task_id = $1");
        let admin = &admin;
        async move { admin.query_one(&sql, &[&id]).await.expect("count").get::<_, i64>(0) }
    };
    assert_eq!(count(ok.id.clone()).await, 1, "the row committed with the settlement");

    // The lease is stolen while the handler waits: its row and its
    // settlement roll back together.
    let stolen =
        store.submit(NewTask::new("receipt", json!({"wait": true})).queue("tx")).await.expect("submit");
    until_status(Duration::from_secs(10), "the run to start", &store, &stolen.id, TaskStatus::Running).await;
    // Take it over by force, as another worker's claim after an expiry.
    schema.steal_lease(&stolen.id, "thief").await;
    stolen_now.notify_one();
    eventually(Duration::from_secs(10), "the robbed run to end", || async {
        returned.load(Ordering::SeqCst) == 2 && worker.running() == 0
    })
    .await;
    let t = fetch(&store, &stolen.id).await;
    assert_eq!((t.status, t.worker_id.as_deref()), (TaskStatus::Running, Some("thief")));
    assert_eq!(
        count(stolen.id.clone()).await,
        0,
        "the handler's row rolled back with the refused settlement"
    );
    worker.stop().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_under_load_gives_unfinished_tasks_back_at_once() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    for i in 0..40 {
        store.submit(NewTask::new("sleepy", json!({ "i": i })).queue("sd")).await.expect("submit");
    }
    let worker = test_worker(&store, "sd")
        .concurrency(5)
        .shutdown_grace(Duration::from_millis(300))
        .task("sleepy", |_ctx, _p: serde_json::Value| async move {
            std::future::pending::<()>().await;
            Ok(())
        })
        .start();
    let s = store.clone();
    eventually(Duration::from_secs(10), "five running", || {
        let s = s.clone();
        async move { s.stats(Some("sd")).await.expect("stats")["sd"].running == 5 }
    })
    .await;
    let started = Instant::now();
    worker.stop().await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "shutdown takes about the grace period: {took:?}");
    let counts = store.stats(Some("sd")).await.expect("stats")["sd"];
    assert_eq!((counts.queued, counts.running, counts.succeeded), (40, 0, 0), "nothing lost: {counts:?}");
    // Given back due now and with the attempt unspent: claimable at once.
    let again = store
        .claim(&ClaimRequest::new("next", ["sd"]).limit(40).lease(Duration::from_millis(10_000)))
        .await
        .expect("claim");
    assert_eq!(again.len(), 40);
    assert!(again.iter().all(|t| t.attempt == 1), "no attempt was burnt by the shutdown");
    schema.drop().await;
}

/// A worker busy with a deep backlog skips the probe on most claims, yet it
/// still probes (on its polls, and at least once per poll interval), and so
/// recovers a lease another worker let expire while its own backlog is
/// still draining.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_worker_still_recovers_expired_leases_every_poll_interval() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let backlog: Vec<NewTask> =
        (0..3000).map(|i| NewTask::new("busy", json!({ "i": i })).queue("busy")).collect();
    store.submit_batch(backlog).await.expect("backlog");
    let ghost = store
        .submit(NewTask::new("busy", json!({"ghost": true})).queue("busy").priority(10))
        .await
        .expect("ghost");
    let taken = store
        .claim(&ClaimRequest::new("ghost-worker", ["busy"]).limit(1).lease(Duration::from_millis(100)))
        .await
        .expect("the ghost claims it");
    assert_eq!(taken[0].id, ghost.id);

    let worker = test_worker(&store, "busy")
        .concurrency(16)
        .poll_interval(Duration::from_millis(300))
        .task("busy", |_ctx, _p: serde_json::Value| async move {
            // Real time under test: 200 ms of work per task keeps a backlog
            // draining (for over 30 s) while the expired lease is recovered.
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(())
        })
        .start();
    let started = Instant::now();
    let s = store.clone();
    let id = ghost.id.clone();
    eventually(Duration::from_secs(20), "the expired lease to be recovered and the task run again", || {
        let (s, id) = (s.clone(), id.clone());
        async move {
            let t = s.fetch(&id).await.expect("fetch");
            t.status == TaskStatus::Succeeded && t.attempt == 2
        }
    })
    .await;
    let queued = store.stats(Some("busy")).await.expect("stats")["busy"].queued;
    assert!(
        queued > 0,
        "recovered while the backlog still drained ({queued} left after {:?})",
        started.elapsed()
    );
    worker.stop().await;
    schema.drop().await;
}

/// A worker whose one task's settlement meets a passing failure: the
/// pool's only connection is held here (`tx`) from before the handler
/// returns, and the settlement has been refused as saturated a few times.
struct RefusedSettlement {
    store: Arc<Store<PgPool>>,
    task: Task,
    worker: Running,
    tx: waymark_pool::PoolTransaction,
}

async fn a_refused_settlement(
    schema: &TestSchema,
    configure: impl FnOnce(WorkerBuilder<PgPool>) -> WorkerBuilder<PgPool>,
) -> RefusedSettlement {
    use waymark_store::{ConnectOptions, PgExecutor};
    let pool = PgPool::builder(&schema.url)
        .max_size(1)
        .acquire_timeout(Duration::from_millis(50))
        .schema(&schema.schema)
        .build()
        .expect("pool");
    let store =
        Arc::new(Store::connect(pool, ConnectOptions::new().schema(&schema.schema)).await.expect("connect"));
    let task = store.submit(NewTask::new("held", json!({})).queue("held")).await.expect("submit");
    let (started, gate) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
    let (s, g) = (started.clone(), gate.clone());
    let worker = configure(test_worker(&store, "held").no_poll())
        .task("held", move |_ctx, _p: serde_json::Value| {
            let (s, g) = (s.clone(), g.clone());
            async move {
                s.notify_one();
                g.notified().await;
                Ok(())
            }
        })
        .start();
    tokio::time::timeout(Duration::from_secs(10), started.notified()).await.expect("the handler starts");

    // The worker is idle between its loops' turns, so the connection is
    // free but for a moment now and then: take it within a few tries.
    let tx = until_some(Duration::from_secs(5), "the pool's only connection", || async {
        store.executor().begin().await.ok()
    })
    .await;
    let refused = store.executor().stats().saturated;
    gate.notify_one();
    eventually(Duration::from_secs(10), "the settlement refused a few times", || async {
        store.executor().stats().saturated >= refused + 3
    })
    .await;
    RefusedSettlement { store, task, worker, tx }
}

/// A settlement that meets a passing failure (here the pool's only
/// connection held elsewhere, so each try is refused as saturated) is tried
/// again while the lease lasts, and lands once the connection is free: no
/// settle error reaches the hook, and the task ends succeeded on its first
/// attempt, long before its lease would have run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_refused_by_a_saturated_pool_is_tried_again() {
    use waymark_store::PgTransaction;
    let schema = TestSchema::new().await;
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let e = errors.clone();
    let RefusedSettlement { store, task, worker, tx } =
        a_refused_settlement(&schema, |b| b.on_error(move |err| e.lock().unwrap().push(err.during.clone())))
            .await;
    tx.rollback().await.expect("give it back");

    until_status(Duration::from_secs(10), "the settlement to land", &store, &task.id, TaskStatus::Succeeded)
        .await;
    assert_eq!(fetch(&store, &task.id).await.attempt, 1);
    let settle_errors: Vec<String> =
        errors.lock().unwrap().iter().filter(|d| d.starts_with("settle")).cloned().collect();
    assert!(settle_errors.is_empty(), "a passing failure is not reported: {settle_errors:?}");
    worker.stop().await;
    schema.drop().await;
}

/// A settlement still failing for a passing reason when shutdown's grace
/// runs out is not tried again for the rest of its lease (half of 30 s
/// here): shutdown ends within its bound and the lease decides. The call
/// ended when its handler returned (its settlement handed to the batcher),
/// so it is the batcher's resend that must stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_still_refused_past_the_grace_does_not_hold_shutdown() {
    use waymark_store::PgTransaction;
    let schema = TestSchema::new().await;
    let RefusedSettlement { store, task, worker, tx } =
        a_refused_settlement(&schema, |b| b.shutdown_grace(Duration::from_millis(200)).on_error(|_| {}))
            .await;
    let stopping = Instant::now();
    worker.shutdown();
    worker.ended(Duration::from_secs(10)).await;
    let took = stopping.elapsed();
    // The grace (0.2 s), the stop grace and settle bound (2.5 s), and the
    // resend's pause (at most 1 s), with room for a slow machine.
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}, holding a resend past its grace");
    tx.rollback().await.expect("give the connection back");
    let row = fetch(&store, &task.id).await;
    assert_eq!((row.status, row.attempt), (TaskStatus::Running, 1), "unsettled: its lease decides");
    schema.drop().await;
}

/// Settings a worker could not run with are refused when it is built,
/// each with an error naming the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_builder_refuses_settings_it_cannot_run() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let refused = |b: WorkerBuilder<PgPool>, needle: &str| {
        let err = b.task("x", |_ctx, _p: serde_json::Value| async move { Ok(()) }).build().expect_err(needle);
        assert!(err.to_string().contains(needle), "{err} should name {needle:?}");
    };
    let year = Duration::from_secs(400 * 24 * 3600);
    refused(Worker::builder(store.clone()).lease(Duration::from_millis(5)), "lease must be at least 10 ms");
    refused(Worker::builder(store.clone()).lease(year), "lease must be at most");
    refused(Worker::builder(store.clone()).statement_concurrency(0), "statement_concurrency must be 1 to");
    refused(
        Worker::builder(store.clone()).statement_concurrency(usize::MAX),
        "statement_concurrency must be 1 to",
    );
    refused(Worker::builder(store.clone()).retry_backoff(Duration::from_secs(1), year), "retry backoff max");
    refused(
        Worker::builder(store.clone())
            .lease(Duration::from_secs(1))
            .heartbeat_interval(Duration::from_secs(2)),
        "must be shorter than the lease",
    );
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_store_is_closed_stops_and_reports_it() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = errors.clone();
    let worker = test_worker(&store, "closing")
        .poll_interval(Duration::from_millis(50))
        .on_error(move |e| seen.lock().unwrap().push(e.error.is_store_closed()))
        .task("noop", |_ctx, _p: serde_json::Value| async move { Ok(()) })
        .start();
    let t = store.submit(NewTask::new("noop", json!({})).queue("closing")).await.expect("submit");
    store.wait(&t.id, Duration::from_secs(20)).await.expect("runs while open");
    store.close().await;
    // Its next claim meets the closed store: the worker stops by itself.
    worker.ended(Duration::from_secs(10)).await;
    assert!(errors.lock().unwrap().iter().any(|closed| *closed), "the hook heard StoreClosed");
    schema.drop().await;
}

/// Counts handlers at work and the most seen at once.
#[derive(Default)]
struct AtOnce {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl AtOnce {
    fn enter(&self) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

/// A worker of two slots whose "work" handler returns at once, or, for a
/// payload with `"slow": true`, when `gate` gives it a permit; it counts
/// the handlers at work in `at_once`.
fn two_slot_worker(store: &Arc<S>, at_once: &Arc<AtOnce>, gate: &Arc<tokio::sync::Semaphore>) -> Running {
    let (seen, open) = (at_once.clone(), gate.clone());
    test_worker(store, "default")
        .concurrency(2)
        .shutdown_grace(Duration::from_millis(200))
        .task("work", move |_ctx, p: serde_json::Value| {
            let (seen, open) = (seen.clone(), open.clone());
            async move {
                seen.enter();
                if p["slow"] == true {
                    if let Ok(permit) = open.acquire().await {
                        permit.forget();
                    }
                }
                seen.leave();
                Ok(())
            }
        })
        .start()
}

/// Submits `n` short tasks and waits for them to succeed; answers the most
/// rows seen running at once meanwhile.
async fn drain_short(store: &Arc<S>, n: usize) -> usize {
    let quick: Vec<NewTask> = (0..n).map(|i| NewTask::new("work", json!({ "i": i }))).collect();
    store.submit_batch(quick).await.expect("short tasks");
    let most_held = Arc::new(AtomicUsize::new(0));
    let (s, held) = (store.clone(), most_held.clone());
    eventually(Duration::from_secs(60), "the short tasks to succeed", || {
        let (s, held) = (s.clone(), held.clone());
        async move {
            let c = s.stats(None).await.expect("stats")["default"];
            held.fetch_max(c.running as usize, Ordering::SeqCst);
            c.succeeded as usize >= n
        }
    })
    .await;
    most_held.load(Ordering::SeqCst)
}

/// Submits 20 slow tasks.
async fn submit_slow(store: &S) {
    let slow: Vec<NewTask> = (0..20).map(|i| NewTask::new("work", json!({ "i": i, "slow": true }))).collect();
    store.submit_batch(slow).await.expect("slow tasks");
}

async fn queued_all_unspent(store: &S) -> bool {
    let queued = store
        .list(&waymark_store::ListFilter { status: Some(TaskStatus::Queued), ..Default::default() })
        .await
        .expect("list");
    queued.iter().all(|t| t.attempt == 0)
}

/// With short calls a worker claims ahead of its free slots (a worker of
/// two slots holds more running rows than two), never running more than
/// two handlers at once; when the calls turn long, what it claimed ahead
/// goes back to the queue with its attempt unspent, for any worker to
/// take, and it claims ahead no more while the long calls run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_claims_ahead_only_while_calls_are_short() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let (at_once, gate) = (Arc::new(AtOnce::default()), Arc::new(tokio::sync::Semaphore::new(0)));
    let worker = two_slot_worker(&store, &at_once, &gate);

    // Short calls: held rows pass the two slots, handlers never do.
    let most_held = drain_short(&store, 2000).await;
    assert!(most_held > 2, "claimed ahead of its two slots: {most_held}");
    assert!(at_once.most() <= 2, "never more than two handlers at once");

    // Long calls: two run; whatever was claimed ahead goes back, unspent.
    submit_slow(&store).await;
    let s = store.clone();
    eventually(Duration::from_secs(10), "two slow tasks running, the rest queued", || {
        let s = s.clone();
        async move {
            let c = s.stats(None).await.expect("stats")["default"];
            (c.running, c.queued) == (2, 18)
        }
    })
    .await;
    assert!(queued_all_unspent(&store).await, "given back with the attempt unspent");
    // While the long calls run, nothing more is claimed ahead. (A negative
    // check, in real time: nothing marks a claim that is not made, so
    // several of the worker's turns pass.)
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c = store.stats(None).await.expect("stats")["default"];
    assert_eq!((c.running, c.queued), (2, 18), "no claim ahead behind long calls");

    gate.add_permits(20);
    let s = store.clone();
    eventually(Duration::from_secs(30), "every task to succeed", || {
        let s = s.clone();
        async move { s.stats(None).await.expect("stats")["default"].succeeded == 2020 }
    })
    .await;
    assert!(at_once.most() <= 2, "never more than two handlers at once");
    worker.stop().await;
    schema.drop().await;
}

/// Shutdown with calls claimed ahead of a free slot: they are given back,
/// never started past the worker's slots, and every task ends queued with
/// its attempt unspent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_gives_back_what_was_claimed_ahead_without_running_it() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let (at_once, gate) = (Arc::new(AtOnce::default()), Arc::new(tokio::sync::Semaphore::new(0)));
    let worker = two_slot_worker(&store, &at_once, &gate);
    // Short calls first, so that the worker claims ahead.
    drain_short(&store, 200).await;
    // Told in-process, not by the table: a call claimed ahead goes back
    // after 100 ms, which a loaded machine's reads could miss.
    let mut events = worker.events();
    submit_slow(&store).await;
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut claimed = 0;
        while claimed <= 2 {
            match events.recv().await {
                Ok(waymark_worker::WorkerEvent::Claimed { .. }) => claimed += 1,
                Ok(_) => {}
                Err(e) => panic!("events: {e}"),
            }
        }
    })
    .await
    .expect("more slow tasks claimed than slots within 10 s");
    worker.stop().await;
    assert!(at_once.most() <= 2, "never more than two handlers at once");
    let c = store.stats(None).await.expect("stats")["default"];
    assert_eq!((c.queued, c.running, c.succeeded), (20, 0, 200), "nothing lost: {c:?}");
    assert!(queued_all_unspent(&store).await, "every slow task given back unspent");
    schema.drop().await;
}

/// A task submitted while a claim is under way goes to a second claim at
/// once: the first reserved only the few slots a trickle of work needs, so
/// the signal finds slots to claim for, and the task waits neither for the
/// first claim (whose snapshot may predate it) nor for the next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_queued_during_a_claim_is_claimed_by_a_second_claim_at_once() {
    use waymark_store::protocol::Statement;
    let schema = TestSchema::new().await;
    let plain = pool_store(&schema).await;
    let submitter = plain.clone();
    let (late_tx, late_rx) = tokio::sync::oneshot::channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let released = release.clone();
    // Before the worker's first claim statement runs, another task is
    // queued; the claim is held until that task has been claimed.
    let (store, _answered) =
        waymark_tests::fault_executor::hooked(&plain, Statement::ClaimOneQueueOneName, 1, async move {
            let late = submitter.submit(NewTask::new("sig", json!({}))).await.expect("submit late");
            let _ = late_tx.send(late.id);
            released.notified().await;
        });
    let store = Arc::new(store);
    let (worker, mut events) = test_worker(&store, "default")
        .concurrency(64)
        // No poll comes to the rescue within the test's time.
        .no_poll()
        .task("sig", |_ctx, _p: serde_json::Value| async move { Ok(json!({})) })
        .start_with_events();
    let first = store.submit(NewTask::new("sig", json!({}))).await.expect("submit").id;
    let late = tokio::time::timeout(Duration::from_secs(20), late_rx)
        .await
        .expect("the first claim statement within 20 s")
        .expect("the hook sent the late task's id");
    let claimed_late = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match events.recv().await.expect("events") {
                waymark_worker::WorkerEvent::Claimed { task_id, .. } if task_id == late => return,
                _ => {}
            }
        }
    })
    .await;
    release.notify_one();
    assert!(claimed_late.is_ok(), "the late task was not claimed while the first claim was under way");
    for id in [&first, &late] {
        let done = plain.wait(id, Duration::from_secs(20)).await.expect("the task ends");
        assert_eq!(done.status, TaskStatus::Succeeded);
    }
    worker.stop().await;
    schema.drop().await;
}

/// A task row that another transaction holds locked (an operator's open
/// transaction here; a handler's own, a settlement in flight) does not hold
/// back the renewal of the worker's other leases, and stays the worker's
/// while the lock lasts: once it goes, its lease is renewed too, and both
/// runs end on their first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_locked_elsewhere_holds_back_no_other_lease() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let (open, gate) = tokio::sync::watch::channel(false);
    let reasons = Arc::new(Mutex::new(Vec::new()));
    let seen = reasons.clone();
    let w = test_worker(&store, "held")
        .concurrency(2)
        // Long enough that `a`, not renewed while held, keeps its lease
        // through a slow machine's beats.
        .beating_lease(Duration::from_secs(6))
        .no_poll()
        .task("wait", move |ctx, _p: serde_json::Value| {
            let (mut gate, seen) = (gate.clone(), seen.clone());
            async move {
                tokio::select! {
                    _ = gate.wait_for(|open| *open) => {}
                    reason = ctx.cancelled() => { seen.lock().unwrap().push(reason); }
                }
                Ok(json!("done"))
            }
        });
    let a = store.submit(NewTask::new("wait", json!({})).queue("held")).await.expect("submit");
    let b = store.submit(NewTask::new("wait", json!({})).queue("held")).await.expect("submit");
    let worker = w.start();
    eventually(Duration::from_secs(10), "both runs to start", || async { worker.running() == 2 }).await;

    let table = format!("\"{}\".cairnq_tasks", schema.schema);
    let now_ms = "(extract(epoch from clock_timestamp()) * 1000)::int8";
    let mut admin = waymark_tests::db::admin_client(&schema.url).await;
    let lock = admin.transaction().await.expect("begin");
    lock.query(&format!("select 1 from {table} where id = $1 for update"), &[&a.id]).await.expect("lock a");
    let locked_at: i64 = lock.query_one(&format!("select {now_ms}"), &[]).await.expect("clock").get(0);
    // Renewed after the lock was taken: a beat that waited for `a`'s row
    // would renew nothing until the lock went.
    let s = store.clone();
    eventually(Duration::from_secs(10), "b's lease renewed while a's row is locked", || {
        let (s, id) = (s.clone(), b.id.clone());
        async move { s.fetch(&id).await.expect("fetch").lease_until_ms > Some(locked_at + 6000) }
    })
    .await;
    lock.rollback().await.expect("unlock a");
    let checker = waymark_tests::db::admin_client(&schema.url).await;
    let unlocked_at: i64 = checker.query_one(&format!("select {now_ms}"), &[]).await.expect("clock").get(0);
    eventually(Duration::from_secs(10), "a's lease renewed once its row is free", || {
        let (s, id) = (s.clone(), a.id.clone());
        async move { s.fetch(&id).await.expect("fetch").lease_until_ms > Some(unlocked_at + 6000) }
    })
    .await;
    assert_eq!(worker.running(), 2, "neither run ended");
    assert!(reasons.lock().unwrap().is_empty(), "no token fired: {:?}", reasons.lock().unwrap());

    open.send(true).expect("open the gate");
    for id in [&a.id, &b.id] {
        let done = store.wait(id, Duration::from_secs(10)).await.expect("wait");
        assert_eq!((done.status, done.attempt), (TaskStatus::Succeeded, 1), "{id}");
    }
    worker.stop().await;
    schema.drop().await;
}
