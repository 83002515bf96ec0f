//! Waiting for results through the built-in pool, whose LISTEN hub pushes
//! `cairnq_done`: the wait contract, the wakeup latency, a completion that
//! races the waiter's first read, and thousands of waiters on one listener.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::protocol::Statement;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::Lease;
use waymark_store::{ClaimRequest, NewTask, PgExecutor, Store, TaskStatus};
use waymark_tests::fault_executor::{counted, Answers, Tapped};
use waymark_tests::wait_kit::spawn_wait;
use waymark_tests::{eventually, pool_store, test_worker, TestDatabase, TestSchema, TestWorker};

waymark_tests::wait_contract!(waymark_tests::pool_store);

/// Starts the store's done listener with a first wait, and waits until it
/// is up (its first "may have missed").
async fn listening<E: PgExecutor>(store: &Store<E>) {
    let first = store.wait("task_none", Duration::from_millis(1)).await;
    assert!(first.is_err_and(|e| e.is_not_found()), "a wait on no task");
    eventually(Duration::from_secs(10), "the listener up", || async { store.is_listening() }).await;
    // Live means the hub listens and its self-probe came back.
}

/// A store on `store`'s executor that counts its waits' reads of a task's
/// status: a test commits once a waiter has read the row, and so can only
/// be woken (or poll), never answer from that read.
fn counting_reads<E: PgExecutor + Clone>(store: &Store<E>) -> (Arc<Store<Tapped<E>>>, Answers) {
    let (store, reads) = counted(store, Statement::GetStatus);
    (Arc::new(store), reads)
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_returns_within_milliseconds_of_the_completion_commit() {
    let schema = TestSchema::new().await;
    let (store, mut reads) = counting_reads(&pool_store(&schema).await);
    listening(&store).await;
    let mut took = Vec::with_capacity(200);
    for i in 0..200 {
        let task = store.submit(NewTask::new("lat", json!({ "i": i })).queue("lat")).await.expect("submit");
        let claimed = store.claim(&ClaimRequest::new("w", ["lat"]).limit(1)).await.expect("claim");
        assert_eq!(claimed.len(), 1);
        let first_read = reads.so_far() + 1;
        let waiter = spawn_wait(&store, &task.id, Duration::from_secs(10));
        reads.reach(first_read).await;
        store.complete(&Lease::new(&task.id, "w"), json!(i)).await.expect("complete");
        let committed = Instant::now();
        let (returned, done) = waiter.await.expect("waiter").expect("wait");
        assert_eq!(done.status, TaskStatus::Succeeded);
        took.push(returned.saturating_duration_since(committed));
    }
    took.sort();
    let (p50, p99) = (percentile(&took, 0.5), percentile(&took, 0.99));
    println!("wakeup latency over 200 waits: p50 {p50:?}, p99 {p99:?}");
    // Polling alone would take at least the first backstop (100 ms).
    assert!(p50 < Duration::from_millis(50), "p50 {p50:?}: the wait was not pushed");
    // The tail is the machine's as much as the wait's: a loose bound.
    assert!(p99 < Duration::from_secs(2), "p99 {p99:?}");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_racing_the_first_read_is_not_lost() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    listening(&store).await;
    // Completed at the same moment the waiter registers and reads: whichever
    // comes first, the wait must end, and within the backstop's bound.
    for i in 0..50 {
        let task = store.submit(NewTask::new("race", json!({ "i": i })).queue("race")).await.expect("submit");
        store.claim(&ClaimRequest::new("w", ["race"]).limit(1)).await.expect("claim");
        let waiter = spawn_wait(&store, &task.id, Duration::from_secs(10));
        store.complete(&Lease::new(&task.id, "w"), json!(i)).await.expect("complete");
        let committed = Instant::now();
        let (returned, done) = waiter.await.expect("waiter").expect("wait");
        assert_eq!(done.status, TaskStatus::Succeeded);
        let late = returned.saturating_duration_since(committed);
        // The first backstop is 100 ms away; the rest is room for a loaded
        // machine, still far short of the wait's 10 s.
        assert!(
            late < Duration::from_millis(1500),
            "round {i}: {late:?} after the commit, past the backstop"
        );
    }
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_waiters_share_one_listener() {
    // A database of its own: other tests' hubs would count too.
    let db = TestDatabase::new().await;
    let store = Arc::new(db_store(&db).await);
    listening(&store).await;
    let batch: Vec<NewTask> =
        (0..5000).map(|i| NewTask::new("many", json!({ "i": i })).queue("many")).collect();
    let ids = store.submit_batch(batch).await.expect("submit");
    let started = Instant::now();
    let waiters: Vec<_> = ids
        .iter()
        .map(|id| {
            let (store, id) = (store.clone(), id.clone());
            tokio::spawn(async move { store.wait(&id, Duration::from_secs(120)).await })
        })
        .collect();
    // Settle them all in a few big commits.
    let mut settled = 0;
    while settled < 5000 {
        let claimed = store.claim(&ClaimRequest::new("w", ["many"]).limit(1000)).await.expect("claim");
        let items: Vec<_> = claimed
            .iter()
            .map(|t| waymark_store::Settlement::Complete {
                lease: t.lease().expect("claimed"),
                result: json!(1),
            })
            .collect();
        for out in store.settle_batch(&items).await.expect("settle") {
            out.expect("owned");
        }
        settled += claimed.len();
    }
    for w in waiters {
        assert_eq!(w.await.expect("waiter").expect("wait").status, TaskStatus::Succeeded);
    }
    println!("5000 waiters returned {:?} after the first settlement began", started.elapsed());
    assert_eq!(notify_sessions(&db).await, 1, "one listener session for every waiter");
    drop(store);
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_finish_across_a_killed_listener_and_listening_comes_back() {
    // A database of its own: other tests' hubs would be counted (and killed).
    let db = TestDatabase::new().await;
    let (store, mut reads) = counting_reads(&db_store(&db).await);
    listening(&store).await;
    let admin = waymark_tests::db::admin_client(&db.url).await;
    let task = store.submit(NewTask::new("kill", json!({})).queue("kill")).await.expect("submit");
    store.claim(&ClaimRequest::new("w", ["kill"]).limit(1)).await.expect("claim");
    let first_read = reads.so_far() + 1;
    let waiter = spawn_wait(&store, &task.id, Duration::from_secs(20));
    // The listener is killed once the waiter has read the row.
    reads.reach(first_read).await;
    let killed: i64 = admin
        .query_one(
            "select count(pg_terminate_backend(pid)) from pg_stat_activity \
             where datname = current_database() and application_name = 'waymark-notify'",
            &[],
        )
        .await
        .expect("terminate")
        .get(0);
    assert_eq!(killed, 1, "one listener to kill");
    store.complete(&Lease::new(&task.id, "w"), json!("after the kill")).await.expect("complete");
    let (_, done) = waiter.await.expect("waiter").expect("the wait still finishes");
    assert_eq!(done.result, Some(json!("after the kill")));
    // The hub reconnects by itself; pushed waits work again.
    eventually(Duration::from_secs(10), "the listener back", || async {
        let n: i64 = admin
            .query_one(
                "select count(*) from pg_stat_activity where datname = current_database() \
                 and application_name = 'waymark-notify' and state is not null",
                &[],
            )
            .await
            .expect("count")
            .get(0);
        n == 1 && store.is_listening()
    })
    .await;
    let again = store.submit(NewTask::new("kill", json!({})).queue("kill")).await.expect("submit");
    store.claim(&ClaimRequest::new("w", ["kill"]).limit(1)).await.expect("claim");
    let fifth_read = reads.so_far() + 5;
    let waiter = spawn_wait(&store, &again.id, Duration::from_secs(20));
    // The commit comes just after the waiter's fifth read: its backstop
    // (100 ms, then half as long again each time: reads about 0, 100, 250,
    // 475, 812 and 1,312 ms after it began) is then 500 ms away, so a wait
    // that only polled would return about 500 ms after the commit, and a
    // pushed one at once; the bound between them leaves a loaded machine
    // room.
    reads.reach(fifth_read).await;
    store.complete(&Lease::new(&again.id, "w"), json!(2)).await.expect("complete");
    let committed = Instant::now();
    let (returned, _) = waiter.await.expect("waiter").expect("wait");
    assert!(
        returned.saturating_duration_since(committed) < Duration::from_millis(300),
        "pushed again after the reconnect"
    );
    drop(store);
    db.drop().await;
}

/// A store on the built-in pool in a database of its own.
async fn db_store(db: &TestDatabase) -> Store<PgPool> {
    let pool = PgPool::builder(&db.url).max_size(4).build().expect("pool");
    Store::connect(pool, waymark_store::ConnectOptions::default()).await.expect("connect")
}

/// Listener sessions of waymark-notify on the test's database.
async fn notify_sessions(db: &TestDatabase) -> i64 {
    let admin = waymark_tests::db::admin_client(&db.url).await;
    admin
        .query_one(
            "select count(*) from pg_stat_activity where datname = current_database() \
             and application_name = 'waymark-notify'",
            &[],
        )
        .await
        .expect("count")
        .get(0)
}

/// A store that only runs a worker listens to `cairnq_queued` alone: it
/// never hears the end of every task. Its first wait adds the done stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_listens_to_queued_only_and_a_first_wait_adds_done() {
    // A database of its own: hubs are shared per URL within the process.
    let db = TestDatabase::new().await;
    let pool = PgPool::builder(&db.url).max_size(4).build().expect("pool");
    let store =
        Arc::new(Store::connect(pool, waymark_store::ConnectOptions::default()).await.expect("connect"));
    assert_eq!(notify_sessions(&db).await, 0, "connect listens to nothing yet");
    let worker = test_worker(&store, "only")
        .poll_interval(Duration::from_secs(30))
        .task("only", |_ctx, _p: serde_json::Value| async move { Ok(()) })
        .start();
    eventually(Duration::from_secs(10), "the worker's watch listening", || async { store.is_watching() })
        .await;
    for i in 0..20 {
        store.submit(NewTask::new("only", json!({ "i": i })).queue("only")).await.expect("submit");
    }
    // Within 10 s: pushed by cairnq_queued, not its 30 s poll.
    tokio::time::timeout(Duration::from_secs(10), worker.until_settled(20)).await.expect("twenty settled");
    assert!(!store.is_listening(), "no done stream while nothing waits");
    assert_eq!(notify_sessions(&db).await, 1, "one listener: cairnq_queued");

    listening(&store).await;
    assert_eq!(notify_sessions(&db).await, 2, "the first wait adds the cairnq_done listener");
    worker.stop().await;
    drop(store);
    db.drop().await;
}

/// A watch whose LISTEN stream ends (its hub closed or gone) listens again
/// within seconds, not at its next poll. The executor here ends its first
/// stream when the test says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_whose_stream_ended_listens_again_before_its_poll() {
    let schema = TestSchema::new().await;
    let plain = pool_store(&schema).await;
    let (cut, cut_rx) = tokio::sync::watch::channel(false);
    let listens = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Its first stream ends once `cut` is true.
    let counted = listens.clone();
    let executor = HookedListen::new(plain.executor().clone(), move |pool, channels| {
        let first = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        let mut cut = cut_rx.clone();
        Box::pin(async move {
            use futures::StreamExt as _;
            let channels: Vec<&str> = channels.iter().map(String::as_str).collect();
            let stream = pool.listen(&channels).await?;
            if !first {
                return Ok(stream);
            }
            let ended = async move {
                let _ = cut.wait_for(|cut| *cut).await;
            };
            Ok(stream.map(|s| s.take_until(ended).boxed()))
        })
    });
    let store = Arc::new(Store::new(executor));
    let queue = "stream-ended";
    let (pump, mut queued) = pump_queued(&store, queue);
    eventually(Duration::from_secs(10), "the watch listening", || async { store.is_watching() }).await;
    cut.send_replace(true);
    submit_until_pushed(&store, queue, &mut queued, || {
        listens.load(std::sync::atomic::Ordering::SeqCst) >= 2
    })
    .await;
    pump.abort();
    drop(store);
    schema.drop().await;
}

type Listened = Result<Option<waymark_store::NotificationStream>, waymark_store::ExecError>;
type ListenHook = dyn Fn(PgPool, Vec<String>) -> futures::future::BoxFuture<'static, Listened> + Send + Sync;

/// The pool's executor, its `listen` made by a test's hook (given the pool
/// and the channels).
#[derive(Clone)]
struct HookedListen {
    inner: PgPool,
    hook: Arc<ListenHook>,
}

impl HookedListen {
    fn new(
        inner: PgPool,
        hook: impl Fn(PgPool, Vec<String>) -> futures::future::BoxFuture<'static, Listened>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        HookedListen { inner, hook: Arc::new(hook) }
    }
}

impl std::fmt::Debug for HookedListen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookedListen").field("inner", &self.inner).finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl waymark_store::PgExecutor for HookedListen {
    type Transaction = <PgPool as waymark_store::PgExecutor>::Transaction;

    async fn query(
        &self,
        sql: waymark_store::Sql<'_>,
        params: &[waymark_store::Value],
    ) -> Result<Vec<waymark_store::Row>, waymark_store::ExecError> {
        self.inner.query(sql, params).await
    }

    async fn execute_script(&self, script: &str) -> Result<(), waymark_store::ExecError> {
        self.inner.execute_script(script).await
    }

    async fn begin(&self) -> Result<Self::Transaction, waymark_store::ExecError> {
        self.inner.begin().await
    }

    async fn listen(&self, channels: &[&str]) -> Listened {
        (self.hook)(self.inner.clone(), channels.iter().map(|c| (*c).to_owned()).collect()).await
    }
}

/// A watch's `next` dropped while it asks for its listener (a `select!`
/// whose other branch won, as in the worker's claim loop) still owes its
/// caller the poll it was about to answer: the next call answers it, not
/// the next poll interval. The cancelled attempt blocks another for 2 s
/// (`RELISTEN_AFTER`); once they have passed, everyone is woken and the
/// watch listens again, long before its 600 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_dropped_while_it_listens_answers_its_poll_and_listens_again() {
    let schema = TestSchema::new().await;
    let plain = pool_store(&schema).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    // Each LISTEN attempt is held until the test adds a permit for it.
    let permits = gate.clone();
    let store = Store::new(HookedListen::new(plain.executor().clone(), move |pool, channels| {
        let permits = permits.clone();
        Box::pin(async move {
            // One permit per attempt: the test counts attempts by what is left.
            permits.acquire().await.expect("gate open").forget();
            let channels: Vec<&str> = channels.iter().map(String::as_str).collect();
            pool.listen(&channels).await
        })
    }));
    let mut watch = store.watch_queues(["gated"], Duration::from_secs(600));
    {
        let next = watch.next();
        tokio::pin!(next);
        assert!(futures::poll!(next.as_mut()).is_pending(), "the first next waits for its listener");
    }
    gate.add_permits(1);
    let signal = tokio::time::timeout(Duration::from_secs(10), watch.next()).await;
    assert_eq!(signal.ok(), Some(waymark_store::Signal::Poll), "the owed poll, at once");
    assert_eq!(gate.available_permits(), 1, "no second attempt within RELISTEN_AFTER");
    let signal = tokio::time::timeout(Duration::from_secs(10), watch.next()).await;
    assert_eq!(signal.ok(), Some(waymark_store::Signal::Poll), "a wake once RELISTEN_AFTER passed");
    assert_eq!(gate.available_permits(), 0, "the watch listened again");
    eventually(Duration::from_secs(10), "the watch hears queued signals", || async { store.is_watching() })
        .await;
    schema.drop().await;
}

/// A store shared by two runtimes: the runtime whose watch listened first
/// ends, with the store's LISTEN consumer on it, and the store listens
/// again for a watch on the other, before that watch's poll (the store
/// once thought itself listening for good then, and stayed deaf).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_listens_again_when_the_runtime_that_listened_first_ends() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    let queue = "first-runtime-ended";
    let other = {
        let store = store.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
            rt.block_on(async {
                let mut watch = store.watch_queues([queue], Duration::from_secs(60));
                watch.next().await;
                eventually(Duration::from_secs(10), "the first runtime's watch listening", || async {
                    store.is_watching()
                })
                .await;
            });
            drop(rt); // the store's consumer task goes with it
        })
    };
    other.join().expect("the other runtime ends");
    let (pump, mut queued) = pump_queued(&store, queue);
    submit_until_pushed(&store, queue, &mut queued, || true).await;
    pump.abort();
    drop(store);
    schema.drop().await;
}

/// A watch on `queue` whose poll is a minute away, in a task of its own:
/// the queues of the `Queued` signals pushed to it come out of the
/// receiver (only a prompt listen brings one).
fn pump_queued<E: waymark_store::PgExecutor + 'static>(
    store: &Arc<Store<E>>,
    queue: &'static str,
) -> (tokio::task::JoinHandle<()>, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let (queued_tx, queued) = tokio::sync::mpsc::unbounded_channel();
    let store = store.clone();
    let pump = tokio::spawn(async move {
        let mut watch = store.watch_queues([queue], Duration::from_secs(60));
        loop {
            if let waymark_store::Signal::Queued(q) = watch.next().await {
                let _ = queued_tx.send(q);
            }
        }
    });
    (pump, queued)
}

/// Submits to `queue` until a submit's signal is pushed while `counts`
/// holds, 15 s at most. A task submitted before the store listens again is
/// read by the re-read that listening brings, so keep submitting: only a
/// new LISTEN can push one.
async fn submit_until_pushed<E: waymark_store::PgExecutor>(
    store: &Store<E>,
    queue: &str,
    queued: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    counts: impl Fn() -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        assert!(Instant::now() < deadline, "no queued signal pushed within 15 s");
        store.submit(NewTask::new("x", json!({})).queue(queue)).await.expect("submit");
        if let Ok(Some(q)) = tokio::time::timeout(Duration::from_millis(500), queued.recv()).await {
            if counts() {
                assert_eq!(q, queue);
                return;
            }
        }
    }
}
