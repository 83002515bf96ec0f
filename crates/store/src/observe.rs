//! What a store and its workers let an observer see: each submit, claim
//! and settlement, and each run of a task. `waymark-otel` turns these into
//! OpenTelemetry metrics and spans; anything else (a test, a custom
//! exporter) can implement [`Observer`] too.
//!
//! Every method has a default that does nothing, and a store without an
//! observer pays one `Option` check per operation. The calls are made on the
//! operation's own task, before and after its statements, so an observer
//! must be quick and must not block: record, never wait.

use std::fmt;
use std::time::Duration;

use crate::error::Error;
use crate::new_task::NewTask;
use crate::task::{Task, TaskStatus};

/// Sees a store's operations, installed with
/// [`ConnectOptions::observer`](crate::ConnectOptions::observer). A worker on that
/// store reports its runs to it too ([`Observer::run`]).
pub trait Observer: Send + Sync + fmt::Debug + 'static {
    /// A submit (one task, or a batch) is about to write `tasks`; the
    /// observer may change them (waymark-otel puts the trace context in
    /// their metadata). The scope returned is ended with the outcome once
    /// the write answers. A keyed submit that finds its key's task counts
    /// as submitted: the caller got a task back.
    fn submit(&self, tasks: &mut [NewTask]) -> Option<Box<dyn Scope<()>>> {
        let _ = tasks;
        None
    }

    /// A claim pass over `queues` is starting; its scope ends with the
    /// tasks it claimed (an empty slice when none was due).
    fn claim(&self, queues: &[String]) -> Option<Box<dyn Scope<[Task]>>> {
        let _ = queues;
        None
    }

    /// A settlement write of `count` settlements (one, or a batch) is
    /// starting: `complete`, `fail` or `settle_batch`.
    fn settle(&self, count: usize) -> Option<Box<dyn Scope<()>>> {
        let _ = count;
        None
    }

    /// A worker is starting the run of `task`, which it just claimed. The
    /// scope lasts until the run's end is known (see [`RunScope`]).
    fn run(&self, task: &Task) -> Option<Box<dyn RunScope>> {
        let _ = task;
        None
    }
}

/// One operation, ended once with its outcome: `Ok` with what it answered,
/// or the error the caller got. Dropped without [`Scope::end`] only if the
/// operation's future was dropped mid-way (its outcome unknown).
pub trait Scope<T: ?Sized>: Send {
    /// The operation answered.
    fn end(self: Box<Self>, outcome: Result<&T, &Error>);
}

/// One task's run on a worker.
pub trait RunScope: Send + Sync {
    /// Polls the run's future (or calls a blocking handler) inside the
    /// observer's context: waymark-otel makes the run's span the current
    /// one here, so the handler's own spans and submits are its children.
    /// Must call `poll` exactly once.
    fn enter(&self, poll: &mut dyn FnMut()) {
        poll();
    }

    /// The handler answered after `took`: with an error (`Some`, the
    /// error's type as the envelope names it: `HandlerTimeout`, `Panic`,
    /// a handler's own) or not (`None`). May come after [`RunScope::end`]
    /// when the run ended first (the handler settled the task itself, or
    /// its lease was lost); not at all for a run stopped at shutdown that
    /// did not answer in time.
    fn returned(&self, took: Duration, error: Option<&str>) {
        let _ = (took, error);
    }

    /// The run is over, and how; called once.
    fn end(&self, end: RunEnd);
}

/// How a run ended, as its worker saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunEnd {
    /// Its settlement committed and left the task in this status
    /// (`Queued` for a retry).
    Settled(TaskStatus),
    /// The worker lost the task's lease; its settlement, if any, was not
    /// made.
    LeaseLost,
    /// Shutdown gave the task back (`Queued`, its attempt unspent), or
    /// ended it `Canceled` on a cancel request.
    GivenBack(TaskStatus),
    /// Nothing the worker wrote is known to have committed (a settlement
    /// that failed, a give-back that did not answer): the lease decides.
    Unknown,
}

/// Starts a scope if there is an observer.
pub(crate) fn start<T: ?Sized>(
    observer: Option<&std::sync::Arc<dyn Observer>>,
    begin: impl FnOnce(&dyn Observer) -> Option<Box<dyn Scope<T>>>,
) -> Option<Box<dyn Scope<T>>> {
    observer.and_then(|o| begin(&**o))
}

/// Ends a scope, if one was started.
pub(crate) fn end<T: ?Sized>(scope: Option<Box<dyn Scope<T>>>, outcome: Result<&T, &Error>) {
    if let Some(scope) = scope {
        scope.end(outcome);
    }
}

/// Awaits `op`, then ends `scope` (if one was started) with its outcome.
pub(crate) async fn within<T>(
    scope: Option<Box<dyn Scope<()>>>,
    op: impl std::future::Future<Output = crate::error::Result<T>>,
) -> crate::error::Result<T> {
    let out = op.await;
    end(scope, out.as_ref().map(|_| &()));
    out
}
