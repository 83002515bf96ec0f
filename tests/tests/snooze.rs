//! Snooze through a real worker: a handler that answers "not yet" five
//! times gets its task back each time without spending an attempt, and
//! succeeds on attempt 1; meanwhile cairnq's Python client reads the task
//! as queued, due later, with no error.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value as Json};
use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, NewTask, PgExecutor, Store, TaskStatus};
use waymark_tests::{python, test_worker, until_some, TestDatabase, TestWorker};
use waymark_worker::TaskError;

/// The first snooze is long enough for the Python read on a loaded machine
/// (the test then makes the task due by hand); the rest are short.
const FIRST: Duration = Duration::from_secs(60);
const REST: Duration = Duration::from_millis(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_snoozed_five_times_succeeds_on_attempt_one() {
    tokio::task::spawn_blocking(python::venv_python).await.expect("setting up the Python venv");
    let db = TestDatabase::new().await;
    let pool = PgPool::builder(&db.url).max_size(4).build().expect("pool");
    let store = Arc::new(Store::connect(pool, ConnectOptions::default()).await.expect("connect"));
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let worker = test_worker(&store, "default")
        .poll_interval(Duration::from_millis(50))
        .task("rate.limited", move |ctx, _payload: Json| {
            let seen = seen.clone();
            async move {
                let n = seen.fetch_add(1, Ordering::SeqCst);
                assert_eq!(ctx.attempt(), 1, "a snooze never spends an attempt");
                match n {
                    0 => Err(TaskError::snooze(FIRST)),
                    1..=4 => Err(TaskError::snooze(REST)),
                    _ => Ok(json!({"after_snoozes": n})),
                }
            }
        })
        .start();
    let task = store.submit(NewTask::new("rate.limited", json!({})).max_attempts(1)).await.expect("submit");

    // The first snooze lands: the row is queued again, due later.
    let snoozed = until_some(Duration::from_secs(10), "the first snooze", || {
        let store = store.clone();
        let id = task.id.clone();
        let calls = calls.clone();
        async move {
            let t = store.fetch(&id).await.expect("fetch");
            (t.status == TaskStatus::Queued
                && calls.load(Ordering::SeqCst) == 1
                && t.updated_at_ms > t.created_at_ms)
                .then_some(t)
        }
    })
    .await;
    assert_eq!((snoozed.attempt, snoozed.worker_id.as_deref()), (0, None));
    let url = db.url.clone();
    let id = task.id.clone();
    let read =
        tokio::task::spawn_blocking(move || python::interop(&url, vec!["read".into(), "--id".into(), id]))
            .await
            .expect("python read");
    let seen_by_python = &read["by_id"][&task.id];
    assert_eq!(seen_by_python["status"], "queued", "{seen_by_python}");
    assert_eq!(seen_by_python["attempt"], 0, "{seen_by_python}");
    assert_eq!(seen_by_python["error"], Json::Null, "{seen_by_python}");
    let due = seen_by_python["run_at_ms"].as_i64().expect("run_at_ms");
    let since = seen_by_python["updated_at_ms"].as_i64().expect("updated_at_ms");
    assert_eq!(
        due - since,
        i64::try_from(FIRST.as_millis()).unwrap(),
        "due a snooze after: {seen_by_python}"
    );
    // Read: due now, so the worker need not wait out the first snooze.
    store
        .executor()
        .execute_script(&format!("update cairnq_tasks set run_at_ms = 0 where id = '{}'", task.id))
        .await
        .expect("make the task due");

    let done = store.wait(&task.id, Duration::from_secs(30)).await.expect("the task ends");
    assert_eq!((done.status, done.attempt), (TaskStatus::Succeeded, 1), "{done:?}");
    assert_eq!(done.result, Some(json!({"after_snoozes": 5})));
    assert_eq!(done.error, None);
    assert_eq!(calls.load(Ordering::SeqCst), 6, "five snoozes and the run that succeeded");
    worker.stop().await;
    db.drop().await;
}
