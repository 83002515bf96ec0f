//! Settling: `complete_in`, retries, settlement batches, release.

use serde_json::json;
use std::time::Duration;

use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{
    codes, ClaimRequest, Error, ErrorEnvelope, Failure, Lease, ListFilter, NewTask, PgExecutor, PgSession,
    PgTransaction, Settlement, Store, TaskStatus,
};

use super::claim;

/// A settlement inside the caller's transaction commits with the caller's
/// own writes, or neither does; a lost lease is reported before commit.
pub async fn complete_in_commits_with_the_callers_writes<E: PgExecutor>(store: &Store<E>) {
    store
        .executor()
        .execute_script("create table side_effect (task_id text not null)")
        .await
        .expect("side table");
    let t = store.submit(NewTask::new("x", json!({}))).await.expect("submit");
    store.claim(&claim("w1")).await.expect("claim");

    let mut tx = store.executor().begin().await.expect("begin");
    tx.execute_script(&format!("insert into side_effect values ('{}')", t.id)).await.expect("insert");
    store.complete_in(&mut tx, &Lease::new(&t.id, "w1"), json!({"n": 1})).await.expect("complete_in");
    tx.rollback().await.expect("rollback");
    assert_eq!(store.fetch(&t.id).await.expect("get").status, TaskStatus::Running, "rolled back together");

    let mut tx = store.executor().begin().await.expect("begin");
    tx.execute_script(&format!("insert into side_effect values ('{}')", t.id)).await.expect("insert");
    let err =
        store.complete_in(&mut tx, &Lease::new(&t.id, "thief"), json!(0)).await.expect_err("not the owner");
    assert!(err.is_lost_lease(), "{err}");
    store.complete_in(&mut tx, &Lease::new(&t.id, "w1"), json!({"n": 2})).await.expect("complete_in");
    tx.commit().await.expect("commit");
    let done = store.fetch(&t.id).await.expect("get");
    assert_eq!((done.status, done.result), (TaskStatus::Succeeded, Some(json!({"n": 2}))));
    let rows = store.list(&ListFilter::default()).await.expect("list").len();
    assert_eq!(rows, 1);
    store.executor().execute_script("drop table side_effect").await.expect("drop");
}

/// A retryable failure comes back after its delay, keeping its error.
pub async fn fail_retries_after_the_delay<E: PgExecutor>(store: &Store<E>) {
    let t = store.submit(NewTask::new("x", json!({}))).await.expect("submit");
    store.claim(&claim("w1")).await.expect("claim");
    let envelope = ErrorEnvelope::new("Timeout", codes::HANDLER_ERROR, "upstream slow", true).to_json();
    let f = store
        .fail(&Lease::new(&t.id, "w1"), &Failure::new(envelope.clone()).delay(Duration::from_secs(60)))
        .await
        .expect("fail");
    assert_eq!(
        (f.status, f.error.clone(), f.worker_id.clone()),
        (TaskStatus::Queued, Some(envelope.clone()), None)
    );
    assert!(f.run_at_ms >= f.updated_at_ms + 60_000);
    assert!(store.claim(&claim("w2")).await.expect("claim").is_empty(), "not due before its delay");

    let p = store.submit(NewTask::new("y", json!({}))).await.expect("submit");
    store.claim(&ClaimRequest::new("w1", ["default"]).names(["y"])).await.expect("claim");
    let f =
        store.fail(&Lease::new(&p.id, "w1"), &Failure::new(envelope).retryable(false)).await.expect("fail");
    assert_eq!(f.status, TaskStatus::Failed, "not retryable means failed with attempts left");
    let r = store.retry(&p.id, false).await.expect("retry").expect("retried");
    assert_eq!((r.status, r.attempt, r.error, r.completed_at_ms), (TaskStatus::Queued, 1, None, None));
    assert_eq!(store.retry(&p.id, false).await.expect("retry queued"), None, "only failed or canceled retry");
}

/// The ids of `n` tasks submitted and claimed by `w1`, in submit order.
async fn claimed_in_order<E: PgExecutor>(store: &Store<E>, n: i64) -> Vec<String> {
    for i in 0..n {
        store.submit(NewTask::new("b", json!({ "i": i }))).await.expect("submit");
    }
    let mut claimed = store.claim(&claim("w1").limit(n)).await.expect("claim");
    claimed.sort_by_key(|t| t.payload["i"].as_i64());
    claimed.into_iter().map(|t| t.id).collect()
}

/// Several settlements in one transaction: completes of one worker in one
/// statement, a failure beside them, a stolen lease and a cancel request;
/// each is answered on its own.
pub async fn settle_batch_answers_each_settlement_on_its_own<E: PgExecutor>(store: &Store<E>) {
    let ids = claimed_in_order(store, 5).await;
    store.cancel(&ids[1]).await.expect("cancel request on a running task");
    let held = |i: usize, worker: &str| Lease::new(&ids[i], worker);
    let items = vec![
        Settlement::Complete { lease: held(0, "w1"), result: json!({"r": 0}) },
        Settlement::Complete { lease: held(1, "w1"), result: json!({"r": 1}) },
        Settlement::Complete { lease: held(2, "w2"), result: json!({"r": 2}) },
        Settlement::Fail {
            lease: held(3, "w1"),
            failure: Failure::new(json!({"code": "task_error"})).retryable(false),
        },
        Settlement::Complete { lease: held(4, "w1"), result: json!(null) },
        Settlement::Complete { lease: held(0, "w1"), result: json!({"r": "again"}) },
    ];
    let out = store.settle_batch(&items).await.expect("the batch commits");
    assert_eq!(out.len(), items.len());
    let status = |i: usize| out[i].as_ref().map(|t| t.status).map_err(|e| e.class_name());
    assert_eq!(status(0), Ok(TaskStatus::Succeeded));
    assert_eq!(status(1), Ok(TaskStatus::Canceled), "a cancel request wins");
    assert_eq!(status(2), Err("LostLease"), "another worker's settlement is refused");
    assert_eq!(status(3), Ok(TaskStatus::Failed));
    assert_eq!(status(4), Ok(TaskStatus::Succeeded));
    assert_eq!(status(5), Err("LostLease"), "a second settlement of one task is refused");
    assert_eq!(store.fetch(&ids[0]).await.expect("get").result, Some(json!({"r": 0})));
    assert_eq!(store.fetch(&ids[2]).await.expect("get").status, TaskStatus::Running, "untouched");
}

/// The usual batch, one worker's completes, is one statement (run without
/// a transaction); each settlement is still answered on its own.
pub async fn settle_batch_of_one_workers_completes_answers_each<E: PgExecutor>(store: &Store<E>) {
    let ids = claimed_in_order(store, 4).await;
    store.cancel(&ids[1]).await.expect("cancel request");
    store.complete(&Lease::new(&ids[2], "w1"), json!("early")).await.expect("settled before the batch");
    let complete =
        |id: &String, r: serde_json::Value| Settlement::Complete { lease: Lease::new(id, "w1"), result: r };
    let items = vec![
        complete(&ids[0], json!({"r": 0})),
        complete(&ids[1], json!({"r": 1})),
        complete(&ids[2], json!({"r": 2})),
        complete(&ids[3], json!([3])),
        complete(&"task_missing".to_owned(), json!(null)),
    ];
    let out = store.settle_batch(&items).await.expect("the batch commits");
    let status = |i: usize| out[i].as_ref().map(|t| (t.id.as_str(), t.status)).map_err(|e| e.class_name());
    assert_eq!(status(0), Ok((ids[0].as_str(), TaskStatus::Succeeded)));
    assert_eq!(status(1), Ok((ids[1].as_str(), TaskStatus::Canceled)));
    assert_eq!(status(2), Err("LostLease"), "settled already");
    assert_eq!(status(3), Ok((ids[3].as_str(), TaskStatus::Succeeded)));
    assert_eq!(status(4), Err("LostLease"));
    assert_eq!(store.fetch(&ids[0]).await.expect("get").result, Some(json!({"r": 0})));
    assert_eq!(store.fetch(&ids[2]).await.expect("get").result, Some(json!("early")));
    assert_eq!(store.fetch(&ids[3]).await.expect("get").result, Some(json!([3])));
    let live = store.submit(NewTask::new("b", json!({}))).await.expect("submit");
    assert_eq!(store.claim(&claim("w1")).await.expect("claim")[0].id, live.id);
    let bad = vec![
        complete(&live.id, json!(1)),
        Settlement::Complete { lease: Lease::new("", "w1"), result: json!(1) },
    ];
    let err = store.settle_batch(&bad).await.expect_err("an empty id is refused");
    assert!(matches!(err, Error::InvalidArgument(ref why) if why.contains("lease task id")), "{err}");
    let still = store.fetch(&live.id).await.expect("get");
    assert_eq!(
        still.status,
        TaskStatus::Running,
        "refused before any SQL: the good one is not settled either"
    );
}

/// `release` puts a running task back, due now, with its attempt unspent;
/// with a cancel requested it ends canceled instead.
pub async fn release_gives_a_task_back_without_spending_its_attempt<E: PgExecutor>(store: &Store<E>) {
    let a = store.submit(NewTask::new("r", json!({}))).await.expect("submit");
    let b = store.submit(NewTask::new("r", json!({}))).await.expect("submit");
    assert_eq!(store.claim(&claim("w1").limit(2)).await.expect("claim").len(), 2);
    store.cancel(&b.id).await.expect("cancel request");
    let back = store.release(&Lease::new(&a.id, "w1")).await.expect("release");
    assert_eq!(
        (back.status, back.attempt, back.worker_id, back.lease_until_ms),
        (TaskStatus::Queued, 0, None, None)
    );
    assert!(store.release(&Lease::new(&a.id, "w1")).await.expect_err("not running any more").is_lost_lease());
    let canceled = store.release(&Lease::new(&b.id, "w1")).await.expect("release with a cancel request");
    assert_eq!(canceled.status, TaskStatus::Canceled);
    let again = store.claim(&claim("w2")).await.expect("claim again at once");
    assert_eq!((again.len(), again[0].id.as_str(), again[0].attempt), (1, a.id.as_str(), 1));
}

/// `snooze` puts a running task back due after its delay, attempt unspent
/// and the error of an earlier attempt kept; a cancel request wins, a
/// delay past the most is refused, and a second snooze finds no lease.
pub async fn snooze_requeues_later_keeping_attempt_and_error<E: PgExecutor>(store: &Store<E>) {
    let t = store.submit(NewTask::new("s", json!({}))).await.expect("submit");
    let other = store.submit(NewTask::new("s", json!({}))).await.expect("submit");
    store.claim(&claim("w1").limit(2)).await.expect("claim");
    let envelope = json!({"type": "Boom", "code": "task_error", "message": "first try", "retryable": true, "details": {}});
    let failed = store.fail(&Lease::new(&t.id, "w1"), &Failure::new(envelope.clone())).await.expect("fail");
    assert_eq!((failed.status, failed.attempt), (TaskStatus::Queued, 1));
    let again = store.claim(&claim("w1")).await.expect("claim again");
    assert_eq!((again.len(), again[0].attempt), (1, 2));

    let hour = Duration::from_secs(3600);
    let snoozed = store.snooze(&Lease::new(&t.id, "w1"), hour).await.expect("snooze");
    assert_eq!(
        (snoozed.status, snoozed.attempt, snoozed.worker_id.as_deref(), snoozed.lease_until_ms),
        (TaskStatus::Queued, 1, None, None),
        "queued, the second attempt unspent"
    );
    assert_eq!(snoozed.error, Some(envelope), "the first attempt's error is kept");
    let wait = snoozed.run_at_ms - snoozed.updated_at_ms;
    assert!((3_599_000..=3_600_000).contains(&wait), "due an hour after the snooze, got {wait} ms");
    assert!(store.claim(&claim("w2")).await.expect("claim").is_empty(), "not due yet");
    let err = store.snooze(&Lease::new(&t.id, "w1"), hour).await.expect_err("snoozed already");
    assert!(err.is_lost_lease(), "{err}");

    let too_long = waymark_store::MAX_SNOOZE + Duration::from_secs(1);
    let err = store.snooze(&Lease::new(&other.id, "w1"), too_long).await.expect_err("too long");
    assert!(matches!(err, Error::InvalidArgument(ref why) if why.contains("snooze")), "{err}");
    store.cancel(&other.id).await.expect("cancel request");
    let batch = [Settlement::Snooze { lease: Lease::new(&other.id, "w1"), delay: hour }];
    let answers = store.settle_batch(&batch).await.expect("settle batch");
    let settled = answers[0].as_ref().expect("the snooze settles");
    assert_eq!(settled.status, TaskStatus::Canceled, "a cancel request wins over a snooze");
}
