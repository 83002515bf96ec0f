//! The thread a registry's hubs run on.
//!
//! A hub is shared by every caller of its key, so it must not live and die
//! with the runtime of whichever caller happened to lease it first: when
//! that runtime ends (a test's runtime, one of several runtimes in an app),
//! the others would lose their stream. A registry therefore runs its hubs,
//! and its idle timers, on a current-thread runtime of its own, on one
//! thread, started at the first lease and stopped when the registry goes.

use std::io;
use std::sync::mpsc;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

/// A running background runtime; dropping it stops the thread, and with it
/// every task still on it (a hub's session is closed by its drop).
pub(crate) struct Background {
    handle: Handle,
    // Dropped with the registry: the thread's wait ends and its runtime is
    // dropped there, outside any async context.
    _stop: oneshot::Sender<()>,
}

impl Background {
    /// Starts the thread and waits (briefly: a runtime's build) for its
    /// runtime. The runtime is built and dropped on that thread only: a
    /// runtime dropped on the caller's would panic inside async code.
    pub(crate) fn start() -> io::Result<Background> {
        let (stop, stopped) = oneshot::channel::<()>();
        let (started_tx, started) = mpsc::sync_channel::<io::Result<Handle>>(1);
        std::thread::Builder::new().name("waymark-notify".to_owned()).spawn(move || {
            let runtime = match Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                    return;
                }
            };
            if started_tx.send(Ok(runtime.handle().clone())).is_err() {
                return;
            }
            runtime.block_on(async {
                // Ok or Err both mean the registry is gone.
                let _ = stopped.await;
            });
        })?;
        let handle =
            started.recv().map_err(|_| io::Error::other("the thread ended before its runtime started"))??;
        Ok(Background { handle, _stop: stop })
    }

    /// Where to spawn the registry's tasks.
    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }
}
