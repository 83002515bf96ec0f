//! The worker: a claim loop, a heartbeat loop, one spawned run per task,
//! settlement once per task, and graceful shutdown.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use waymark_store::{
    codes, ClaimRequest, Error, Failure, PgExecutor, RetryBackoff, Settlement, Signal, Store, Task,
};

use crate::context::{CancelReason, Running, TaskContext};
use crate::error::{envelope, TaskError};
use crate::handler::{Handler, Outcome, Typed};
use crate::settle::Settler;

/// How long the claim loop waits for more free slots before it claims for
/// the few that are free.
const CLAIM_GATHER: Duration = Duration::from_millis(10);

/// How long a handler may take to stop by itself once shutdown fires its
/// token, before its future is dropped.
const STOP_GRACE: Duration = Duration::from_millis(500);

/// The first pause before a failed claim is tried again; it doubles up
/// to the poll interval while claims keep failing.
const CLAIM_RETRY_FIRST: Duration = Duration::from_millis(50);

/// Claim transactions under way at once: while one commits, the next
/// draws.
const CLAIMS_IN_FLIGHT: usize = 2;

/// A failure the worker survived (a claim, heartbeat or settlement that
/// failed), passed to the error hook.
#[derive(Debug)]
pub struct WorkerError {
    /// What the worker was doing, such as `claim` or `settle task_01...`.
    pub during: String,
    /// The cause.
    pub error: Error,
}

type ErrorHook = Arc<dyn Fn(&WorkerError) + Send + Sync>;

/// Configures a [`Worker`]; every setting's doc states its default.
pub struct WorkerBuilder<E> {
    store: Arc<Store<E>>,
    queues: Vec<String>,
    concurrency: usize,
    lease: Duration,
    heartbeat: Option<Duration>,
    poll_interval: Duration,
    max_run_time: Option<Duration>,
    shutdown_grace: Duration,
    backoff: RetryBackoff,
    settle_batch: usize,
    settle_window: Duration,
    worker_id: Option<String>,
    on_error: ErrorHook,
    handlers: HashMap<String, Arc<dyn Handler<E>>>,
}

impl<E> std::fmt::Debug for WorkerBuilder<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("queues", &self.queues)
            .field("concurrency", &self.concurrency)
            .field("handlers", &self.handlers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl<E: PgExecutor + 'static> WorkerBuilder<E> {
    fn new(store: Arc<Store<E>>) -> Self {
        WorkerBuilder {
            store,
            queues: vec!["default".to_owned()],
            concurrency: 10,
            lease: Duration::from_secs(30),
            heartbeat: None,
            poll_interval: Duration::from_secs(1),
            max_run_time: None,
            shutdown_grace: Duration::from_secs(10),
            backoff: RetryBackoff::default(),
            settle_batch: 64,
            settle_window: Duration::from_millis(2),
            worker_id: None,
            on_error: Arc::new(
                |e: &WorkerError| tracing::warn!(during = %e.during, error = %e.error, "waymark worker"),
            ),
            handlers: HashMap::new(),
        }
    }

    /// Queues to claim from. Defaults to `["default"]`.
    pub fn queues<Q: Into<String>>(mut self, queues: impl IntoIterator<Item = Q>) -> Self {
        self.queues = queues.into_iter().map(Into::into).collect();
        self
    }

    /// Most tasks running at once. Defaults to 10.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Lease length of each claim. Defaults to 30 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often every held lease is renewed. Defaults to a third of the
    /// lease, at least 50 ms.
    pub fn heartbeat_interval(mut self, every: Duration) -> Self {
        self.heartbeat = Some(every);
        self
    }

    /// How often to look for work without a wakeup. Defaults to 1 s.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// Longest run of one task; past it the run is stopped and the task
    /// fails (retryable) with code `handler_timeout`. Defaults to none.
    pub fn max_run_time(mut self, limit: Duration) -> Self {
        self.max_run_time = Some(limit);
        self
    }

    /// How long shutdown lets running handlers finish before it cancels
    /// them and gives their tasks back. Defaults to 10 s.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Retry backoff of failed runs. Defaults to base 1 s, max 30 s.
    pub fn retry_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff = RetryBackoff { base_ms: base.as_millis() as i64, max_ms: max.as_millis() as i64 };
        self
    }

    /// Settlement batching: up to `max` settlements that arrive within
    /// `window` commit in one transaction. `max` of 1 turns batching off.
    /// Defaults to 64 and 2 ms.
    pub fn settle_batch(mut self, max: usize, window: Duration) -> Self {
        self.settle_batch = max;
        self.settle_window = window;
        self
    }

    /// The worker's id on the tasks it claims. Defaults to
    /// `waymark-<pid>-<random>`.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    /// Called with each failure the worker survives. Defaults to a
    /// `tracing` warning.
    pub fn on_error(mut self, hook: impl Fn(&WorkerError) + Send + Sync + 'static) -> Self {
        self.on_error = Arc::new(hook);
        self
    }

    /// Registers the handler for tasks named `name`. The payload is
    /// deserialised into `P` (a mismatch fails the task for good); the
    /// result `R` is serialised as the task's result.
    pub fn task<F, P, R, Fut>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        F: Fn(TaskContext<E>, P) -> Fut + Send + Sync + 'static,
        P: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        Fut: Future<Output = Result<R, TaskError>> + Send + 'static,
    {
        self.handlers.insert(name.into(), Arc::new(Typed(handler, std::marker::PhantomData)));
        self
    }

    /// Builds the worker; bad settings are refused with the setting named.
    pub fn build(self) -> Result<Worker<E>, Error> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.concurrency == 0 {
            return bad("concurrency must be at least 1".to_owned());
        }
        if self.queues.is_empty() || self.queues.iter().any(|q| q.is_empty()) {
            return bad("queues must name at least one queue, none of them empty".to_owned());
        }
        if self.handlers.is_empty() {
            return bad("a worker needs at least one handler (WorkerBuilder::task)".to_owned());
        }
        if self.lease < Duration::from_millis(10) {
            return bad(format!("lease must be at least 10 ms, got {:?}", self.lease));
        }
        let heartbeat = self.heartbeat.unwrap_or(self.lease / 3).max(Duration::from_millis(50));
        if heartbeat >= self.lease {
            return bad(format!(
                "heartbeat interval {heartbeat:?} must be shorter than the lease {:?}",
                self.lease
            ));
        }
        if self.poll_interval.is_zero() {
            return bad("poll_interval must be positive".to_owned());
        }
        let worker_id = self
            .worker_id
            .unwrap_or_else(|| format!("waymark-{}-{:08x}", std::process::id(), rand::random::<u32>()));
        let (stop, _) = watch::channel(false);
        Ok(Worker {
            shared: Arc::new(Shared {
                store: self.store,
                queues: self.queues,
                concurrency: self.concurrency,
                lease_ms: self.lease.as_millis() as i64,
                heartbeat,
                poll_interval: self.poll_interval,
                max_run_time: self.max_run_time,
                shutdown_grace: self.shutdown_grace,
                backoff: self.backoff,
                settle_batch: self.settle_batch,
                settle_window: self.settle_window,
                worker_id: worker_id.into(),
                on_error: self.on_error,
                handlers: self.handlers,
                running: Mutex::default(),
                busy: AtomicUsize::new(0),
                slot_freed: Notify::new(),
                stop,
                past_grace: watch::channel(false).0,
                heartbeats_paused: AtomicBool::new(false),
                settled: AtomicU64::new(0),
            }),
        })
    }
}

struct Shared<E> {
    store: Arc<Store<E>>,
    queues: Vec<String>,
    concurrency: usize,
    lease_ms: i64,
    heartbeat: Duration,
    poll_interval: Duration,
    max_run_time: Option<Duration>,
    shutdown_grace: Duration,
    backoff: RetryBackoff,
    settle_batch: usize,
    settle_window: Duration,
    worker_id: Arc<str>,
    on_error: ErrorHook,
    handlers: HashMap<String, Arc<dyn Handler<E>>>,
    running: Mutex<HashMap<String, Arc<Running>>>,
    /// Runs in flight. Counted apart from `running`: a task re-claimed
    /// while our earlier run of it winds down holds two slots, one entry.
    busy: AtomicUsize,
    slot_freed: Notify,
    stop: watch::Sender<bool>,
    /// Set when shutdown's grace period has passed: runs still going stop.
    past_grace: watch::Sender<bool>,
    heartbeats_paused: AtomicBool,
    settled: AtomicU64,
}

impl<E> Shared<E> {
    fn report(&self, during: impl Into<String>, error: Error) {
        (self.on_error)(&WorkerError { during: during.into(), error });
    }

    fn running_count(&self) -> usize {
        self.busy.load(Ordering::SeqCst)
    }
}

/// A worker; see the crate docs. [`Worker::run`] drives it until
/// [`WorkerHandle::shutdown`].
pub struct Worker<E> {
    shared: Arc<Shared<E>>,
}

impl<E> std::fmt::Debug for Worker<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("worker_id", &self.shared.worker_id).finish_non_exhaustive()
    }
}

/// Stops a running worker, and carries its test signals.
#[derive(Clone)]
pub struct WorkerHandle {
    stop: watch::Sender<bool>,
    paused: Arc<dyn Fn(bool) + Send + Sync>,
    running: Arc<dyn Fn() -> usize + Send + Sync>,
    settled: Arc<dyn Fn() -> u64 + Send + Sync>,
}

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHandle").field("running", &(self.running)()).finish()
    }
}

impl WorkerHandle {
    /// Begins graceful shutdown: no more claims; running handlers get the
    /// grace period, then are cancelled and their tasks given back.
    pub fn shutdown(&self) {
        self.stop.send_replace(true);
    }

    /// Test signal: pauses (or resumes) lease renewal, so a test can make
    /// a lease run out while its handler still runs.
    pub fn pause_heartbeats(&self, paused: bool) {
        (self.paused)(paused)
    }

    /// Runs in flight: claimed tasks whose handlers have not ended. (At
    /// shutdown, tasks being given back are no longer counted.)
    pub fn running(&self) -> usize {
        (self.running)()
    }

    /// Tasks this worker settled so far (completed, failed or given back
    /// by the worker's own write).
    pub fn settled(&self) -> u64 {
        (self.settled)()
    }
}

impl<E: PgExecutor + 'static> Worker<E> {
    /// A builder for a worker over `store`.
    pub fn builder(store: impl Into<Arc<Store<E>>>) -> WorkerBuilder<E> {
        WorkerBuilder::new(store.into())
    }

    /// The worker's id.
    pub fn id(&self) -> &str {
        &self.shared.worker_id
    }

    /// A handle to stop the worker.
    pub fn handle(&self) -> WorkerHandle {
        let (s1, s2, s3) = (self.shared.clone(), self.shared.clone(), self.shared.clone());
        WorkerHandle {
            stop: self.shared.stop.clone(),
            paused: Arc::new(move |p| s1.heartbeats_paused.store(p, Ordering::SeqCst)),
            running: Arc::new(move || s2.running_count()),
            settled: Arc::new(move || s3.settled.load(Ordering::Relaxed)),
        }
    }

    /// Runs until [`WorkerHandle::shutdown`], then shuts down gracefully.
    pub async fn run(self) {
        let shared = self.shared;
        let (settler, batcher) =
            Settler::start(shared.store.clone(), shared.settle_batch, shared.settle_window);
        // Dropped with `run` (a caller's select!, say): no lease outlives it.
        let _beats = AbortOnDrop(tokio::spawn(heartbeat_loop(shared.clone())));
        let mut runs = JoinSet::new();
        claim_loop(&shared, &settler, &mut runs).await;
        shutdown(&shared, &mut runs).await;
        drop(settler);
        if let Some(b) = batcher {
            b.finish().await; // flushes what is queued, then ends
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn claim_loop<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    settler: &Settler,
    runs: &mut JoinSet<()>,
) {
    let mut stop = shared.stop.subscribe();
    let mut watch = shared.store.watch_queues(shared.queues.iter().cloned(), shared.poll_interval);
    let names: Vec<String> = shared.handlers.keys().cloned().collect();
    let request = ClaimRequest::new(shared.worker_id.to_string(), shared.queues.iter().cloned())
        .names(names)
        .lease_ms(shared.lease_ms);
    // Claims under way, and the slots each asked for (by task id, so that
    // a claim task that panicked still gives its slots back).
    let mut claims: JoinSet<Result<Vec<Task>, Error>> = JoinSet::new();
    let mut asked: HashMap<tokio::task::Id, usize> = HashMap::new();
    let mut reserved = 0usize;
    // Set when a claim came back short: wait for a wakeup before the next.
    let mut dry = false;
    // The probe (and the lease recovery it starts) runs on a poll, and at
    // least once per poll interval; a claim after a full claim or a queued
    // signal knows work is due and goes straight to the claim statement.
    let mut probe_due = true;
    let mut last_probe = Instant::now();
    // After a failed claim, when to try again: soon, backing off to the
    // poll interval, not at the next signal (which may be a poll away).
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut retry_pause = CLAIM_RETRY_FIRST;
    // The watch's first answer is "read now".
    let _ = watch.next().await;
    loop {
        while runs.try_join_next().is_some() {}
        if *stop.borrow() {
            // Claimed tasks are ours: run them, so shutdown settles or
            // gives them back like the rest.
            while let Some(done) = claims.join_next().await {
                match done {
                    Ok(out) => start_all(shared, settler, runs, out),
                    Err(e) => shared.report("claim", claim_panicked(e)),
                }
            }
            return;
        }
        let running = shared.running_count();
        let mut free = shared.concurrency.saturating_sub(running + reserved);
        // Claim in batches: with a few slots free while others run, wait a
        // moment for more to free up, so one claim transaction fills many.
        let batch = (shared.concurrency / 4).max(1);
        if !dry && free > 0 && free < batch && running + reserved > 0 && claims.len() < CLAIMS_IN_FLIGHT {
            let deadline = tokio::time::Instant::now() + CLAIM_GATHER;
            while free < batch
                && tokio::time::timeout_at(deadline, shared.slot_freed.notified()).await.is_ok()
            {
                free = shared.concurrency.saturating_sub(shared.running_count() + reserved);
            }
            free = shared.concurrency.saturating_sub(shared.running_count() + reserved);
        }
        if !dry && free > 0 && claims.len() < CLAIMS_IN_FLIGHT {
            let probe = probe_due || last_probe.elapsed() >= shared.poll_interval;
            if probe {
                (probe_due, last_probe) = (false, Instant::now());
            }
            let (store, req) = (shared.store.clone(), request.clone().limit(free as i64).probe(probe));
            reserved += free;
            let handle = claims.spawn(async move { store.claim(&req).await });
            asked.insert(handle.id(), free);
            continue;
        }
        let slots_full = shared.concurrency <= shared.running_count() + reserved;
        tokio::select! {
            _ = stop.changed() => {}
            Some(done) = claims.join_next_with_id(), if !claims.is_empty() => {
                let (id, out) = match done {
                    Ok((id, out)) => (id, out),
                    Err(e) => (e.id(), Err(claim_panicked(e))),
                };
                let slots = asked.remove(&id).unwrap_or(0);
                reserved -= slots;
                dry = !matches!(&out, Ok(tasks) if tasks.len() == slots);
                // A failed claim may have been the one that probed: the
                // next one probes (and so recovers leases) instead.
                probe_due |= out.is_err();
                if out.is_err() {
                    retry_at = Some(tokio::time::Instant::now() + retry_pause);
                    retry_pause = (retry_pause * 2).min(shared.poll_interval);
                } else {
                    retry_pause = CLAIM_RETRY_FIRST;
                }
                start_all(shared, settler, runs, out);
            }
            _ = shared.slot_freed.notified(), if slots_full => {}
            _ = sleep_until_some(retry_at), if retry_at.is_some() => {
                (dry, retry_at) = (false, None);
            }
            // A queued signal or a poll (a queue watch yields no done signals).
            signal = watch.next(), if !slots_full => {
                dry = false;
                probe_due |= signal == Signal::Poll;
            }
        }
    }
}

async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A claim task that panicked or was cancelled: what it claimed, if
/// anything, comes back when the leases expire.
fn claim_panicked(e: tokio::task::JoinError) -> Error {
    Error::Internal(format!(
        "the claim task ended abnormally ({e}); its claims, if any, return on lease expiry"
    ))
}

fn start_all<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    settler: &Settler,
    runs: &mut JoinSet<()>,
    claimed: Result<Vec<Task>, Error>,
) {
    match claimed {
        Ok(tasks) => {
            for task in tasks {
                start_run(shared, settler, runs, task);
            }
        }
        Err(e) => shared.report("claim", e),
    }
}

fn start_run<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    settler: &Settler,
    runs: &mut JoinSet<()>,
    task: Task,
) {
    let running = Running::new(task.id.clone(), task.attempt);
    shared.busy.fetch_add(1, Ordering::SeqCst);
    let previous = shared.running.lock().expect("running lock").insert(task.id.clone(), running.clone());
    // From here, whatever happens (a panic, a spawn refused while the
    // runtime shuts down, which drops the future), the slot comes free.
    let slot = Slot { shared: shared.clone(), running: running.clone() };
    if let Some(old) = previous {
        // Our own earlier run of this task lost its lease (the claim just
        // recovered and re-took it): that run must write nothing more.
        old.mark_lost();
    }
    let shared = shared.clone();
    let settler = settler.clone();
    let task = Arc::new(task);
    runs.spawn(async move {
        let _slot = slot;
        let body = async {
            let outcome = run_handler(&shared, &task, &running).await;
            settle(&shared, &settler, &task, &running, outcome).await;
        };
        let mut body = std::pin::pin!(body);
        // Marks each poll, so shutdown can tell a run stuck in blocking code.
        std::future::poll_fn(|cx| {
            running.set_in_poll(true);
            let polled = body.as_mut().poll(cx);
            running.set_in_poll(false);
            polled
        })
        .await;
    });
}

/// Frees a run's slot when the run ends, however it ends, and wakes the
/// claim loop. Its entry leaves the running map (if it is still this
/// run's), except past the shutdown grace: shutdown owns the map then, and
/// a run it stopped ends unsettled, its lease renewed until shutdown gives
/// the task back.
struct Slot<E> {
    shared: Arc<Shared<E>>,
    running: Arc<Running>,
}

impl<E> Drop for Slot<E> {
    fn drop(&mut self) {
        self.running.mark_ended();
        let mut map = self.shared.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let past_grace = *self.shared.past_grace.borrow();
        if !past_grace && map.get(&self.running.id).is_some_and(|r| Arc::ptr_eq(r, &self.running)) {
            map.remove(&self.running.id);
        }
        drop(map);
        self.shared.busy.fetch_sub(1, Ordering::SeqCst);
        self.shared.slot_freed.notify_one();
    }
}

/// How a run ended, including the ends the worker decides itself.
enum RunEnd {
    Handler(Outcome),
    Panicked(String),
    TimedOut(Duration),
    NoHandler,
    /// Stopped at shutdown: shutdown gives the task back.
    Stopped,
}

async fn run_handler<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    task: &Arc<Task>,
    running: &Arc<Running>,
) -> RunEnd {
    let Some(handler) = shared.handlers.get(&task.name) else { return RunEnd::NoHandler };
    let ctx = TaskContext::new(
        shared.store.clone(),
        task.clone(),
        shared.worker_id.clone(),
        shared.lease_ms,
        shared.backoff,
        running.clone(),
    );
    // The call itself may panic too (its synchronous part, a payload's
    // Deserialize), not only the future it returns.
    let payload = task.payload.clone();
    let run = AssertUnwindSafe(async move { handler.call(ctx, payload).await }).catch_unwind();
    let bounded = async {
        match shared.max_run_time {
            Some(limit) => tokio::time::timeout(limit, run).await.map_err(|_| limit),
            None => Ok(run.await),
        }
    };
    // Past the shutdown grace the token fires; the handler gets a moment to
    // stop by itself, then its future is dropped and the task given back.
    let mut past_grace = shared.past_grace.subscribe();
    let stopped = async move {
        if past_grace.wait_for(|past| *past).await.is_err() {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(STOP_GRACE).await;
    };
    let result = tokio::select! {
        r = bounded => match r {
            Ok(r) => r,
            Err(limit) => return RunEnd::TimedOut(limit),
        },
        _ = stopped => return RunEnd::Stopped,
    };
    match result {
        Ok(outcome) => RunEnd::Handler(outcome),
        Err(panic) => RunEnd::Panicked(panic_message(&panic)),
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "the handler panicked".to_owned()
    }
}

async fn settle<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    settler: &Settler,
    task: &Task,
    running: &Running,
    end: RunEnd,
) {
    let Some(settlement) = settlement_for(shared, task, running, end) else { return };
    let first = settler.settle(&shared.store, settlement.clone()).await;
    match first {
        Err(e) if passing(&e) => {
            // Rare, and kept out of line: every run's future holds this
            // function's state, so its size is paid per task.
            Box::pin(settle_again(shared, settler, running, settlement, e)).await;
        }
        other => settled(shared, &settlement, other),
    }
}

/// What a run's end settles, or `None` when it settles nothing (a lost
/// lease, a stop at shutdown, a settlement already made).
fn settlement_for<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    task: &Task,
    running: &Running,
    end: RunEnd,
) -> Option<Settlement> {
    if running.is_lost() {
        tracing::debug!(task = %task.id, "lease lost; the late settlement is dropped");
        return None;
    }
    if matches!(end, RunEnd::Stopped) || running.reason() == Some(CancelReason::Shutdown) {
        // Shutdown gives it back, however the handler answered its token:
        // an Err must not spend an attempt, an Ok of a run told to stop must
        // not count as done.
        return None;
    }
    if !running.take_settlement() {
        return None; // settled by complete_in, or given back at shutdown
    }
    let id = task.id.clone();
    let worker_id = shared.worker_id.to_string();
    let fail = |error: serde_json::Value, retryable: bool| {
        let delay_ms = if retryable { shared.backoff.delay_ms(task.attempt) } else { 0 };
        Settlement::Fail {
            id: id.clone(),
            worker_id: worker_id.clone(),
            failure: Failure::new(error).retryable(retryable).delay_ms(delay_ms).on_attempt(task.attempt),
        }
    };
    Some(match end {
        RunEnd::Handler(Outcome::Done(result)) => {
            Settlement::Complete { id: id.clone(), worker_id: worker_id.clone(), result }
        }
        RunEnd::Handler(Outcome::Failed(e)) => fail(e.envelope(), e.is_retryable()),
        RunEnd::Handler(Outcome::BadPayload(why)) => fail(
            envelope(
                "InvalidPayload",
                codes::TASK_ERROR,
                format!("payload does not fit the handler of {:?}: {why}", task.name),
                false,
            ),
            false,
        ),
        RunEnd::Handler(Outcome::Unserializable(why)) => fail(
            envelope(
                "UnserializableResult",
                codes::UNSERIALIZABLE_RESULT,
                format!("the result does not serialise to JSON: {why}"),
                false,
            ),
            false,
        ),
        RunEnd::Panicked(message) => fail(
            envelope("Panic", codes::HANDLER_ERROR, format!("the handler panicked: {message}"), true),
            true,
        ),
        RunEnd::TimedOut(limit) => fail(
            envelope(
                "HandlerTimeout",
                codes::HANDLER_TIMEOUT,
                format!("the handler ran longer than {limit:?}"),
                true,
            ),
            true,
        ),
        RunEnd::Stopped => unreachable!("handled above"),
        RunEnd::NoHandler => fail(
            envelope(
                "NoHandler",
                codes::NO_HANDLER,
                format!("no handler registered for {:?}", task.name),
                false,
            ),
            false,
        ),
    })
}

/// Counts or reports a settlement's final answer.
fn settled<E>(shared: &Shared<E>, settlement: &Settlement, answer: Result<waymark_store::Settled, Error>) {
    match answer {
        Ok(_) => {
            shared.settled.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) if e.is_lost_lease() => {
            tracing::debug!(task = %settlement.task_id(), "lease lost before settlement");
        }
        Err(e) => shared.report(format!("settle {}", settlement.task_id()), e),
    }
}

/// A passing failure (the pool saturated, its breaker open, a lost
/// connection) is tried again while the lease lasts; a resent settlement
/// that had committed answers "lost lease", and the row is right.
async fn settle_again<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    settler: &Settler,
    running: &Running,
    settlement: Settlement,
    error: Error,
) {
    let deadline = Instant::now() + Duration::from_millis(shared.lease_ms as u64 / 2);
    let again = || settler.settle(&shared.store, settlement.clone());
    let out = while_passing(Err(error), deadline, || running.is_lost(), settlement.task_id(), again).await;
    if out.is_err() && running.is_lost() {
        tracing::debug!(task = %settlement.task_id(), "lease lost while a settlement was retried");
        return;
    }
    settled(shared, &settlement, out);
}

/// Tries a write again after a passing failure, waiting 20 ms doubling to
/// 1 s in between, while the next try would start before `deadline` and
/// `stop` says nothing changed; answers the last outcome.
async fn while_passing<T, Fut>(
    mut out: Result<T, Error>,
    deadline: Instant,
    stop: impl Fn() -> bool,
    task: &str,
    mut again: impl FnMut() -> Fut,
) -> Result<T, Error>
where
    Fut: Future<Output = Result<T, Error>>,
{
    let mut pause = Duration::from_millis(20);
    while let Err(error) = &out {
        if !passing(error) || Instant::now() + pause >= deadline || stop() {
            break;
        }
        tracing::debug!(task, error = %error, "a worker write failed; trying again");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
        if stop() {
            break; // the lease went meanwhile: a resend could only do harm
        }
        out = again().await;
    }
    out
}

/// A failure that may pass: worth another try.
fn passing(e: &Error) -> bool {
    use waymark_store::ExecErrorKind::*;
    matches!(e.exec_kind(), Some(Saturated | CircuitOpen | Connection | Timeout | Capacity))
        || e.is_lock_timeout()
}

/// Renews every unsettled lease with one statement per interval; a task
/// missing from the answer lost its lease, a cancel request fires its token.
async fn heartbeat_loop<E: PgExecutor + 'static>(shared: Arc<Shared<E>>) {
    let mut tick = tokio::time::interval(shared.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; claims are fresh
    loop {
        tick.tick().await;
        if shared.heartbeats_paused.load(Ordering::SeqCst) {
            continue;
        }
        let held: Vec<Arc<Running>> =
            shared.running.lock().expect("running lock").values().filter(|r| !r.is_lost()).cloned().collect();
        if held.is_empty() {
            continue;
        }
        let ids: Vec<String> = held.iter().map(|r| r.id.clone()).collect();
        match shared.store.heartbeat_batch(&ids, &shared.worker_id, shared.lease_ms).await {
            Ok(beats) => {
                let owned: HashMap<&str, Option<i64>> =
                    beats.iter().map(|b| (b.id.as_str(), b.cancel_requested_at_ms)).collect();
                for r in &held {
                    match owned.get(r.id.as_str()) {
                        // A settlement committed meanwhile also leaves the
                        // answer; marking it lost then changes nothing.
                        None if !r.is_settled() => r.mark_lost(),
                        Some(Some(_)) => r.cancel(CancelReason::Requested),
                        _ => {}
                    }
                }
            }
            Err(e) => shared.report("heartbeat", e),
        }
    }
}

/// How long shutdown waits, after the stop grace, for runs that are
/// finishing a settlement, before it stops waiting for them.
const SETTLE_BOUND: Duration = Duration::from_secs(2);

/// Stop claiming (done by the caller), let handlers finish within the
/// grace period, then fire the tokens of the rest and give their tasks back.
/// Ends within the grace plus [`STOP_GRACE`], [`SETTLE_BOUND`] and the
/// releases, even when a handler is stuck in blocking code. Such a run's
/// task is not given back (another worker would start it while this one
/// still runs it): it is left to its lease, which is no longer renewed.
async fn shutdown<E: PgExecutor + 'static>(shared: &Arc<Shared<E>>, runs: &mut JoinSet<()>) {
    let grace =
        tokio::time::timeout(shared.shutdown_grace, async { while runs.join_next().await.is_some() {} });
    if grace.await.is_ok() {
        return;
    }
    // Past the grace first, so that a run answering its token keeps its
    // entry (and its lease renewed) until shutdown gives its task back.
    shared.past_grace.send_replace(true);
    let left: Vec<Arc<Running>> = shared.running.lock().expect("running lock").values().cloned().collect();
    for r in &left {
        r.cancel(CancelReason::Shutdown);
    }
    // A run that answers its token, or is dropped after STOP_GRACE, ends
    // here; one already settling gets a moment to hear its answer.
    let ended =
        tokio::time::timeout(STOP_GRACE + SETTLE_BOUND, async { while runs.join_next().await.is_some() {} })
            .await
            .is_ok();
    if !ended {
        // Blocking code never yields, so it cannot be aborted or awaited.
        // An aborted run that does yield ends at once; wait a moment for
        // those, and leave the rest behind.
        runs.abort_all();
        let _ = tokio::time::timeout(Duration::from_millis(100), async {
            while runs.join_next().await.is_some() {}
        })
        .await;
    }
    // A run not stuck may still be waiting for a thread (one the stuck run
    // holds): aborted, it can never run its handler again, so its task is
    // safe to give back.
    let (stuck, done): (Vec<_>, Vec<_>) = left.into_iter().partition(|r| r.is_stuck());
    for r in &stuck {
        tracing::warn!(task = %r.id, "a handler is stuck in blocking code at shutdown; its task returns when its lease expires");
    }
    if !runs.is_empty() {
        runs.detach_all();
    }
    let give_back: Vec<Arc<Running>> =
        done.into_iter().filter(|r| !r.is_lost() && r.take_settlement()).collect();
    {
        // The heartbeat renews what the map holds: the tasks being given
        // back, while their releases are retried; not the stuck runs',
        // whose leases run out.
        let mut map = shared.running.lock().expect("running lock");
        map.clear();
        map.extend(give_back.iter().map(|r| (r.id.clone(), r.clone())));
    }
    futures::future::join_all(give_back.iter().map(|r| release(shared, r))).await;
    shared.running.lock().expect("running lock").clear();
}

/// Gives one task back, trying again on passing failures while its lease
/// lasts (the heartbeat loop keeps renewing it meanwhile). What cannot be
/// given back is reported and left to lease expiry.
async fn release<E: PgExecutor + 'static>(shared: &Arc<Shared<E>>, r: &Running) {
    let deadline = Instant::now() + Duration::from_millis(shared.lease_ms as u64);
    let again = || shared.store.release_attempt(&r.id, &shared.worker_id, Some(r.attempt));
    let first = again().await;
    let resent = first.as_ref().is_err_and(passing);
    match while_passing(first, deadline, || r.is_lost(), &r.id, again).await {
        Ok(_) => {
            shared.settled.fetch_add(1, Ordering::Relaxed);
        }
        // A resend finds the task gone when the first try had committed.
        Err(e) if e.is_lost_lease() && resent => {
            tracing::debug!(task = %r.id, "a resent release found the task given back already");
        }
        Err(e) => shared.report(format!("release {} at shutdown (left to its lease)", r.id), e),
    }
}
