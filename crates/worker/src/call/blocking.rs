//! A blocking handler's closure, watched: it may outlive its run's future
//! (past `max_run_time`, or the shutdown grace), and holds its call's slot
//! and units until it returns.

use std::sync::Arc;

use crate::shared::{CallHold, Running};

/// Marks a blocking handler's closure running, until dropped with it.
/// It holds the call (its concurrency slot and its units) too: a closure
/// that outlives its run (past `max_run_time`) still occupies them.
#[derive(Debug)]
pub(crate) struct BlockingGuard {
    running: Arc<Running>,
    _call: Option<CallHold>,
}

impl BlockingGuard {
    /// Marks `running`'s closure running, holding what the run holds of
    /// its call.
    pub(super) fn new(running: Arc<Running>) -> Self {
        running.set_blocking(true);
        let call = running.call_hold();
        BlockingGuard { running, _call: call }
    }

    /// Calls a blocking handler inside the observer's context.
    pub(crate) fn enter<T>(&self, call: impl FnOnce() -> T) -> T {
        self.running.enter(call)
    }
}

impl Drop for BlockingGuard {
    fn drop(&mut self) {
        self.running.set_blocking(false);
    }
}
