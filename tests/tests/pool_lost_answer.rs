//! A write whose commit succeeded but whose answer was lost (the connection
//! died in between), through a proxy that cuts exactly there. The submit
//! must not create a second task, whichever way it is retried.

use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, ExecErrorKind, NewTask, Store};
use waymark_tests::db::admin_client;
use waymark_tests::pgbouncer::host_and_port;
use waymark_tests::proxy::AnswerCuttingProxy;
use waymark_tests::TestSchema;

/// A store whose pool reaches the server through `proxy`.
async fn store_through(proxy: &AnswerCuttingProxy, schema: &TestSchema) -> Store<PgPool> {
    let (host, port) = host_and_port(&schema.url);
    let through = schema.url.replacen(&format!("{host}:{port}"), &format!("127.0.0.1:{}", proxy.port()), 1);
    let sep = if through.contains('?') { '&' } else { '?' };
    let pool = PgPool::builder(format!("{through}{sep}sslmode=disable"))
        .max_size(2)
        .schema(&schema.schema)
        .build()
        .expect("pool");
    Store::connect(pool, ConnectOptions::schema(&schema.schema)).await.expect("connect through the proxy")
}

async fn task_rows(schema: &TestSchema, name: &str) -> Vec<String> {
    let admin = admin_client(&schema.url).await;
    let sql = format!("select id from \"{}\".cairnq_tasks where name = $1", schema.schema);
    admin.query(&sql, &[&name]).await.expect("rows").iter().map(|r| r.get(0)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_whose_answer_was_lost_is_retried_into_the_same_task() {
    let schema = TestSchema::new().await;
    let (host, port) = host_and_port(&schema.url);
    let proxy = AnswerCuttingProxy::start(format!("{host}:{port}")).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_submit_whose_commit_answer_was_lost_resubmits_into_the_same_task() {
    let schema = TestSchema::new().await;
    let (host, port) = host_and_port(&schema.url);
    let proxy = AnswerCuttingProxy::start(format!("{host}:{port}")).await;
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
