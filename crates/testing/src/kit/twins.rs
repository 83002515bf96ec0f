//! The application's `*_in` twins (beyond `submit_in`, in `submit.rs`):
//! each runs inside the caller's transaction, so what it does commits with
//! the caller's own writes or rolls back with them, and the caller's
//! transaction sees it before it commits.
//!
//! While a caller's transaction is open the cases use only that
//! transaction: an executor may have one connection (a bare client), which
//! its transaction holds until it ends.

use std::time::Duration;

use serde_json::json;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{
    Failure, Lane, Lease, NewTask, PgExecutor, PgSession, PgTransaction, PurgeFilter, Sql, Store, Task,
    TaskStatus, Value,
};

use super::{claim, raw};

/// A transaction of the caller's that has written a row `mark` to a
/// table of its own (made on first use).
async fn caller_tx<E: PgExecutor>(store: &Store<E>, mark: &str) -> E::Transaction {
    raw(store, "create table if not exists caller_rows (mark text not null)").await;
    let mut tx = store.executor().begin().await.expect("begin");
    tx.execute_script(&format!("insert into caller_rows values ('{mark}')"))
        .await
        .expect("the caller's write");
    tx
}

/// The marks of the caller's transactions that committed.
async fn caller_marks<E: PgExecutor>(store: &Store<E>) -> Vec<String> {
    let text = "select mark from caller_rows order by mark";
    let sql = Sql { text, types: &[], lane: Lane::Ordinary, repeatable: true };
    let rows = store.executor().query(sql, &[]).await.expect("the caller's rows");
    rows.into_iter()
        .map(|mut row| match row.take("mark") {
            Some(Value::Text(mark)) => mark,
            other => panic!("a mark is text, got {other:?}"),
        })
        .collect()
}

/// A task that ended `failed` (no attempts left), to retry.
async fn failed_task<E: PgExecutor>(store: &Store<E>, key: Option<&str>) -> Task {
    let mut task = NewTask::new("x", json!({})).max_attempts(1);
    if let Some(key) = key {
        task = task.key(key);
    }
    let t = store.submit(task).await.expect("submit");
    store.claim(&claim("w1")).await.expect("claim");
    let failed = store.fail(&Lease::new(&t.id, "w1"), &Failure::new(json!({}))).await.expect("fail");
    assert_eq!(failed.status, TaskStatus::Failed);
    failed
}

/// `cancel_in`: canceled only if the caller commits; its transaction sees
/// the cancel at once.
pub async fn cancel_in_commits_and_rolls_back_with_the_caller<E: PgExecutor>(store: &Store<E>) {
    let t = store.submit(NewTask::new("x", json!({}))).await.expect("submit");

    let mut tx = caller_tx(store, "a").await;
    let canceled = store.cancel_in(&mut tx, &t.id).await.expect("cancel_in").expect("a queued task");
    assert_eq!(canceled.status, TaskStatus::Canceled);
    tx.rollback().await.expect("rollback");
    assert_eq!(store.fetch(&t.id).await.expect("get").status, TaskStatus::Queued, "rolled back together");
    assert!(caller_marks(store).await.is_empty());

    let mut tx = caller_tx(store, "b").await;
    store.cancel_in(&mut tx, &t.id).await.expect("cancel_in").expect("a queued task");
    tx.commit().await.expect("commit");
    assert_eq!(store.fetch(&t.id).await.expect("get").status, TaskStatus::Canceled);
    assert_eq!(caller_marks(store).await, ["b"], "committed together");

    let mut tx = store.executor().begin().await.expect("begin");
    assert_eq!(store.cancel_in(&mut tx, &t.id).await.expect("cancel_in"), None, "finished already");
    tx.rollback().await.expect("rollback");
}

/// `cancel_by_key_in`: the task the key names, canceled only if the caller
/// commits; a key that names nothing answers `None`.
pub async fn cancel_by_key_in_commits_and_rolls_back_with_the_caller<E: PgExecutor>(store: &Store<E>) {
    let t = store.submit(NewTask::new("x", json!({})).key("ck")).await.expect("submit");

    let mut tx = caller_tx(store, "a").await;
    let canceled = store.cancel_by_key_in(&mut tx, "ck").await.expect("cancel_by_key_in").expect("named");
    assert_eq!((canceled.id.as_str(), canceled.status), (t.id.as_str(), TaskStatus::Canceled));
    assert_eq!(store.cancel_by_key_in(&mut tx, "nothing").await.expect("no key"), None);
    tx.rollback().await.expect("rollback");
    assert_eq!(store.fetch(&t.id).await.expect("get").status, TaskStatus::Queued, "rolled back together");

    let mut tx = caller_tx(store, "b").await;
    store.cancel_by_key_in(&mut tx, "ck").await.expect("cancel_by_key_in").expect("named");
    tx.commit().await.expect("commit");
    assert_eq!(store.fetch(&t.id).await.expect("get").status, TaskStatus::Canceled);
    assert_eq!(caller_marks(store).await, ["b"], "committed together");

    let mut tx = store.executor().begin().await.expect("begin");
    let err = store.cancel_by_key_in(&mut tx, "").await.expect_err("an empty key");
    assert!(err.is_invalid_argument(), "{err}");
    tx.rollback().await.expect("rollback");
}

/// `retry_in`: queued again only if the caller commits.
pub async fn retry_in_commits_and_rolls_back_with_the_caller<E: PgExecutor>(store: &Store<E>) {
    let t = failed_task(store, None).await;

    let mut tx = caller_tx(store, "a").await;
    let retried = store.retry_in(&mut tx, &t.id, true).await.expect("retry_in").expect("a failed task");
    assert_eq!((retried.status, retried.attempt), (TaskStatus::Queued, 0));
    tx.rollback().await.expect("rollback");
    let still = store.fetch(&t.id).await.expect("get");
    assert_eq!((still.status, still.attempt), (TaskStatus::Failed, 1), "rolled back together");

    let mut tx = caller_tx(store, "b").await;
    store.retry_in(&mut tx, &t.id, false).await.expect("retry_in").expect("a failed task");
    assert_eq!(
        store.retry_in(&mut tx, &t.id, false).await.expect("again"),
        None,
        "queued in this transaction"
    );
    tx.commit().await.expect("commit");
    let queued = store.fetch(&t.id).await.expect("get");
    assert_eq!((queued.status, queued.attempt), (TaskStatus::Queued, 1));
    assert_eq!(caller_marks(store).await, ["b"], "committed together");
}

/// `retry_by_key_in`: the task the key names, queued again only if the
/// caller commits.
pub async fn retry_by_key_in_commits_and_rolls_back_with_the_caller<E: PgExecutor>(store: &Store<E>) {
    let t = failed_task(store, Some("rk")).await;

    let mut tx = caller_tx(store, "a").await;
    let retried = store.retry_by_key_in(&mut tx, "rk", false).await.expect("retry_by_key_in").expect("named");
    assert_eq!((retried.id.as_str(), retried.status), (t.id.as_str(), TaskStatus::Queued));
    assert_eq!(store.retry_by_key_in(&mut tx, "nothing", false).await.expect("no key"), None);
    tx.rollback().await.expect("rollback");
    assert_eq!(store.fetch(&t.id).await.expect("get").status, TaskStatus::Failed, "rolled back together");

    let mut tx = caller_tx(store, "b").await;
    store.retry_by_key_in(&mut tx, "rk", false).await.expect("retry_by_key_in").expect("named");
    tx.commit().await.expect("commit");
    assert_eq!(store.fetch(&t.id).await.expect("get").status, TaskStatus::Queued);
    assert_eq!(caller_marks(store).await, ["b"], "committed together");
}

/// `purge_in`: the tasks (and their keys) are gone only if the caller
/// commits; a bad filter is refused before anything runs.
pub async fn purge_in_commits_and_rolls_back_with_the_caller<E: PgExecutor>(store: &Store<E>) {
    let t = store.submit(NewTask::new("x", json!({})).key("pk")).await.expect("submit");
    store.claim(&claim("w1")).await.expect("claim");
    store.complete(&Lease::new(&t.id, "w1"), json!(1)).await.expect("complete");
    // Completed a second ago, written to the row rather than waited for.
    raw(
        store,
        &format!("update cairnq_tasks set completed_at_ms = completed_at_ms - 1000 where id = '{}'", t.id),
    )
    .await;
    let filter = PurgeFilter::older_than(Duration::ZERO);

    let mut tx = caller_tx(store, "a").await;
    assert_eq!(store.purge_in(&mut tx, &filter).await.expect("purge_in"), [t.id.as_str()]);
    assert_eq!(store.get_in(&mut tx, &t.id).await.expect("get_in"), None, "gone in the transaction");
    tx.rollback().await.expect("rollback");
    assert!(store.get(&t.id).await.expect("get").is_some(), "rolled back together");
    assert_eq!(store.get_by_key("pk").await.expect("key").map(|k| k.id), Some(t.id.clone()));

    let mut tx = caller_tx(store, "b").await;
    assert_eq!(store.purge_in(&mut tx, &filter).await.expect("purge_in"), [t.id.as_str()]);
    tx.commit().await.expect("commit");
    assert_eq!(store.get(&t.id).await.expect("get"), None);
    assert_eq!(store.get_by_key("pk").await.expect("key"), None, "its key went with it");
    assert_eq!(caller_marks(store).await, ["b"], "committed together");

    let mut tx = store.executor().begin().await.expect("begin");
    let bad = PurgeFilter { limit: 0, ..PurgeFilter::older_than(Duration::ZERO) };
    assert!(store.purge_in(&mut tx, &bad).await.expect_err("limit 0").is_invalid_argument());
    tx.rollback().await.expect("rollback");
}

/// `get_in` and `get_by_key_in` read inside the caller's transaction: they
/// see its uncommitted submit, and nothing once it rolled back.
pub async fn get_in_sees_the_callers_uncommitted_writes<E: PgExecutor>(store: &Store<E>) {
    let mut tx = store.executor().begin().await.expect("begin");
    let t = store.submit_in(&mut tx, NewTask::new("x", json!({})).key("gk")).await.expect("submit_in");
    assert_eq!(
        store.get_in(&mut tx, &t.id).await.expect("get_in").map(|t| t.status),
        Some(TaskStatus::Queued)
    );
    assert_eq!(
        store.get_by_key_in(&mut tx, "gk").await.expect("get_by_key_in").map(|k| k.id),
        Some(t.id.clone())
    );
    tx.rollback().await.expect("rollback");
    assert_eq!(store.get(&t.id).await.expect("get"), None, "rolled back");

    let mut tx = store.executor().begin().await.expect("begin");
    assert_eq!(store.get_in(&mut tx, &t.id).await.expect("get_in"), None, "rolled back");
    assert_eq!(store.get_by_key_in(&mut tx, "gk").await.expect("get_by_key_in"), None);
    tx.commit().await.expect("commit");
}
