//! A lease is one run: a write of one claim, resent after its answer was
//! lost, never lands on a later claim of the same task, also when that
//! claim is made under the same worker id (the claim's identity is fenced,
//! not the attempt, which a release gives back). Each test cuts the
//! answer of a release after it committed (the proxy), holds the resend
//! (a tap on the executor) until the task has been claimed again under the
//! same worker id, then lets it go: the second run keeps its task, and no
//! two runs overlap.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::watch;
use waymark_pool::PgPool;
use waymark_store::{NewTask, Store, TaskStatus};
use waymark_tests::fault_executor::{tapped, Tap, Tapped};
use waymark_tests::proxy::{proxy_for, store_behind, AnswerCuttingProxy};
use waymark_tests::{eventually, pool_store, test_worker, until_status, TestSchema, TestWorker};
use waymark_worker::{TaskError, WorkerEvent};

/// A piece of `release.sql` that no other statement holds: the proxy cuts
/// the answer of the first message that carries it, and the tap holds
/// every later run of it.
const RELEASE: &str = "greatest(t.attempt - 1";

/// How the first run gives its task back.
#[derive(Clone, Copy, Debug)]
enum FirstRun {
    /// `ctx.snooze(0)`, whose answer is lost: the worker makes the same
    /// settlement again when the run ends.
    SnoozeInHandler,
    /// `Err(TaskError::snooze(0))`: the worker's settlement, whose answer
    /// is lost, is tried again (`settle_again`).
    SnoozeReturned,
    /// The handler obeys shutdown: the worker's give-back, whose answer is
    /// lost, is tried again.
    GiveBackAtShutdown,
}

/// Runs counted by the handler: how many began, how many at once at most.
#[derive(Default)]
struct Runs {
    started: AtomicUsize,
    active: AtomicUsize,
    most_at_once: AtomicUsize,
}

impl Runs {
    fn begin(&self) -> usize {
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_at_once.fetch_max(now, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn end(&self) {
        self.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A store through the answer-cutting proxy, without the pool's own
/// retries (the worker's resend is what is tested), with a tap that holds
/// every release after the first until `go` is told.
async fn cut_and_held(
    schema: &TestSchema,
    go: watch::Receiver<bool>,
    answered: Arc<watch::Sender<usize>>,
) -> (AnswerCuttingProxy, Arc<Store<Tapped<PgPool>>>) {
    let proxy = proxy_for(&schema.url).await;
    let plain = store_behind(&proxy, schema).await;
    let releases = Arc::new(AtomicUsize::new(0));
    let store = tapped(&plain, move |sql, tap, _run| {
        if !sql.contains(RELEASE) {
            return None;
        }
        let (mut go, answered) = (go.clone(), answered.clone());
        match tap {
            Tap::Before if releases.fetch_add(1, Ordering::SeqCst) >= 1 => Some(Box::pin(async move {
                let _ = go.wait_for(|go| *go).await;
            })),
            Tap::After => {
                answered.send_modify(|n| *n += 1);
                None
            }
            Tap::Before => None,
        }
    });
    (proxy, Arc::new(store))
}

async fn a_resend_never_lands_on_a_later_claim(first: FirstRun) {
    let schema = TestSchema::new().await;
    let (go_tx, go_rx) = watch::channel(false);
    let answered = Arc::new(watch::channel(0).0);
    let (proxy, cut) = cut_and_held(&schema, go_rx, answered.clone()).await;
    let plain = pool_store(&schema).await;
    // The same executor type as the first worker's, so one handler serves
    // both: a tap that holds nothing.
    let direct = Arc::new(tapped(&plain, |_, _, _| None));
    let id = direct.submit(NewTask::new("once", json!({}))).await.expect("submit").id;

    let runs = Arc::new(Runs::default());
    let (finish_tx, finish) = watch::channel(false);
    // Both workers under one id: the second stands for the same worker's
    // next claim (a later claim of this worker, or the same configured id
    // started again beside it in a rolling deploy).
    let handler = |runs: Arc<Runs>, finish: watch::Receiver<bool>, first: Option<FirstRun>| {
        move |ctx: waymark_worker::TaskContext<Tapped<PgPool>>, _p: serde_json::Value| {
            let (runs, finish) = (runs.clone(), finish.clone());
            async move {
                let n = runs.begin();
                let out = match (n, first) {
                    (1, Some(FirstRun::SnoozeInHandler)) => {
                        let lost = ctx.snooze(Duration::ZERO).await;
                        assert!(lost.is_err(), "the snooze's answer is cut");
                        Err(TaskError::new("the snooze's answer was lost"))
                    }
                    (1, Some(FirstRun::SnoozeReturned)) => Err(TaskError::snooze(Duration::ZERO)),
                    (1, Some(FirstRun::GiveBackAtShutdown)) => {
                        ctx.cancelled().await;
                        Err(TaskError::new("stopped"))
                    }
                    _ => {
                        let mut finish = finish;
                        let _ = finish.wait_for(|go| *go).await;
                        Ok(json!({"run": n}))
                    }
                };
                runs.end();
                out
            }
        }
    };
    proxy.arm(RELEASE);
    let (first_worker, mut first_events) = test_worker(&cut, "default")
        .worker_id("w")
        .concurrency(1)
        .shutdown_grace(Duration::from_millis(50))
        .task("once", handler(runs.clone(), finish.clone(), Some(first)))
        .start_with_events();
    if matches!(first, FirstRun::GiveBackAtShutdown) {
        eventually(Duration::from_secs(10), "the first run started", || async {
            runs.started.load(Ordering::SeqCst) == 1
        })
        .await;
        first_worker.shutdown();
    }
    eventually(Duration::from_secs(10), "the release's answer cut", || async { proxy.cuts() == 1 }).await;

    let second_worker = test_worker(&direct, "default")
        .worker_id("w")
        .concurrency(1)
        .task("once", handler(runs.clone(), finish.clone(), None))
        .start();
    eventually(Duration::from_secs(10), "the task claimed again", || async {
        runs.started.load(Ordering::SeqCst) >= 2
    })
    .await;
    // The resend goes now (the first release's answer was the first), unless
    // the first worker knew already that its run was over (it lost the
    // lease, or claimed the task again itself, which displaced the old run):
    // then it sends none.
    go_tx.send_replace(true);
    let mut releases = answered.subscribe();
    let known_over = async {
        let mut claims = 0;
        while let Ok(event) = first_events.recv().await {
            match event {
                WorkerEvent::LeaseLost { .. } => break,
                WorkerEvent::Claimed { .. } if claims == 1 => break,
                WorkerEvent::Claimed { .. } => claims += 1,
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        tokio::select! {
            _ = releases.wait_for(|n| *n >= 2) => {}
            () = known_over => {}
        }
    })
    .await
    .expect("the release resent, or the first run known over");
    let row = direct.fetch(&id).await.expect("fetch");
    assert_eq!(row.status, TaskStatus::Running, "{first:?}: the resend gave the second claim back: {row:?}");

    finish_tx.send_replace(true);
    until_status(Duration::from_secs(10), "the task succeeded", &direct, &id, TaskStatus::Succeeded).await;
    // Whatever ran after the row was checked: each run began once, alone.
    assert_eq!(runs.started.load(Ordering::SeqCst), 2, "{first:?}: two runs in all");
    assert_eq!(runs.most_at_once.load(Ordering::SeqCst), 1, "{first:?}: no two runs at once");
    second_worker.shutdown();
    first_worker.stop().await;
    second_worker.stop().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snooze_resent_after_a_lost_answer_never_gives_back_a_later_claim() {
    a_resend_never_lands_on_a_later_claim(FirstRun::SnoozeInHandler).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_tried_again_never_gives_back_a_later_claim() {
    a_resend_never_lands_on_a_later_claim(FirstRun::SnoozeReturned).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_at_shutdown_tried_again_never_gives_back_a_later_claim() {
    a_resend_never_lands_on_a_later_claim(FirstRun::GiveBackAtShutdown).await;
}
