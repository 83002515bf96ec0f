//! Configuring a worker: every setting, its default, and the checks of `build`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use waymark_store::{ClaimRequest, Error, FleetLimit, PgExecutor, RetryBackoff, Store};

use super::run::Worker;
use crate::call::{Kind, Registration};
use crate::claim;
use crate::shared::{ErrorHook, HandlerOptions, Settings, Shared, State, StatementBudget, WorkerError};

/// The longest lease or retry backoff a worker takes: far past any real
/// need, and far inside the protocol's int8 milliseconds and `Instant`'s range.
const LONGEST: Duration = Duration::from_secs(366 * 24 * 3600);
/// The largest batch a batch handler takes (as `Store::submit_batch`).
const MAX_BATCH: usize = 10_000;

/// Configures a [`Worker`]; every setting's doc states its default.
pub struct WorkerBuilder<E> {
    store: Arc<Store<E>>,
    queues: Vec<String>,
    concurrency: usize,
    lease: Duration,
    heartbeat: Option<Duration>,
    poll_interval: Duration,
    held_sweep: Option<Duration>,
    max_run_time: Option<Duration>,
    shutdown_grace: Duration,
    backoff: RetryBackoff,
    settle_batch: usize,
    settle_window: Duration,
    statement_concurrency: usize,
    worker_id: Option<String>,
    on_error: ErrorHook,
    resources: HashMap<String, usize>,
    fleet_limits: Vec<FleetLimit>,
    handlers: HashMap<String, Registration<E>>,
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

impl<E: PgExecutor + 'static> Worker<E> {
    /// A builder for a worker over `store`.
    pub fn builder(store: impl Into<Arc<Store<E>>>) -> WorkerBuilder<E> {
        WorkerBuilder::new(store.into())
    }
}

impl<E: PgExecutor + 'static> WorkerBuilder<E> {
    fn new(store: Arc<Store<E>>) -> Self {
        WorkerBuilder {
            store,
            queues: vec!["default".to_owned()],
            concurrency: 10,
            lease: Duration::from_secs(30),
            heartbeat: None,
            poll_interval: Duration::from_secs(1),
            held_sweep: Some(Duration::from_secs(1)),
            max_run_time: None,
            shutdown_grace: Duration::from_secs(10),
            backoff: RetryBackoff::default(),
            settle_batch: 64,
            settle_window: Duration::from_millis(2),
            statement_concurrency: 2,
            worker_id: None,
            on_error: Arc::new(
                |e: &WorkerError| tracing::warn!(during = %e.during, error = %e.error, "waymark worker"),
            ),
            resources: HashMap::new(),
            fleet_limits: Vec::new(),
            handlers: HashMap::new(),
        }
    }

    /// Queues to claim from. Defaults to `["default"]`.
    pub fn queues<Q: Into<String>>(mut self, queues: impl IntoIterator<Item = Q>) -> Self {
        self.queues = queues.into_iter().map(Into::into).collect();
        self
    }

    /// Keeps to a limit on running tasks across the whole fleet (see
    /// [`FleetLimit`]): this worker claims the tasks the limit covers only
    /// into its free slots. Every worker that runs those tasks must be
    /// given the same limit; workers without it (and cairnq SDK workers)
    /// claim past it, though their running tasks count against it. A task
    /// may fall under one fleet limit at most. Defaults to none.
    pub fn fleet_limit(mut self, limit: FleetLimit) -> Self {
        self.fleet_limits.push(limit);
        self
    }

    /// Most handler calls at once (a batch handler's call counts once).
    /// A call's slot comes free when its handler ends; its settlement then
    /// commits in the background, batched, so a worker of few slots is not
    /// held to one settlement commit per turn. Defaults to 10.
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

    /// How often the worker runs the held ledger's upkeep
    /// ([`Store::sweep_held`](waymark_store::Store::sweep_held)): it passes
    /// on the ends of released held tasks that no waymark settlement passed
    /// on (settled by another SDK, by plain SQL, or by a lease that expired
    /// for good), and applies event deadlines. `None` turns it off (another
    /// process must run it then). Defaults to every second.
    pub fn held_sweep_interval(mut self, every: Option<Duration>) -> Self {
        self.held_sweep = every;
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

    /// How many claim and settlement statements the worker runs at once,
    /// together. Defaults to 2. Each writes many rows of the task table
    /// near the same index pages, and past what the server's cores run in
    /// parallel more of them at once wait on each other's buffer locks
    /// instead of working: on a two-core server, 2 drained about a fifth
    /// faster than a worker did before there was a budget (up to six at
    /// once, three on average; docs/benchmarks.md). Raise it for a server
    /// of many cores that this worker has to itself, or when round trips
    /// are long. Heartbeats, give-backs, and settlements that skip the
    /// batcher (batching off, a handler's own `complete`, `fail`, `snooze`
    /// or `complete_in`) run outside it; a claim or flush that has held its
    /// place for a second gives it up.
    pub fn statement_concurrency(mut self, n: usize) -> Self {
        self.statement_concurrency = n;
        self
    }

    /// The worker's id. Defaults to `waymark-<pid>-<random>`. Each claim
    /// writes an id of its own into the rows it claims: this id, `/`, and
    /// the claim's number (`waymark_store::claim_id`), which every owned
    /// write of the claim names.
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

    /// Declares a resource: `capacity` calls may hold it at once on this
    /// worker, across every handler that names it with
    /// [`HandlerOptions::resource`]. The claim never takes a task whose call
    /// could not get a unit.
    pub fn resource(mut self, name: impl Into<String>, capacity: usize) -> Self {
        self.resources.insert(name.into(), capacity);
        self
    }

    pub(super) fn register(mut self, name: String, kind: Kind<E>, options: HandlerOptions) -> Self {
        let pace = (options.quick && matches!(kind, Kind::One(_))).then(Arc::default);
        self.handlers.insert(name, Registration { kind, options, pace });
        self
    }

    /// Builds the worker; bad settings are refused with the setting named.
    pub fn build(self) -> Result<Worker<E>, Error> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.concurrency == 0 {
            return bad("concurrency must be at least 1".to_owned());
        }
        if !(1..=StatementBudget::MAX_PLACES).contains(&self.statement_concurrency) {
            return bad(format!(
                "statement_concurrency must be 1 to {}, got {}",
                StatementBudget::MAX_PLACES,
                self.statement_concurrency
            ));
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
        if self.held_sweep.is_some_and(|d| d.is_zero()) {
            return bad("held_sweep_interval must be positive".to_owned());
        }
        if self.poll_interval.is_zero() {
            return bad("poll_interval must be positive".to_owned());
        }
        if let Some((r, _)) = self.resources.iter().find(|(r, n)| r.is_empty() || **n == 0) {
            return bad(format!("resource {r:?} needs a non-empty name and a capacity of at least 1"));
        }
        for (name, reg) in &self.handlers {
            claim::check(name, &reg.options, &self.resources)?;
            if let Kind::Batch(_, max) = reg.kind {
                if !(1..=MAX_BATCH).contains(&max) {
                    return bad(format!(
                        "the batch size of handler {name:?} must be 1 to {MAX_BATCH}, got {max}"
                    ));
                }
            }
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
            held_sweep: self.held_sweep,
            max_run_time: self.max_run_time,
            shutdown_grace: self.shutdown_grace,
            backoff: self.backoff,
            settle_batch: self.settle_batch,
            settle_window: self.settle_window,
            worker_id: worker_id.into(),
        };
        let request = ClaimRequest::new(settings.worker_id.to_string(), settings.queues.iter().cloned())
            .lease(settings.lease);
        for limit in &self.fleet_limits {
            limit.check()?;
        }
        let draws: Vec<(&String, usize, &HandlerOptions)> = self
            .handlers
            .iter()
            .map(|(name, reg)| {
                let batch = match reg.kind {
                    Kind::Batch(_, max) => max,
                    Kind::One(_) => 1,
                };
                (name, batch, &reg.options)
            })
            .collect();
        let planner = claim::plan(&draws, &self.resources, &self.fleet_limits, &settings.queues, request)?;
        Ok(Worker {
            // Looked up per call: a fast hash of the name.
            handlers: Arc::new(self.handlers.into_iter().collect()),
            planner: Arc::new(planner),
            shared: Arc::new(Shared {
                store: self.store,
                on_error: self.on_error,
                statements: Arc::new(StatementBudget::new(self.statement_concurrency)),
                settings,
                state: State::default(),
            }),
        })
    }
}
