//! The worker's handler kinds and limits on a real PostgreSQL: a resource
//! shared by two handlers, a handler's own `max_running`, batch handlers
//! (their results, their own settlements, one lease lost), blocking
//! handlers, `ctx.canceled()` reading the row, and typed definitions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::{NewTask, Store, TaskDef, TaskStatus};
use waymark_tests::{eventually, pool_store, test_worker, until_status, Running, TestSchema, TestWorker};
use waymark_worker::{CancelReason, HandlerOptions, TaskError, Worker};

type S = Arc<Store<PgPool>>;

/// Calls in flight of one kind, and the most seen at once.
#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl InFlight {
    fn enter(&self) -> impl Drop + '_ {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        struct Leave<'a>(&'a AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        Leave(&self.now)
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

/// Samples the table every 10 ms until stopped: the most rows of `names`
/// seen running at once.
fn sample_running(
    schema: &TestSchema,
    names: &[&str],
) -> (Arc<std::sync::atomic::AtomicBool>, tokio::task::JoinHandle<i64>) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (url, sql) = (
        schema.url.clone(),
        format!(
            "select count(*) from \"{}\".cairnq_tasks where status = 'running' and name = any($1)",
            schema.schema
        ),
    );
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let flag = stop.clone();
    let sampler = tokio::spawn(async move {
        let admin = waymark_tests::db::admin_client(&url).await;
        let mut most = 0;
        while !flag.load(Ordering::SeqCst) {
            let n: i64 = admin.query_one(&sql, &[&names]).await.expect("sample").get(0);
            most = most.max(n);
            // Real time: the sampling period is what is asked for.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        most
    });
    (stop, sampler)
}

async fn all_succeeded(store: &S, queue: &str, n: i64) {
    eventually(Duration::from_secs(60), "every task succeeded", || async {
        store.stats(Some(queue)).await.expect("stats")[queue].succeeded == n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_of_one_shared_by_two_handlers_never_runs_two_at_once() {
    let schema = TestSchema::new().await;
    let store: S = Arc::new(pool_store(&schema).await);
    let (gpu, free) = (Arc::new(InFlight::default()), Arc::new(InFlight::default()));
    let gpu_handler = |gpu: Arc<InFlight>| {
        move |_ctx, _p: serde_json::Value| {
            let gpu = gpu.clone();
            async move {
                let _in = gpu.enter();
                // Real time: each call holds the resource a while.
                tokio::time::sleep(Duration::from_millis(15)).await;
                Ok(())
            }
        }
    };
    let on_gpu = || HandlerOptions::new().resource("gpu");
    let free_calls = free.clone();
    let w = test_worker(&store, "res")
        .concurrency(8)
        .resource("gpu", 1)
        .task_with("gpu.a", on_gpu(), gpu_handler(gpu.clone()))
        .task_with("gpu.b", on_gpu(), gpu_handler(gpu.clone()))
        .task("free", move |_ctx, _p: serde_json::Value| {
            let free = free_calls.clone();
            async move {
                let _in = free.enter();
                // Real time: long enough that free calls overlap.
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(())
            }
        });
    let mut tasks = Vec::new();
    for i in 0..40 {
        let name = ["gpu.a", "gpu.b", "free", "gpu.a"][i % 4];
        tasks.push(NewTask::new(name, json!({})).queue("res"));
    }
    store.submit_batch(tasks).await.expect("submit");
    let (stop, sampler) = sample_running(&schema, &["gpu.a", "gpu.b"]);
    let worker = w.start();
    all_succeeded(&store, "res", 40).await;
    stop.store(true, Ordering::SeqCst);
    let most_rows = sampler.await.expect("sampler");
    assert_eq!(gpu.most(), 1, "the two gpu handlers never ran at once");
    assert!(most_rows <= 1, "never two gpu tasks running in the table: {most_rows}");
    assert!(free.most() > 1, "the free handler was not held back: {}", free.most());
    worker.stop().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_max_running_bounds_its_calls_and_bad_limits_are_refused() {
    let schema = TestSchema::new().await;
    let store: S = Arc::new(pool_store(&schema).await);
    let seen = Arc::new(InFlight::default());
    let calls = seen.clone();
    let w = test_worker(&store, "two").concurrency(8).task_with(
        "two",
        HandlerOptions::new().max_running(2),
        move |_ctx, _p: serde_json::Value| {
            let calls = calls.clone();
            async move {
                let _in = calls.enter();
                // Real time: long enough that a third call could overlap.
                tokio::time::sleep(Duration::from_millis(30)).await;
                Ok(())
            }
        },
    );
    store.submit_batch((0..12).map(|_| NewTask::new("two", json!({})).queue("two"))).await.expect("submit");
    let (stop, sampler) = sample_running(&schema, &["two"]);
    let worker = w.start();
    all_succeeded(&store, "two", 12).await;
    stop.store(true, Ordering::SeqCst);
    assert!(sampler.await.expect("sampler") <= 2);
    assert_eq!(seen.most(), 2, "two at once, never more");
    worker.stop().await;

    let refused = |b: waymark_worker::WorkerBuilder<PgPool>| b.build().expect_err("refused").to_string();
    let noop = |_ctx, _p: serde_json::Value| async move { Ok(()) };
    let e =
        refused(Worker::builder(store.clone()).task_with("x", HandlerOptions::new().resource("gpu"), noop));
    assert!(
        e.contains("names resource \"gpu\", which WorkerBuilder::resource did not declare (declared: none)"),
        "{e}"
    );
    let e =
        refused(Worker::builder(store.clone()).task_with("x", HandlerOptions::new().max_running(0), noop));
    assert!(e.contains("max_running of handler \"x\" must be at least 1"), "{e}");
    let e = refused(Worker::builder(store.clone()).resource("gpu", 0).task("x", noop));
    assert!(e.contains("resource \"gpu\" needs a non-empty name and a capacity of at least 1"), "{e}");
    let e = refused(Worker::builder(store.clone()).batch_task(
        "x",
        0,
        |_items: Vec<waymark_worker::BatchItem<PgPool, serde_json::Value>>| async move {
            Ok(HashMap::<String, ()>::new())
        },
    ));
    assert!(e.contains("batch size of handler \"x\" must be 1 to 10000, got 0"), "{e}");
    schema.drop().await;
}

#[derive(Debug, Deserialize)]
struct Num {
    n: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_handler_settles_by_its_results_its_own_settlements_and_its_error() {
    let schema = TestSchema::new().await;
    let store: S = Arc::new(pool_store(&schema).await);
    let sizes = Arc::new(Mutex::new(Vec::new()));
    let seen = sizes.clone();
    let w = test_worker(&store, "batch")
        .concurrency(2)
        .batch_task("double", 5, move |items: Vec<waymark_worker::BatchItem<PgPool, Num>>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(items.len());
                let mut results = HashMap::new();
                for item in items {
                    match item.payload.n {
                        // Settled by the handler itself, for good.
                        13 => {
                            let failed = item.ctx.fail(TaskError::permanent("unlucky")).await.expect("fail");
                            assert_eq!(failed.expect("settled now").status, TaskStatus::Failed);
                            let again = item.ctx.complete(0).await.expect("a second settlement");
                            assert!(again.is_none(), "is a no-op");
                        }
                        // Not named: succeeds with a null result.
                        7 => {}
                        n => drop(results.insert(item.ctx.id().to_owned(), n * 2)),
                    }
                }
                Ok(results)
            }
        })
        .batch_task("all.fail", 4, |_items: Vec<waymark_worker::BatchItem<PgPool, Num>>| async move {
            Err::<HashMap<String, i64>, _>(TaskError::permanent("the whole batch failed"))
        });
    let mut ids = HashMap::new();
    for n in 0..14 {
        ids.insert(
            n,
            store.submit(NewTask::new("double", json!({ "n": n })).queue("batch")).await.expect("submit").id,
        );
    }
    let bad = store
        .submit(NewTask::new("double", json!({"n": "not a number"})).queue("batch"))
        .await
        .expect("submit");
    let mut failing = Vec::new();
    for n in 0..3 {
        failing.push(
            store
                .submit(NewTask::new("all.fail", json!({ "n": n })).queue("batch"))
                .await
                .expect("submit")
                .id,
        );
    }
    let worker = w.start();
    for id in ids.values().chain(&failing).chain([&bad.id]) {
        store.wait(id, Duration::from_secs(30)).await.expect("ends");
    }
    for (n, id) in &ids {
        let t = store.fetch(id).await.expect("fetch");
        match n {
            13 => {
                assert_eq!(t.status, TaskStatus::Failed);
                assert_eq!(t.error_envelope().expect("envelope").message, "unlucky");
                assert_eq!(t.attempt, 1, "settled once, by the handler");
            }
            7 => assert_eq!((t.status, t.result), (TaskStatus::Succeeded, Some(json!(null)))),
            n => assert_eq!((t.status, t.result), (TaskStatus::Succeeded, Some(json!(n * 2)))),
        }
    }
    let t = store.fetch(&bad.id).await.expect("fetch");
    assert_eq!(t.status, TaskStatus::Failed);
    assert_eq!(t.error_envelope().expect("envelope").kind, "InvalidPayload", "fails alone");
    for id in &failing {
        let t = store.fetch(id).await.expect("fetch");
        assert_eq!(t.status, TaskStatus::Failed);
        assert_eq!(t.error_envelope().expect("envelope").message, "the whole batch failed");
    }
    let sizes = sizes.lock().unwrap().clone();
    assert!(sizes.iter().all(|&s| (1..=5).contains(&s)), "batches of at most 5: {sizes:?}");
    assert!(sizes.iter().any(|&s| s > 1), "tasks came in batches: {sizes:?}");
    assert_eq!(sizes.iter().sum::<usize>(), 14, "every good payload reached the handler once");
    worker.stop().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_lease_is_lost_for_one_task_settles_the_others_only() {
    let schema = TestSchema::new().await;
    let store: S = Arc::new(pool_store(&schema).await);
    // The task whose lease the test takes, named once it is taken.
    let (victim, pick) = tokio::sync::watch::channel(None::<String>);
    let reasons = Arc::new(Mutex::new(Vec::new()));
    let heard = reasons.clone();
    let w = test_worker(&store, "lost")
        .beating_lease(Duration::from_secs(2))
        // No poll of this worker's may recover the lease the test expires.
        .no_poll()
        .batch_task("hold", 4, move |items: Vec<waymark_worker::BatchItem<PgPool, serde_json::Value>>| {
            let (mut pick, heard) = (pick.clone(), heard.clone());
            async move {
                let victim = pick.wait_for(Option::is_some).await.expect("the test names the victim").clone();
                let victim = victim.expect("named");
                let item = items.iter().find(|i| i.ctx.id() == victim).expect("the victim is in the batch");
                let reason = item.ctx.cancelled().await;
                // A run whose lease is gone submits no children.
                let child = item.ctx.submit(NewTask::new("child", json!({})).queue("lost")).await;
                assert!(child.is_err_and(|e| e.is_lost_lease()));
                heard.lock().unwrap().push(reason);
                Ok(items.iter().map(|i| (i.ctx.id().to_owned(), "done")).collect())
            }
        });
    let ids = store
        .submit_batch((0..4).map(|i| NewTask::new("hold", json!({ "i": i })).queue("lost")))
        .await
        .expect("submit");
    let worker = w.start();
    eventually(Duration::from_secs(20), "the batch claimed", || async {
        store.stats(Some("lost")).await.expect("stats")["lost"].running == 4
    })
    .await;
    // Another worker takes one task of the batch once its lease is gone.
    schema.steal_lease(&ids[0], "thief").await;
    victim.send_replace(Some(ids[0].clone()));
    for id in &ids[1..] {
        let t = store.wait(id, Duration::from_secs(20)).await.expect("the others settle");
        assert_eq!((t.status, t.result), (TaskStatus::Succeeded, Some(json!("done"))));
    }
    assert_eq!(
        *reasons.lock().unwrap(),
        vec![CancelReason::LeaseLost],
        "the victim's token said so, and its child submit was refused"
    );
    assert_eq!(store.stats(Some("lost")).await.expect("stats")["lost"].queued, 0, "no child");
    let t = store.fetch(&ids[0]).await.expect("fetch");
    assert_eq!(
        (t.status, t.worker_id.as_deref()),
        (TaskStatus::Running, Some("thief")),
        "its settlement was dropped"
    );
    worker.stop().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_handlers_run_off_the_async_threads_with_leases_cancellation_and_settlement() {
    let schema = TestSchema::new().await;
    let store: S = Arc::new(pool_store(&schema).await);
    // The sleepers hold their threads until the gate opens (30 s at most).
    let gate = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (entered, slept) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (open, came, woke) = (gate.clone(), entered.clone(), slept.clone());
    // A failed assertion opens the gate too, or the sleepers would hold
    // the runtime's shutdown for their 30 s.
    struct OpenOnDrop(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for OpenOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let _open_on_drop = OpenOnDrop(gate.clone());
    let worker = test_worker(&store, "cpu")
        .concurrency(6)
        .heartbeat_interval(Duration::from_millis(100))
        .retry_backoff(Duration::from_millis(1), Duration::from_millis(1))
        .blocking_task("cpu.sleep", move |ctx, p: Num| {
            // Blocking code: it holds its thread, never an async one.
            came.fetch_add(1, Ordering::SeqCst);
            let until = Instant::now() + Duration::from_secs(30);
            while !open.load(Ordering::SeqCst) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
            woke.fetch_add(1, Ordering::SeqCst);
            tokio::runtime::Handle::current()
                .block_on(ctx.progress(Some(1.0), Some("slept")))
                .map_err(TaskError::from)?;
            Ok(p.n + 1)
        })
        .blocking_task("cpu.until_cancelled", |ctx, _p: serde_json::Value| {
            while !ctx.is_cancelled() {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err::<(), _>(TaskError::new("stopped"))
        })
        .blocking_task("cpu.panics", |_ctx, _p: serde_json::Value| -> Result<(), TaskError> {
            panic!("boom")
        })
        .task("ping", |_ctx, _p: serde_json::Value| async move { Ok("pong") })
        .start();
    let sleepers = store
        .submit_batch((0..4).map(|n| NewTask::new("cpu.sleep", json!({ "n": n })).queue("cpu")))
        .await
        .expect("submit");
    eventually(Duration::from_secs(20), "the sleepers running", || async {
        entered.load(Ordering::SeqCst) == 4
    })
    .await;
    // Four threads block; the runtime's two async threads are free, so the
    // ping runs while every sleeper still holds its thread.
    let ping = store
        .call(NewTask::new("ping", json!({})).queue("cpu"), Duration::from_secs(20))
        .await
        .expect("ping");
    assert_eq!(ping.result, Some(json!("pong")));
    assert_eq!(slept.load(Ordering::SeqCst), 0, "async work went on while the blocking handlers held on");
    gate.store(true, Ordering::SeqCst);
    for (n, id) in sleepers.iter().enumerate() {
        let t = store.wait(id, Duration::from_secs(20)).await.expect("done");
        assert_eq!((t.status, t.result), (TaskStatus::Succeeded, Some(json!(n as i64 + 1))));
        assert_eq!(t.message.as_deref(), Some("slept"));
    }
    let long =
        store.submit(NewTask::new("cpu.until_cancelled", json!({})).queue("cpu")).await.expect("submit");
    until_status(Duration::from_secs(20), "it runs", &store, &long.id, TaskStatus::Running).await;
    store.cancel(&long.id).await.expect("cancel");
    let t = store.wait(&long.id, Duration::from_secs(20)).await.expect("ends");
    assert_eq!(t.status, TaskStatus::Canceled, "the heartbeat's cancel reached blocking code");
    let p = store
        .submit(NewTask::new("cpu.panics", json!({})).queue("cpu").max_attempts(1))
        .await
        .expect("submit");
    let t = store.wait(&p.id, Duration::from_secs(20)).await.expect("ends");
    assert_eq!(t.status, TaskStatus::Failed);
    let envelope = t.error_envelope().expect("envelope");
    assert_eq!(
        (envelope.code.as_str(), envelope.message.as_str()),
        ("handler_error", "the handler panicked: boom")
    );
    worker.stop().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canceled_reads_the_row_rather_than_waiting_for_the_next_heartbeat() {
    let schema = TestSchema::new().await;
    let store: S = Arc::new(pool_store(&schema).await);
    let (go_tx, go_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let go = Arc::new(tokio::sync::Mutex::new(go_rx));
    // The handler's first read done: the cancel must come after it (a
    // running row says only that the task was claimed).
    let (read_tx, mut read_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    // (before the cancel, after it, the token's reason then)
    type Seen = Option<(bool, bool, Option<CancelReason>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let saw = seen.clone();
    let worker = test_worker(&store, "ask")
        // The next heartbeat is a minute away: only a read can tell.
        .lease(Duration::from_secs(180))
        .task("ask", move |ctx, _p: serde_json::Value| {
            let (go, saw, read) = (go.clone(), saw.clone(), read_tx.clone());
            async move {
                let before = ctx.canceled().await?;
                let _ = read.send(());
                go.lock().await.recv().await;
                let after = ctx.canceled().await?;
                *saw.lock().unwrap() = Some((before, after, ctx.cancel_reason()));
                Ok(())
            }
        })
        .start();
    let t = store.submit(NewTask::new("ask", json!({})).queue("ask")).await.expect("submit");
    tokio::time::timeout(Duration::from_secs(20), read_rx.recv())
        .await
        .expect("the handler reads the row within 20 s")
        .expect("the handler is alive");
    store.cancel(&t.id).await.expect("cancel");
    go_tx.send(()).expect("go");
    let done = store.wait(&t.id, Duration::from_secs(20)).await.expect("ends");
    assert_eq!(
        *seen.lock().unwrap(),
        Some((false, true, Some(CancelReason::Requested))),
        "not canceled, then canceled by the read, which fired the token"
    );
    // A cancel requested wins the settlement.
    assert_eq!(done.status, TaskStatus::Canceled);
    worker.stop().await;
    schema.drop().await;
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Order {
    id: u32,
    qty: u32,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Receipt {
    total: u32,
}

const PRICE: TaskDef<Order, Receipt> = TaskDef::new("order.price");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_definition_binds_the_submit_and_the_handler() {
    let schema = TestSchema::new().await;
    let store: S = Arc::new(pool_store(&schema).await);
    let w = test_worker(&store, "typed")
        .task(PRICE, |_ctx, order: Order| async move { Ok(Receipt { total: order.qty * 3 }) })
        .build()
        .expect("worker");
    assert_eq!(w.task_names(), vec!["order.price".to_owned()]);
    let worker = Running::spawn(w);
    let receipt = store
        .call_as(
            &PRICE,
            PRICE.task(&Order { id: 1, qty: 7 }).expect("task").queue("typed"),
            Duration::from_secs(20),
        )
        .await
        .expect("call");
    assert_eq!(receipt, Receipt { total: 21 });
    let e = store
        .call_as(&PRICE, NewTask::new("other", json!({})), Duration::from_secs(1))
        .await
        .expect_err("another name");
    assert!(e.to_string().contains("call_as(\"order.price\") was given a task named \"other\""), "{e}");
    worker.stop().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_closure_past_its_time_limit_keeps_its_resource_until_it_returns() {
    let schema = TestSchema::new().await;
    let store: S = Arc::new(pool_store(&schema).await);
    let gpu = Arc::new(InFlight::default());
    let calls = gpu.clone();
    let w = test_worker(&store, "slow")
        .concurrency(4)
        .resource("gpu", 1)
        .max_run_time(Duration::from_millis(100))
        .retry_backoff(Duration::from_millis(1), Duration::from_millis(1))
        .blocking_task_with(
            "slow.gpu",
            HandlerOptions::new().resource("gpu"),
            move |_ctx, _p: serde_json::Value| {
                let _in = calls.enter();
                // Real time: the closure runs on well past the run's limit.
                std::thread::sleep(Duration::from_millis(400));
                Ok(())
            },
        );
    let ids = store
        .submit_batch((0..3).map(|_| NewTask::new("slow.gpu", json!({})).queue("slow").max_attempts(1)))
        .await
        .expect("submit");
    let worker = w.start();
    for id in &ids {
        let t = store.wait(id, Duration::from_secs(30)).await.expect("ends");
        assert_eq!(t.status, TaskStatus::Failed);
        assert_eq!(t.error_envelope().expect("envelope").code, "handler_timeout");
    }
    assert_eq!(gpu.most(), 1, "a timed-out closure still held the resource until it returned");
    worker.stop().await;
    schema.drop().await;
}

/// A run past its time limit fires its token: a blocking closure, which
/// cannot be dropped, hears it and can stop (the task is failed and may be
/// claimed again meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_its_time_limit_fires_its_token_for_a_blocking_closure() {
    let schema = TestSchema::new().await;
    let store: S = Arc::new(pool_store(&schema).await);
    let (heard_tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let w = test_worker(&store, "timed-token").max_run_time(Duration::from_millis(200)).blocking_task(
        "timed.token",
        move |ctx, _p: serde_json::Value| {
            // Real time: waits for the token, 20 s at most.
            let started = std::time::Instant::now();
            while !ctx.is_cancelled() && started.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = heard_tx.send(ctx.cancel_reason());
            Ok(())
        },
    );
    let id = store
        .submit(NewTask::new("timed.token", json!({})).queue("timed-token").max_attempts(1))
        .await
        .expect("submit")
        .id;
    let worker = w.start();
    let reason =
        tokio::time::timeout(Duration::from_secs(30), heard.recv()).await.expect("the closure returns");
    assert_eq!(reason, Some(Some(CancelReason::TimedOut)));
    let t = store.wait(&id, Duration::from_secs(30)).await.expect("ends");
    assert_eq!(t.error_envelope().expect("envelope").code, "handler_timeout");
    worker.stop().await;
    schema.drop().await;
}

/// A handler's own settlement whose write never answers (here: the run is
/// stopped by its time limit while the write waits) is still the one the
/// worker makes, not the end the run's stop maps to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_own_settlement_cut_short_is_made_by_the_worker() {
    use waymark_store::protocol::Statement;
    let schema = TestSchema::new().await;
    let plain = pool_store(&schema).await;
    // The first `fail` waits a while before it runs.
    let (store, _answered) = waymark_tests::fault_executor::hooked(&plain, Statement::Fail, 1, async {
        // Real time: longer than the run's limit below.
        tokio::time::sleep(Duration::from_millis(600)).await;
    });
    let store = Arc::new(store);
    let w = test_worker(&store, "own").max_run_time(Duration::from_millis(150)).task(
        "own",
        |ctx, _p: serde_json::Value| async move {
            ctx.fail(TaskError::permanent("the handler's own verdict")).await?;
            Ok(())
        },
    );
    let t = plain.submit(NewTask::new("own", json!({})).queue("own")).await.expect("submit");
    let worker = w.start();
    let done = plain.wait(&t.id, Duration::from_secs(20)).await.expect("ends");
    assert_eq!(done.status, TaskStatus::Failed);
    let envelope = done.error_envelope().expect("envelope");
    assert_eq!(envelope.message, "the handler's own verdict", "not handler_timeout: {envelope:?}");
    assert_eq!(done.attempt, 1);
    worker.stop().await;
    schema.drop().await;
}

/// A worker whose only handler takes batches drains a backlog without
/// waiting for its polls: it claims nothing ahead of its free slots (a
/// batch's call is never claimed ahead), so it must count no room for
/// that either, or every claim would come back short of what it asked for
/// and the worker would wait for a signal with work still due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_only_worker_drains_a_backlog_without_its_polls() {
    batch_backlog_drains_without_polls(false).await;
}

/// The same with a plain handler beside it, which has nothing due: the
/// room ahead its draw could fill stays empty, and that must not make the
/// batch draw's full answers look short, nor take the batch draw's slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_backlog_beside_an_idle_plain_handler_drains_without_its_polls() {
    batch_backlog_drains_without_polls(true).await;
}

async fn batch_backlog_drains_without_polls(with_plain: bool) {
    let schema = TestSchema::new().await;
    let store: S = Arc::new(pool_store(&schema).await);
    store
        .submit_batch((0..200).map(|n| NewTask::new("fast.batch", json!({ "n": n })).queue("backlog")))
        .await
        .expect("submit");
    let mut builder = test_worker(&store, "backlog")
        .concurrency(2)
        // No poll within the test's time: only claims that follow claims.
        .no_poll()
        .batch_task("fast.batch", 5, |items: Vec<waymark_worker::BatchItem<PgPool, Num>>| async move {
            Ok(items.into_iter().map(|i| (i.ctx.id().to_owned(), i.payload.n)).collect::<HashMap<_, _>>())
        });
    if with_plain {
        builder = builder.task("idle.plain", |_ctx, _p: serde_json::Value| async move { Ok(()) });
    }
    let worker = builder.start();
    let s = store.clone();
    eventually(Duration::from_secs(20), "all 200 tasks settled without a poll", || {
        let s = s.clone();
        async move { s.stats(None).await.expect("stats")["backlog"].succeeded == 200 }
    })
    .await;
    worker.stop().await;
    schema.drop().await;
}

/// A batch task queued while a claim holds every free slot is claimed
/// without waiting for a poll. The claim its signal sends beside the first
/// has no free slot to draw a batch for (only room ahead, which a batch
/// never takes), so it must not count as having answered that signal; the
/// next claim with slots does. (A plain handler beside the batch one, its
/// calls known to be short, and no more slots than a claim asks for.)
///
/// The notification channel is the database's, so other tests' submits
/// reach this worker too, and a watch that lags behind them says "poll":
/// the claim beside the held one may then probe first and, finding
/// nothing for its plain handlers, stop there. Either statement shows it
/// went out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_task_queued_while_a_claim_holds_every_slot_is_claimed_without_a_poll() {
    use std::sync::atomic::AtomicBool;
    use tokio::sync::{Notify, Semaphore};
    use waymark_store::protocol::Statement;
    use waymark_tests::fault_executor::{sql_of, tapped, Tap};

    // A queue of its own: other tests' submits to theirs wake no claim.
    const QUEUE: &str = "held-claim";
    let schema = TestSchema::new().await;
    let plain = pool_store(&schema).await;
    let (batch_sql, plain_sql) =
        (sql_of(Statement::ClaimOneQueueOneName, &[]), sql_of(Statement::ClaimOneQueue, &["names"]));
    // The probe has no optional filter: one text.
    let probe_sql = sql_of(Statement::ClaimableProbe, &[]);
    let armed = Arc::new(AtomicBool::new(false));
    let late: Arc<Mutex<Option<String>>> = Arc::default();
    // Set before the late task is queued: its signal may send the second
    // claim before its submit has answered.
    let queuing = Arc::new(AtomicBool::new(false));
    let second_claim = Arc::new(Notify::new());
    let no_second = Arc::new(AtomicBool::new(false));
    // Claim statements answered so far.
    let (claims_answered, mut claim_answers) = tokio::sync::watch::channel(0_usize);
    let tap = {
        let (armed, late, queuing, second_claim, no_second, submitter) = (
            armed.clone(),
            late.clone(),
            queuing.clone(),
            second_claim.clone(),
            no_second.clone(),
            plain.clone(),
        );
        move |sql: &str, at: Tap, _run: u64| -> Option<waymark_tests::fault_executor::Hook> {
            let opens_a_draw = sql == plain_sql || sql == probe_sql;
            if at == Tap::After && (opens_a_draw || sql == batch_sql) {
                claims_answered.send_modify(|n| *n += 1);
            }
            if at == Tap::Before && opens_a_draw && queuing.load(Ordering::SeqCst) {
                // A claim's plain draw (or its probe) beside the held one:
                // it went out.
                second_claim.notify_one();
                return None;
            }
            if at != Tap::After || sql != batch_sql || !armed.swap(false, Ordering::SeqCst) {
                return None;
            }
            // The first claim has drawn for the batch handler: queue a
            // batch task it cannot see, and hold the claim until the
            // task's signal has sent another.
            let (late, queuing, second_claim, no_second, submitter) =
                (late.clone(), queuing.clone(), second_claim.clone(), no_second.clone(), submitter.clone());
            Some(Box::pin(async move {
                queuing.store(true, Ordering::SeqCst);
                let task =
                    submitter.submit(NewTask::new("b", json!({})).queue(QUEUE)).await.expect("submit late");
                *late.lock().expect("late") = Some(task.id);
                let sent = tokio::time::timeout(Duration::from_secs(5), second_claim.notified()).await;
                no_second.store(sent.is_err(), Ordering::SeqCst);
            }))
        }
    };
    let store = Arc::new(tapped(&plain, tap));
    // The batch handler's calls end once the late task is claimed, so no
    // freed slot sends a claim that would find it anyway.
    let release = Arc::new(Semaphore::new(0));
    let held = release.clone();
    let (worker, mut events) = test_worker(&store, QUEUE)
        // As many slots as a claim asks for at least (so the first takes
        // them all), and room ahead once a call is known to take under 5 ms.
        .concurrency(16)
        // No poll comes to the rescue within the test's time.
        .no_poll()
        .task("p1", |_ctx, _p: serde_json::Value| async move { Ok(()) })
        .task("p2", |_ctx, _p: serde_json::Value| async move { Ok(()) })
        .batch_task("b", 2, move |items: Vec<waymark_worker::BatchItem<_, serde_json::Value>>| {
            let held = held.clone();
            async move {
                let _ = tokio::time::timeout(Duration::from_secs(10), held.acquire()).await;
                Ok(items.into_iter().map(|i| (i.ctx.id().to_owned(), ())).collect::<HashMap<_, _>>())
            }
        })
        .start_with_events();
    // Plain calls that end tell the worker its calls are short (an average
    // under 5 ms, a new call weighing an eighth), so it claims room ahead
    // of its slots.
    let warm = store
        .submit_batch((0..8).map(|i| NewTask::new("p1", json!({ "i": i })).queue(QUEUE)))
        .await
        .expect("submit");
    let mut unsettled: std::collections::HashSet<&str> = warm.iter().map(String::as_str).collect();
    tokio::time::timeout(Duration::from_secs(20), async {
        while !unsettled.is_empty() {
            if let waymark_worker::WorkerEvent::Settled { task_id, .. } = events.recv().await.expect("events")
            {
                unsettled.remove(task_id.as_str());
            }
        }
    })
    .await
    .expect("the plain tasks settle within 20 s");
    // Each ended call frees its slot and units just after its settlement,
    // and the claims that wakes must come and go before the test arms:
    // else a wakeup kept for later would claim the late task whatever the
    // fix. Nothing says "idle", so: no claim answered for 200 ms (real
    // time here is the quiet, not what is tested).
    tokio::time::timeout(Duration::from_secs(20), async {
        claim_answers.borrow_and_update();
        while tokio::time::timeout(Duration::from_millis(200), claim_answers.changed()).await.is_ok() {}
    })
    .await
    .expect("the worker goes quiet after the plain tasks within 20 s");
    for id in &warm {
        assert_eq!(store.fetch(id).await.expect("fetch").status, TaskStatus::Succeeded);
    }
    armed.store(true, Ordering::SeqCst);
    let first = store.submit(NewTask::new("b", json!({})).queue(QUEUE)).await.expect("submit").id;
    // Both batch tasks claimed (the event may come before the late task's
    // submit has answered, so it is told by its name).
    let claimed_late = tokio::time::timeout(Duration::from_secs(10), async {
        let mut batch_claims = 0;
        while batch_claims < 2 {
            if let waymark_worker::WorkerEvent::Claimed { name, .. } = events.recv().await.expect("events") {
                batch_claims += usize::from(name == "b");
            }
        }
    })
    .await;
    release.add_permits(16);
    assert!(!no_second.load(Ordering::SeqCst), "the late task's signal sent no second claim within 5 s");
    assert!(claimed_late.is_ok(), "the late batch task waited for a poll");
    let late = late.lock().expect("late").clone().expect("the late task was queued");
    for id in [&first, &late] {
        let done = store.wait(id, Duration::from_secs(20)).await.expect("the task ends");
        assert_eq!(done.status, TaskStatus::Succeeded);
    }
    worker.stop().await;
    schema.drop().await;
}
