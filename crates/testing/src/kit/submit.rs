//! Submitting: defaults and reads, bad arguments, `submit_in`, keys, batches.

use serde_json::json;
use std::time::Duration;

use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{
    ClaimRequest, Conflict, Error, Failure, Lease, ListFilter, NewTask, PgExecutor, PgTransaction,
    PurgeFilter, Settlement, Store, Task, TaskStatus,
};

use super::{claim, count_all};

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
        store.submit(NewTask::new("x", json!({})).delay(Duration::MAX)).await,
        "delay of 18446744073709551615.999999999s is too long",
    );
    assert_invalid(
        store.submit(NewTask::new("x", json!({})).max_attempts(0)).await,
        "max_attempts must be at least 1",
    );
    assert_invalid(store.submit(NewTask::new("", json!({}))).await, "task name must not be empty");
    assert_invalid(store.submit(NewTask::new("x", json!({})).queue("")).await, "queue must not be empty");
    assert_invalid(store.submit(NewTask::new("x", json!({})).key("")).await, "key must not be empty");
    // Past bigint once added to the clock, or what PostgreSQL cannot hold.
    assert_invalid(
        store.submit(NewTask::new("x", json!({})).delay(Duration::from_secs(1 << 50))).await,
        "is too long: at most 10,000 years",
    );
    assert_invalid(store.submit(NewTask::new("x\u{0}y", json!({}))).await, "task name holds a NUL character");
    assert_invalid(
        store.submit(NewTask::new("x", json!({})).correlation_id("c\u{0}")).await,
        "correlation_id holds a NUL character",
    );
    assert_invalid(
        store.submit(NewTask::new("x", json!({ "deep": [{ "s": "a\u{0}" }] }))).await,
        "payload holds a NUL character",
    );
    assert_invalid(
        store
            .submit_batch([
                NewTask::new("x", json!({})),
                NewTask::new("x", json!({})).metadata(json!({ "k\u{0}": 1 })),
            ])
            .await,
        "task 1 of the batch: metadata holds a NUL character",
    );
    assert_invalid("first-wins".parse::<Conflict>(), "unknown conflict strategy \"first-wins\"");
    assert_invalid("done".parse::<TaskStatus>(), "unknown task status \"done\"");
    let mut purge = PurgeFilter::older_than(Duration::ZERO);
    purge.status = Some(TaskStatus::Running);
    assert_invalid(
        store.purge(&purge).await,
        "purge status must be succeeded, failed or canceled, got running",
    );
    assert_invalid(
        store.purge(&PurgeFilter { limit: 0, ..PurgeFilter::older_than(Duration::ZERO) }).await,
        "purge limit",
    );
    assert_invalid(store.purge(&PurgeFilter::older_than(Duration::MAX)).await, "purge older_than of");
    assert_invalid(
        store.claim(&claim("w").lease(Duration::from_micros(999))).await,
        "lease must be at least 1 ms",
    );
    assert_invalid(store.claim(&ClaimRequest::new("", ["default"])).await, "worker_id must not be empty");
    assert_invalid(
        store.heartbeat(&Lease::new("task_x", "w"), Duration::ZERO).await,
        "lease must be at least 1 ms",
    );
    assert_invalid(store.heartbeat_batch(&["task_x".to_owned()], "w", Duration::MAX).await, "lease of");
    assert_invalid(
        store.progress(&Lease::new("task_x", "w"), Some(1.5), None).await,
        "progress must be within [0, 1], got 1.5",
    );
    assert_invalid(
        store.progress(&Lease::new("task_x", "w"), Some(f64::NAN), None).await,
        "progress must be within [0, 1]",
    );
    assert_invalid(
        store.fail(&Lease::new("task_x", "w"), &Failure::new(json!({})).delay(Duration::MAX)).await,
        "failure delay of",
    );
    assert_invalid(store.complete(&Lease::new("", "w"), json!(1)).await, "lease task id must not be empty");
    assert_invalid(
        store.complete(&Lease::new("task_x", ""), json!(1)).await,
        "lease worker_id must not be empty",
    );
    let batch = [Settlement::Complete { lease: Lease::new("task_x", ""), result: json!(1) }];
    assert_invalid(store.settle_batch(&batch).await, "lease worker_id must not be empty");
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

/// The four conflict strategies in the states the scenarios do not cover.
pub async fn keyed_submit_strategies<E: PgExecutor>(store: &Store<E>) {
    let keyed = |conflict| NewTask::new("x", json!({})).key("K").conflict(conflict);
    let first = store.submit(keyed(Conflict::Reject)).await.expect("first");
    store.claim(&claim("w1")).await.expect("claim");
    store.complete(&Lease::new(&first.id, "w1"), json!(1)).await.expect("complete");

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

/// A batch of alike tasks (they differ in id and payload only, and the
/// store binds what they share once): each task is the row a single
/// submit of it writes, every column but its id, its payload and when it
/// was written; tasks at the defaults are each their own root.
pub async fn submit_batch_of_alike_tasks_writes_what_they_share<E: PgExecutor>(store: &Store<E>) {
    // A task's row with what differs between submits of one kind set aside:
    // its id and payload blanked, its times taken from its creation.
    let kind = |t: &Task| Task {
        id: String::new(),
        payload: json!(null),
        run_at_ms: t.run_at_ms - t.created_at_ms,
        updated_at_ms: t.updated_at_ms - t.created_at_ms,
        created_at_ms: 0,
        ..t.clone()
    };
    let parent = store.submit(NewTask::new("parent", json!({}))).await.expect("parent");
    let root = parent.root_id.clone().expect("a top-level task has a root");
    let alike = |i: usize| {
        NewTask::new("alike", json!({ "i": i }))
            .queue("aq")
            .priority(7)
            .max_attempts(5)
            .metadata(json!({ "m": 1 }))
            .delay(Duration::from_secs(60))
            .parent_id(&parent.id)
            .root_id(&root)
            .correlation_id("c")
    };
    let ids = store.submit_batch((0..50).map(alike)).await.expect("alike batch");
    let single = kind(&store.submit(alike(50)).await.expect("single"));
    assert_eq!((single.run_at_ms, single.max_attempts, single.priority), (60_000, 5, 7));
    for (i, id) in ids.iter().enumerate() {
        let t = store.fetch(id).await.expect("each task is there");
        assert_eq!(t.payload, json!({ "i": i }), "in the order given");
        assert_eq!(kind(&t), single, "as a single submit writes it");
    }

    let plain = |i: usize| NewTask::new("alike", json!(i)).queue("aq");
    let ids = store.submit_batch((0..3).map(plain)).await.expect("alike at the defaults");
    let single = store.submit(plain(3)).await.expect("single");
    let own_root = |t: &Task| Task { root_id: None, ..kind(t) };
    for id in &ids {
        let t = store.fetch(id).await.expect("each task is there");
        assert_eq!(t.root_id.as_deref(), Some(id.as_str()), "its own root");
        assert_eq!(own_root(&t), own_root(&single), "as a single submit writes it");
    }
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
                1 => t.delay(Duration::from_secs(60)).correlation_id(format!("c{i}")),
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
