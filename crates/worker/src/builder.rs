//! Configuring a worker: every setting, its default, and the checks of `build`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use waymark_store::{Error, PgExecutor, RetryBackoff, Store};

use crate::context::TaskContext;
use crate::error::TaskError;
use crate::handler::{Handler, Typed};
use crate::worker::{ErrorHook, Settings, Shared, State, Worker, WorkerError};

/// The longest lease or retry backoff a worker takes: far past any real
/// need, and far inside the protocol's int8 milliseconds and `Instant`'s range.
const LONGEST: Duration = Duration::from_secs(366 * 24 * 3600);
/// Configures a [`Worker`]; every setting's doc states its default.
pub struct WorkerBuilder<E> {
    store: Arc<Store<E>>,
    queues: Vec<String>,
    concurrency: usize,
    lease: Duration,
    heartbeat: Option<Duration>,
    poll_interval: Duration,
    max_run_time: Option<Duration>,
    shutdown_grace: Duration,
    backoff: RetryBackoff,
    settle_batch: usize,
    settle_window: Duration,
    worker_id: Option<String>,
    on_error: ErrorHook,
    handlers: HashMap<String, Arc<dyn Handler<E>>>,
}

impl<E> std::fmt::Debug for WorkerBuilder<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("queues", &self.queues)
            .field("concurrency", &self.concurrency)
            .field("handlers", &self.handlers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl<E: PgExecutor + 'static> WorkerBuilder<E> {
    pub(crate) fn new(store: Arc<Store<E>>) -> Self {
        WorkerBuilder {
            store,
            queues: vec!["default".to_owned()],
            concurrency: 10,
            lease: Duration::from_secs(30),
            heartbeat: None,
            poll_interval: Duration::from_secs(1),
            max_run_time: None,
            shutdown_grace: Duration::from_secs(10),
            backoff: RetryBackoff::default(),
            settle_batch: 64,
            settle_window: Duration::from_millis(2),
            worker_id: None,
            on_error: Arc::new(
                |e: &WorkerError| tracing::warn!(during = %e.during, error = %e.error, "waymark worker"),
            ),
            handlers: HashMap::new(),
        }
    }

    /// Queues to claim from. Defaults to `["default"]`.
    pub fn queues<Q: Into<String>>(mut self, queues: impl IntoIterator<Item = Q>) -> Self {
        self.queues = queues.into_iter().map(Into::into).collect();
        self
    }

    /// Most tasks running at once. Defaults to 10.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Lease length of each claim. Defaults to 30 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often every held lease is renewed. Defaults to a third of the
    /// lease, at least 50 ms.
    pub fn heartbeat_interval(mut self, every: Duration) -> Self {
        self.heartbeat = Some(every);
        self
    }

    /// How often to look for work without a wakeup. Defaults to 1 s.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// Longest run of one task; past it the run is stopped and the task
    /// fails (retryable) with code `handler_timeout`. Defaults to none.
    pub fn max_run_time(mut self, limit: Duration) -> Self {
        self.max_run_time = Some(limit);
        self
    }

    /// How long shutdown lets running handlers finish before it cancels
    /// them and gives their tasks back. Defaults to 10 s.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Retry backoff of failed runs. Defaults to base 1 s, max 30 s.
    pub fn retry_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff = RetryBackoff { base, max };
        self
    }

    /// Settlement batching: up to `max` settlements that arrive within
    /// `window` commit in one transaction. `max` of 1 turns batching off.
    /// Defaults to 64 and 2 ms.
    pub fn settle_batch(mut self, max: usize, window: Duration) -> Self {
        self.settle_batch = max;
        self.settle_window = window;
        self
    }

    /// The worker's id on the tasks it claims. Defaults to
    /// `waymark-<pid>-<random>`.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    /// Called with each failure the worker survives. Defaults to a
    /// `tracing` warning.
    pub fn on_error(mut self, hook: impl Fn(&WorkerError) + Send + Sync + 'static) -> Self {
        self.on_error = Arc::new(hook);
        self
    }

    /// Registers the handler for tasks named `name`. The payload is
    /// deserialised into `P` (a mismatch fails the task for good); the
    /// result `R` is serialised as the task's result.
    pub fn task<F, P, R, Fut>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        F: Fn(TaskContext<E>, P) -> Fut + Send + Sync + 'static,
        P: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        Fut: Future<Output = Result<R, TaskError>> + Send + 'static,
    {
        self.handlers.insert(name.into(), Arc::new(Typed(handler, std::marker::PhantomData)));
        self
    }

    /// Builds the worker; bad settings are refused with the setting named.
    pub fn build(self) -> Result<Worker<E>, Error> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.concurrency == 0 {
            return bad("concurrency must be at least 1".to_owned());
        }
        if self.queues.is_empty() || self.queues.iter().any(|q| q.is_empty()) {
            return bad("queues must name at least one queue, none of them empty".to_owned());
        }
        if self.handlers.is_empty() {
            return bad("a worker needs at least one handler (WorkerBuilder::task)".to_owned());
        }
        if self.lease < Duration::from_millis(10) {
            return bad(format!("lease must be at least 10 ms, got {:?}", self.lease));
        }
        if self.lease > LONGEST {
            return bad(format!("lease must be at most {LONGEST:?}, got {:?}", self.lease));
        }
        if self.backoff.max > LONGEST {
            return bad(format!("retry backoff max must be at most {LONGEST:?}, got {:?}", self.backoff.max));
        }
        let heartbeat = self.heartbeat.unwrap_or(self.lease / 3).max(Duration::from_millis(50));
        if heartbeat >= self.lease {
            return bad(format!(
                "heartbeat interval {heartbeat:?} must be shorter than the lease {:?}",
                self.lease
            ));
        }
        if self.poll_interval.is_zero() {
            return bad("poll_interval must be positive".to_owned());
        }
        let worker_id = self
            .worker_id
            .unwrap_or_else(|| format!("waymark-{}-{:08x}", std::process::id(), rand::random::<u32>()));
        let settings = Settings {
            queues: self.queues,
            concurrency: self.concurrency,
            lease: self.lease,
            heartbeat,
            poll_interval: self.poll_interval,
            max_run_time: self.max_run_time,
            shutdown_grace: self.shutdown_grace,
            backoff: self.backoff,
            settle_batch: self.settle_batch,
            settle_window: self.settle_window,
            worker_id: worker_id.into(),
        };
        Ok(Worker {
            shared: Arc::new(Shared {
                store: self.store,
                handlers: self.handlers,
                on_error: self.on_error,
                settings,
                state: State::default(),
            }),
        })
    }
}
