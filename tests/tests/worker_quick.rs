//! Handlers declared quick (`HandlerOptions::quick`) on a real PostgreSQL:
//! their calls run in groups once they have shown they end at once; a
//! grouped call that awaits goes on on a runner of its own, one that
//! panics fails alone, and handlers not declared quick (or blocking ones)
//! never run in a group.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::{NewTask, Store, TaskStatus};
use waymark_tests::{pool_store, test_worker, TestSchema, TestWorker};
use waymark_worker::{HandlerOptions, WorkerBuilder, WorkerHandle};

type S = Arc<Store<PgPool>>;

/// Submits `tasks` and waits until the worker has settled `settled`
/// tasks in all; answers the ids.
async fn run_through(store: &S, handle: &WorkerHandle, tasks: Vec<NewTask>, settled: u64) -> Vec<String> {
    let ids = store.submit_batch(tasks).await.expect("submit");
    tokio::time::timeout(Duration::from_secs(60), handle.until_settled(settled))
        .await
        .unwrap_or_else(|_| panic!("{settled} tasks settled within 60 s (settled {})", handle.settled()));
    ids
}

fn quick_worker(store: &S) -> WorkerBuilder<PgPool> {
    test_worker(store, "default").concurrency(64).task_with(
        "step",
        HandlerOptions::new().quick(),
        |_ctx, p: serde_json::Value| async move {
            match p["mode"].as_str() {
                // A call that is pending at its first poll.
                Some("await") => tokio::time::sleep(Duration::from_millis(2)).await,
                Some("panic") => panic!("a grouped call panics"),
                _ => {}
            }
            Ok(p["i"].clone())
        },
    )
}

/// `name` tasks of `mode` (see `quick_worker`), numbered from 0, each of
/// one attempt (a panic fails it for good, and no retry comes later).
fn tasks(name: &str, mode: &str, range: std::ops::Range<i64>) -> Vec<NewTask> {
    range.map(|i| NewTask::new(name, json!({ "mode": mode, "i": i })).max_attempts(1)).collect()
}

/// Runs batches of `tasks` (after quick ones that let the handler show it
/// ends at once) until one of them has calls run in a group, five tries
/// at most: on a busy machine two slow polls in a row send the handler
/// back to a runner per call. Each batch must settle as `check` says.
/// Answers whether a batch ran in a group.
async fn in_a_group(
    store: &S,
    handle: &WorkerHandle,
    settled: &mut u64,
    batch: impl Fn() -> Vec<NewTask>,
    check: impl Fn(usize, waymark_store::Task),
) -> bool {
    for _ in 0..5 {
        *settled += 100;
        run_through(store, handle, tasks("step", "ok", 0..100), *settled).await;
        let before = handle.calls_run_in_groups();
        let tasks = batch();
        *settled += tasks.len() as u64;
        let ids = run_through(store, handle, tasks, *settled).await;
        for (i, id) in ids.iter().enumerate() {
            check(i, store.fetch(id).await.expect("fetch"));
        }
        if handle.calls_run_in_groups() > before {
            return true;
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quick_handlers_calls_run_in_groups_and_those_that_await_or_panic_still_settle() {
    let schema = TestSchema::new().await;
    let store: S = Arc::new(pool_store(&schema).await);
    let worker = quick_worker(&store).start();
    let mut settled = 0;

    // Quick calls: after the first have shown it, they run in groups.
    let quick = |i: usize, t: waymark_store::Task| {
        assert_eq!((t.status, t.result), (TaskStatus::Succeeded, Some(json!(i))), "quick task {i}");
    };
    let grouped = in_a_group(&store, &worker, &mut settled, || tasks("step", "ok", 0..200), quick).await;
    assert!(grouped, "no quick call ran in a group");

    // Calls that await in their first poll: in a group, they go on, each
    // on a runner of its own, and every one of them settles.
    let waiting = |i: usize, t: waymark_store::Task| {
        assert_eq!((t.status, t.result), (TaskStatus::Succeeded, Some(json!(i))), "awaiting task {i}");
    };
    let grouped = in_a_group(&store, &worker, &mut settled, || tasks("step", "await", 0..64), waiting).await;
    assert!(grouped, "no awaiting call was started in a group");

    // Calls that panic in a group: each fails alone, as a panic does on a
    // runner.
    let panicked = |_: usize, t: waymark_store::Task| {
        let e = t.error_envelope().expect("envelope");
        assert_eq!(
            (t.status, e.kind.as_str()),
            (TaskStatus::Failed, "Panic"),
            "a panicking call fails alone"
        );
    };
    let grouped = in_a_group(&store, &worker, &mut settled, || tasks("step", "panic", 0..10), panicked).await;
    assert!(grouped, "no panicking call ran in a group");

    worker.stop().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_not_declared_quick_never_runs_in_groups() {
    let schema = TestSchema::new().await;
    let store: S = Arc::new(pool_store(&schema).await);
    let worker = test_worker(&store, "default")
        .concurrency(64)
        .task("plain", |_ctx, p: serde_json::Value| async move { Ok(p["i"].clone()) })
        .start();
    run_through(&store, &worker, tasks("plain", "ok", 0..300), 300).await;
    assert_eq!(worker.calls_run_in_groups(), 0);
    worker.stop().await;
    schema.drop().await;
}

/// A grouped call that blocks its thread past shutdown's grace: the calls
/// after it in its group are given back (their attempts unspent) and never
/// run, not even once the blocking call returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_behind_a_blocked_call_in_a_group_are_given_back_at_shutdown_and_never_run() {
    let schema = TestSchema::new().await;
    let store: S = Arc::new(pool_store(&schema).await);
    // Each try is a worker of its own (shutdown ends it). A try may miss
    // the case: on a busy machine two slow polls can send the handler back
    // to a runner per call before the batch starts, and a claim answers in
    // no set order, so the blocking call may come last in its group.
    for _ in 0..3 {
        if blocked_group_at_shutdown(&store).await {
            schema.drop().await;
            return;
        }
    }
    panic!("in three tries, no call waited behind the blocking one in its group");
}

/// One try of the test above: answers whether calls waited behind the
/// blocking one; what it promises is checked either way.
async fn blocked_group_at_shutdown(store: &S) -> bool {
    let started = Arc::new(AtomicUsize::new(0));
    let blocking = Arc::new(tokio::sync::Notify::new());
    let (count, blocks) = (started.clone(), blocking.clone());
    // Real time is under test: the block outlasts the grace, the stop
    // grace and shutdown's bound for settlements (0.2 + 0.5 + 2 s).
    let block_for = Duration::from_secs(6);
    let worker = test_worker(store, "default")
        .concurrency(64)
        .shutdown_grace(Duration::from_millis(200))
        .task_with("step", HandlerOptions::new().quick(), move |_ctx, p: serde_json::Value| {
            let (count, blocks) = (count.clone(), blocks.clone());
            async move {
                match p["mode"].as_str() {
                    Some("block") => {
                        blocks.notify_one();
                        std::thread::sleep(block_for);
                    }
                    Some("after") => {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {}
                }
                Ok(p["i"].clone())
            }
        })
        .start();
    // Shown quick: a batch whose calls ran in groups, just before.
    let mut settled = 0;
    for _ in 0..5 {
        let before = worker.calls_run_in_groups();
        settled += 100;
        run_through(store, &worker, tasks("step", "ok", 0..100), settled).await;
        if worker.calls_run_in_groups() > before {
            break;
        }
    }
    // One claim, by priority: the blocking call and forty others.
    let blocked = NewTask::new("step", json!({ "mode": "block", "i": -1 })).priority(10).max_attempts(1);
    let mut batch = vec![blocked];
    batch.extend(tasks("step", "after", 0..40).into_iter().map(|t| t.priority(5)));
    let ids = store.submit_batch(batch).await.expect("submit");
    tokio::time::timeout(Duration::from_secs(10), blocking.notified())
        .await
        .expect("the blocking call started");
    worker.shutdown();
    worker.ended(Duration::from_secs(30)).await;
    let ran_at_shutdown = started.load(Ordering::SeqCst);
    let mut given_back = Vec::new();
    for id in &ids[1..] {
        let t = store.fetch(id).await.expect("fetch");
        match t.status {
            TaskStatus::Succeeded => {}
            TaskStatus::Queued => {
                assert_eq!(t.attempt, 0, "given back with its attempt unspent");
                given_back.push(id.clone());
            }
            other => panic!("task {id} is {other:?}"),
        }
    }
    assert_eq!(ran_at_shutdown, 40 - given_back.len(), "every call not given back ran, and only those");
    // Once the blocking call returns, its group's runner goes on: the
    // calls given back must not run. Real time: a negative check, past the
    // block's end (nothing marks a call that does not run).
    tokio::time::sleep(block_for).await;
    assert_eq!(started.load(Ordering::SeqCst), ran_at_shutdown, "a call given back ran after all");
    for id in &given_back {
        assert_eq!(store.fetch(id).await.expect("fetch").status, TaskStatus::Queued, "still queued: {id}");
        // Out of the next try's way.
        store.cancel(id).await.expect("cancel");
    }
    !given_back.is_empty()
}

/// A panic in the worker's own code past a handler's guard (the test hook
/// makes the next calls panic right after their handlers return) ends
/// that call only, whether it ran on a runner of its own or in a group:
/// the runners go on, the call gives its slot back, its lease is no
/// longer renewed, so its task comes back once the lease runs out and
/// runs again; and shutdown does not wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_past_the_handler_ends_its_call_only_and_its_task_comes_back() {
    let schema = TestSchema::new().await;
    let store: S = Arc::new(pool_store(&schema).await);
    // Real time is under test: a lease renewed every second would never
    // run out, one left alone runs out in three.
    let worker = test_worker(&store, "default")
        .concurrency(64)
        .lease(Duration::from_secs(3))
        .poll_interval(Duration::from_millis(100))
        .task_with("step", HandlerOptions::new().quick(), |_ctx, p: serde_json::Value| async move {
            Ok(p["i"].clone())
        })
        .task("plain", |_ctx, p: serde_json::Value| async move { Ok(p["i"].clone()) })
        .start();
    let mut settled = 0;

    // On runners of their own (a handler not declared quick), then in a
    // group (after quick calls that let the handler show it ends at once;
    // five tries, as `in_a_group`).
    let mut grouped = false;
    for (name, tries) in [("plain", 1), ("step", 5)] {
        for _ in 0..tries {
            if name == "step" {
                settled += 100;
                run_through(&store, &worker, tasks("step", "ok", 0..100), settled).await;
            }
            let before = worker.calls_run_in_groups();
            worker.panic_past_handlers(2);
            settled += 38;
            // Attempts to spare: the lease's run-out requeues the task.
            let batch = tasks(name, "ok", 0..40).into_iter().map(|t| t.max_attempts(3)).collect();
            let ids = run_through(&store, &worker, batch, settled).await;
            // Every call of the batch, the two that panicked among them.
            grouped = worker.calls_run_in_groups() - before == 40;
            waymark_tests::eventually(Duration::from_secs(30), "the panicked calls free their slots", || {
                let running = worker.running();
                async move { running == 0 }
            })
            .await;
            // The two come back once their leases run out, and run again.
            settled += 2;
            tokio::time::timeout(Duration::from_secs(60), worker.until_settled(settled))
                .await
                .expect("the tasks of the panicked calls ran again");
            let mut again = 0;
            for id in &ids {
                let t = store.fetch(id).await.expect("fetch");
                assert_eq!(t.status, TaskStatus::Succeeded, "{name} task {id}");
                again += usize::from(t.attempt == 2);
            }
            assert_eq!(again, 2, "{name}: the two calls that panicked, and only they, ran again");
            if name == "plain" || grouped {
                break;
            }
        }
    }
    assert!(grouped, "in five tries, no batch whose calls panicked past their handlers ran in groups whole");
    worker.shutdown();
    worker.ended(Duration::from_secs(30)).await;
    schema.drop().await;
}
