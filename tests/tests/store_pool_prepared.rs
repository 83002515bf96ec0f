//! The store contract through the built-in pool with prepared statements
//! cached per connection, and proof that they are prepared once and reused.

use serde_json::json;
use waymark_store::{NewTask, PgExecutor};
use waymark_tests::{connect_in, pool_in, TestSchema};

waymark_testing::store_contract!(waymark_tests::pool_store_prepared, schema = waymark_tests::TestSchema);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_are_prepared_once_per_connection_and_reused() {
    let schema = TestSchema::new().await;
    // One connection, so the transaction below sees the one that worked.
    let pool = pool_in(&schema, 1).prepared_statements(true).build().expect("pool");
    let store = connect_in(pool, &schema).await;
    for i in 0..20 {
        let task = store.submit(NewTask::new("prepared.reuse", json!({ "i": i }))).await.expect("submit");
        store.get_status(&task.id).await.expect("status");
    }
    // The connection's pg_prepared_statements holds each statement once,
    // however often it ran.
    let tx = store.executor().begin().await.expect("begin");
    let rows = tx
        .client()
        .query(
            "select count(*)::int8, count(distinct statement)::int8 from pg_prepared_statements \
             where statement like '%cairnq_tasks%'",
            &[],
        )
        .await
        .expect("pg_prepared_statements");
    let (all, distinct): (i64, i64) = (rows[0].get(0), rows[0].get(1));
    assert!(all > 0, "statements were prepared on this connection");
    assert_eq!(all, distinct, "no statement prepared twice on one connection");
    drop(tx);
    schema.drop().await;
}
