//! The executor conformance kit: the store's whole contract, as cases that
//! run against any [`PgExecutor`]. `store_contract!(make)` expands to one
//! `#[tokio::test]` per case, each on a fresh schema, where `make` is an
//! `async fn(&TestSchema) -> Store<E>`; every executor we ship and every
//! adapter in these tests calls it.

use std::time::Duration;

use serde_json::json;
use waymark_store::{
    codes, ClaimRequest, Conflict, Error, ErrorEnvelope, Failure, ListFilter, NewTask, PgExecutor, PgSession,
    PgTransaction, PurgeFilter, Settlement, Store, TaskStatus,
};

/// Expands to one test per contract case for the executor `make` builds.
#[macro_export]
macro_rules! store_contract {
    ($make:path) => {
        $crate::store_contract!(@cases $make;
            submit_defaults_and_reads,
            bad_arguments_are_refused_with_a_clear_error,
            submit_in_commits_and_rolls_back_with_the_caller,
            complete_in_commits_with_the_callers_writes,
            keyed_submit_strategies,
            concurrent_keyed_submits_make_one_task,
            claim_order_shapes_and_due_time,
            expired_leases_are_recovered,
            a_claim_without_its_probe_claims_due_work_and_recovers_nothing,
            heartbeat_batch_reports_owned_tasks_in_order,
            lost_lease_writes_change_nothing,
            fail_retries_after_the_delay,
            progress_keeps_what_is_not_given,
            queue_depth_and_stats,
            purge_takes_the_key_with_it,
            migrate_is_idempotent,
            settle_batch_answers_each_settlement_on_its_own,
            settle_batch_of_one_workers_completes_answers_each,
            release_gives_a_task_back_without_spending_its_attempt,
            submit_batch_inserts_many_in_order,
            a_row_it_cannot_read_stops_nothing,
        );
    };
    (@cases $make:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let schema = $crate::TestSchema::new().await;
                let store = $make(&schema).await;
                $crate::kit::$case(&store).await;
                schema.drop().await;
            }
        )*
    };
}

fn claim(worker: &str) -> ClaimRequest {
    ClaimRequest::new(worker, ["default"]).lease_ms(30_000)
}

async fn count_all<E: PgExecutor>(store: &Store<E>) -> usize {
    store.list(&ListFilter { limit: 10_000, ..ListFilter::default() }).await.expect("list").len()
}

/// Defaults of a submit, and every read of one task.
pub async fn submit_defaults_and_reads<E: PgExecutor>(store: &Store<E>) {
    let t = store.submit(NewTask::new("echo", json!({"x": 1}))).await.expect("submit");
    assert!(t.id.starts_with("task_") && t.id.len() == 31, "{}", t.id);
    assert_eq!(t.status, TaskStatus::Queued);
    assert_eq!((t.queue.as_str(), t.attempt, t.max_attempts, t.priority), ("default", 0, 3, 0));
    assert_eq!(t.root_id.as_deref(), Some(t.id.as_str()), "a top-level task is its own root");
    assert_eq!(t.metadata, json!({}));
    assert_eq!(t.lease_until_ms, None);
    assert!(t.run_at_ms >= t.created_at_ms);

    assert_eq!(store.get(&t.id).await.expect("get"), Some(t.clone()));
    assert_eq!(store.fetch(&t.id).await.expect("fetch"), t);
    let state = store.get_status(&t.id).await.expect("status").expect("present");
    assert_eq!((state.id.as_str(), state.status), (t.id.as_str(), TaskStatus::Queued));

    assert_eq!(store.get("task_missing").await.expect("get"), None);
    assert_eq!(store.get_status("task_missing").await.expect("status"), None);
    let err = store.fetch("task_missing").await.expect_err("missing");
    assert!(err.is_not_found(), "{err}");
    assert_eq!(err.to_string(), "task task_missing not found");

    let child = store
        .submit(NewTask::new("child", json!(null)).parent_id(&t.id).root_id(&t.id).correlation_id("c1"))
        .await
        .expect("child");
    assert_eq!(child.payload, json!(null));
    let tree =
        store.list(&ListFilter { root_id: Some(t.id.clone()), ..Default::default() }).await.expect("list");
    assert_eq!(tree.iter().map(|x| x.id.as_str()).collect::<Vec<_>>(), [child.id.as_str(), t.id.as_str()]);
}

fn assert_invalid(result: Result<impl std::fmt::Debug, Error>, needle: &str) {
    match result {
        Err(Error::InvalidArgument(msg)) => {
            assert!(msg.contains(needle), "message {msg:?} should name {needle:?}")
        }
        other => panic!("expected InvalidArgument naming {needle:?}, got {other:?}"),
    }
}

/// Every bad argument gets `InvalidArgument` naming what was wrong, and
/// nothing is written.
pub async fn bad_arguments_are_refused_with_a_clear_error<E: PgExecutor>(store: &Store<E>) {
    assert_invalid(
        store.submit(NewTask::new("x", json!({})).delay_ms(-1)).await,
        "delay_ms must not be negative",
    );
    assert_invalid(
        store.submit(NewTask::new("x", json!({})).max_attempts(0)).await,
        "max_attempts must be at least 1",
    );
    assert_invalid(store.submit(NewTask::new("", json!({}))).await, "task name must not be empty");
    assert_invalid(store.submit(NewTask::new("x", json!({})).queue("")).await, "queue must not be empty");
    assert_invalid(store.submit(NewTask::new("x", json!({})).key("")).await, "key must not be empty");
    assert_invalid(
        store.submit(NewTask::new("x", json!({})).metadata(json!([1]))).await,
        "metadata must be a JSON object",
    );
    assert_invalid("first-wins".parse::<Conflict>(), "unknown conflict strategy \"first-wins\"");
    assert_invalid("done".parse::<TaskStatus>(), "unknown task status \"done\"");
    let mut purge = PurgeFilter::older_than_ms(0);
    purge.status = Some(TaskStatus::Running);
    assert_invalid(
        store.purge(&purge).await,
        "purge status must be succeeded, failed or canceled, got running",
    );
    assert_invalid(
        store.purge(&PurgeFilter { limit: 0, ..PurgeFilter::older_than_ms(0) }).await,
        "purge limit",
    );
    assert_invalid(store.purge(&PurgeFilter::older_than_ms(-5)).await, "older_than_ms must not be negative");
    assert_invalid(store.claim(&claim("w").lease_ms(0)).await, "lease_ms must be at least 1");
    assert_invalid(store.claim(&ClaimRequest::new("", ["default"])).await, "worker_id must not be empty");
    assert_invalid(store.heartbeat("task_x", "w", -1).await, "lease_ms must be at least 1");
    assert_invalid(
        store.heartbeat_batch(&["task_x".to_owned()], "w", 0).await,
        "lease_ms must be at least 1",
    );
    assert_invalid(
        store.progress("task_x", "w", Some(1.5), None).await,
        "progress must be within [0, 1], got 1.5",
    );
    assert_invalid(
        store.progress("task_x", "w", Some(f64::NAN), None).await,
        "progress must be within [0, 1]",
    );
    assert_invalid(
        store.fail("task_x", "w", &Failure::new(json!({})).delay_ms(-10)).await,
        "delay_ms must not be negative",
    );
    assert_invalid(store.complete("", "w", json!(1)).await, "task id must not be empty");
    assert_invalid(store.complete("task_x", "", json!(1)).await, "worker_id must not be empty");
    assert_invalid(
        store.list(&ListFilter { limit: -1, ..Default::default() }).await,
        "list limit must not be negative",
    );
    assert_invalid(
        store.list(&ListFilter { offset: -1, ..Default::default() }).await,
        "list offset must not be negative",
    );
    assert_invalid(store.queue_depth("default", -1).await, "max_depth must not be negative");
    assert_invalid(store.cancel_by_key("").await, "key must not be empty");
    assert_invalid(store.retry_by_key("", false).await, "key must not be empty");
    assert_eq!(count_all(store).await, 0, "a refused call must write nothing");
}

/// A submit inside the caller's transaction exists only if the caller commits.
pub async fn submit_in_commits_and_rolls_back_with_the_caller<E: PgExecutor>(store: &Store<E>) {
    let mut tx = store.executor().begin().await.expect("begin");
    let gone = store.submit_in(&mut tx, NewTask::new("x", json!({}))).await.expect("submit_in");
    let gone_keyed = store.submit_in(&mut tx, NewTask::new("x", json!({})).key("k1")).await.expect("keyed");
    tx.rollback().await.expect("rollback");
    assert_eq!(store.get(&gone.id).await.expect("get"), None);
    assert_eq!(store.get_by_key("k1").await.expect("get"), None);
    assert_eq!(store.get(&gone_keyed.id).await.expect("get"), None);

    let mut tx = store.executor().begin().await.expect("begin");
    let kept = store.submit_in(&mut tx, NewTask::new("x", json!({})).key("k1")).await.expect("keyed");
    tx.commit().await.expect("commit");
    assert_eq!(store.get_by_key("k1").await.expect("get").map(|t| t.id), Some(kept.id));

    // A batch too: all of it with the caller's commit, none of it after a rollback.
    let batch = || (0..3).map(|i| NewTask::new("x", json!({ "i": i })));
    let mut tx = store.executor().begin().await.expect("begin");
    let gone = store.submit_batch_in(&mut tx, batch()).await.expect("batch in");
    tx.rollback().await.expect("rollback");
    for id in &gone {
        assert_eq!(store.get(id).await.expect("get"), None, "rolled back with the caller");
    }
    let mut tx = store.executor().begin().await.expect("begin");
    let kept = store.submit_batch_in(&mut tx, batch()).await.expect("batch in");
    tx.commit().await.expect("commit");
    for (i, id) in kept.iter().enumerate() {
        let t = store.fetch(id).await.expect("committed with the caller");
        assert_eq!((t.payload, t.root_id.as_deref()), (json!({ "i": i }), Some(id.as_str())));
    }
}

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
    store.complete_in(&mut tx, &t.id, "w1", json!({"n": 1})).await.expect("complete_in");
    tx.rollback().await.expect("rollback");
    assert_eq!(store.fetch(&t.id).await.expect("get").status, TaskStatus::Running, "rolled back together");

    let mut tx = store.executor().begin().await.expect("begin");
    tx.execute_script(&format!("insert into side_effect values ('{}')", t.id)).await.expect("insert");
    let err = store.complete_in(&mut tx, &t.id, "thief", json!(0)).await.expect_err("not the owner");
    assert!(err.is_lost_lease(), "{err}");
    store.complete_in(&mut tx, &t.id, "w1", json!({"n": 2})).await.expect("complete_in");
    tx.commit().await.expect("commit");
    let done = store.fetch(&t.id).await.expect("get");
    assert_eq!((done.status, done.result), (TaskStatus::Succeeded, Some(json!({"n": 2}))));
    let rows = store.list(&ListFilter::default()).await.expect("list").len();
    assert_eq!(rows, 1);
    store.executor().execute_script("drop table side_effect").await.expect("drop");
}

/// The four conflict strategies in the states the scenarios do not cover.
pub async fn keyed_submit_strategies<E: PgExecutor>(store: &Store<E>) {
    let keyed = |conflict| NewTask::new("x", json!({})).key("K").conflict(conflict);
    let first = store.submit(keyed(Conflict::Reject)).await.expect("first");
    store.claim(&claim("w1")).await.expect("claim");
    store.complete(&first.id, "w1", json!(1)).await.expect("complete");

    // reject refuses even a finished task, naming it.
    match store.submit(keyed(Conflict::Reject)).await {
        Err(Error::AlreadyExists { key, task_id }) => {
            assert_eq!((key.as_str(), task_id), ("K", first.id.clone()))
        }
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    // replace of a running task asks it to stop and repoints the key.
    let second = store.submit(keyed(Conflict::Replace)).await.expect("replace finished");
    assert_ne!(second.id, first.id);
    assert_eq!(
        store.fetch(&first.id).await.expect("get").status,
        TaskStatus::Succeeded,
        "a settled task stays"
    );
    store.claim(&claim("w1")).await.expect("claim");
    let third = store.submit(keyed(Conflict::Replace)).await.expect("replace running");
    let old = store.fetch(&second.id).await.expect("get");
    assert_eq!(old.status, TaskStatus::Running);
    assert!(old.cancel_requested_at_ms.is_some(), "replace asks a running task to stop");
    assert_eq!(store.get_by_key("K").await.expect("get").map(|t| t.id), Some(third.id.clone()));

    // reuse-succeeded never hands back a failed task.
    store.cancel(&third.id).await.expect("cancel");
    let fourth = store.submit(keyed(Conflict::ReuseSucceeded)).await.expect("after cancel");
    assert_ne!(fourth.id, third.id);
    assert_eq!(fourth.status, TaskStatus::Queued);
    let state = store.get_status_by_key("K").await.expect("status").expect("present");
    assert_eq!(state.id, fourth.id);
}

/// Concurrent keyed submits serialise on the key: one task, one answer.
pub async fn concurrent_keyed_submits_make_one_task<E: PgExecutor>(store: &Store<E>) {
    let submits = (0..8).map(|_| store.submit(NewTask::new("x", json!({})).key("same")));
    let results = futures::future::join_all(submits).await;
    let ids: std::collections::BTreeSet<String> =
        results.into_iter().map(|r| r.expect("submit").id).collect();
    assert_eq!(ids.len(), 1, "every submit must return the one task: {ids:?}");
    assert_eq!(count_all(store).await, 1);
}

/// Claim order (priority, then due time), every claim shape, delayed tasks.
pub async fn claim_order_shapes_and_due_time<E: PgExecutor>(store: &Store<E>) {
    let low = store.submit(NewTask::new("a", json!({})).priority(-1)).await.expect("low");
    let high = store.submit(NewTask::new("a", json!({})).priority(5)).await.expect("high");
    let mid = store.submit(NewTask::new("b", json!({}))).await.expect("mid");
    let later = store.submit(NewTask::new("a", json!({})).delay_ms(60_000)).await.expect("delayed");
    let other = store.submit(NewTask::new("a", json!({})).queue("q2")).await.expect("q2");

    let order: Vec<String> = [
        store.claim(&claim("w")).await.expect("1"),
        store.claim(&claim("w")).await.expect("2"),
        store.claim(&claim("w")).await.expect("3"),
    ]
    .into_iter()
    .flatten()
    .map(|t| t.id)
    .collect();
    assert_eq!(order, [high.id.clone(), mid.id.clone(), low.id.clone()], "priority first, then due time");
    assert!(
        store.claim(&claim("w").limit(10)).await.expect("none due").is_empty(),
        "delayed task is not due"
    );
    assert_eq!(store.fetch(&later.id).await.expect("get").status, TaskStatus::Queued);

    // one name across two queues, and several queues with names.
    let c =
        store.claim(&ClaimRequest::new("w", ["default", "q2"]).names(["a"]).limit(10)).await.expect("claim");
    assert_eq!(c.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), [other.id.as_str()]);
    assert_eq!((c[0].attempt, c[0].worker_id.as_deref()), (1, Some("w")));
    assert!(c[0].lease_until_ms.expect("lease") > c[0].updated_at_ms);
    let more = store.submit(NewTask::new("b", json!({})).queue("q2")).await.expect("b");
    let c =
        store.claim(&ClaimRequest::new("w", ["default", "q2"]).names(["b", "c"]).limit(10)).await.expect("c");
    assert_eq!(c.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), [more.id.as_str()]);
    assert!(store.claim(&claim("w").limit(0)).await.expect("limit 0").is_empty());
    assert!(store.claim(&ClaimRequest::new("w", Vec::<String>::new())).await.expect("no queues").is_empty());
}

/// recover_leases requeues, fails (with the lease_expired envelope) or
/// cancels expired tasks on the next claim pass.
pub async fn expired_leases_are_recovered<E: PgExecutor>(store: &Store<E>) {
    let last = store.submit(NewTask::new("x", json!({})).max_attempts(1)).await.expect("last");
    let retried = store.submit(NewTask::new("x", json!({})).max_attempts(2)).await.expect("retried");
    let canceled = store.submit(NewTask::new("x", json!({})).max_attempts(2)).await.expect("canceled");
    assert_eq!(store.claim(&claim("w1").lease_ms(100).limit(3)).await.expect("claim").len(), 3);
    store.progress(&retried.id, "w1", Some(0.5), Some("half")).await.expect("progress");
    store.cancel(&canceled.id).await.expect("cancel");
    tokio::time::sleep(Duration::from_millis(250)).await;

    let again = store.claim(&ClaimRequest::new("w2", ["none"])).await.expect("claim pass");
    assert!(again.is_empty(), "a pass on another queue still recovers");
    let failed = store.fetch(&last.id).await.expect("get");
    assert_eq!(failed.status, TaskStatus::Failed);
    assert_eq!(failed.error_envelope(), Some(ErrorEnvelope::lease_expired()));
    assert_eq!(failed.error_envelope().map(|e| e.code), Some(codes::LEASE_EXPIRED.to_owned()));
    assert!(failed.completed_at_ms.is_some() && failed.lease_until_ms.is_none());
    assert_eq!(failed.worker_id.as_deref(), Some("w1"), "worker kept on terminal rows");

    let requeued = store.fetch(&retried.id).await.expect("get");
    assert_eq!((requeued.status, requeued.attempt), (TaskStatus::Queued, 1));
    assert_eq!((requeued.worker_id, requeued.progress, requeued.message), (None, None, None));
    assert_eq!(requeued.lease_until_ms, None);

    assert_eq!(store.fetch(&canceled.id).await.expect("get").status, TaskStatus::Canceled);
}

/// With its probe off, a claim pass is the claim alone: it takes due work,
/// best priority first, and leaves an expired lease for a pass that probes;
/// that pass recovers the task and claims it first.
pub async fn a_claim_without_its_probe_claims_due_work_and_recovers_nothing<E: PgExecutor>(store: &Store<E>) {
    let stale = store.submit(NewTask::new("x", json!({"n": "stale"}))).await.expect("submit");
    assert_eq!(store.claim(&claim("w1").lease_ms(50)).await.expect("claim").len(), 1);
    let low = store.submit(NewTask::new("x", json!({}))).await.expect("submit");
    let high = store.submit(NewTask::new("x", json!({})).priority(5)).await.expect("submit");
    tokio::time::sleep(Duration::from_millis(150)).await; // w1's lease is gone

    let got = store.claim(&claim("w2").probe(false)).await.expect("claim without probe");
    assert_eq!(got.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), [high.id.as_str()]);
    let still = store.fetch(&stale.id).await.expect("get");
    assert_eq!(
        (still.status, still.worker_id.as_deref()),
        (TaskStatus::Running, Some("w1")),
        "not recovered"
    );

    let got = store.claim(&claim("w3").limit(5)).await.expect("a pass with its probe");
    let mut ids: Vec<&str> = got.iter().map(|t| t.id.as_str()).collect();
    ids.sort();
    let mut want = vec![stale.id.as_str(), low.id.as_str()];
    want.sort();
    assert_eq!(ids, want, "the recovering pass claims the recovered task");
    assert_eq!(store.fetch(&stale.id).await.expect("get").attempt, 2);
    assert!(store.claim(&claim("w4").probe(false)).await.expect("empty queue").is_empty());
}

/// heartbeat_batch answers in the order asked, leaves out what is lost, and
/// shows cancel requests.
pub async fn heartbeat_batch_reports_owned_tasks_in_order<E: PgExecutor>(store: &Store<E>) {
    for _ in 0..3 {
        store.submit(NewTask::new("x", json!({}))).await.expect("submit");
    }
    let mut ids: Vec<String> =
        store.claim(&claim("w1").limit(3)).await.expect("claim").into_iter().map(|t| t.id).collect();
    ids.sort();
    ids.reverse();
    store.cancel(&ids[1]).await.expect("cancel");
    let mut asked = ids.clone();
    asked.insert(1, "task_not_mine".to_owned());
    let beats = store.heartbeat_batch(&asked, "w1", 60_000).await.expect("beat");
    assert_eq!(beats.iter().map(|b| b.id.clone()).collect::<Vec<_>>(), ids);
    assert_eq!(
        beats.iter().map(|b| b.cancel_requested_at_ms.is_some()).collect::<Vec<_>>(),
        [false, true, false]
    );
    assert!(store.heartbeat_batch(&ids, "w2", 60_000).await.expect("beat").is_empty());
    assert!(store.heartbeat_batch(&[], "w1", 60_000).await.expect("empty").is_empty());
    let t = store.heartbeat(&ids[0], "w1", 90_000).await.expect("heartbeat");
    assert!(t.lease_until_ms.expect("lease") >= t.updated_at_ms + 90_000);
}

/// Once another worker holds the task, the old owner's writes are no-ops
/// reported as LostLease.
pub async fn lost_lease_writes_change_nothing<E: PgExecutor>(store: &Store<E>) {
    let t = store.submit(NewTask::new("x", json!({}))).await.expect("submit");
    store.claim(&claim("w1").lease_ms(50)).await.expect("claim");
    tokio::time::sleep(Duration::from_millis(150)).await;
    let c = store.claim(&claim("w2")).await.expect("reclaim");
    assert_eq!(c.len(), 1);
    let before = store.fetch(&t.id).await.expect("get");
    for err in [
        store.complete(&t.id, "w1", json!(1)).await.expect_err("complete"),
        store.succeed(&t.id, "w1", json!(1), None).await.expect_err("succeed"),
        store.fail(&t.id, "w1", &Failure::new(json!({}))).await.expect_err("fail"),
        store.progress(&t.id, "w1", Some(0.1), None).await.expect_err("progress"),
        store.heartbeat(&t.id, "w1", 1000).await.expect_err("heartbeat"),
    ] {
        assert!(err.is_lost_lease(), "{err}");
        assert_eq!(err.task_id(), Some(t.id.as_str()));
    }
    assert_eq!(store.fetch(&t.id).await.expect("get"), before, "nothing changed");
}

/// A retryable failure comes back after its delay, keeping its error.
pub async fn fail_retries_after_the_delay<E: PgExecutor>(store: &Store<E>) {
    let t = store.submit(NewTask::new("x", json!({}))).await.expect("submit");
    store.claim(&claim("w1")).await.expect("claim");
    let envelope = ErrorEnvelope::new("Timeout", codes::HANDLER_ERROR, "upstream slow", true).to_json();
    let f = store.fail(&t.id, "w1", &Failure::new(envelope.clone()).delay_ms(60_000)).await.expect("fail");
    assert_eq!(
        (f.status, f.error.clone(), f.worker_id.clone()),
        (TaskStatus::Queued, Some(envelope.clone()), None)
    );
    assert!(f.run_at_ms >= f.updated_at_ms + 60_000);
    assert!(store.claim(&claim("w2")).await.expect("claim").is_empty(), "not due before its delay");

    let p = store.submit(NewTask::new("y", json!({}))).await.expect("submit");
    store.claim(&ClaimRequest::new("w1", ["default"]).names(["y"])).await.expect("claim");
    let f = store.fail(&p.id, "w1", &Failure::new(envelope).retryable(false)).await.expect("fail");
    assert_eq!(f.status, TaskStatus::Failed, "not retryable means failed with attempts left");
    let r = store.retry(&p.id, false).await.expect("retry").expect("retried");
    assert_eq!((r.status, r.attempt, r.error, r.completed_at_ms), (TaskStatus::Queued, 1, None, None));
    assert_eq!(store.retry(&p.id, false).await.expect("retry queued"), None, "only failed or canceled retry");
}

/// progress with a null leaves that field alone.
pub async fn progress_keeps_what_is_not_given<E: PgExecutor>(store: &Store<E>) {
    let t = store.submit(NewTask::new("x", json!({}))).await.expect("submit");
    store.claim(&claim("w1")).await.expect("claim");
    store.progress(&t.id, "w1", Some(0.25), Some("reading")).await.expect("progress");
    let p = store.progress(&t.id, "w1", None, Some("writing")).await.expect("progress");
    assert_eq!((p.progress, p.message.as_deref()), (Some(0.25), Some("writing")));
    let p = store.progress(&t.id, "w1", Some(0.5), None).await.expect("progress");
    assert_eq!((p.progress, p.message.as_deref()), (Some(0.5), Some("writing")));
    let s = store.succeed(&t.id, "w1", json!("ok"), None).await.expect("succeed");
    assert_eq!((s.progress, s.message.as_deref(), s.lease_until_ms), (Some(1.0), Some("writing"), None));
}

/// queue_depth counts queued rows (delayed included) against the bound.
pub async fn queue_depth_and_stats<E: PgExecutor>(store: &Store<E>) {
    for delay in [0, 0, 60_000] {
        store.submit(NewTask::new("x", json!({})).queue("d").delay_ms(delay)).await.expect("submit");
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
    store.complete(&t.id, "w1", json!(1)).await.expect("complete");
    let live = store.submit(NewTask::new("x", json!({}))).await.expect("live");
    assert!(store.purge(&PurgeFilter::older_than_ms(3_600_000)).await.expect("purge").is_empty());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut by_queue = PurgeFilter::older_than_ms(0);
    by_queue.queue = Some("elsewhere".to_owned());
    assert!(store.purge(&by_queue).await.expect("purge").is_empty(), "queue filter");
    assert_eq!(store.purge(&PurgeFilter::older_than_ms(0)).await.expect("purge"), [t.id.as_str()]);
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
    assert_eq!(report.skipped, 10);
    let status = store.migration_status().await.expect("status");
    assert_eq!(status.len(), 10);
    assert!(status.iter().all(|m| m.applied_at_ms.is_some()), "{status:?}");
    assert_eq!(status[2].name, "0003_notify.sql");
    store.check_protocol_version().await.expect("version 1");
}

/// Several settlements in one transaction: completes of one worker in one
/// statement, a failure beside them, a stolen lease and a cancel request;
/// each is answered on its own.
pub async fn settle_batch_answers_each_settlement_on_its_own<E: PgExecutor>(store: &Store<E>) {
    for i in 0..5 {
        store.submit(NewTask::new("b", json!({ "i": i }))).await.expect("submit");
    }
    let mut claimed = store.claim(&claim("w1").limit(5)).await.expect("claim");
    claimed.sort_by_key(|t| t.payload["i"].as_i64());
    let ids: Vec<String> = claimed.iter().map(|t| t.id.clone()).collect();
    store.cancel(&ids[1]).await.expect("cancel request on a running task");
    let items = vec![
        Settlement::Complete { id: ids[0].clone(), worker_id: "w1".into(), result: json!({"r": 0}) },
        Settlement::Complete { id: ids[1].clone(), worker_id: "w1".into(), result: json!({"r": 1}) },
        Settlement::Complete { id: ids[2].clone(), worker_id: "w2".into(), result: json!({"r": 2}) },
        Settlement::Fail {
            id: ids[3].clone(),
            worker_id: "w1".into(),
            failure: Failure::new(json!({"code": "task_error"})).retryable(false),
        },
        Settlement::Complete { id: ids[4].clone(), worker_id: "w1".into(), result: json!(null) },
        Settlement::Complete { id: ids[0].clone(), worker_id: "w1".into(), result: json!({"r": "again"}) },
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
    for i in 0..4 {
        store.submit(NewTask::new("b", json!({ "i": i }))).await.expect("submit");
    }
    let mut claimed = store.claim(&claim("w1").limit(4)).await.expect("claim");
    claimed.sort_by_key(|t| t.payload["i"].as_i64());
    let ids: Vec<String> = claimed.iter().map(|t| t.id.clone()).collect();
    store.cancel(&ids[1]).await.expect("cancel request");
    store.complete(&ids[2], "w1", json!("early")).await.expect("settled before the batch");
    let complete = |id: &String, r: serde_json::Value| Settlement::Complete {
        id: id.clone(),
        worker_id: "w1".into(),
        result: r,
    };
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
        Settlement::Complete { id: String::new(), worker_id: "w1".into(), result: json!(1) },
    ];
    let err = store.settle_batch(&bad).await.expect_err("an empty id is refused");
    assert!(matches!(err, Error::InvalidArgument(ref why) if why.contains("task id")), "{err}");
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
    let back = store.release(&a.id, "w1").await.expect("release");
    assert_eq!(
        (back.status, back.attempt, back.worker_id, back.lease_until_ms),
        (TaskStatus::Queued, 0, None, None)
    );
    assert!(store.release(&a.id, "w1").await.expect_err("not running any more").is_lost_lease());
    let canceled = store.release(&b.id, "w1").await.expect("release with a cancel request");
    assert_eq!(canceled.status, TaskStatus::Canceled);
    let again = store.claim(&claim("w2")).await.expect("claim again at once");
    assert_eq!((again.len(), again[0].id.as_str(), again[0].attempt), (1, a.id.as_str(), 1));
}

/// A batched submit: one statement, the ids back in the order given, each
/// task with every field a single submit sets (per task, optional ones
/// too); keyed tasks are refused.
pub async fn submit_batch_inserts_many_in_order<E: PgExecutor>(store: &Store<E>) {
    let parent = store.submit(NewTask::new("parent", json!({}))).await.expect("parent");
    let batch: Vec<NewTask> = (0..300)
        .map(|i| {
            let t = NewTask::new("batch", json!({ "i": i }))
                .queue("bq")
                .priority(i % 3)
                .max_attempts(1 + i % 4)
                .metadata(json!({"m": i}));
            match i % 3 {
                0 => t,
                1 => t.delay_ms(60_000).correlation_id(format!("c{i}")),
                _ => t.parent_id(&parent.id).root_id(parent.root_id.clone().unwrap_or_default()),
            }
        })
        .collect();
    let ids = store.submit_batch(batch).await.expect("batch");
    assert_eq!(ids.len(), 300);
    for (i, id) in ids.iter().enumerate() {
        let t = store.fetch(id).await.expect("each task is there");
        assert_eq!(t.payload, json!({ "i": i }), "in the order given");
        assert_eq!((t.name.as_str(), t.queue.as_str()), ("batch", "bq"));
        assert_eq!(
            (t.status, t.attempt, t.priority, t.max_attempts),
            (TaskStatus::Queued, 0, i as i32 % 3, 1 + i as i32 % 4)
        );
        assert_eq!(t.metadata, json!({"m": i}));
        match i % 3 {
            0 => {
                assert_eq!((t.root_id.as_deref(), t.parent_id.as_deref()), (Some(id.as_str()), None));
                assert_eq!((t.correlation_id.as_deref(), t.run_at_ms), (None, t.created_at_ms));
            }
            1 => {
                assert_eq!(t.correlation_id, Some(format!("c{i}")));
                assert_eq!(t.run_at_ms, t.created_at_ms + 60_000, "delayed by its own delay");
            }
            _ => {
                assert_eq!(t.parent_id.as_deref(), Some(parent.id.as_str()));
                assert_eq!(t.root_id, parent.root_id);
            }
        }
    }
    let nulls = store.submit_batch([NewTask::new("batch", json!(null)).queue("bq")]).await.expect("null");
    assert_eq!(store.fetch(&nulls[0]).await.expect("get").payload, json!(null), "a JSON null payload stays");
    assert_eq!(store.stats(Some("bq")).await.expect("stats")["bq"].queued, 301);
    assert!(store.submit_batch([]).await.expect("empty").is_empty());
    let keyed = vec![NewTask::new("batch", json!({})), NewTask::new("batch", json!({})).key("k")];
    match store.submit_batch(keyed).await {
        Err(Error::InvalidArgument(why)) => assert!(why.contains("task 1") && why.contains("key"), "{why}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    let bad = vec![NewTask::new("", json!({}))];
    match store.submit_batch(bad).await {
        Err(Error::InvalidArgument(why)) => assert!(why.starts_with("task 0 of the batch"), "{why}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert_eq!(
        store.stats(Some("bq")).await.expect("stats")["bq"].queued,
        301,
        "refused batches wrote nothing"
    );
}

/// Inserts, with plain SQL, a row whose payload is legal jsonb that
/// serde_json cannot hold, as any other client may write it.
async fn insert_raw<E: PgExecutor>(store: &Store<E>, id: &str, payload: &str, running: bool) {
    let (status, worker, lease, attempt) =
        if running { ("running", "'gone'", "1", 1) } else { ("queued", "null", "null", 0) };
    store
        .executor()
        .execute_script(&format!(
            "insert into cairnq_tasks (id, name, queue, status, payload, attempt, worker_id, lease_until_ms, \
             run_at_ms, root_id, created_at_ms, updated_at_ms) \
             values ('{id}', 'x', 'default', '{status}', '{payload}', {attempt}, {worker}, {lease}, 0, '{id}', 0, 0)"
        ))
        .await
        .expect("raw insert");
}

/// One row the store cannot read (a number past f64's range, nesting
/// deeper than serde_json goes) fails no read of others and no claim:
/// lists and gets name the column, a claim fails a task whose input it
/// cannot read for good and claims others in its place, a task whose old
/// error it cannot read still runs, `call` answers an unreadable result
/// with a decode error, and a lease recovery that brings such a row back
/// does not stop either.
pub async fn a_row_it_cannot_read_stops_nothing<E: PgExecutor>(store: &Store<E>) {
    let good =
        store.submit_batch((0..48).map(|n| NewTask::new("x", json!({ "n": n })))).await.expect("batch");
    let huge = "task_01HUGENUMBER0000000000000";
    let deep = "task_01DEEPNESTING00000000000";
    let meta = "task_01BADMETADATA00000000000";
    let old_error = "task_01BADOLDERROR0000000000";
    insert_raw(store, huge, r#"{"n": 1e400}"#, false).await;
    insert_raw(store, deep, &format!("{}{}", "[".repeat(200), "]".repeat(200)), false).await;
    insert_raw(store, meta, "{}", false).await;
    insert_raw(store, old_error, r#"{"ok": true}"#, false).await;
    raw(store, &format!("update cairnq_tasks set metadata = '{{\"n\": 1e400}}' where id = '{meta}'")).await;
    raw(store, &format!("update cairnq_tasks set error = '{{\"n\": 1e400}}' where id = '{old_error}'")).await;

    let listed = store.list(&ListFilter { limit: 100, ..ListFilter::default() }).await.expect("list");
    assert_eq!(listed.len(), 52, "every row listed");
    let unreadable: Vec<&str> =
        listed.iter().filter(|t| !t.unreadable.is_empty()).map(|t| t.id.as_str()).collect();
    assert_eq!(unreadable.len(), 4, "{unreadable:?}");
    let read = store.fetch(huge).await.expect("get reads the row");
    let why = read.unreadable_column("payload").expect("payload marked unreadable");
    assert!(why.to_string().starts_with("column payload: "), "{why}");
    assert_eq!(read.payload, serde_json::Value::Null);
    assert_eq!(store.get_status(huge).await.expect("status").map(|s| s.status), Some(TaskStatus::Queued));
    let read = store.fetch(old_error).await.expect("get");
    assert_eq!(read.unreadable.iter().map(|u| u.column.as_str()).collect::<Vec<_>>(), ["error"]);
    assert!(!read.input_unreadable(), "only an old error is unreadable");

    // The raw rows are due first: the claim draws them, fails the three it
    // cannot hand out, and claims three more in their place.
    let first = store.claim(&claim("w1").limit(10)).await.expect("a claim beside unreadable rows");
    assert_eq!(first.len(), 10, "a full claim: failed rows are claimed again in their place");
    assert!(first.iter().all(|t| !t.input_unreadable()));
    assert!(first.iter().any(|t| t.id == old_error), "a task whose old error cannot be read still runs");
    let rest = store.claim(&claim("w1").limit(60)).await.expect("claim the rest");
    assert_eq!(first.len() + rest.len(), 49, "every readable task handed out once");
    assert!(rest.iter().all(|t| good.contains(&t.id)));
    for (id, column) in [(huge, "payload"), (deep, "payload"), (meta, "metadata")] {
        let t = store.fetch(id).await.expect("get");
        assert_eq!((t.status, t.attempt), (TaskStatus::Failed, 1), "{id} failed for good");
        let envelope = t.error_envelope().expect("an envelope");
        assert_eq!((envelope.kind.as_str(), envelope.retryable), ("UnreadableTask", false));
        assert!(envelope.message.contains(&format!("column {column}")), "{}", envelope.message);
    }

    // A row stuck running with an expired lease (as an older release left
    // it): the recovering claim requeues it, fails it, and goes on.
    let stuck = "task_01STUCKRUNNING00000000000";
    insert_raw(store, stuck, r#"{"n": -1e400}"#, true).await;
    let next = store.submit(NewTask::new("x", json!({}))).await.expect("submit");
    let claimed = store.claim(&claim("w2").limit(10)).await.expect("a recovering claim");
    assert_eq!(claimed.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), [next.id.as_str()]);
    let t = store.fetch(stuck).await.expect("get");
    assert_eq!((t.status, t.attempt), (TaskStatus::Failed, 2));

    // A result another SDK wrote that cannot be read is an error, not `None`.
    let called = store.call(NewTask::new("x", json!({})).queue("calls"), Duration::from_secs(20));
    let answer = async {
        let req = ClaimRequest::new("w3", ["calls"]).lease_ms(30_000);
        let task = loop {
            if let Some(t) = store.claim(&req).await.expect("claim").pop() {
                break t;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        raw(
            store,
            &format!(
                "update cairnq_tasks set status = 'succeeded', result = '{{\"n\": 1e400}}', \
                 lease_until_ms = null, completed_at_ms = 1 where id = '{}'",
                task.id
            ),
        )
        .await;
    };
    let (called, ()) = tokio::join!(called, answer);
    match called {
        Err(Error::UnreadableAnswer { status, column, .. }) => {
            assert_eq!((status, column.as_str()), (TaskStatus::Succeeded, "result"));
        }
        other => panic!("expected UnreadableAnswer naming the result, got {other:?}"),
    }
}

async fn raw<E: PgExecutor>(store: &Store<E>, sql: &str) {
    store.executor().execute_script(sql).await.expect(sql);
}
