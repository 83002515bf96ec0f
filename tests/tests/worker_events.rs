//! The worker's events: what a subscriber sees of each task's life, in
//! order, and that a test can wait on them instead of polling the table.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::broadcast::Receiver;
use waymark_store::{NewTask, TaskStatus};
use waymark_tests::{pool_store, test_worker, TestSchema, TestWorker};
use waymark_worker::{CancelReason, WorkerEvent};

/// The next event, or a panic naming what was awaited.
async fn next(events: &mut Receiver<WorkerEvent>, what: &str) -> WorkerEvent {
    match tokio::time::timeout(Duration::from_secs(20), events.recv()).await {
        Ok(Ok(event)) => event,
        Ok(Err(e)) => panic!("waiting for {what}: {e}"),
        Err(_) => panic!("no event within 20 s while waiting for {what}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_sees_claims_settlements_lost_leases_give_backs_and_the_stop() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let (worker, mut events) = test_worker(&store, "ev")
        .beating_lease(Duration::from_secs(2))
        // No poll of this worker's may recover the lease the test expires:
        // the thief below must be the one to take the task.
        .no_poll()
        .shutdown_grace(Duration::from_millis(200))
        .task("ok", |_ctx, p: serde_json::Value| async move { Ok(p) })
        .task("fails", |_ctx, _p: serde_json::Value| async move {
            Err::<(), _>(waymark_worker::TaskError::new("no").retryable(false))
        })
        .task("hold", |ctx, _p: serde_json::Value| async move {
            // Until the token fires; a lost lease ends the run, whose
            // answer is then dropped.
            let reason = ctx.cancelled().await;
            assert_ne!(reason, CancelReason::Requested);
            Ok(())
        })
        .start_with_events();

    let ok = store.submit(NewTask::new("ok", json!({"n": 1})).queue("ev")).await.expect("submit");
    assert_eq!(
        next(&mut events, "the claim").await,
        WorkerEvent::Claimed { task_id: ok.id.clone(), name: "ok".into(), attempt: 1 }
    );
    assert_eq!(
        next(&mut events, "the settlement").await,
        WorkerEvent::Settled { task_id: ok.id.clone(), attempt: 1, status: TaskStatus::Succeeded }
    );
    let failed = store.submit(NewTask::new("fails", json!({})).queue("ev")).await.expect("submit");
    assert!(
        matches!(next(&mut events, "the claim").await, WorkerEvent::Claimed { ref task_id, .. } if *task_id == failed.id)
    );
    assert_eq!(
        next(&mut events, "the failure").await,
        WorkerEvent::Settled { task_id: failed.id.clone(), attempt: 1, status: TaskStatus::Failed }
    );

    // A lease ended by writing the row, the task taken by another worker:
    // the next heartbeat misses it.
    let held = store.submit(NewTask::new("hold", json!({})).queue("ev")).await.expect("submit");
    assert!(
        matches!(next(&mut events, "the claim").await, WorkerEvent::Claimed { ref task_id, .. } if *task_id == held.id)
    );
    schema.steal_lease(&held.id, "thief").await;
    assert_eq!(
        next(&mut events, "the lost lease").await,
        WorkerEvent::LeaseLost { task_id: held.id.clone(), attempt: 1 }
    );

    // Shutdown gives an unfinished task back, then the worker stops.
    let back = store.submit(NewTask::new("hold", json!({})).queue("ev")).await.expect("submit");
    assert!(
        matches!(next(&mut events, "the claim").await, WorkerEvent::Claimed { ref task_id, .. } if *task_id == back.id)
    );
    worker.shutdown();
    assert_eq!(
        next(&mut events, "the give-back").await,
        WorkerEvent::GivenBack { task_id: back.id.clone(), attempt: 1, status: TaskStatus::Queued }
    );
    assert_eq!(next(&mut events, "the stop").await, WorkerEvent::Stopped);
    let handle = worker.handle();
    worker.stop().await;
    let row = store.fetch(&back.id).await.expect("fetch");
    assert_eq!((row.status, row.attempt), (TaskStatus::Queued, 0), "the event says what the row holds");
    assert_eq!(handle.settled(), 3, "two settlements and one give-back");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_in_is_reported_as_a_settlement() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let (worker, mut events) = test_worker(&store, "ev-tx")
        .task("own", |ctx, _p: serde_json::Value| async move {
            let tx = ctx.begin().await?;
            ctx.complete_in(tx, json!("mine")).await?;
            Ok(())
        })
        .start_with_events();
    let t = store.submit(NewTask::new("own", json!({})).queue("ev-tx")).await.expect("submit");
    assert!(matches!(next(&mut events, "the claim").await, WorkerEvent::Claimed { .. }));
    assert_eq!(
        next(&mut events, "the handler's settlement").await,
        WorkerEvent::Settled { task_id: t.id.clone(), attempt: 1, status: TaskStatus::Succeeded }
    );
    worker.shutdown();
    assert_eq!(next(&mut events, "the stop").await, WorkerEvent::Stopped, "and nothing settles it twice");
    worker.stop().await;
    schema.drop().await;
}

/// An observer that panics as a run's end is recorded spoils no task's
/// record, its own or the others' answered in the same settlement batch:
/// each is counted and reported, and the worker goes on. (Two tasks' ends
/// panic, so that without the guard some task after the first panic
/// always goes unrecorded, whatever the batch's order.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_panicking_as_a_run_ends_spoils_no_other_task_s_record() {
    use waymark_store::{Observer, RunEnd, RunScope, Task};
    #[derive(Debug)]
    struct PanicsForSome;
    struct Scope(bool);
    impl Observer for PanicsForSome {
        fn run(&self, task: &Task) -> Option<Box<dyn RunScope>> {
            Some(Box::new(Scope(task.payload["boom"] == json!(true))))
        }
    }
    impl RunScope for Scope {
        fn end(&self, _end: RunEnd) {
            assert!(!self.0, "the observer panics as this run ends");
        }
    }
    let schema = TestSchema::new().await;
    let options = waymark_store::ConnectOptions::new().observer(Arc::new(PanicsForSome));
    let store = Arc::new(
        waymark_store::Store::with_options(pool_store(&schema).await.into_executor(), options)
            .expect("store"),
    );
    let (worker, mut events) = test_worker(&store, "ev-obs")
        .concurrency(16)
        // A long window: the ten answers come back in one batch.
        .settle_batch(64, Duration::from_millis(300))
        .task("t", |_ctx, _p: serde_json::Value| async move { Ok(()) })
        .start_with_events();
    let tasks: Vec<NewTask> =
        (0..10).map(|i| NewTask::new("t", json!({ "boom": i == 3 || i == 7 })).queue("ev-obs")).collect();
    let ids = store.submit_batch(tasks).await.expect("submit");
    let all: std::collections::HashSet<String> = ids.into_iter().collect();
    let mut reported = std::collections::HashSet::new();
    while reported.len() < all.len() {
        if let WorkerEvent::Settled { task_id, status, .. } = next(&mut events, "the settlements").await {
            assert_eq!(status, TaskStatus::Succeeded);
            reported.insert(task_id);
        }
    }
    assert_eq!(reported, all, "every task is reported, those whose observer panicked too");
    waymark_tests::eventually(Duration::from_secs(10), "all ten counted settled", || async {
        worker.settled() == 10
    })
    .await;
    let after = store.submit(NewTask::new("t", json!({})).queue("ev-obs")).await.expect("submit");
    loop {
        if let WorkerEvent::Settled { task_id, .. } = next(&mut events, "a later settlement").await {
            if task_id == after.id {
                break;
            }
        }
    }
    worker.stop().await;
    schema.drop().await;
}
