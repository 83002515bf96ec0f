//! The hot statements keep to indexes on a large backlog whose statistics
//! are stale (analysed before it was drained and a batch claimed), and on a
//! backlog of a million queued tasks: no sequential scan, no hash over the
//! whole table, no join that compares every pair of rows.

use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, Store};
use waymark_tests::{plans, TestDatabase};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_statements_stay_on_indexes_with_stale_statistics() {
    stays_on_indexes(20_000, 2_000).await;
}

/// A million due tasks wait; a worker claims 512 of them. The claim reads
/// the first rows of its index in order, so its plan and its time do not
/// grow with the backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_statements_stay_on_indexes_over_a_million_queued_tasks() {
    stays_on_indexes(1_000_000, 1_000_000).await;
}

async fn stays_on_indexes(total: i64, queued: i64) {
    let db = TestDatabase::new().await;
    let pool = PgPool::builder(&db.url).max_size(1).build().expect("pool");
    Store::connect(pool, ConnectOptions::default()).await.expect("migrate");
    let mut client = waymark_tests::db::admin_client(&db.url).await;
    let running = plans::stale_backlog(&client, total, queued, 512).await;
    for analyze in [false, true] {
        for plan in plans::explain_hot_statements(&mut client, &running, analyze).await {
            let bad = plan.whole_table_nodes();
            assert!(
                bad.is_empty(),
                "{} (analyze {analyze}, {total} tasks, {queued} queued) reads the whole table: {bad:?}\n{}",
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
                // Seeking the ids, not reading the whole index in its order
                // with the ids as a filter.
                assert!(
                    plan.text.contains("Index Cond: (id = ANY"),
                    "{} seeks its rows by id in the primary key:\n{}",
                    plan.statement,
                    plan.text
                );
            }
            if plan.statement.starts_with("heartbeat_batch") || plan.statement == "complete_batch" {
                // One worker's batched writes seek its ids in the primary
                // key; the status and lease indexes hold every worker's
                // running rows (a bitmap of one of them read beside the
                // primary key's drops no row by a filter, but reads them).
                let indexes = plan.indexes();
                assert!(
                    indexes.iter().all(|i| *i == "cairnq_tasks_pkey"),
                    "{} reads an index other than the primary key: {indexes:?}\n{}",
                    plan.statement,
                    plan.text
                );
                // Run, they never read the other worker's running rows only
                // to filter them out.
                let filtered = if analyze { plan.filtered_table_scans() } else { Vec::new() };
                assert!(
                    filtered.is_empty(),
                    "{} reads rows it does not own: {filtered:?}\n{}",
                    plan.statement,
                    plan.text
                );
            }
            if analyze
                && !plan.statement.starts_with("claimable_probe")
                && plan.statement.starts_with("claim")
            {
                // The claim's index scan stops after its limit: it never
                // walks the backlog (rows it passed over would show here).
                assert!(
                    !plan.text.contains("Rows Removed by Filter"),
                    "{} filters rows it read instead of seeking them:\n{}",
                    plan.statement,
                    plan.text
                );
            }
        }
    }
    db.drop().await;
}
