//! [`Observer`] for [`Telemetry`]: what each submit, claim, settlement and
//! run records, as metrics and as spans.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use waymark_store::{Error, NewTask, Observer, RunEnd, RunScope, Scope, Task, TaskStatus};

use crate::metrics::{key, operation, SYSTEM};
use crate::propagation::{extract, inject};
use crate::Telemetry;

impl Observer for Telemetry {
    fn submit(&self, tasks: &mut [NewTask]) -> Option<Box<dyn Scope<()>>> {
        let inner = &self.inner;
        let current = Context::current();
        let active = current.has_active_span();
        let queue = one_queue(tasks.iter().map(|t| t.queue.as_str())).map(str::to_owned);
        // The submit's parent: the caller's span, else (one task) the
        // context its metadata already names.
        let own = match &*tasks {
            [one] if !active => extract(&one.metadata),
            _ => None,
        };
        let parent = match own {
            Some(remote) => current.with_remote_span_context(remote),
            None => current,
        };
        let mut attributes = operation("submit", "send");
        attributes.extend(queue.clone().map(|q| KeyValue::new(key::DESTINATION, q)));
        let mut span_attributes = attributes.clone();
        if tasks.len() > 1 {
            span_attributes.push(KeyValue::new(key::BATCH_COUNT, tasks.len() as i64));
        }
        let span = inner
            .tracer
            .span_builder(span_name("submit", queue.as_deref()))
            .with_kind(SpanKind::Producer)
            .with_attributes(span_attributes)
            .start_with_context(&inner.tracer, &parent);
        let cx = parent.with_span(span);
        let span_context = cx.span().span_context().clone();
        // A batch outside any span keeps what its tasks name themselves:
        // one span cannot be the child of each.
        let keep_own = !active && tasks.len() > 1;
        let mut groups: BTreeMap<(String, String), u64> = BTreeMap::new();
        for task in tasks.iter_mut() {
            if !(keep_own && extract(&task.metadata).is_some()) {
                inject(&span_context, &mut task.metadata);
            }
            *groups.entry((task.queue.clone(), task.name.clone())).or_default() += 1;
        }
        Some(Box::new(SubmitScope {
            telemetry: self.clone(),
            cx,
            attributes,
            groups,
            started: Instant::now(),
        }))
    }

    fn claim(&self, queues: &[String]) -> Option<Box<dyn Scope<[Task]>>> {
        let queue = one_queue(queues.iter().map(String::as_str)).map(str::to_owned);
        Some(Box::new(ClaimScope { call: Call::start(self), queue }))
    }

    fn settle(&self, count: usize) -> Option<Box<dyn Scope<()>>> {
        Some(Box::new(SettleScope { call: Call::start(self), count }))
    }

    fn run(&self, task: &Task) -> Option<Box<dyn RunScope>> {
        let inner = &self.inner;
        // A run's parent is the context its task carries (the submit's
        // span, or a cairnq client's), never whatever the worker's own task
        // happens to hold.
        let parent = match extract(&task.metadata) {
            Some(remote) => Context::new().with_remote_span_context(remote),
            None => Context::new(),
        };
        let labels = inner.labels.of(&task.queue, &task.name);
        let mut attributes = operation("run", "process");
        attributes.extend(labels.iter().cloned());
        attributes.push(KeyValue::new(key::MESSAGE_ID, task.id.clone()));
        attributes.push(KeyValue::new(key::ATTEMPT, i64::from(task.attempt)));
        let span = inner
            .tracer
            .span_builder(span_name("run", Some(&task.queue)))
            .with_kind(SpanKind::Consumer)
            .with_attributes(attributes)
            .start_with_context(&inner.tracer, &parent);
        Some(Box::new(Run {
            telemetry: self.clone(),
            cx: parent.with_span(span),
            labels,
            error: Mutex::new(None),
        }))
    }
}

/// `submit orders`, or `submit` over several queues.
fn span_name(operation: &str, queue: Option<&str>) -> String {
    match queue {
        Some(q) => format!("{operation} {q}"),
        None => operation.to_owned(),
    }
}

/// The queue, if every item names the same one.
fn one_queue<'a>(mut queues: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let first = queues.next()?;
    queues.all(|q| q == first).then_some(first)
}

/// The `error.type` of a store error: its variant, and an executor
/// error's kind (`Executor.Connection`).
pub(crate) fn error_type(e: &Error) -> String {
    let debug = format!("{e:?}");
    let variant: String = debug.chars().take_while(char::is_ascii_alphanumeric).collect();
    match e.exec_kind() {
        Some(kind) => format!("{variant}.{kind:?}"),
        None => variant,
    }
}

fn with_error(mut attributes: Vec<KeyValue>, error: Option<&Error>) -> Vec<KeyValue> {
    if let Some(e) = error {
        attributes.push(KeyValue::new(key::ERROR_TYPE, error_type(e)));
    }
    attributes
}

fn set_error(span: &opentelemetry::trace::SpanRef<'_>, e: &Error) {
    span.set_attribute(KeyValue::new(key::ERROR_TYPE, error_type(e)));
    span.set_status(Status::error(e.to_string()));
}

struct SubmitScope {
    telemetry: Telemetry,
    cx: Context,
    attributes: Vec<KeyValue>,
    groups: BTreeMap<(String, String), u64>,
    started: Instant,
}

impl Scope<()> for SubmitScope {
    fn end(self: Box<Self>, outcome: Result<&(), &Error>) {
        let m = &self.telemetry.inner.instruments;
        let error = outcome.err();
        m.operation.record(self.started.elapsed().as_secs_f64(), &with_error(self.attributes.clone(), error));
        for ((queue, name), n) in &self.groups {
            let mut a = operation("submit", "send");
            a.push(KeyValue::new(key::DESTINATION, queue.clone()));
            a.push(KeyValue::new(key::TASK_NAME, name.clone()));
            m.sent.add(*n, &with_error(a, error));
        }
        let span = self.cx.span();
        if let Some(e) = error {
            set_error(&span, e);
        }
        span.end();
    }
}

/// A claim or settlement write: its client span is made as it ends, from
/// when it started under the context current then.
struct Call {
    telemetry: Telemetry,
    parent: Context,
    started: Instant,
    start_time: SystemTime,
}

impl Call {
    fn start(telemetry: &Telemetry) -> Call {
        Call {
            telemetry: telemetry.clone(),
            parent: Context::current(),
            started: Instant::now(),
            start_time: SystemTime::now(),
        }
    }

    /// Records the call's duration, with the error's type if it failed.
    fn record(&self, attributes: Vec<KeyValue>, error: Option<&Error>) {
        let seconds = self.started.elapsed().as_secs_f64();
        self.telemetry.inner.instruments.operation.record(seconds, &with_error(attributes, error));
    }

    /// Makes and ends the call's span, from its start until now.
    fn span(&self, name: impl Into<Cow<'static, str>>, attributes: Vec<KeyValue>, error: Option<&Error>) {
        let tracer = &self.telemetry.inner.tracer;
        let span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_start_time(self.start_time)
            .with_attributes(attributes)
            .start_with_context(tracer, &self.parent);
        let cx = self.parent.with_span(span);
        if let Some(e) = error {
            set_error(&cx.span(), e);
        }
        cx.span().end();
    }
}

struct ClaimScope {
    call: Call,
    queue: Option<String>,
}

impl Scope<[Task]> for ClaimScope {
    fn end(self: Box<Self>, outcome: Result<&[Task], &Error>) {
        let inner = &self.call.telemetry.inner;
        let m = &inner.instruments;
        let mut attributes = operation("claim", "receive");
        attributes.extend(self.queue.as_ref().map(|q| KeyValue::new(key::DESTINATION, q.clone())));
        self.call.record(attributes.clone(), outcome.err());
        let claimed = outcome.as_ref().map_or(0, |tasks| tasks.len());
        if let Ok(tasks) = outcome {
            let mut groups: BTreeMap<(&str, &str), u64> = BTreeMap::new();
            for task in tasks {
                *groups.entry((&task.queue, &task.name)).or_default() += 1;
                // Both times are the database's: no clock skew between hosts.
                let late_ms = (task.updated_at_ms - task.run_at_ms).max(0);
                let [queue, name] = &*inner.labels.of(&task.queue, &task.name);
                let labels = [KeyValue::new(key::SYSTEM, SYSTEM), queue.clone(), name.clone()];
                m.pickup.record(late_ms as f64 / 1000.0, &labels);
            }
            for ((queue, name), n) in groups {
                let mut a = operation("claim", "receive");
                a.push(KeyValue::new(key::DESTINATION, queue.to_owned()));
                a.push(KeyValue::new(key::TASK_NAME, name.to_owned()));
                m.consumed.add(n, &a);
            }
        }
        // A pass that found nothing leaves no span: an idle worker polls.
        if claimed == 0 && outcome.is_ok() {
            return;
        }
        attributes.push(KeyValue::new(key::BATCH_COUNT, claimed as i64));
        self.call.span(span_name("claim", self.queue.as_deref()), attributes, outcome.err());
    }
}

struct SettleScope {
    call: Call,
    count: usize,
}

impl Scope<()> for SettleScope {
    fn end(self: Box<Self>, outcome: Result<&(), &Error>) {
        let attributes = operation("settle", "settle");
        self.call.record(attributes.clone(), outcome.err());
        // A failed batch is settled again one by one, each write recorded:
        // the sizes add up to the settlements written.
        if outcome.is_ok() {
            self.call.telemetry.inner.instruments.settle_batch.record(self.count as u64, &attributes);
        }
        let mut span_attributes = attributes;
        span_attributes.push(KeyValue::new(key::BATCH_COUNT, self.count as i64));
        // A settlement made inside a run (one statement per settlement) is
        // a child of the run's span; a batch's write belongs to no one run.
        self.call.span("settle", span_attributes, outcome.err());
    }
}

/// One run's span and labels.
struct Run {
    telemetry: Telemetry,
    cx: Context,
    /// The queue and the task name.
    labels: Arc<[KeyValue; 2]>,
    /// The handler's error type, once it answered with one.
    error: Mutex<Option<String>>,
}

impl RunScope for Run {
    fn enter(&self, poll: &mut dyn FnMut()) {
        let _current = self.cx.clone().attach();
        poll();
    }

    fn returned(&self, took: Duration, error: Option<&str>) {
        let mut attributes = operation("run", "process");
        attributes.extend(self.labels.iter().cloned());
        attributes.extend(error.map(|e| KeyValue::new(key::ERROR_TYPE, e.to_owned())));
        self.telemetry.inner.instruments.process.record(took.as_secs_f64(), &attributes);
        *self.error.lock().unwrap_or_else(|p| p.into_inner()) = error.map(str::to_owned);
    }

    fn end(&self, end: RunEnd) {
        let m = &self.telemetry.inner.instruments;
        let span = self.cx.span();
        let error = self.error.lock().unwrap_or_else(|p| p.into_inner()).take();
        let labels = || {
            let mut a = vec![KeyValue::new(key::SYSTEM, SYSTEM)];
            a.extend(self.labels.iter().cloned());
            a
        };
        let outcome = match end {
            RunEnd::Settled(status) => {
                let outcome = match status {
                    TaskStatus::Succeeded => "succeeded",
                    TaskStatus::Failed => "failed",
                    TaskStatus::Canceled => "canceled",
                    // A handler's "not yet" (waymark-worker's `TaskError::snooze`).
                    TaskStatus::Queued if error.as_deref() == Some("Snooze") => "snoozed",
                    TaskStatus::Queued => "retried",
                    TaskStatus::Running => "running",
                };
                let mut a = labels();
                a.push(KeyValue::new(key::OUTCOME, outcome));
                m.settled.add(1, &a);
                outcome
            }
            RunEnd::LeaseLost => {
                m.lost.add(1, &labels());
                "lease_lost"
            }
            RunEnd::GivenBack(status) => {
                let mut a = labels();
                a.push(KeyValue::new(key::STATUS, status.as_str()));
                m.given_back.add(1, &a);
                "given_back"
            }
            _ => {
                m.unknown.add(1, &labels());
                "unconfirmed"
            }
        };
        span.set_attribute(KeyValue::new(key::OUTCOME, outcome));
        match (outcome, error) {
            ("succeeded" | "canceled" | "given_back" | "snoozed", _) => {}
            (_, Some(kind)) => {
                span.set_attribute(KeyValue::new(key::ERROR_TYPE, kind.clone()));
                span.set_status(Status::error(kind));
            }
            (other, None) => span.set_status(Status::error(other.to_owned())),
        }
        span.end();
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        // Ended already in the usual case; a second end is ignored.
        self.cx.span().end();
    }
}
