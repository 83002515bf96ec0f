//! Closing a store: the flag every operation checks first, and what the
//! store's background work (its LISTEN consumers, its sweepers) watches to
//! stop. Shared by the clones of one store: closing one closes them all.
//!
//! The executor is the caller's and is never closed: a pool handed to a
//! store goes on serving its other users, and a new store over it works.

use tokio::sync::{watch, RwLock, RwLockReadGuard};

use crate::error::{Error, Result};

/// A store's life: open until `Store::close`. Shared by its clones.
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

    /// Closes: every later check fails, and `closed` resolves.
    pub(crate) fn close(&self) {
        self.closed.send_replace(true);
    }

    /// Waits until no sweep is under way; a sweep that starts after
    /// [`Life::close`] finds the store closed and never runs.
    pub(crate) async fn sweeps_ended(&self) {
        drop(self.sweeps.write().await);
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
