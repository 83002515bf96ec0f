//! Waiting for results, run against any executor: with a listener the waits
//! are pushed, without one they poll; the answers must be the same.
//! `wait_contract!(make)` expands to one test per case, like `store_contract!`.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use waymark_store::protocol::{ParamType, Statement};
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::Lease;
use waymark_store::{
    codes, ClaimRequest, Conflict, Error, Failure, Lane, NewTask, PgExecutor, Signal, Sql, Store, Task,
    TaskStatus, Value,
};
use waymark_testing::until_some;

pub use crate::fault_executor::{hooked, Hooked};

/// Expands to one test per wait case for the executor `make` builds.
#[macro_export]
macro_rules! wait_contract {
    ($make:path) => {
        $crate::wait_contract!(@cases $make;
            wait_returns_the_terminal_task_settled_elsewhere,
            wait_times_out_without_stopping_the_task,
            wait_refuses_an_unknown_task,
            call_turns_failed_and_canceled_into_errors,
            wait_by_key_follows_the_key_to_its_current_task,
            waits_go_on_when_a_retry_lands_before_the_reread,
            wait_goes_on_for_a_task_purged_under_it,
            wait_by_key_waits_for_a_key_not_taken_yet,
            a_timeout_carries_the_last_snapshot_of_the_task,
            watch_polls_on_its_timer_and_hears_queued_when_listening,
        );
    };
    (@cases $make:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let schema = $crate::TestSchema::new().await;
                let store = $make(&schema).await;
                $crate::wait_kit::$case(&store).await;
                schema.drop().await;
            }
        )*
    };
}

/// A wait for task `id`, at most `limit`, on a task of its own: it answers
/// the moment the wait returned, and the task.
pub fn spawn_wait<E: PgExecutor + 'static>(
    store: &Arc<Store<E>>,
    id: &str,
    limit: Duration,
) -> JoinHandle<Result<(Instant, Task), Error>> {
    let (store, id) = (store.clone(), id.to_owned());
    tokio::spawn(async move { store.wait(&id, limit).await.map(|t| (Instant::now(), t)) })
}

/// Deletes task `id` with plain SQL, as a purge would, whatever its status.
async fn delete_task<E: PgExecutor>(store: &Store<E>, id: &str) {
    let sql = Sql {
        text: "delete from cairnq_tasks where id = $1",
        types: &[ParamType::Text],
        lane: Lane::Ordinary,
        repeatable: false,
    };
    let rows = store.executor().query(sql, &[Value::Text(id.to_owned())]).await.expect("delete");
    assert!(rows.is_empty(), "a delete without returning");
}

/// Claims the one task in `queue` and fails it for good: a failed task that
/// `retry` can queue again.
async fn fail_one<E: PgExecutor>(store: &Store<E>, queue: &str) -> String {
    let id = claim_one(store, queue, "wk").await;
    fail_for_good(store, &id).await;
    id
}

/// Fails task `id`, held by worker `wk`, with no retry left.
async fn fail_for_good<E: PgExecutor>(store: &Store<E>, id: &str) {
    let envelope = json!({"type": "E", "code": codes::TASK_ERROR, "message": "first run", "retryable": false, "details": {}});
    store.fail(&Lease::new(id, "wk"), &Failure::new(envelope).retryable(false)).await.expect("fail");
}

/// Claims the one task in `queue` as `worker`.
async fn claim_one<E: PgExecutor>(store: &Store<E>, queue: &str, worker: &str) -> String {
    let claimed = store
        .claim(&ClaimRequest::new(worker, [queue]).limit(1).lease(Duration::from_millis(30_000)))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1, "one task to claim in {queue}");
    claimed[0].id.clone()
}

pub async fn wait_returns_the_terminal_task_settled_elsewhere<E>(store: &Store<E>)
where
    E: PgExecutor + Clone + 'static,
{
    let task = store.submit(NewTask::new("w.echo", json!({"x": 1})).queue("w1")).await.expect("submit");
    // The task ends once the wait's first read has found it queued: the
    // wait must then be woken (or poll), not answer from that read.
    let (waiter, read) = hooked(store, Statement::GetStatus, 1, async {});
    let settler = store.clone();
    let id = task.id.clone();
    let settle = tokio::spawn(async move {
        read.await.expect("the wait's first read answered");
        let claimed = claim_one(&settler, "w1", "wk").await;
        assert_eq!(claimed, id);
        settler.complete(&Lease::new(&id, "wk"), json!({"y": 2})).await.expect("complete");
    });
    let done = waiter.wait(&task.id, Duration::from_secs(10)).await.expect("wait");
    settle.await.expect("settler");
    assert_eq!(done.status, TaskStatus::Succeeded);
    assert_eq!(done.result, Some(json!({"y": 2})));
    // Already terminal: answered by the first read.
    let again = store.wait(&task.id, Duration::from_millis(1)).await.expect("terminal at once");
    assert_eq!(again.id, task.id);
}

pub async fn wait_times_out_without_stopping_the_task<E: PgExecutor>(store: &Store<E>) {
    let task = store.submit(NewTask::new("w.slow", json!({})).queue("w2")).await.expect("submit");
    let started = Instant::now();
    let err = store.wait(&task.id, Duration::from_millis(300)).await.expect_err("times out");
    let took = started.elapsed();
    match &err {
        Error::TaskTimeout { task_id, waited, last } => {
            assert_eq!(task_id, &task.id);
            assert!(*waited >= Duration::from_millis(300), "{waited:?}");
            let last = last.as_deref().expect("the snapshot at the timeout");
            assert_eq!((last.id.as_str(), last.status), (task.id.as_str(), TaskStatus::Queued));
        }
        other => panic!("expected TaskTimeout, got {other:?}"),
    }
    assert_eq!(err.class_name(), "TaskTimeout");
    assert!(took < Duration::from_secs(3), "the timeout bounds the wait: {took:?}");
    let state = store.get_status(&task.id).await.expect("status").expect("still there");
    assert_eq!(state.status, TaskStatus::Queued, "a timed-out wait does not stop the task");
}

pub async fn wait_refuses_an_unknown_task<E: PgExecutor>(store: &Store<E>) {
    let err =
        store.wait("task_01HZZZZZZZZZZZZZZZZZZZZZZZ", Duration::from_secs(1)).await.expect_err("unknown");
    assert!(err.is_not_found(), "{err:?}");
}

pub async fn call_turns_failed_and_canceled_into_errors<E: PgExecutor + 'static>(store: &Store<E>)
where
    Store<E>: Clone,
{
    // A worker elsewhere fails the first task permanently.
    let worker = store.clone();
    let failing = tokio::spawn(async move {
        let req = ClaimRequest::new("wk-fail", ["w3"]).limit(1).lease(Duration::from_millis(30_000));
        let t = until_some(Duration::from_secs(10), "the call's task to claim", || async {
            worker.claim(&req).await.expect("claim").pop()
        })
        .await;
        let envelope = json!({"type": "ValueError", "code": codes::TASK_ERROR, "message": "bad input", "retryable": false, "details": {}});
        worker
            .fail(&Lease::new(&t.id, "wk-fail"), &Failure::new(envelope).retryable(false))
            .await
            .expect("fail");
    });
    let err = store
        .call(NewTask::new("w.fails", json!({})).queue("w3").max_attempts(1), Duration::from_secs(10))
        .await
        .expect_err("failed");
    failing.await.expect("worker");
    match &err {
        Error::TaskFailed { error: Some(envelope), .. } => {
            assert_eq!(envelope.code, codes::TASK_ERROR);
            assert_eq!(envelope.message, "bad input");
        }
        other => panic!("expected TaskFailed with the envelope, got {other:?}"),
    }
    assert!(err.to_string().contains("bad input"), "{err}");

    // Another client cancels the second while it is queued.
    let canceler = store.clone();
    let cancel = tokio::spawn(async move {
        let in_w4 = waymark_store::ListFilter { queue: Some("w4".into()), limit: 1, ..Default::default() };
        let t = until_some(Duration::from_secs(10), "the call's task to cancel", || async {
            canceler.list(&in_w4).await.expect("list").pop()
        })
        .await;
        canceler.cancel(&t.id).await.expect("cancel");
    });
    let err = store.call(NewTask::new("w.canceled", json!({})).queue("w4"), Duration::from_secs(10)).await;
    cancel.await.expect("canceler");
    assert!(matches!(err, Err(Error::TaskCanceled { .. })), "{err:?}");
}

pub async fn wait_by_key_follows_the_key_to_its_current_task<E>(store: &Store<E>)
where
    E: PgExecutor + Clone + 'static,
{
    let first =
        store.submit(NewTask::new("w.keyed", json!({"v": 1})).queue("w5").key("w5:k")).await.expect("first");
    // The key moves on once the wait has found the first task pending and
    // read it again under its registration for that task's end.
    let (waiter, registered) = hooked(store, Statement::GetStatusByKey, 2, async {});
    let other = store.clone();
    let replace = tokio::spawn(async move {
        registered.await.expect("the wait's second read answered");
        // Replace cancels the first and points the key at a new task,
        // which a worker then completes.
        let second = other
            .submit(
                NewTask::new("w.keyed", json!({"v": 2})).queue("w5").key("w5:k").conflict(Conflict::Replace),
            )
            .await
            .expect("replace");
        let claimed = claim_one(&other, "w5", "wk").await;
        assert_eq!(claimed, second.id);
        other.complete(&Lease::new(&second.id, "wk"), json!("second")).await.expect("complete");
        second.id
    });
    // The first task ends canceled, but the key now names the second:
    // the wait follows the key until the task it names is terminal.
    let done = waiter.wait_by_key("w5:k", Duration::from_secs(10)).await.expect("wait_by_key");
    let second = replace.await.expect("replacer");
    assert_ne!(first.id, second);
    if done.id == second {
        assert_eq!(done.status, TaskStatus::Succeeded);
    } else {
        // The wait saw the first task canceled before the key moved on.
        assert_eq!((done.id.as_str(), done.status), (first.id.as_str(), TaskStatus::Canceled));
    }
}

pub async fn watch_polls_on_its_timer_and_hears_queued_when_listening<E: PgExecutor>(store: &Store<E>) {
    let mut watch = store.watch(["w6"], Duration::from_millis(200));
    assert_eq!(watch.next().await, Signal::Poll, "the first answer is a read-now");
    // The queued stream's, not the done stream's (another test's waits may
    // have that one up while this one still connects).
    let listening = store.is_watching();
    store.submit(NewTask::new("w.watched", json!({})).queue("w6")).await.expect("submit");
    let started = Instant::now();
    let mut heard_queued = false;
    let mut polls = 0;
    while started.elapsed() < Duration::from_secs(2) && (polls < 2 || (listening && !heard_queued)) {
        match tokio::time::timeout(Duration::from_secs(2), watch.next()).await.expect("a signal in time") {
            Signal::Queued(q) => {
                assert_eq!(q, "w6", "only watched queues");
                heard_queued = true;
            }
            Signal::Poll => polls += 1,
            Signal::Done(_) => {}
        }
    }
    assert!(polls >= 2, "the timer answers Poll every interval ({polls} in 2 s)");
    if listening {
        assert!(heard_queued, "a listening store hears the submit");
    }
}

/// A store whose first full read of a task is preceded by a `retry` of the
/// task `id` names (then failed), and a worker elsewhere that runs that
/// second attempt to success once that read has answered: it can only have
/// found the task queued.
fn retried_then_completed<E: PgExecutor + Clone + 'static>(
    store: &Store<E>,
    queue: &'static str,
    id: impl Future<Output = String> + Send + 'static,
) -> (Store<Hooked<E>>, tokio::task::JoinHandle<String>) {
    let (retried_tx, retried) = oneshot::channel::<String>();
    let retrier = store.clone();
    let (waiter, reread) = hooked(store, Statement::Get, 1, async move {
        let id = id.await;
        let queued = retrier.retry(&id, true).await.expect("retry").expect("a failed task retries");
        assert_eq!(queued.status, TaskStatus::Queued);
        retried_tx.send(id).expect("the test waits");
    });
    let worker = store.clone();
    let second_run = tokio::spawn(async move {
        let id = retried.await.expect("the hook ran");
        reread.await.expect("the re-read answered");
        assert_eq!(claim_one(&worker, queue, "wk2").await, id);
        worker.complete(&Lease::new(&id, "wk2"), json!("second run")).await.expect("complete");
        id
    });
    (waiter, second_run)
}

/// The probe finds the task failed, and a `retry` lands before the full
/// re-read, which so finds it queued: `wait`, `call` and `wait_by_key` go on
/// waiting and answer the end of the second run, never the queued row.
pub async fn waits_go_on_when_a_retry_lands_before_the_reread<E>(store: &Store<E>)
where
    E: PgExecutor + Clone + 'static,
{
    let submitted = store.submit(NewTask::new("w.flaky", json!({})).queue("w7")).await.expect("submit");
    let id = fail_one(store, "w7").await;
    assert_eq!(id, submitted.id);
    let (waiter, second_run) = retried_then_completed(store, "w7", std::future::ready(id.clone()));
    let done = waiter.wait(&id, Duration::from_secs(10)).await.expect("wait");
    assert_eq!(second_run.await.expect("second run"), id);
    assert_eq!((done.status, done.result), (TaskStatus::Succeeded, Some(json!("second run"))), "wait");

    // call: a worker elsewhere fails the first run.
    let (failed_tx, failed) = oneshot::channel::<String>();
    let failer = store.clone();
    let first_run = tokio::spawn(async move {
        let req = ClaimRequest::new("wk", ["w8"]).limit(1).lease(Duration::from_millis(30_000));
        let id = until_some(Duration::from_secs(10), "the first run to claim", || async {
            failer.claim(&req).await.expect("claim").pop().map(|t| t.id)
        })
        .await;
        fail_for_good(&failer, &id).await;
        failed_tx.send(id).expect("the hook waits");
    });
    let (waiter, second_run) =
        retried_then_completed(store, "w8", async move { failed.await.expect("the first run failed") });
    let done = waiter
        .call(NewTask::new("w.flaky", json!({})).queue("w8").max_attempts(1), Duration::from_secs(10))
        .await
        .expect("call: the second run succeeds");
    first_run.await.expect("first run");
    assert_eq!(second_run.await.expect("second run"), done.id);
    assert_eq!((done.status, done.result), (TaskStatus::Succeeded, Some(json!("second run"))), "call");

    // wait_by_key: the key names the failed task, retried under the re-read.
    let submitted =
        store.submit(NewTask::new("w.flaky", json!({})).queue("w9").key("w9:k")).await.expect("submit");
    let id = fail_one(store, "w9").await;
    assert_eq!(id, submitted.id);
    let (waiter, second_run) = retried_then_completed(store, "w9", std::future::ready(id.clone()));
    let done = waiter.wait_by_key("w9:k", Duration::from_secs(10)).await.expect("wait_by_key");
    assert_eq!(second_run.await.expect("second run"), id);
    assert_eq!((done.status, done.result), (TaskStatus::Succeeded, Some(json!("second run"))), "wait_by_key");
}

/// A task the wait has seen and that then vanishes (purged between the
/// probe and the re-read, or between two probes) is waited for until the
/// timeout, as cairnq does, not refused as unknown.
pub async fn wait_goes_on_for_a_task_purged_under_it<E>(store: &Store<E>)
where
    E: PgExecutor + Clone + 'static,
{
    // Purged between the probe that found it terminal and the full re-read.
    let task = store.submit(NewTask::new("w.gone", json!({})).queue("w10")).await.expect("submit");
    store.cancel(&task.id).await.expect("cancel").expect("canceled");
    let purger = store.clone();
    let id = task.id.clone();
    let (waiter, _) = hooked(store, Statement::Get, 1, async move { delete_task(&purger, &id).await });
    let err = waiter.wait(&task.id, Duration::from_millis(400)).await.expect_err("gone under the re-read");
    match &err {
        Error::TaskTimeout { task_id, waited, last } => {
            assert_eq!(task_id, &task.id);
            assert!(*waited >= Duration::from_millis(400), "{waited:?}");
            assert!(last.is_none(), "no snapshot of a task that is gone: {last:?}");
        }
        other => panic!("expected TaskTimeout, got {other:?}"),
    }

    // Seen queued by the first probe, canceled and purged before the second.
    let task = store.submit(NewTask::new("w.gone", json!({})).queue("w10")).await.expect("submit");
    let purger = store.clone();
    let id = task.id.clone();
    let (waiter, _) = hooked(store, Statement::GetStatus, 2, async move {
        purger.cancel(&id).await.expect("cancel").expect("canceled");
        delete_task(&purger, &id).await;
    });
    let err = waiter.wait(&task.id, Duration::from_millis(400)).await.expect_err("gone between probes");
    assert!(matches!(&err, Error::TaskTimeout { task_id, last: None, .. } if *task_id == task.id), "{err:?}");
}

/// `wait_by_key` on a key that names no task yet waits for one: the submit
/// that takes the key, and that task's end, arrive during the wait.
pub async fn wait_by_key_waits_for_a_key_not_taken_yet<E>(store: &Store<E>)
where
    E: PgExecutor + Clone + 'static,
{
    let (submitted_tx, submitted) = oneshot::channel::<String>();
    let other = store.clone();
    // After the wait's first probe found nothing under the key.
    let (waiter, _) = hooked(store, Statement::GetStatusByKey, 2, async move {
        let task =
            other.submit(NewTask::new("w.later", json!({})).queue("w11").key("w11:k")).await.expect("submit");
        assert_eq!(claim_one(&other, "w11", "wk").await, task.id);
        other.complete(&Lease::new(&task.id, "wk"), json!("arrived")).await.expect("complete");
        submitted_tx.send(task.id).expect("the test waits");
    });
    let done = waiter.wait_by_key("w11:k", Duration::from_secs(10)).await.expect("wait_by_key");
    assert_eq!(done.id, submitted.await.expect("the hook ran"));
    assert_eq!((done.status, done.result), (TaskStatus::Succeeded, Some(json!("arrived"))));

    // A key no task ever takes: the wait runs to its timeout.
    let err = store.wait_by_key("w11:none", Duration::from_millis(300)).await.expect_err("never taken");
    match &err {
        Error::TaskTimeout { task_id, last: None, .. } => assert_eq!(task_id, r#"key "w11:none""#),
        other => panic!("expected TaskTimeout with no snapshot, got {other:?}"),
    }
}

/// The timeout of a running task carries the task as it is at the timeout,
/// read in full: running, with its worker and lease.
pub async fn a_timeout_carries_the_last_snapshot_of_the_task<E: PgExecutor>(store: &Store<E>) {
    let task = store.submit(NewTask::new("w.long", json!({"n": 7})).queue("w12")).await.expect("submit");
    assert_eq!(claim_one(store, "w12", "wk").await, task.id);
    store.progress(&Lease::new(&task.id, "wk"), Some(0.5), Some("halfway")).await.expect("progress");
    let err = store.wait(&task.id, Duration::from_millis(300)).await.expect_err("still running");
    let last = err.last_snapshot().expect("a snapshot");
    assert_eq!((last.id.as_str(), last.status), (task.id.as_str(), TaskStatus::Running));
    assert_eq!(last.worker_id.as_deref(), Some("wk"));
    assert!(last.lease_until_ms.is_some(), "a running row holds its lease");
    assert_eq!((last.progress, last.message.as_deref()), (Some(0.5), Some("halfway")), "the full row");
    assert_eq!(last.payload, json!({"n": 7}));
    let shown = err.to_string();
    assert!(shown.contains("last seen running") && shown.contains(&task.id), "{shown}");

    let err = store.wait_by_key("w12:none", Duration::from_millis(1)).await.expect_err("no such key");
    assert!(err.last_snapshot().is_none(), "{err:?}");
}
