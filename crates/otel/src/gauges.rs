//! Gauges read on the exporter's schedule: queue depths (from a snapshot
//! a background task refreshes, since a callback may not wait on the
//! database) and the pool's statistics.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::KeyValue;
use waymark_store::{Error, PgExecutor, StatusCounts, Store, TaskStatus};

use crate::metrics::{key, SYSTEM};
use crate::Telemetry;

/// The last depths read; `None` once the handle is dropped, so a read
/// finishing after that writes nothing.
type Snapshot = Arc<Mutex<Option<Vec<(String, StatusCounts)>>>>;

/// The `waymark.queue.depth` gauge of one store, refreshed in the
/// background until this is dropped (or the store closes). Started by
/// [`Telemetry::observe_queues`].
#[must_use = "the depths are reported only while the handle lives"]
pub struct QueueDepths {
    snapshot: Snapshot,
    refresh: Arc<dyn Fn() -> Refresh + Send + Sync>,
    task: tokio::task::JoinHandle<()>,
}

/// One read of the depths into the snapshot.
type Refresh = std::pin::Pin<Box<dyn std::future::Future<Output = waymark_store::Result<()>> + Send>>;

impl std::fmt::Debug for QueueDepths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueDepths").finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Reports the store's task counts by queue and status as the
    /// `waymark.queue.depth` gauge, read with one `stats` statement now and
    /// every `every` after (at least a second apart). A failed read clears
    /// the gauge until a read succeeds: no stale depths. Needs a tokio
    /// runtime.
    pub fn observe_queues<E: PgExecutor + Clone + 'static>(
        &self,
        store: Store<E>,
        every: Duration,
    ) -> QueueDepths {
        let snapshot: Snapshot = Arc::new(Mutex::new(Some(Vec::new())));
        let read = {
            let snapshot = snapshot.clone();
            Arc::new(move || -> Refresh {
                let (store, snapshot) = (store.clone(), snapshot.clone());
                Box::pin(async move { refresh(&store, &snapshot).await })
            })
        };
        let seen = snapshot.clone();
        // Registered once per call; the meter keeps the callback, which
        // reports nothing once the handle is dropped.
        let _gauge = self
            .inner
            .meter
            .i64_observable_gauge("waymark.queue.depth")
            .with_unit("{task}")
            .with_description("Tasks by queue and status.")
            .with_callback(move |observer| {
                for (queue, counts) in seen.lock().unwrap_or_else(|p| p.into_inner()).iter().flatten() {
                    for (status, n) in by_status(counts) {
                        let attributes = [
                            KeyValue::new(key::SYSTEM, SYSTEM),
                            KeyValue::new(key::DESTINATION, queue.clone()),
                            KeyValue::new(key::STATUS, status.as_str()),
                        ];
                        observer.observe(n, &attributes);
                    }
                }
            })
            .build();
        let every = every.max(Duration::from_secs(1));
        let looped = read.clone();
        let task = tokio::spawn(async move {
            loop {
                match looped().await {
                    Err(Error::StoreClosed) => return,
                    Err(e) => {
                        tracing::warn!(error = %e, "reading queue depths failed; the gauge is empty until a read succeeds")
                    }
                    Ok(()) => {}
                }
                tokio::time::sleep(every).await;
            }
        });
        QueueDepths { snapshot, refresh: read, task }
    }
}

impl QueueDepths {
    /// Reads the depths now, rather than at the next interval.
    pub async fn refresh(&self) -> waymark_store::Result<()> {
        (self.refresh)().await
    }
}

impl Drop for QueueDepths {
    fn drop(&mut self) {
        self.task.abort();
        *self.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

async fn refresh<E: PgExecutor>(store: &Store<E>, snapshot: &Snapshot) -> waymark_store::Result<()> {
    let read = store.stats(None).await;
    let mut held = snapshot.lock().unwrap_or_else(|p| p.into_inner());
    // Dropped meanwhile: the gauge stays empty.
    let Some(depths) = held.as_mut() else { return read.map(|_| ()) };
    match read {
        Ok(stats) => {
            *depths = stats.into_iter().collect();
            Ok(())
        }
        Err(e) => {
            depths.clear();
            Err(e)
        }
    }
}

fn by_status(c: &StatusCounts) -> [(TaskStatus, i64); 5] {
    [
        (TaskStatus::Queued, c.queued),
        (TaskStatus::Running, c.running),
        (TaskStatus::Succeeded, c.succeeded),
        (TaskStatus::Failed, c.failed),
        (TaskStatus::Canceled, c.canceled),
    ]
}

#[cfg(feature = "pool")]
pub use pool::PoolMetrics;

#[cfg(feature = "pool")]
mod pool {
    use std::sync::{Arc, Mutex};

    use opentelemetry::metrics::{AsyncInstrument, Meter};
    use opentelemetry::KeyValue;
    use waymark_pool::{BreakerState, PgPool, PoolStats};

    use crate::Telemetry;

    type Shared = Arc<Mutex<Option<PgPool>>>;

    /// The pool's gauges and counters, reported until this is dropped
    /// (the meter then holds no reference to the pool). Started by
    /// [`Telemetry::observe_pool`].
    #[must_use = "the pool is reported only while the handle lives"]
    pub struct PoolMetrics {
        pool: Shared,
    }

    impl std::fmt::Debug for PoolMetrics {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("PoolMetrics").finish_non_exhaustive()
        }
    }

    impl Drop for PoolMetrics {
        fn drop(&mut self) {
            *self.pool.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }

    const POOL: &str = "db.client.connection.pool.name";

    impl Telemetry {
        /// Reports `pool`'s statistics under `db.client.connection.pool.name
        /// = name`: `db.client.connection.count` (state `used`),
        /// `db.client.connection.pending_requests`, and counters
        /// `waymark.pool.acquires`, `waymark.pool.refusals` (by
        /// `waymark.pool.reason`: `saturated`, `breaker_open`),
        /// `waymark.pool.errors` (by `error.type`: `connection`, `capacity`,
        /// `query`, `timeout`), `waymark.pool.retries`; the gauge
        /// `waymark.pool.breaker.state` (1 for the state it is in, by
        /// `waymark.pool.breaker.state`) and `waymark.pool.acquire.wait`
        /// (seconds, by `waymark.quantile`: 0.5, 0.95).
        pub fn observe_pool(&self, name: &str, pool: &PgPool) -> PoolMetrics {
            let shared: Shared = Arc::new(Mutex::new(Some(pool.clone())));
            register(&self.inner.meter, name, &shared);
            PoolMetrics { pool: shared }
        }
    }

    fn register(meter: &Meter, name: &str, shared: &Shared) {
        let base = KeyValue::new(POOL, name.to_owned());
        let with = |extra: &[KeyValue]| {
            let mut a = vec![base.clone()];
            a.extend_from_slice(extra);
            a
        };

        // The pool's connections as the database client conventions count them.
        let in_use: fn(&PoolStats) -> i64 = |s| s.in_use as i64;
        let waiting: fn(&PoolStats) -> i64 = |s| s.waiting as i64;
        for (name, unit, what, value, a) in [
            (
                "db.client.connection.count",
                "{connection}",
                "Connections in use.",
                in_use,
                with(&[KeyValue::new("db.client.connection.state", "used")]),
            ),
            (
                "db.client.connection.pending_requests",
                "{request}",
                "Callers waiting for a connection.",
                waiting,
                with(&[]),
            ),
        ] {
            let _gauge = meter
                .i64_observable_up_down_counter(name)
                .with_unit(unit)
                .with_description(what)
                .with_callback(reporting(shared, move |s, o| o.observe(value(s), &a)))
                .build();
        }

        counter(meter, "waymark.pool.acquires", "{acquire}", "Calls admitted.", shared, {
            let a = with(&[]);
            move |s, o| o.observe(s.acquires, &a)
        });
        counter(meter, "waymark.pool.refusals", "{call}", "Calls refused.", shared, {
            let (sat, open) = (
                with(&[KeyValue::new("waymark.pool.reason", "saturated")]),
                with(&[KeyValue::new("waymark.pool.reason", "breaker_open")]),
            );
            move |s, o| {
                o.observe(s.saturated, &sat);
                o.observe(s.breaker_rejections, &open);
            }
        });
        counter(meter, "waymark.pool.errors", "{error}", "Failed calls, by kind.", shared, {
            let kinds = ["connection", "capacity", "query", "timeout"]
                .map(|k| with(&[KeyValue::new(crate::metrics::key::ERROR_TYPE, k)]));
            move |s, o| {
                for (n, a) in
                    [s.connection_errors, s.capacity_errors, s.query_errors, s.timeouts].iter().zip(&kinds)
                {
                    o.observe(*n, a);
                }
            }
        });
        counter(
            meter,
            "waymark.pool.retries",
            "{call}",
            "Calls sent again after a passing failure.",
            shared,
            {
                let a = with(&[]);
                move |s, o| o.observe(s.retries, &a)
            },
        );

        let states = [
            ("closed", BreakerState::Closed),
            ("open", BreakerState::Open),
            ("half_open", BreakerState::HalfOpen),
        ]
        .map(|(label, state)| (state, with(&[KeyValue::new("waymark.pool.breaker.state", label)])));
        let _breaker = meter
            .i64_observable_gauge("waymark.pool.breaker.state")
            .with_unit("{state}")
            .with_description("1 for the state the pool's circuit breaker is in, 0 for the others.")
            .with_callback(reporting(shared, move |s, o| {
                for (state, a) in &states {
                    o.observe(i64::from(s.breaker == *state), a);
                }
            }))
            .build();

        let (p50, p95) = (
            with(&[KeyValue::new("waymark.quantile", 0.5)]),
            with(&[KeyValue::new("waymark.quantile", 0.95)]),
        );
        let _wait = meter
            .f64_observable_gauge("waymark.pool.acquire.wait")
            .with_unit("s")
            .with_description("Wait for admission and a connection, over the last 4096 acquires.")
            .with_callback(reporting(shared, move |s, o| {
                o.observe(s.acquire_wait_p50.as_secs_f64(), &p50);
                o.observe(s.acquire_wait_p95.as_secs_f64(), &p95);
            }))
            .build();
    }

    fn counter(
        meter: &Meter,
        name: &'static str,
        unit: &'static str,
        what: &'static str,
        shared: &Shared,
        observe: impl Fn(&PoolStats, &dyn AsyncInstrument<u64>) + Send + Sync + 'static,
    ) {
        let _counter = meter
            .u64_observable_counter(name)
            .with_unit(unit)
            .with_description(what)
            .with_callback(reporting(shared, observe))
            .build();
    }

    /// An instrument's callback: `observe` reports the pool's statistics
    /// while the handle lives, and nothing once it is dropped.
    fn reporting<M>(
        shared: &Shared,
        observe: impl Fn(&PoolStats, &dyn AsyncInstrument<M>) + Send + Sync + 'static,
    ) -> impl Fn(&dyn AsyncInstrument<M>) + Send + Sync + 'static {
        let shared = shared.clone();
        move |o| {
            let stats = shared.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(PgPool::stats);
            if let Some(s) = stats {
                observe(&s, o);
            }
        }
    }
}
