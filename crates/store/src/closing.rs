//! Closing a store: the flag every operation checks first, and what the
//! store's background work (its LISTEN consumers, its sweepers) watches to
//! stop. Shared by the clones of one store: closing one closes them all.
//!
//! The executor is the caller's and is never closed: a pool handed to a
//! store goes on serving its other users, and a new store over it works.

use tokio::sync::{watch, RwLock, RwLockReadGuard};

use crate::error::{Error, Result};
use crate::executor::PgExecutor;
use crate::store::Store;

#[derive(Debug)]
pub(crate) struct Life {
    closed: watch::Sender<bool>,
    /// Held shared by each sweep under way; `close` takes it exclusively,
    /// so it returns only once no sweep of this store is mid-purge.
    sweeps: RwLock<()>,
}

impl Default for Life {
    fn default() -> Self {
        Life { closed: watch::channel(false).0, sweeps: RwLock::new(()) }
    }
}

impl Life {
    /// Fails with [`Error::StoreClosed`] once the store is closed.
    pub(crate) fn check(&self) -> Result<()> {
        if *self.closed.borrow() {
            Err(Error::StoreClosed)
        } else {
            Ok(())
        }
    }

    /// Resolves when the store closes.
    pub(crate) fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.closed.subscribe();
        async move {
            // An error means the store itself is gone: closed for good too.
            let _ = rx.wait_for(|closed| *closed).await;
        }
    }

    /// Marks a sweep under way, or `None` once the store is closed.
    pub(crate) async fn sweeping(&self) -> Option<RwLockReadGuard<'_, ()>> {
        let guard = self.sweeps.read().await;
        // Checked under the guard: `close` sets the flag before it waits
        // for the write side, so no sweep starts after `close` returned.
        self.check().ok().map(|()| guard)
    }
}

impl<E: PgExecutor> Store<E> {
    /// Closes the store: every later call of it (and of its clones) fails
    /// with [`Error::StoreClosed`], its LISTEN streams are dropped (a pool's
    /// listener hub is released with them), waits under way end with
    /// [`Error::StoreClosed`] at their next read, and its [`Sweeper`]s stop.
    /// Returns once no sweep is mid-purge. A call already running finishes
    /// as it would have. The executor is not closed. Closing twice is a
    /// no-op.
    ///
    /// [`Sweeper`]: crate::Sweeper
    pub async fn close(&self) {
        self.life.closed.send_replace(true);
        // Waiters and watchers re-read now, and meet the closed store.
        self.signals.wake_everyone();
        drop(self.life.sweeps.write().await);
    }

    /// Whether [`Store::close`] was called on this store or a clone.
    pub fn is_closed(&self) -> bool {
        self.life.check().is_err()
    }
}
