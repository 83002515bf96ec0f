//! Waiting for results, run against any executor: with a listener the waits
//! are pushed, without one they poll; the answers must be the same.
//! `wait_contract!(make)` expands to one test per case, like `store_contract!`.

use std::time::{Duration, Instant};

use serde_json::json;
use waymark_store::{
    codes, ClaimRequest, Conflict, Error, Failure, NewTask, PgExecutor, Signal, Store, TaskStatus,
};

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

/// Claims the one task in `queue` as `worker`.
async fn claim_one<E: PgExecutor>(store: &Store<E>, queue: &str, worker: &str) -> String {
    let claimed =
        store.claim(&ClaimRequest::new(worker, [queue]).limit(1).lease_ms(30_000)).await.expect("claim");
    assert_eq!(claimed.len(), 1, "one task to claim in {queue}");
    claimed[0].id.clone()
}

pub async fn wait_returns_the_terminal_task_settled_elsewhere<E: PgExecutor + 'static>(store: &Store<E>)
where
    Store<E>: Clone,
{
    let task = store.submit(NewTask::new("w.echo", json!({"x": 1})).queue("w1")).await.expect("submit");
    let settler = store.clone();
    let id = task.id.clone();
    let settle = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let claimed = claim_one(&settler, "w1", "wk").await;
        assert_eq!(claimed, id);
        settler.complete(&id, "wk", json!({"y": 2})).await.expect("complete");
    });
    let done = store.wait(&task.id, Duration::from_secs(10)).await.expect("wait");
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
        Error::TaskTimeout { task_id, waited } => {
            assert_eq!(task_id, &task.id);
            assert!(*waited >= Duration::from_millis(300), "{waited:?}");
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
        loop {
            let claimed = worker
                .claim(&ClaimRequest::new("wk-fail", ["w3"]).limit(1).lease_ms(30_000))
                .await
                .expect("claim");
            if let Some(t) = claimed.first() {
                let envelope = json!({"type": "ValueError", "code": codes::TASK_ERROR, "message": "bad input", "retryable": false, "details": {}});
                worker.fail(&t.id, "wk-fail", &Failure::new(envelope).retryable(false)).await.expect("fail");
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
        loop {
            let queued = canceler
                .list(&waymark_store::ListFilter { queue: Some("w4".into()), limit: 1, ..Default::default() })
                .await
                .expect("list");
            if let Some(t) = queued.first() {
                canceler.cancel(&t.id).await.expect("cancel");
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let err = store.call(NewTask::new("w.canceled", json!({})).queue("w4"), Duration::from_secs(10)).await;
    cancel.await.expect("canceler");
    assert!(matches!(err, Err(Error::TaskCanceled { .. })), "{err:?}");
}

pub async fn wait_by_key_follows_the_key_to_its_current_task<E: PgExecutor + 'static>(store: &Store<E>)
where
    Store<E>: Clone,
{
    let first =
        store.submit(NewTask::new("w.keyed", json!({"v": 1})).queue("w5").key("w5:k")).await.expect("first");
    let other = store.clone();
    let replace = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
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
        other.complete(&second.id, "wk", json!("second")).await.expect("complete");
        second.id
    });
    // The first task ends canceled, but the key now names the second:
    // the wait follows the key until the task it names is terminal.
    let done = store.wait_by_key("w5:k", Duration::from_secs(10)).await.expect("wait_by_key");
    let second = replace.await.expect("replacer");
    assert_ne!(first.id, second);
    if done.id == second {
        assert_eq!(done.status, TaskStatus::Succeeded);
    } else {
        // The wait saw the first task canceled before the key moved on.
        assert_eq!((done.id.as_str(), done.status), (first.id.as_str(), TaskStatus::Canceled));
    }
    let err = store.wait_by_key("w5:none", Duration::from_secs(1)).await.expect_err("unknown key");
    assert!(err.is_not_found(), "{err:?}");
}

pub async fn watch_polls_on_its_timer_and_hears_queued_when_listening<E: PgExecutor>(store: &Store<E>) {
    let mut watch = store.watch(["w6"], Duration::from_millis(200));
    assert_eq!(watch.next().await, Signal::Poll, "the first answer is a read-now");
    let listening = store.is_listening();
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
