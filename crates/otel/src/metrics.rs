//! The instruments, named after OpenTelemetry's semantic conventions for
//! messaging where one applies (`messaging.*`), and `waymark.*` where none
//! does. Every measurement carries `messaging.system = "waymark"`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use opentelemetry::metrics::{Counter, Histogram, Meter};
use opentelemetry::{KeyValue, StringValue, Value};

/// Attribute keys.
pub(crate) mod key {
    pub const SYSTEM: &str = "messaging.system";
    pub const OPERATION_NAME: &str = "messaging.operation.name";
    pub const OPERATION_TYPE: &str = "messaging.operation.type";
    pub const DESTINATION: &str = "messaging.destination.name";
    pub const MESSAGE_ID: &str = "messaging.message.id";
    pub const BATCH_COUNT: &str = "messaging.batch.message_count";
    pub const ERROR_TYPE: &str = "error.type";
    pub const TASK_NAME: &str = "waymark.task.name";
    pub const ATTEMPT: &str = "waymark.task.attempt";
    pub const OUTCOME: &str = "waymark.task.outcome";
    pub const STATUS: &str = "waymark.task.status";
}

/// The value of `messaging.system`.
pub(crate) const SYSTEM: &str = "waymark";

/// The queue and task-name attributes of each pair seen, built once, so a
/// run's measurements clone reference counts rather than strings (a no-op
/// drain is measured per microsecond). Pairs past [`Labels::MAX`] are
/// built each time rather than kept.
#[derive(Default)]
pub(crate) struct Labels(Mutex<LabelCache>);

#[derive(Default)]
pub(crate) struct LabelCache {
    pairs: usize,
    by_queue: HashMap<String, HashMap<String, Arc<[KeyValue; 2]>>>,
}

impl Labels {
    const MAX: usize = 10_000;

    /// `messaging.destination.name` and `waymark.task.name`.
    pub(crate) fn of(&self, queue: &str, name: &str) -> Arc<[KeyValue; 2]> {
        let mut cache = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(labels) = cache.by_queue.get(queue).and_then(|names| names.get(name)) {
            return labels.clone();
        }
        let text = |s: &str| Value::String(StringValue::from(Arc::<str>::from(s)));
        let labels = Arc::new([
            KeyValue::new(key::DESTINATION, text(queue)),
            KeyValue::new(key::TASK_NAME, text(name)),
        ]);
        if cache.pairs < Self::MAX {
            cache.pairs += 1;
            cache.by_queue.entry(queue.to_owned()).or_default().insert(name.to_owned(), labels.clone());
        }
        labels
    }
}

/// Bounds of the duration histograms, in seconds: 1 ms to 5 min.
const SECONDS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// Bounds of the batch size histogram.
const SIZES: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];

#[derive(Debug, Clone)]
pub(crate) struct Instruments {
    /// Tasks submitted (failed submits carry `error.type`).
    pub sent: Counter<u64>,
    /// Tasks claimed.
    pub consumed: Counter<u64>,
    /// Each submit, claim and settlement write, in seconds.
    pub operation: Histogram<f64>,
    /// Handler time per task, in seconds.
    pub process: Histogram<f64>,
    /// From due (`run_at`) to claimed, by the database's clock.
    pub pickup: Histogram<f64>,
    /// Runs settled, by `waymark.task.outcome`.
    pub settled: Counter<u64>,
    /// Leases a worker lost.
    pub lost: Counter<u64>,
    /// Tasks given back at shutdown.
    pub given_back: Counter<u64>,
    /// Runs whose end no write confirmed.
    pub unknown: Counter<u64>,
    /// Settlements per settlement write.
    pub settle_batch: Histogram<u64>,
}

impl Instruments {
    pub(crate) fn new(meter: &Meter) -> Self {
        let seconds = |name: &'static str, what: &'static str| {
            meter
                .f64_histogram(name)
                .with_unit("s")
                .with_description(what)
                .with_boundaries(SECONDS.to_vec())
                .build()
        };
        let count = |name: &'static str, unit: &'static str, what: &'static str| {
            meter.u64_counter(name).with_unit(unit).with_description(what).build()
        };
        Instruments {
            sent: count("messaging.client.sent.messages", "{message}", "Tasks submitted."),
            consumed: count("messaging.client.consumed.messages", "{message}", "Tasks claimed by workers."),
            operation: seconds(
                "messaging.client.operation.duration",
                "Duration of each submit, claim and settlement write.",
            ),
            process: seconds("messaging.process.duration", "Time a handler took over one task."),
            pickup: seconds("waymark.task.pickup.duration", "Time from a task's due time to its claim."),
            settled: count(
                "waymark.tasks.settled",
                "{task}",
                "Runs settled, by outcome (retried is a retry).",
            ),
            lost: count("waymark.leases.lost", "{lease}", "Leases a worker lost before it settled."),
            given_back: count(
                "waymark.tasks.given_back",
                "{task}",
                "Tasks given back unspent: at shutdown, or claimed ahead and never started.",
            ),
            unknown: count(
                "waymark.runs.unconfirmed",
                "{run}",
                "Runs whose settlement no answer confirmed (the lease decides).",
            ),
            settle_batch: meter
                .u64_histogram("waymark.settle.batch.size")
                .with_unit("{settlement}")
                .with_description("Settlements per settlement write.")
                .with_boundaries(SIZES.to_vec())
                .build(),
        }
    }
}

/// The attributes every measurement of one operation starts with.
pub(crate) fn operation(name: &'static str, kind: &'static str) -> Vec<KeyValue> {
    vec![
        KeyValue::new(key::SYSTEM, SYSTEM),
        KeyValue::new(key::OPERATION_NAME, name),
        KeyValue::new(key::OPERATION_TYPE, kind),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_built_once_per_queue_and_name() {
        let labels = Labels::default();
        let a = labels.of("mail", "send");
        assert!(Arc::ptr_eq(&a, &labels.of("mail", "send")), "the second ask clones the first");
        assert!(!Arc::ptr_eq(&a, &labels.of("mail", "bounce")));
        assert_eq!(a[0], KeyValue::new(key::DESTINATION, "mail"));
        assert_eq!(a[1], KeyValue::new(key::TASK_NAME, "send"));
    }
}
