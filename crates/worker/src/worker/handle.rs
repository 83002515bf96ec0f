//! A worker's handle: stops it, counts and subscribes to what it does,
//! and carries its test signals (feature `test-hooks`).

use std::sync::Arc;

use tokio::sync::watch;
use waymark_store::PgExecutor;

use crate::shared::{Events, SettledCount, Shared, WorkerEvent};

/// Stops a running worker, and carries its test signals.
#[derive(Clone)]
pub struct WorkerHandle {
    stop: watch::Sender<bool>,
    stop_now: watch::Sender<bool>,
    #[cfg(feature = "test-hooks")]
    paused: Arc<dyn Fn(bool) + Send + Sync>,
    #[cfg(feature = "test-hooks")]
    grouped: Arc<dyn Fn() -> u64 + Send + Sync>,
    #[cfg(feature = "test-hooks")]
    panics: Arc<dyn Fn(usize) + Send + Sync>,
    running: Arc<dyn Fn() -> usize + Send + Sync>,
    settled: Arc<SettledCount>,
    events: Events,
}

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHandle").field("running", &(self.running)()).finish()
    }
}

impl WorkerHandle {
    /// A handle to the worker whose parts `shared` are.
    pub(super) fn new<E: PgExecutor + 'static>(shared: &Arc<Shared<E>>) -> Self {
        let s2 = shared.clone();
        #[cfg(feature = "test-hooks")]
        let s1 = shared.clone();
        #[cfg(feature = "test-hooks")]
        let s3 = shared.clone();
        #[cfg(feature = "test-hooks")]
        let s4 = shared.clone();
        WorkerHandle {
            stop: shared.state.stop.clone(),
            stop_now: shared.state.stop_now.clone(),
            #[cfg(feature = "test-hooks")]
            paused: Arc::new(move |p| {
                s1.state.heartbeats_paused.store(p, std::sync::atomic::Ordering::SeqCst)
            }),
            #[cfg(feature = "test-hooks")]
            grouped: Arc::new(move || s3.state.grouped_calls.load(std::sync::atomic::Ordering::Relaxed)),
            #[cfg(feature = "test-hooks")]
            panics: Arc::new(move |n| {
                s4.state.panics_past_handlers.store(n, std::sync::atomic::Ordering::SeqCst)
            }),
            running: Arc::new(move || s2.running_count()),
            settled: shared.state.settled.clone(),
            events: shared.state.events.clone(),
        }
    }

    /// Begins graceful shutdown: no more claims; running handlers get the
    /// grace period, then are cancelled and their tasks given back.
    pub fn shutdown(&self) {
        self.stop.send_replace(true);
    }

    /// Shutdown without the grace: stops claiming, fires every running
    /// handler's token and stops it at once, and gives its task back (the
    /// attempt not spent). A shutdown under way ends its grace now. A
    /// handler stuck in blocking code is left to its lease, as at the end
    /// of a grace.
    pub fn stop_now(&self) {
        self.stop.send_replace(true);
        self.stop_now.send_replace(true);
    }

    /// Test hook (feature `test-hooks`): pauses (or resumes) lease
    /// renewal, so a test can make a lease run out while its handler runs.
    #[cfg(feature = "test-hooks")]
    pub fn pause_heartbeats(&self, paused: bool) {
        (self.paused)(paused)
    }

    /// Test hook (feature `test-hooks`): how many calls have been polled
    /// in a group, by a runner that took several calls of handlers that
    /// end at once, rather than each by a runner of its own.
    #[cfg(feature = "test-hooks")]
    pub fn calls_run_in_groups(&self) -> u64 {
        (self.grouped)()
    }

    /// Test hook (feature `test-hooks`): the next `calls` one-task calls
    /// panic in the worker's own code right after their handlers return,
    /// past the handlers' guard, as a bug of the worker's would: a test
    /// sees what such a panic ends.
    #[cfg(feature = "test-hooks")]
    pub fn panic_past_handlers(&self, calls: usize) {
        (self.panics)(calls)
    }

    /// Runs in flight: claimed tasks whose handlers have not ended. (At
    /// shutdown, tasks being given back are no longer counted.)
    pub fn running(&self) -> usize {
        (self.running)()
    }

    /// Tasks this worker settled so far (completed, failed or given back
    /// by the worker's own write).
    pub fn settled(&self) -> u64 {
        self.settled.get()
    }

    /// Until this worker has settled at least `n` tasks in all (the count
    /// [`settled`](Self::settled) reads), woken by the settlement that
    /// reaches it: a test or a bench can wait for a batch of work to be
    /// done without polling. It does not end by itself if the worker stops
    /// short of `n`: bound it with a timeout.
    pub async fn until_settled(&self, n: u64) {
        self.settled.until(n).await;
    }

    /// Subscribes to what the worker does from now on: claims,
    /// settlements, lost leases, tasks given back, its stop (see
    /// [`WorkerEvent`]). A subscriber that falls more than 4096 events
    /// behind misses the oldest and is told how many
    /// (`RecvError::Lagged`). Without subscribers no event is built.
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<WorkerEvent> {
        self.events.subscribe()
    }
}
