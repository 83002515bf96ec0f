//! The `waymark` facade end to end: `connect(url)`, a worker, and `call`.

use std::time::Duration;

use serde_json::json;
use waymark::{NewTask, TaskError, Worker};
use waymark_tests::TestDatabase;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_work_and_call_through_the_facade() {
    let db = TestDatabase::new().await;
    let store = waymark::connect(&db.url).await.expect("connect migrates a fresh database");
    let worker = Worker::builder(store.clone())
        .task("add", |_ctx, p: serde_json::Value| async move {
            let a = p["a"].as_i64().ok_or(TaskError::permanent("a is missing"))?;
            Ok(json!({ "sum": a + 1 }))
        })
        .build()
        .expect("worker");
    let handle = worker.handle();
    let run = tokio::spawn(worker.run());
    let done =
        store.call(NewTask::new("add", json!({"a": 41})), Duration::from_secs(10)).await.expect("call");
    assert_eq!(done.result, Some(json!({"sum": 42})));
    let err = store.call(NewTask::new("add", json!({})), Duration::from_secs(10)).await.expect_err("fails");
    assert!(
        matches!(&err, waymark::Error::TaskFailed { .. }) && err.to_string().contains("a is missing"),
        "{err}"
    );
    handle.shutdown();
    run.await.expect("worker");

    let bad = waymark::connect("postgres://u@h/db?sslmode=sometimes").await.expect_err("bad url");
    assert!(bad.to_string().contains("sslmode"), "{bad}");
    db.drop().await;
}
