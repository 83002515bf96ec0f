//! Claiming and holding: order and due time, lease recovery, the probe,
//! heartbeats, lost leases, progress.

use serde_json::json;
use std::time::Duration;

use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{
    codes, ClaimRequest, Error, ErrorEnvelope, Failure, Lease, NewTask, PgExecutor, Settlement, Store,
    TaskStatus,
};

use super::{claim, expire_leases};

/// Claim order (priority, then due time), every claim shape, delayed tasks.
pub async fn claim_order_shapes_and_due_time<E: PgExecutor>(store: &Store<E>) {
    let low = store.submit(NewTask::new("a", json!({})).priority(-1)).await.expect("low");
    let high = store.submit(NewTask::new("a", json!({})).priority(5)).await.expect("high");
    let mid = store.submit(NewTask::new("b", json!({}))).await.expect("mid");
    let later =
        store.submit(NewTask::new("a", json!({})).delay(Duration::from_secs(60))).await.expect("delayed");
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
    // The claim filled in its status and worker: the row must hold them.
    let row = store.fetch(&c[0].id).await.expect("get");
    assert_eq!((row.status, row.worker_id.as_deref(), row.attempt), (TaskStatus::Running, Some("w"), 1));
    // The lease is the one asked for (leases run out by writing the row in
    // the cases below, so this is where its length is checked).
    let long = store.submit(NewTask::new("a", json!({})).queue("q3")).await.expect("submit");
    let c = store
        .claim(&ClaimRequest::new("w", ["q3"]).lease(Duration::from_millis(45_678)))
        .await
        .expect("claim");
    assert_eq!(c[0].id, long.id);
    assert_eq!(c[0].lease_until_ms, Some(c[0].updated_at_ms + 45_678), "lease_ms bound and used");
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
    assert_eq!(store.claim(&claim("w1").limit(3)).await.expect("claim").len(), 3);
    store.progress(&Lease::new(&retried.id, "w1"), Some(0.5), Some("half")).await.expect("progress");
    store.cancel(&canceled.id).await.expect("cancel");
    expire_leases(store, "w1").await;

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
    assert_eq!(store.claim(&claim("w1")).await.expect("claim").len(), 1);
    let low = store.submit(NewTask::new("x", json!({}))).await.expect("submit");
    let high = store.submit(NewTask::new("x", json!({})).priority(5)).await.expect("submit");
    expire_leases(store, "w1").await;

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
    let beats = store.heartbeat_batch(&asked, "w1", Duration::from_secs(60)).await.expect("beat");
    assert_eq!(beats.iter().map(|b| b.id.clone()).collect::<Vec<_>>(), ids);
    assert_eq!(
        beats.iter().map(|b| b.cancel_requested_at_ms.is_some()).collect::<Vec<_>>(),
        [false, true, false]
    );
    assert!(store.heartbeat_batch(&ids, "w2", Duration::from_secs(60)).await.expect("beat").is_empty());
    assert!(store.heartbeat_batch(&[], "w1", Duration::from_secs(60)).await.expect("empty").is_empty());
    let t = store.heartbeat(&Lease::new(&ids[0], "w1"), Duration::from_secs(90)).await.expect("heartbeat");
    assert!(t.lease_until_ms.expect("lease") >= t.updated_at_ms + 90_000);
}

/// Once another worker holds the task, the old owner's writes are no-ops
/// reported as LostLease.
pub async fn lost_lease_writes_change_nothing<E: PgExecutor>(store: &Store<E>) {
    let t = store.submit(NewTask::new("x", json!({}))).await.expect("submit");
    store.claim(&claim("w1")).await.expect("claim");
    expire_leases(store, "w1").await;
    let c = store.claim(&claim("w2")).await.expect("reclaim");
    assert_eq!(c.len(), 1);
    let before = store.fetch(&t.id).await.expect("get");
    for err in [
        store.complete(&Lease::new(&t.id, "w1"), json!(1)).await.expect_err("complete"),
        store.succeed(&Lease::new(&t.id, "w1"), json!(1), None).await.expect_err("succeed"),
        store.fail(&Lease::new(&t.id, "w1"), &Failure::new(json!({}))).await.expect_err("fail"),
        store.progress(&Lease::new(&t.id, "w1"), Some(0.1), None).await.expect_err("progress"),
        store.heartbeat(&Lease::new(&t.id, "w1"), Duration::from_secs(1)).await.expect_err("heartbeat"),
    ] {
        assert!(err.is_lost_lease(), "{err}");
        assert_eq!(err.task_id(), Some(t.id.as_str()));
    }
    assert_eq!(store.fetch(&t.id).await.expect("get"), before, "nothing changed");
}

/// progress with a null leaves that field alone.
pub async fn progress_keeps_what_is_not_given<E: PgExecutor>(store: &Store<E>) {
    let t = store.submit(NewTask::new("x", json!({}))).await.expect("submit");
    store.claim(&claim("w1")).await.expect("claim");
    store.progress(&Lease::new(&t.id, "w1"), Some(0.25), Some("reading")).await.expect("progress");
    let p = store.progress(&Lease::new(&t.id, "w1"), None, Some("writing")).await.expect("progress");
    assert_eq!((p.progress, p.message.as_deref()), (Some(0.25), Some("writing")));
    let p = store.progress(&Lease::new(&t.id, "w1"), Some(0.5), None).await.expect("progress");
    assert_eq!((p.progress, p.message.as_deref()), (Some(0.5), Some("writing")));
    let s = store.succeed(&Lease::new(&t.id, "w1"), json!("ok"), None).await.expect("succeed");
    assert_eq!((s.progress, s.message.as_deref(), s.lease_until_ms), (Some(1.0), Some("writing"), None));
}

/// A lease names the worker id its claim was made under, and a worker
/// claims under an id of its own per claim: once a later claim holds the
/// task, every write made with the earlier lease is refused as lost, one by
/// one and in a settlement batch, also when a release gave the attempt
/// back and the later claim carries the same attempt number. A settlement
/// batch checks each lease against its own worker id, also two leases of
/// one task; a renewal refuses a task named twice. A task that is not
/// running holds no lease.
pub async fn a_lease_is_fenced_to_its_claims_worker_id<E: PgExecutor>(store: &Store<E>) {
    let queued = store.submit(NewTask::new("x", json!({}))).await.expect("submit");
    match queued.lease() {
        Err(Error::InvalidArgument(why)) => assert!(why.contains("is queued, not running"), "{why}"),
        other => panic!("a queued task has no lease, got {other:?}"),
    }
    let first = store.claim(&claim("w1/1")).await.expect("claim").remove(0).lease().expect("claimed");
    assert_eq!((first.task_id(), first.worker_id()), (queued.id.as_str(), "w1/1"));
    store.release(&first).await.expect("given back, its attempt unspent");
    let again = store.claim(&claim("w1/2")).await.expect("reclaim").remove(0);
    assert_eq!(again.attempt, 1, "the same attempt number as the first claim");
    let second = again.lease().expect("claimed");
    let before = store.fetch(&queued.id).await.expect("get");
    for err in [
        store.complete(&first, json!(1)).await.expect_err("complete"),
        store.succeed(&first, json!(1), None).await.expect_err("succeed"),
        store.fail(&first, &Failure::new(json!({}))).await.expect_err("fail"),
        store.progress(&first, Some(0.1), None).await.expect_err("progress"),
        store.heartbeat(&first, Duration::from_secs(1)).await.expect_err("heartbeat"),
        store.release(&first).await.expect_err("release"),
    ] {
        assert!(err.is_lost_lease(), "{err}");
    }
    let batch = [Settlement::Complete { lease: first.clone(), result: json!(1) }];
    let out = store.settle_batch(&batch).await.expect("the batch commits");
    assert!(out[0].as_ref().is_err_and(Error::is_lost_lease), "{out:?}");
    let renewal = store
        .renew_leases(std::slice::from_ref(&first), Duration::from_secs(60), Duration::from_secs(1))
        .await;
    assert!(renewal.expect("renew").renewed.is_empty(), "the earlier claim renews nothing");
    assert_eq!(store.fetch(&queued.id).await.expect("get"), before, "nothing changed");
    // Two claims' leases in one statement: each is checked against its own id.
    let other = store.submit(NewTask::new("x", json!({}))).await.expect("submit");
    let third =
        store.claim(&claim("w1/3")).await.expect("claim the other").remove(0).lease().expect("claimed");
    let renewal = store
        .renew_leases(&[second.clone(), third.clone()], Duration::from_secs(60), Duration::from_secs(1))
        .await
        .expect("renew");
    assert_eq!(renewal.renewed.len(), 2, "both renewed: {renewal:?}");
    let both = [third.clone(), third.clone()];
    let twice = store.renew_leases(&both, Duration::from_secs(60), Duration::ZERO).await;
    assert!(matches!(twice, Err(Error::InvalidArgument(_))), "one lease per task");
    // The earlier claim's complete beside the later one's, of one task: the
    // later claim's lands, the earlier answers lost, whatever their order.
    let batch = [
        Settlement::Complete { lease: first, result: json!("one") },
        Settlement::Complete { lease: second, result: json!("two") },
        Settlement::Complete { lease: third, result: json!(null) },
    ];
    let out = store.settle_batch(&batch).await.expect("the batch commits");
    assert!(out[0].as_ref().is_err_and(Error::is_lost_lease), "{out:?}");
    let statuses: Vec<_> = out[1..].iter().map(|o| o.as_ref().map(|s| s.status).ok()).collect();
    assert_eq!(statuses, [Some(TaskStatus::Succeeded), Some(TaskStatus::Succeeded)]);
    assert_eq!(store.fetch(&queued.id).await.expect("get").result, Some(json!("two")));
    assert_eq!(
        store.fetch(&other.id).await.expect("get").result,
        Some(json!(null)),
        "JSON null, as `complete`"
    );
}
