//! A write whose commit succeeded but whose answer was lost (the connection
//! died in between), through a proxy that cuts exactly there. The submit
//! must not create a second task, whichever way it is retried.

use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::Lease;
use waymark_store::{ClaimRequest, ExecErrorKind, Failure, NewTask, Store, TaskStatus};
use waymark_tests::db::admin_client;
use waymark_tests::proxy::{pool_through, proxy_for, AnswerCuttingProxy};
use waymark_tests::{connect_in, TestSchema};

/// A store whose pool reaches the server through `proxy`.
async fn store_through(proxy: &AnswerCuttingProxy, schema: &TestSchema) -> Store<PgPool> {
    connect_in(pool_through(proxy, schema).max_size(2).build().expect("pool"), schema).await
}

async fn task_rows(schema: &TestSchema, name: &str) -> Vec<String> {
    let admin = admin_client(&schema.url).await;
    let sql = format!("select id from \"{}\".cairnq_tasks where name = $1", schema.schema);
    admin.query(&sql, &[&name]).await.expect("rows").iter().map(|r| r.get(0)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_whose_answer_was_lost_is_retried_into_the_same_task() {
    let schema = TestSchema::new().await;
    let proxy = proxy_for(&schema.url).await;
    let store = store_through(&proxy, &schema).await;
    let retries_before = store.executor().stats().retries;

    proxy.arm("insert into cairnq_tasks");
    let task = store.submit(NewTask::new("lost.answer", json!({"n": 1}))).await.expect("submit answers");

    assert_eq!(proxy.cuts(), 1, "the insert's answer was cut");
    assert!(store.executor().stats().retries > retries_before, "the pool resent the insert");
    assert_eq!(task_rows(&schema, "lost.answer").await, vec![task.id.clone()], "one task, the one returned");
    assert_eq!(task.payload, json!({"n": 1}));
    schema.drop().await;
}

/// The same for a batch, alike (one statement binding what its tasks
/// share) and not: the resend finds its ids taken, and the store answers
/// with the batch that is there, each task once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_answer_was_lost_is_retried_into_the_same_tasks() {
    let schema = TestSchema::new().await;
    let proxy = proxy_for(&schema.url).await;
    let store = store_through(&proxy, &schema).await;
    let batches = [
        ("lost.alike", (0..3).map(|n| NewTask::new("lost.alike", json!({ "n": n }))).collect::<Vec<_>>()),
        (
            "lost.mixed",
            (0..3).map(|n| NewTask::new("lost.mixed", json!({ "n": n })).priority(n)).collect::<Vec<_>>(),
        ),
    ];
    for (cuts, (name, batch)) in (1..).zip(batches) {
        let retries_before = store.executor().stats().retries;
        proxy.arm("insert into cairnq_tasks");
        let ids = store.submit_batch(batch).await.expect("the batch answers");
        assert_eq!(proxy.cuts(), cuts, "{name}: the insert's answer was cut");
        assert!(store.executor().stats().retries > retries_before, "{name}: the pool resent the insert");
        let mut rows = task_rows(&schema, name).await;
        rows.sort();
        let mut sent = ids.clone();
        sent.sort();
        assert_eq!(rows, sent, "{name}: each task once, the ones returned");
        for (n, id) in ids.iter().enumerate() {
            assert_eq!(store.fetch(id).await.expect("fetch").payload, json!({ "n": n }), "{name}: in order");
        }
    }
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_submit_whose_commit_answer_was_lost_resubmits_into_the_same_task() {
    let schema = TestSchema::new().await;
    let proxy = proxy_for(&schema.url).await;
    let store = store_through(&proxy, &schema).await;

    // The commit went through; its answer did not. A transaction is never
    // resent by the pool, so the caller hears of the unknown outcome.
    // (The marker is the COMMIT message's text; no name in this test holds it.)
    proxy.arm("commit\0");
    let first = NewTask::new("lost.keyed", json!({})).key("order:7");
    let err = store.submit(first.clone()).await.expect_err("the commit's answer was lost");
    assert_eq!(err.exec_kind(), Some(ExecErrorKind::Connection), "{err}");
    assert_eq!(proxy.cuts(), 1);
    let committed = task_rows(&schema, "lost.keyed").await;
    assert_eq!(committed.len(), 1, "the commit did happen");

    // The caller's retry with the same key finds that task: still one.
    let again = store.submit(first).await.expect("resubmit");
    assert_eq!(again.id, committed[0]);
    assert_eq!(task_rows(&schema, "lost.keyed").await.len(), 1);
    schema.drop().await;
}

/// A retryable `fail` that committed but lost its answer, resent after the
/// same worker claimed the task again under the next claim's id: fenced to
/// the first claim's id, the resend finds nothing to settle and leaves the
/// new claim alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_failure_never_lands_on_a_later_claim() {
    let schema = TestSchema::new().await;
    let proxy = proxy_for(&schema.url).await;
    let store = store_through(&proxy, &schema).await;
    let task = store.submit(NewTask::new("fenced", json!({}))).await.expect("submit");
    // A claim id each, as the worker claims.
    let claim = |n: u32| ClaimRequest::new(format!("w1/{n}"), ["default"]).limit(1);
    let first = store.claim(&claim(1)).await.expect("claim")[0].lease().expect("claimed");

    let failure = Failure::new(json!({"type": "E", "code": "task_error", "message": "m", "retryable": true}));
    proxy.arm("The error is kept on every branch");
    let err = store.fail(&first, &failure).await.expect_err("the answer was lost");
    assert_eq!(err.exec_kind(), Some(ExecErrorKind::Connection), "{err}");
    assert_eq!(proxy.cuts(), 1);
    let after = store.fetch(&task.id).await.expect("fetch");
    assert_eq!((after.status, after.attempt), (TaskStatus::Queued, 1), "the failure did commit");

    // Backoff 0: the same worker claims the task again before the resend.
    assert_eq!(store.claim(&claim(2)).await.expect("claim again")[0].attempt, 2);
    let resent = store.fail(&first, &failure).await.expect_err("fenced to the first claim's id");
    assert!(resent.is_lost_lease(), "{resent}");
    let now = store.fetch(&task.id).await.expect("fetch");
    assert_eq!((now.status, now.attempt), (TaskStatus::Running, 2), "the new claim is untouched");
    let released = store.release(&first).await.expect_err("release is fenced too");
    assert!(released.is_lost_lease(), "{released}");

    // Under the new claim's id, the same write lands on it.
    let second = Lease::new(&task.id, "w1/2");
    let landed = store.fail(&second, &failure).await.expect("lands on attempt 2");
    assert_eq!((landed.status, landed.attempt), (TaskStatus::Queued, 2));
    schema.drop().await;
}
