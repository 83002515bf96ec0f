//! OpenTelemetry for waymark: metrics and traces of every submit, claim,
//! run and settlement, queue depths and pool statistics, through the
//! `opentelemetry` API (bring your own SDK and exporter).
//!
//! ```no_run
//! # async fn demo(pool: waymark_pool::PgPool) -> waymark_store::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use waymark_otel::Telemetry;
//! use waymark_store::{ConnectOptions, Store};
//!
//! // The global meter and tracer providers (set by your SDK set-up).
//! let telemetry = Telemetry::global();
//! let options = ConnectOptions::new().observer(Arc::new(telemetry.clone()));
//! let store = Store::connect(pool.clone(), options).await?;
//! // Gauges: counts by queue and status, read every 30 s; the pool's stats.
//! let _depths = telemetry.observe_queues(store.clone(), Duration::from_secs(30));
//! let _pool = telemetry.observe_pool("waymark", &pool);
//! // A worker built on `store` reports its runs too.
//! # Ok(()) }
//! ```
//!
//! **Traces.** A submit starts a `submit <queue>` span (kind producer),
//! child of the caller's current span, and writes its context into each
//! task's metadata as W3C `traceparent` (and `tracestate`) keys, when that
//! metadata is a JSON object: metadata of another kind (a string, an
//! array, null) is left as written, and its task's run starts a trace of
//! its own. A worker's run of the task is a `run <queue>` span (kind
//! consumer) whose parent is that context, so the submitter's trace holds
//! the run, also when a cairnq client wrote the keys (see
//! [`propagation`]). The run's span is the
//! current context while the handler is polled: the handler's own spans,
//! and tasks it submits, are its children. Claims (that claimed something)
//! and settlement writes are `claim <queue>` and `settle` spans (kind
//! client); a settlement made inside a run is a child of the run's span, a
//! batched one stands alone with its size.
//!
//! **Metrics.** Names follow OpenTelemetry's messaging conventions where one
//! applies; every measurement of a task or an operation has
//! `messaging.system = "waymark"`, and the queue as
//! `messaging.destination.name`, the handler name as `waymark.task.name`
//! (the pool's carry `db.client.connection.pool.name` instead). Two stores
//! on different schemas with the same queue names report the same
//! attributes: give each its own meter provider (with a resource attribute
//! naming the installation) to tell them apart.
//!
//! | instrument | kind | what |
//! | --- | --- | --- |
//! | `messaging.client.sent.messages` | counter | tasks submitted (a failed submit with `error.type`) |
//! | `messaging.client.consumed.messages` | counter | tasks claimed |
//! | `messaging.client.operation.duration` | histogram, s | each submit, claim and settlement write, by `messaging.operation.name` |
//! | `messaging.process.duration` | histogram, s | handler time per task (`error.type` when it failed) |
//! | `waymark.task.pickup.duration` | histogram, s | due time to claim, by the database's clock |
//! | `waymark.tasks.settled` | counter | runs settled, by `waymark.task.outcome`: `succeeded`, `failed`, `canceled`, `retried`, `snoozed` |
//! | `waymark.leases.lost` | counter | leases a worker lost before settling |
//! | `waymark.tasks.given_back` | counter | tasks given back unspent (at shutdown, or claimed ahead and never started), by `waymark.task.status` |
//! | `waymark.runs.unconfirmed` | counter | runs whose settlement no answer confirmed (the lease decides) |
//! | `waymark.settle.batch.size` | histogram | settlements per settlement write |
//! | `waymark.queue.depth` | gauge | tasks by queue and `waymark.task.status` ([`Telemetry::observe_queues`]) |
//! | `db.client.connection.count`, `db.client.connection.pending_requests`, `waymark.pool.*` | gauges, counters | pool statistics ([`Telemetry::observe_pool`]) |
//!
//! The observer is called on each operation's own task and only records;
//! `cargo xtask bench` measures its cost at full drain.

mod gauges;
mod metrics;
mod observer;
pub mod propagation;

use std::fmt;
use std::sync::Arc;

use opentelemetry::global::BoxedTracer;
use opentelemetry::metrics::{Meter, MeterProvider};
use opentelemetry::trace::TracerProvider;
use opentelemetry::InstrumentationScope;

#[cfg(feature = "pool")]
pub use gauges::PoolMetrics;
pub use gauges::QueueDepths;

/// The name of the instrumentation scope of waymark's meter and tracer.
pub const SCOPE: &str = "waymark";

/// Metrics and traces for a store and its workers: install it with
/// [`ConnectOptions::observer`](waymark_store::ConnectOptions::observer).
/// Cloning shares the instruments.
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

struct Inner {
    meter: Meter,
    tracer: BoxedTracer,
    instruments: metrics::Instruments,
    labels: metrics::Labels,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Telemetry {
    /// On the global meter and tracer providers
    /// (`opentelemetry::global::set_meter_provider` and
    /// `set_tracer_provider`), as they are when this is called.
    pub fn global() -> Self {
        Telemetry::from_parts(
            opentelemetry::global::meter_with_scope(scope()),
            opentelemetry::global::tracer_with_scope(scope()),
        )
    }

    /// On these providers.
    pub fn new<M, T>(meters: &M, tracers: &T) -> Self
    where
        M: MeterProvider,
        T: TracerProvider,
        T::Tracer: Send + Sync + 'static,
        <T::Tracer as opentelemetry::trace::Tracer>::Span: Send + Sync + 'static,
    {
        Telemetry::from_parts(
            meters.meter_with_scope(scope()),
            BoxedTracer::new(Box::new(tracers.tracer_with_scope(scope()))),
        )
    }

    fn from_parts(meter: Meter, tracer: BoxedTracer) -> Self {
        let instruments = metrics::Instruments::new(&meter);
        Telemetry {
            inner: Arc::new(Inner { meter, tracer, instruments, labels: metrics::Labels::default() }),
        }
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder(SCOPE).with_version(env!("CARGO_PKG_VERSION")).build()
}
