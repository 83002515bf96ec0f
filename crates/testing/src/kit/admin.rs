//! Admin: queue depth and stats, purge, migrations.

use std::time::Duration;

use serde_json::json;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{Conflict, Lease, NewTask, PgExecutor, PurgeFilter, Store, TaskStatus};

use super::{claim, raw};

/// queue_depth counts queued rows (delayed included) against the bound.
pub async fn queue_depth_and_stats<E: PgExecutor>(store: &Store<E>) {
    for delay in [0, 0, 60_000] {
        store
            .submit(NewTask::new("x", json!({})).queue("d").delay(Duration::from_millis(delay)))
            .await
            .expect("submit");
    }
    assert_eq!(store.queue_depth("d", 5).await.expect("depth"), 2);
    assert_eq!(store.queue_depth("d", 2).await.expect("depth"), 0, "never negative");
    assert_eq!(store.queue_depth("empty", 7).await.expect("depth"), 7);
    let stats = store.stats(None).await.expect("stats");
    assert_eq!(stats.keys().collect::<Vec<_>>(), ["d"]);
    assert_eq!(stats["d"].get(TaskStatus::Queued), 3);
    assert_eq!(stats["d"].get(TaskStatus::Failed), 0);
}

/// purge deletes only old enough terminal rows, oldest first, and the key
/// pointing at a purged task goes too, freeing it.
pub async fn purge_takes_the_key_with_it<E: PgExecutor>(store: &Store<E>) {
    let t = store.submit(NewTask::new("x", json!({})).key("pk")).await.expect("submit");
    store.claim(&claim("w1")).await.expect("claim");
    store.complete(&Lease::new(&t.id, "w1"), json!(1)).await.expect("complete");
    let live = store.submit(NewTask::new("x", json!({}))).await.expect("live");
    assert!(store
        .purge(&PurgeFilter::older_than(Duration::from_secs(3600)))
        .await
        .expect("purge")
        .is_empty());
    // Completed a second ago, written to the row rather than waited for.
    raw(
        store,
        &format!("update cairnq_tasks set completed_at_ms = completed_at_ms - 1000 where id = '{}'", t.id),
    )
    .await;
    let mut by_queue = PurgeFilter::older_than(Duration::ZERO);
    by_queue.queue = Some("elsewhere".to_owned());
    assert!(store.purge(&by_queue).await.expect("purge").is_empty(), "queue filter");
    assert_eq!(store.purge(&PurgeFilter::older_than(Duration::ZERO)).await.expect("purge"), [t.id.as_str()]);
    assert_eq!(store.get_by_key("pk").await.expect("key"), None);
    assert!(store.get(&live.id).await.expect("live").is_some());
    let fresh =
        store.submit(NewTask::new("x", json!({})).key("pk").conflict(Conflict::Reject)).await.expect("free");
    assert_ne!(fresh.id, t.id);
}

/// A second migrate applies nothing and the ledger reads fully applied.
pub async fn migrate_is_idempotent<E: PgExecutor>(store: &Store<E>) {
    let report = store.migrate().await.expect("migrate");
    assert!(report.applied.is_empty(), "{report:?}");
    // cairnq's ten files and waymark's ledgers.
    let files = 10 + waymark_store::protocol::ledger_migrations().len();
    assert_eq!(report.skipped, files);
    let status = store.migration_status().await.expect("status");
    assert_eq!(status.len(), files);
    assert!(status.iter().all(|m| m.applied_at_ms.is_some()), "{status:?}");
    assert_eq!(status[2].name, "0003_notify.sql");
    store.check_protocol_version().await.expect("version 1");
}
