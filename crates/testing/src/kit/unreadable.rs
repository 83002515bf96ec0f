//! Rows written by others that the store cannot read.

use std::time::Duration;

use serde_json::json;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{ClaimRequest, Error, Failure, ListFilter, NewTask, PgExecutor, Store, TaskStatus};

use super::{claim, raw};

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
        let req = ClaimRequest::new("w3", ["calls"]).lease(Duration::from_secs(30));
        let task = crate::until_some(Duration::from_secs(20), "the called task claimed", || async {
            store.claim(&req).await.expect("claim").pop()
        })
        .await;
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

/// Columns an operator added to the task table (of types no executor need
/// decode: a timestamp, a uuid) are never read: every statement names the
/// protocol's columns, so submits, reads, claims, heartbeats and every
/// settlement go on as before, and so do cairnq's clients.
pub async fn a_column_added_by_an_operator_is_never_read<E: PgExecutor>(store: &Store<E>) {
    raw(
        store,
        "alter table cairnq_tasks add column added_at timestamptz not null default now(), \
         add column tenant uuid default '6f1c1f0e-0000-4000-8000-000000000000'",
    )
    .await;
    let plain = store.submit(NewTask::new("x", json!({ "n": 1 }))).await.expect("submit");
    let keyed = store.submit(NewTask::new("x", json!({ "n": 2 })).key("added-column")).await.expect("keyed");
    store.submit_batch((3..6).map(|n| NewTask::new("x", json!({ "n": n })))).await.expect("batch");
    assert_eq!(store.fetch(&plain.id).await.expect("get").payload, json!({ "n": 1 }));
    assert_eq!(store.get_by_key("added-column").await.expect("by key").map(|t| t.id), Some(keyed.id.clone()));
    let listed = store.list(&ListFilter { limit: 100, ..ListFilter::default() }).await.expect("list");
    assert_eq!(listed.len(), 5);

    let claimed = store.claim(&claim("w1").limit(5)).await.expect("claim");
    assert_eq!(claimed.len(), 5);
    let leases: Vec<_> = claimed.iter().map(|t| t.lease().expect("a claimed task's lease")).collect();
    store.heartbeat(&leases[0], Duration::from_secs(30)).await.expect("heartbeat");
    store.progress(&leases[0], Some(0.5), Some("half")).await.expect("progress");
    store.complete(&leases[0], json!({ "done": true })).await.expect("complete");
    store.succeed(&leases[1], json!(1), Some("ok")).await.expect("succeed");
    let failed = store
        .fail(
            &leases[2],
            &Failure::new(json!({ "type": "E", "code": "e", "message": "m", "retryable": false }))
                .retryable(false),
        )
        .await
        .expect("fail");
    assert_eq!(failed.status, TaskStatus::Failed);
    store.release(&leases[3]).await.expect("release");
    store.cancel(leases[4].task_id()).await.expect("cancel");
    store.retry(&failed.id, false).await.expect("retry").expect("retried");
    let mut statuses: Vec<TaskStatus> = store
        .list(&ListFilter { limit: 100, ..ListFilter::default() })
        .await
        .expect("list")
        .into_iter()
        .map(|t| t.status)
        .collect();
    statuses.sort();
    assert_eq!(
        statuses,
        [
            TaskStatus::Queued,
            TaskStatus::Queued,
            TaskStatus::Running,
            TaskStatus::Succeeded,
            TaskStatus::Succeeded
        ],
        "released and retried queued, the cancel requested on a running task"
    );
}

/// Rows whose attempt plain SQL wrote out of range (at int4's top, or
/// negative) stop no claim: each is claimed with an attempt a lease can be
/// fenced to, beside the good rows, and settles like any other.
pub async fn an_attempt_out_of_range_stops_no_claim<E: PgExecutor>(store: &Store<E>) {
    let good = store.submit_batch((0..3).map(|n| NewTask::new("x", json!({ "n": n })))).await.expect("batch");
    let (top, negative) = ("task_01ATTEMPTATTHETOP0000000", "task_01NEGATIVEATTEMPT0000000");
    for (id, attempt) in [(top, i32::MAX), (negative, -3)] {
        raw(
            store,
            &format!(
                "insert into cairnq_tasks (id, name, queue, status, payload, attempt, max_attempts, run_at_ms, \
                 root_id, created_at_ms, updated_at_ms) \
                 values ('{id}', 'x', 'default', 'queued', '{{}}', {attempt}, {attempt}, 0, '{id}', 0, 0)"
            ),
        )
        .await;
    }
    let claimed = store.claim(&claim("w1").limit(10)).await.expect("a claim past both rows");
    assert_eq!(claimed.len(), 5, "the good rows and both odd ones");
    for t in &claimed {
        let lease = t.lease().expect("every claimed row can be fenced");
        store.complete(&lease, json!(null)).await.expect("settles");
    }
    let mut attempts: Vec<(String, i32)> =
        claimed.iter().filter(|t| !good.contains(&t.id)).map(|t| (t.id.clone(), t.attempt)).collect();
    attempts.sort();
    assert_eq!(attempts, [(top.to_owned(), i32::MAX), (negative.to_owned(), 1)]);
}
