//! A worker under test, in three steps that read as what a test does:
//! [`test_worker`] begins its builder on one queue, [`TestWorker::start`]
//! builds it and runs it on a task of its own, and [`Running::stop`] shuts
//! it down and waits for its end. A test names only the settings its
//! behaviour depends on; [`TestWorker`] adds two that tests ask for often.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use waymark_store::{PgExecutor, Store};
use waymark_worker::{Worker, WorkerBuilder, WorkerEvent, WorkerHandle};

/// The builder of a worker on `store` that claims from `queue` alone;
/// every other setting is the worker's default.
pub fn test_worker<E: PgExecutor + 'static>(store: &Arc<Store<E>>, queue: &str) -> WorkerBuilder<E> {
    Worker::builder(store.clone()).queues([queue])
}

/// Settings tests ask for often, and starting the worker.
pub trait TestWorker: Sized {
    /// A poll a minute, past any test's span: a claim within the test
    /// comes from a wakeup (a submit's signal) or a freed slot, never from
    /// the timer, so no poll of this worker's finds a lease the test
    /// expired before the test's own claim does.
    fn no_poll(self) -> Self;

    /// A lease of `lease`, renewed every 100 ms: many beats per lease, so a
    /// loaded machine that stalls a few does not lose it.
    fn beating_lease(self, lease: Duration) -> Self;

    /// Builds the worker (the test fails if its settings are refused) and
    /// runs it on a task of its own.
    fn start(self) -> Running;

    /// [`start`](Self::start), with a subscription to its events taken
    /// before it runs: the first claim's events included.
    fn start_with_events(self) -> (Running, broadcast::Receiver<WorkerEvent>);
}

impl<E: PgExecutor + 'static> TestWorker for WorkerBuilder<E> {
    fn no_poll(self) -> Self {
        self.poll_interval(Duration::from_secs(60))
    }

    fn beating_lease(self, lease: Duration) -> Self {
        self.lease(lease).heartbeat_interval(Duration::from_millis(100))
    }

    fn start(self) -> Running {
        Running::spawn(self.build().expect("worker"))
    }

    fn start_with_events(self) -> (Running, broadcast::Receiver<WorkerEvent>) {
        let worker = self.build().expect("worker");
        let events = worker.handle().events();
        (Running::spawn(worker), events)
    }
}

/// A worker running on a task of its own; its handle, through `Deref`.
#[derive(Debug)]
pub struct Running {
    handle: WorkerHandle,
    run: JoinHandle<()>,
}

impl Running {
    /// Runs `worker` on a task of its own.
    pub fn spawn<E: PgExecutor + 'static>(worker: Worker<E>) -> Running {
        let handle = worker.handle();
        Running { handle, run: tokio::spawn(worker.run()) }
    }

    /// The worker's handle, to keep past [`stop`](Self::stop).
    pub fn handle(&self) -> WorkerHandle {
        self.handle.clone()
    }

    /// Whether its run has ended.
    pub fn is_finished(&self) -> bool {
        self.run.is_finished()
    }

    /// Shuts the worker down gracefully and waits until its run ends; the
    /// test fails if the run panicked.
    pub async fn stop(self) {
        self.handle.shutdown();
        self.run.await.expect("the worker ends");
    }

    /// Waits until its run ends, by itself or after a stop asked through
    /// the handle; the test fails past `limit` or if the run panicked.
    pub async fn ended(self, limit: Duration) {
        tokio::time::timeout(limit, self.run)
            .await
            .expect("the worker stops in time")
            .expect("the worker ends");
    }
}

impl std::ops::Deref for Running {
    type Target = WorkerHandle;

    fn deref(&self) -> &WorkerHandle {
        &self.handle
    }
}
