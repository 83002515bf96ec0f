//! The worker: a claim loop, a heartbeat loop, runners for the calls,
//! settlement once per task, and graceful shutdown.

use std::sync::Arc;

use tokio::sync::watch;
use waymark_store::{PgExecutor, Store};

use crate::builder::WorkerBuilder;
use crate::call::{Handlers, Runs};
use crate::claim::{claim_loop, Planner};
use crate::heartbeat::heartbeat_loop;
use crate::settle::Settler;
use crate::shared::{Events, SettledCount, Shared, WorkerEvent};
use crate::shutdown::shutdown;

/// A worker; see the crate docs. [`Worker::run`] drives it until
/// [`WorkerHandle::shutdown`].
pub struct Worker<E> {
    pub(crate) shared: Arc<Shared<E>>,
    pub(crate) handlers: Arc<Handlers<E>>,
    pub(crate) planner: Arc<Planner>,
}

impl<E> std::fmt::Debug for Worker<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("worker_id", &self.shared.settings.worker_id).finish_non_exhaustive()
    }
}

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

impl<E: PgExecutor + 'static> Worker<E> {
    /// A builder for a worker over `store`.
    pub fn builder(store: impl Into<Arc<Store<E>>>) -> WorkerBuilder<E> {
        WorkerBuilder::new(store.into())
    }

    /// The worker's id.
    pub fn id(&self) -> &str {
        &self.shared.settings.worker_id
    }

    /// The store it claims from.
    pub fn store(&self) -> &Arc<Store<E>> {
        &self.shared.store
    }

    /// The queues it claims from.
    pub fn queues(&self) -> &[String] {
        &self.shared.settings.queues
    }

    /// The task names it has handlers for (the only ones it claims).
    pub fn task_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.handlers.keys().cloned().collect();
        names.sort();
        names
    }

    /// A handle to stop the worker.
    pub fn handle(&self) -> WorkerHandle {
        let s2 = self.shared.clone();
        #[cfg(feature = "test-hooks")]
        let s1 = self.shared.clone();
        #[cfg(feature = "test-hooks")]
        let s3 = self.shared.clone();
        #[cfg(feature = "test-hooks")]
        let s4 = self.shared.clone();
        WorkerHandle {
            stop: self.shared.state.stop.clone(),
            stop_now: self.shared.state.stop_now.clone(),
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
            settled: self.shared.state.settled.clone(),
            events: self.shared.state.events.clone(),
        }
    }

    /// Runs until SIGINT or SIGTERM, then shuts down gracefully, as
    /// [`WorkerHandle::shutdown`] does; a second signal stops at once, as
    /// [`WorkerHandle::stop_now`] does. Made for a worker process's `main`,
    /// to exit when it returns: once installed, tokio's handlers for those
    /// signals stay for the life of the process, so after `serve` returns a
    /// SIGINT or SIGTERM no longer ends the process by itself. Fails only
    /// when the signal handlers cannot be installed.
    #[cfg(unix)]
    pub async fn serve(self) -> std::io::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let (mut term, mut int) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
        let handle = self.handle();
        let mut run = std::pin::pin!(self.run());
        let mut heard = 0;
        loop {
            tokio::select! {
                () = &mut run => return Ok(()),
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            heard += 1;
            if heard == 1 {
                tracing::info!(
                    "waymark worker: signal received, shutting down gracefully (a second one stops at once)"
                );
                handle.shutdown();
            } else {
                tracing::warn!("waymark worker: second signal, stopping now");
                handle.stop_now();
            }
        }
    }

    /// Runs until [`WorkerHandle::shutdown`], then shuts down gracefully.
    pub async fn run(self) {
        let shared = self.shared;
        let (settler, batcher) = Settler::start(&shared);
        // Dropped with `run` (a caller's select!, say): no lease outlives it.
        let _beats = AbortOnDrop(tokio::spawn(heartbeat_loop(shared.clone())));
        // And what the batcher still resends stops: its leases are no
        // longer renewed. (At the end of a run that finished, nothing is
        // left to stop.)
        let _stop = StopNowOnDrop(shared.clone());
        let runs = Runs::new(shared.clone(), self.handlers, settler);
        claim_loop(&shared, self.planner, &runs).await;
        shutdown(&shared, &runs).await;
        // The runners stop (idle, or stuck in blocking code and left; the
        // batcher's end below does not wait for the settler they hold).
        drop(runs);
        if let Some(b) = batcher {
            b.finish().await; // flushes what is queued, then ends
        }
        shared.state.events.emit(|| WorkerEvent::Stopped);
    }
}

struct StopNowOnDrop<E>(Arc<Shared<E>>);

impl<E> Drop for StopNowOnDrop<E> {
    fn drop(&mut self) {
        self.0.state.stop_now.send_replace(true);
    }
}

pub(crate) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
