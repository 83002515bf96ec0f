//! What the builder settled, fixed for the worker's life: the worker's
//! settings, each handler's options, and the hook its survived failures go to.

use std::sync::Arc;
use std::time::Duration;

use waymark_store::{Error, RetryBackoff};

/// A failure the worker survived (a claim, heartbeat or settlement that
/// failed), passed to the error hook.
#[derive(Debug)]
pub struct WorkerError {
    /// What the worker was doing, such as `claim` or `settle task_01...`.
    pub during: String,
    /// The cause.
    pub error: Error,
}

pub(crate) type ErrorHook = Arc<dyn Fn(&WorkerError) + Send + Sync>;

/// What the builder settled; fixed for the worker's life.
pub(crate) struct Settings {
    pub(crate) queues: Vec<String>,
    pub(crate) concurrency: usize,
    pub(crate) lease: Duration,
    pub(crate) heartbeat: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) held_sweep: Option<Duration>,
    pub(crate) max_run_time: Option<Duration>,
    pub(crate) shutdown_grace: Duration,
    pub(crate) backoff: RetryBackoff,
    pub(crate) settle_batch: usize,
    pub(crate) settle_window: Duration,
    pub(crate) worker_id: Arc<str>,
}

/// Options of one handler registration; see [`WorkerBuilder::task_with`].
///
/// [`WorkerBuilder::task_with`]: crate::WorkerBuilder::task_with
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandlerOptions {
    pub(crate) resource: Option<String>,
    pub(crate) max_running: Option<usize>,
    pub(crate) quick: bool,
}

impl HandlerOptions {
    /// No limits beyond the worker's concurrency.
    pub fn new() -> Self {
        HandlerOptions::default()
    }

    /// Each call of this handler holds one unit of the worker's resource
    /// `name` (declared with [`WorkerBuilder::resource`]) while it runs,
    /// shared with every handler that names it: at capacity 1, the
    /// handlers naming it never run at once. Defaults to none.
    ///
    /// [`WorkerBuilder::resource`]: crate::WorkerBuilder::resource
    pub fn resource(mut self, name: impl Into<String>) -> Self {
        self.resource = Some(name.into());
        self
    }

    /// At most `n` calls of this handler at once on this worker. Defaults
    /// to the worker's concurrency.
    pub fn max_running(mut self, n: usize) -> Self {
        self.max_running = Some(n);
        self
    }

    /// Declares the handler quick: its calls end within their first poll,
    /// in well under 100 µs, or await, and never block their thread. The
    /// worker then runs its calls a group at a time (up to 32 on one
    /// runner, each polled once, one after another) instead of waking a
    /// runner per call, which spares a short handler part of the worker's
    /// cost per call (15 to 17 % of the worker's CPU for a no-op handler;
    /// docs/benchmarks.md, "Where the time goes, and what limits it"). Its calls join groups only
    /// after sixteen in a row have ended in their first poll. A call that
    /// awaits in its first poll goes on on a runner of its own, once the
    /// rest of its group has been polled, and sends the handler's next
    /// calls to a runner each until it has shown again that they end at
    /// once; so do first polls longer than about 100 µs (one of them is
    /// forgiven after a long run of quick ones). Calls already in a group
    /// run there still. A worker that settles each task on its own
    /// (`settle_batch(1, _)`) gains nothing: every call awaits its
    /// settlement.
    ///
    /// The price, if the declaration is wrong: a call that blocks its
    /// thread holds up the calls after it in its group (calls of any quick
    /// handler started with it, and one before it that awaited), and a
    /// task that the calls before it woke (the settlement batcher, the
    /// claim loop) can wait on that thread until it returns. Undeclared,
    /// each call has a runner of its own and a blocking call holds up no
    /// other. Defaults to off; ignored for blocking and batch handlers.
    pub fn quick(mut self) -> Self {
        self.quick = true;
        self
    }
}
