//! The worker: a claim loop, a heartbeat loop, runners for the calls,
//! settlement once per task, and graceful shutdown.

use std::sync::Arc;

use waymark_store::{PgExecutor, Store};

use super::handle::WorkerHandle;
use super::heartbeat::heartbeat_loop;
use super::held_sweep::held_sweep_loop;
use super::shutdown::shutdown;
use crate::call::{Handlers, Runs};
use crate::claim::{claim_loop, Planner};
use crate::settle::Settler;
use crate::shared::{Shared, WorkerEvent};

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

impl<E: PgExecutor + 'static> Worker<E> {
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
        WorkerHandle::new(&self.shared)
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
        let _held = shared
            .settings
            .held_sweep
            .map(|every| AbortOnDrop(tokio::spawn(held_sweep_loop(shared.clone(), every))));
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

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
