//! The hot statements keep to indexes on a large backlog whose statistics
//! are stale (analysed before it was drained and a batch claimed): no
//! sequential scan, no hash over the whole table, no join that compares
//! every pair of rows.

use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, Store};
use waymark_tests::{plans, TestDatabase};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_statements_stay_on_indexes_with_stale_statistics() {
    let db = TestDatabase::new().await;
    let pool = PgPool::builder(&db.url).max_size(1).build().expect("pool");
    Store::connect(pool, ConnectOptions::default()).await.expect("migrate");
    let mut client = waymark_tests::db::admin_client(&db.url).await;
    let running = plans::stale_backlog(&client, 20_000, 2_000, 512).await;
    for analyze in [false, true] {
        for plan in plans::explain_hot_statements(&mut client, &running, analyze).await {
            let bad = plan.whole_table_nodes();
            assert!(
                bad.is_empty(),
                "{} (analyze {analyze}) reads the whole table: {bad:?}\n{}",
                plan.statement,
                plan.text
            );
            if !plan.statement.starts_with("claimable_probe") {
                assert!(
                    plan.text.contains("Index Scan using cairnq_tasks_pkey on cairnq_tasks t"),
                    "{} updates its rows through the primary key:\n{}",
                    plan.statement,
                    plan.text
                );
            }
        }
    }
    db.drop().await;
}
