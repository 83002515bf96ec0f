//! Retention on a real PostgreSQL: rules, batches repeated until short, a
//! sweep racing a retry, and the background sweeper's schedule and hook.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{
    ClaimRequest, Failure, NewTask, Retention, RetentionRule, Store, Sweeper, Task, TaskStatus,
};
use waymark_tests::{pool_store, TestSchema};

const HOUR: Duration = Duration::from_secs(3600);

/// A task of `name` in `queue` run to `status` (succeeded, failed or
/// canceled), its completion moved `age` into the past.
async fn finished(
    schema: &TestSchema,
    store: &Store<PgPool>,
    queue: &str,
    name: &str,
    status: TaskStatus,
    age: Duration,
) -> Task {
    let t = store.submit(NewTask::new(name, json!({})).queue(queue)).await.expect("submit");
    if status == TaskStatus::Canceled {
        store.cancel(&t.id).await.expect("cancel");
    } else {
        let claimed = store.claim(&ClaimRequest::new("w", [queue]).names([name])).await.expect("claim");
        let lease = claimed[0].lease().expect("claimed");
        match status {
            TaskStatus::Succeeded => drop(store.complete(&lease, json!(1)).await.expect("complete")),
            _ => drop(store.fail(&lease, &Failure::new(json!({})).retryable(false)).await.expect("fail")),
        }
    }
    let admin = waymark_tests::db::admin_client(&schema.url).await;
    admin
        .execute(
            &format!(
                "update \"{}\".cairnq_tasks set completed_at_ms = completed_at_ms - $2 where id = $1",
                schema.schema
            ),
            &[&t.id, &(age.as_millis() as i64)],
        )
        .await
        .expect("backdate");
    let row = store.fetch(&t.id).await.expect("fetch");
    assert_eq!(row.status, status);
    row
}

async fn exists(store: &Store<PgPool>, t: &Task) -> bool {
    store.get(&t.id).await.expect("get").is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_deletes_what_its_rules_match_in_batches_until_short() {
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    let mut old_ok = Vec::new();
    for _ in 0..5 {
        old_ok.push(finished(&schema, &store, "r", "a", TaskStatus::Succeeded, 2 * HOUR).await);
    }
    let young_ok = finished(&schema, &store, "r", "a", TaskStatus::Succeeded, Duration::ZERO).await;
    let old_failed = finished(&schema, &store, "r", "a", TaskStatus::Failed, 2 * HOUR).await;
    let older_failed = finished(&schema, &store, "r", "a", TaskStatus::Failed, 20 * HOUR).await;
    let old_canceled = finished(&schema, &store, "r", "a", TaskStatus::Canceled, 100 * HOUR).await;
    let live = store.submit(NewTask::new("a", json!({})).queue("r")).await.expect("submit");

    // An age per status, two rows per statement: five old successes take
    // three statements, the last one short.
    let per_status =
        Retention::per_status([(TaskStatus::Succeeded, HOUR), (TaskStatus::Failed, 10 * HOUR)]).batch(2);
    assert_eq!(store.sweep(&per_status).await.expect("sweep"), 6);
    for t in &old_ok {
        assert!(!exists(&store, t).await, "an old success is deleted");
    }
    assert!(!exists(&store, &older_failed).await);
    for (t, why) in [
        (&young_ok, "a young success is kept"),
        (&old_failed, "a failure younger than its status's age is kept"),
        (&old_canceled, "a status without an age is kept"),
    ] {
        assert!(exists(&store, t).await, "{why}");
    }
    assert_eq!(
        store.fetch(&live.id).await.expect("live").status,
        TaskStatus::Queued,
        "a live task is never swept"
    );

    // Rules with a queue and a name: only what they name.
    let other_queue = finished(&schema, &store, "r2", "a", TaskStatus::Succeeded, 2 * HOUR).await;
    let other_name = finished(&schema, &store, "r", "b", TaskStatus::Canceled, 2 * HOUR).await;
    let rules = Retention::rules_of([
        RetentionRule::older_than(HOUR).queue("r2"),
        RetentionRule::older_than(HOUR).name("b"),
    ]);
    assert_eq!(store.sweep(&rules).await.expect("sweep"), 2);
    assert!(!exists(&store, &other_queue).await && !exists(&store, &other_name).await);
    assert!(exists(&store, &old_failed).await && exists(&store, &old_canceled).await, "no rule names these");

    // Bad settings are refused before any SQL.
    let err = store.sweep(&Retention::older_than(HOUR).batch(0)).await.expect_err("batch 0");
    assert!(err.to_string().contains("retention batch must be at least 1"), "{err}");
    let err = store
        .sweep(&Retention::rules_of([RetentionRule::older_than(HOUR).status(TaskStatus::Queued)]))
        .await
        .expect_err("a live status");
    assert!(err.to_string().contains("retention status must be succeeded, failed or canceled"), "{err}");
    assert!(exists(&store, &old_failed).await);
    schema.drop().await;
}

/// A sweep and a `retry` of the same failed task, at once, many times: the
/// task is either deleted (and the retry found nothing) or requeued (and
/// still there); a retried task is never swept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_racing_a_retry_never_deletes_the_retried_task() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let (mut requeued, mut deleted) = (0, 0);
    for _ in 0..30 {
        let t = finished(&schema, &store, "race", "a", TaskStatus::Failed, 2 * HOUR).await;
        let (s1, s2, id) = (store.clone(), store.clone(), t.id.clone());
        let sweep = tokio::spawn(async move { s1.sweep(&Retention::older_than(HOUR)).await });
        let retry = tokio::spawn(async move { s2.retry(&id, false).await });
        let (swept, retried) = (sweep.await.expect("sweep task"), retry.await.expect("retry task"));
        let swept = swept.expect("sweep");
        match retried.expect("retry") {
            Some(r) => {
                assert_eq!(r.status, TaskStatus::Queued);
                assert_eq!(swept, 0, "the sweep deleted nothing else");
                let row = store.fetch(&t.id).await.expect("a retried task is still there");
                assert_eq!(row.status, TaskStatus::Queued);
                requeued += 1;
                store.cancel(&t.id).await.expect("cancel");
                store.sweep(&Retention::older_than(Duration::ZERO)).await.expect("clean up");
            }
            None => {
                assert_eq!(swept, 1);
                assert!(!exists(&store, &t).await, "the retry found it gone");
                deleted += 1;
            }
        }
    }
    assert_eq!(requeued + deleted, 30);
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweeper_sweeps_once_an_interval_has_passed_and_reports_each_sweep() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let old = finished(&schema, &store, "bg", "a", TaskStatus::Succeeded, 2 * HOUR).await;
    let (tx, mut reports) = tokio::sync::mpsc::unbounded_channel();
    let started = tokio::time::Instant::now();
    let sweeper = Sweeper::start(
        store.clone(),
        Retention::older_than(HOUR).interval(Duration::from_millis(500)),
        Arc::new(move |out| drop(tx.send(out.map_err(|e| e.to_string())))),
    )
    .expect("start");
    let first =
        tokio::time::timeout(Duration::from_secs(20), reports.recv()).await.expect("a report").expect("open");
    // Real time is what is under test: the first sweep waits one interval.
    assert!(started.elapsed() >= Duration::from_millis(500), "swept after {:?}", started.elapsed());
    assert_eq!(first, Ok(1));
    assert!(!exists(&store, &old).await);
    let second =
        tokio::time::timeout(Duration::from_secs(20), reports.recv()).await.expect("a report").expect("open");
    assert_eq!(second, Ok(0), "and again each interval");
    sweeper.stop();
    assert!(reports.recv().await.is_none(), "stopped: the hook (and its sender) is gone");
    let bad =
        Sweeper::start(store.clone(), Retention::older_than(HOUR).interval(Duration::ZERO), Arc::new(|_| {}));
    assert!(bad.expect_err("zero interval").to_string().contains("retention interval must be positive"));
    schema.drop().await;
}
