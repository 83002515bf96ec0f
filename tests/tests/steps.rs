//! Durable steps and sleeps on a real PostgreSQL: a finished step is not
//! run again by the task's next run, a durable sleep gives the slot back
//! and is not slept again, a history that no longer matches the code fails
//! the run naming both, and bad input fails with nothing written.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{claim_id, ClaimRequest, Lease, NewTask, StepKind, Store, Task, TaskStatus};
use waymark_tests::{pool_store, test_worker, until_some, TestSchema, TestWorker};
use waymark_worker::TaskError;

async fn ended(store: &Arc<Store<waymark_pool::PgPool>>, id: &str) -> Task {
    until_some(Duration::from_secs(20), "the task's end", || async {
        Some(store.fetch(id).await.expect("fetch")).filter(|t| t.status.is_terminal())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_step_is_not_run_again_by_the_next_run() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let charges = Arc::new(AtomicU32::new(0));
    let counted = charges.clone();
    let worker = test_worker(&store, "steps")
        .retry_backoff(Duration::from_millis(1), Duration::from_millis(1))
        .task("order", move |ctx, _p: Json| {
            let counted = counted.clone();
            async move {
                let receipt: String = ctx
                    .step("charge", || async {
                        let n = counted.fetch_add(1, Ordering::SeqCst);
                        Ok(format!("receipt-{n}"))
                    })
                    .await?;
                if ctx.attempt() == 1 {
                    return Err(TaskError::new("the shipping API is down"));
                }
                Ok(json!({ "receipt": receipt }))
            }
        })
        .start();
    let task = store.submit(NewTask::new("order", json!({})).queue("steps")).await.unwrap();
    let done = ended(&store, &task.id).await;
    worker.stop().await;
    assert_eq!((done.status, done.attempt), (TaskStatus::Succeeded, 2));
    assert_eq!(charges.load(Ordering::SeqCst), 1, "the step ran once");
    assert_eq!(done.result, Some(json!({"receipt": "receipt-0"})), "the second run got the recorded result");
    let history = store.steps(&task.id).await.unwrap();
    assert_eq!(history.records.len(), 1);
    assert_eq!((history.records[0].name.as_str(), history.records[0].kind), ("charge", StepKind::Step));
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_sleep_gives_the_slot_back_and_is_not_slept_again() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let (before, after) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let (b, a) = (before.clone(), after.clone());
    // Real time: the sleep itself is what is tested.
    const NAP: Duration = Duration::from_millis(300);
    let worker = test_worker(&store, "steps")
        .poll_interval(Duration::from_millis(50))
        .task("napper", move |ctx, _p: Json| {
            let (b, a) = (b.clone(), a.clone());
            async move {
                ctx.step("before", || async { Ok(b.fetch_add(1, Ordering::SeqCst)) }).await?;
                ctx.sleep("cool-off", NAP).await?;
                ctx.sleep("no-wait", Duration::ZERO).await?;
                ctx.step("after", || async { Ok(a.fetch_add(1, Ordering::SeqCst)) }).await?;
                Ok(json!("rested"))
            }
        })
        .start();
    let started = Instant::now();
    let task = store.submit(NewTask::new("napper", json!({})).queue("steps").max_attempts(1)).await.unwrap();
    let done = ended(&store, &task.id).await;
    worker.stop().await;
    assert_eq!(done.status, TaskStatus::Succeeded, "{done:?}");
    assert_eq!(done.attempt, 1, "a sleep spends no attempt");
    assert!(started.elapsed() >= NAP, "slept {:?}", started.elapsed());
    assert_eq!((before.load(Ordering::SeqCst), after.load(Ordering::SeqCst)), (1, 1));
    let kinds: Vec<StepKind> = store.steps(&task.id).await.unwrap().records.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, vec![StepKind::Step, StepKind::Sleep, StepKind::Sleep, StepKind::Step]);
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_that_no_longer_matches_the_code_fails_the_run_naming_both() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    // The old code recorded "reserve" at place 0, then failed.
    let old = test_worker(&store, "steps")
        .retry_backoff(Duration::from_secs(60), Duration::from_secs(60))
        .task("deploy", |ctx, _p: Json| async move {
            ctx.step("reserve", || async { Ok(1) }).await?;
            Err::<Json, _>(TaskError::new("first run fails"))
        })
        .start();
    let task = store.submit(NewTask::new("deploy", json!({})).queue("steps")).await.unwrap();
    waymark_tests::eventually(Duration::from_secs(20), "the first run's failure", || async {
        let t = store.fetch(&task.id).await.unwrap();
        t.status == TaskStatus::Queued && t.error.is_some()
    })
    .await;
    old.stop().await;
    // The new code calls "charge" first; the retry is made due now.
    let due = "update cairnq_tasks set run_at_ms = 0 where status = 'queued'";
    schema.execute(due).await;
    let new = test_worker(&store, "steps")
        .task("deploy", |ctx, _p: Json| async move {
            ctx.step("charge", || async { Ok(2) }).await?;
            Ok(json!("never"))
        })
        .start();
    let done = ended(&store, &task.id).await;
    new.stop().await;
    assert_eq!(done.status, TaskStatus::Failed);
    let message = done.error.as_ref().map(|e| e["message"].to_string()).unwrap_or_default();
    assert!(message.contains("reserve") && message.contains("charge"), "{message}");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_steps_fail_the_run_with_nothing_written() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let worker = test_worker(&store, "steps")
        .task("twice", |ctx, _p: Json| async move {
            ctx.step("same", || async { Ok(1) }).await?;
            ctx.step("same", || async { Ok(2) }).await?;
            Ok(json!("never"))
        })
        .task("too-long", |ctx, _p: Json| async move {
            ctx.sleep("forever", waymark_store::MAX_SNOOZE + Duration::from_secs(1)).await?;
            Ok(json!("never"))
        })
        .start();
    let twice = store.submit(NewTask::new("twice", json!({})).queue("steps")).await.unwrap();
    let long = store.submit(NewTask::new("too-long", json!({})).queue("steps")).await.unwrap();
    let (twice_done, long_done) = (ended(&store, &twice.id).await, ended(&store, &long.id).await);
    worker.stop().await;
    let message = |t: &Task| t.error.as_ref().map(|e| e["message"].to_string()).unwrap_or_default();
    assert_eq!(twice_done.status, TaskStatus::Failed);
    assert!(message(&twice_done).contains("used twice"), "{}", message(&twice_done));
    assert_eq!(store.steps(&twice.id).await.unwrap().records.len(), 1, "only the first use recorded");
    assert_eq!(long_done.status, TaskStatus::Failed);
    assert!(message(&long_done).contains("longer than the most"), "{}", message(&long_done));
    assert!(store.steps(&long.id).await.unwrap().records.is_empty(), "nothing written");

    // A record is fenced to the run's lease.
    let plain = store.submit(NewTask::new("plain", json!({})).queue("fenced")).await.unwrap();
    let claimed = store.claim(&ClaimRequest::new(claim_id("w"), ["fenced"]).limit(1)).await.unwrap();
    assert_eq!(claimed[0].id, plain.id);
    let stranger = Lease::new(plain.id.clone(), "someone-else");
    let err = store.record_step(&stranger, 0, "x", StepKind::Step, None, Duration::ZERO).await.unwrap_err();
    assert!(err.is_lost_lease(), "{err}");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_wait_holds_no_slot_and_resumes_with_the_event() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let prepared = Arc::new(AtomicU32::new(0));
    let counted = prepared.clone();
    // One slot: the other task runs while the first is parked.
    let worker = test_worker(&store, "steps")
        .concurrency(1)
        .poll_interval(Duration::from_millis(50))
        .task("invoice", move |ctx, _p: Json| {
            let counted = counted.clone();
            async move {
                ctx.step("prepare", || async { Ok(counted.fetch_add(1, Ordering::SeqCst)) }).await?;
                let paid = ctx.wait_for_event("invoice.paid:9", Duration::from_secs(600)).await?;
                let early = ctx.wait_for_event("kept-before", Duration::from_secs(600)).await?;
                let never = ctx.wait_for_event("never", Duration::from_millis(150)).await?;
                Ok(json!({ "paid": paid, "early": early, "never": never }))
            }
        })
        .task("other", |_ctx, _p: Json| async move { Ok(json!("ran")) })
        .start();
    store.emit("kept-before", json!("was already there")).await.unwrap();
    let task = store.submit(NewTask::new("invoice", json!({})).queue("steps").max_attempts(1)).await.unwrap();
    waymark_tests::eventually(Duration::from_secs(20), "the run parked", || async {
        let history = store.steps(&task.id).await.unwrap();
        history.records.iter().any(|r| r.kind == StepKind::Wait && !r.done)
    })
    .await;
    assert_eq!(store.fetch(&task.id).await.unwrap().status, TaskStatus::Queued, "parked: snoozed, no lease");
    let other = store.submit(NewTask::new("other", json!({})).queue("steps")).await.unwrap();
    let other_done = ended(&store, &other.id).await;
    assert_eq!(other_done.status, TaskStatus::Succeeded, "the parked run held no slot");
    assert_eq!(store.emit("invoice.paid:9", json!({"amount": 5})).await.unwrap(), 1);
    let done = ended(&store, &task.id).await;
    worker.stop().await;
    assert_eq!((done.status, done.attempt), (TaskStatus::Succeeded, 1), "{done:?}");
    assert_eq!(
        done.result,
        Some(json!({"paid": {"amount": 5}, "early": "was already there", "never": null})),
        "the event's payload, the kept event's, and a timeout"
    );
    assert_eq!(prepared.load(Ordering::SeqCst), 1, "the step before the wait ran once");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_past_the_limit_or_twice_fails_with_nothing_written() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let worker = test_worker(&store, "steps")
        .task("too-long", |ctx, _p: Json| async move {
            ctx.wait_for_event("e", waymark_store::MAX_SNOOZE + Duration::from_secs(1)).await?;
            Ok(json!("never"))
        })
        .task("empty", |ctx, _p: Json| async move {
            ctx.wait_for_event("", Duration::from_secs(1)).await?;
            Ok(json!("never"))
        })
        .start();
    for name in ["too-long", "empty"] {
        let task = store.submit(NewTask::new(name, json!({})).queue("steps")).await.unwrap();
        let done = ended(&store, &task.id).await;
        assert_eq!(done.status, TaskStatus::Failed, "{name}");
        assert!(store.steps(&task.id).await.unwrap().records.is_empty(), "{name}: nothing written");
    }
    worker.stop().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_in_commits_its_effect_with_its_record_once() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    schema.execute("create table charges (task_id text, attempt int)").await;
    let table = format!("\"{}\".charges", schema.schema);
    let worker = test_worker(&store, "steps")
        .retry_backoff(Duration::from_millis(1), Duration::from_millis(1))
        .task("pay", move |ctx, _p: Json| {
            let insert = format!("insert into {table} (task_id, attempt) values ($1, $2)");
            async move {
                let (id, attempt) = (ctx.id().to_owned(), ctx.attempt());
                let charged: u64 = ctx
                    .step_in("charge", move |tx| {
                        Box::pin(async move {
                            let n = tx.client().execute(&insert, &[&id, &attempt]).await;
                            n.map_err(|e| TaskError::new(e.to_string()))
                        })
                    })
                    .await?;
                if ctx.attempt() < 3 {
                    return Err(TaskError::new("fails after the step"));
                }
                Ok(json!({ "charged": charged }))
            }
        })
        .start();
    let task = store.submit(NewTask::new("pay", json!({})).queue("steps")).await.unwrap();
    let done = ended(&store, &task.id).await;
    worker.stop().await;
    assert_eq!((done.status, done.attempt), (TaskStatus::Succeeded, 3), "{done:?}");
    assert_eq!(done.result, Some(json!({"charged": 1})));
    assert_eq!(schema.count("charges").await, 1, "the effect committed once, with its record");
    schema.drop().await;
}

/// A wait whose deadline passed is closed as timed out under the event's
/// lock: an emit after it leaves it, and a later run reads the same answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_wait_stays_timed_out_for_later_runs() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let worker = test_worker(&store, "steps")
        .poll_interval(Duration::from_millis(50))
        .retry_backoff(Duration::from_millis(1), Duration::from_millis(1))
        .task("late", |ctx, _p: Json| async move {
            let got = ctx.wait_for_event("late.event", Duration::from_millis(100)).await?;
            if ctx.attempt() == 1 {
                // Real time: the emit lands between the two runs.
                ctx.store().emit("late.event", json!("too late")).await?;
                return Err(TaskError::new("fails after the wait"));
            }
            Ok(json!({ "got": got }))
        })
        .start();
    let task = store.submit(NewTask::new("late", json!({})).queue("steps")).await.unwrap();
    let done = ended(&store, &task.id).await;
    worker.stop().await;
    assert_eq!((done.status, done.attempt), (TaskStatus::Succeeded, 2), "{done:?}");
    assert_eq!(done.result, Some(json!({"got": null})), "the second run read the first's timeout");
    let wait = store.steps(&task.id).await.unwrap().records.remove(0);
    assert!(wait.done && wait.timed_out, "{wait:?}");
    schema.drop().await;
}
