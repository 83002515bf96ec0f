//! What both peers share: options, the JSON report, CPU/wall metering, the
//! handler-side probe, and the latency/drain drivers.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tokio::sync::Notify;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T, E = BoxError> = std::result::Result<T, E>;

/// Builds a boxed error from a message.
pub fn err(msg: impl fmt::Display) -> BoxError {
    msg.to_string().into()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    EnqueueSingle,
    EnqueueBatch,
    Drain,
    Latency,
}

impl Scenario {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "enqueue-single" => Self::EnqueueSingle,
            "enqueue-batch" => Self::EnqueueBatch,
            "drain" => Self::Drain,
            "latency" => Self::Latency,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::EnqueueSingle => "enqueue-single",
            Self::EnqueueBatch => "enqueue-batch",
            Self::Drain => "drain",
            Self::Latency => "latency",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settings {
    /// The best settings found for this peer on the reference machine.
    Tuned,
    /// Whatever the peer gives a user who configures nothing.
    Default,
}

impl Settings {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "tuned" => Some(Self::Tuned),
            "default" => Some(Self::Default),
            _ => None,
        }
    }
}

/// `--set key=value` overrides on top of the chosen settings (for exploring).
#[derive(Debug, Default)]
pub struct Overrides {
    pairs: Vec<(String, String)>,
}

impl Overrides {
    pub fn push(&mut self, raw: &str) -> Result<()> {
        let (k, v) =
            raw.split_once('=').ok_or_else(|| err(format!("--set expects key=value, got {raw:?}")))?;
        self.pairs.push((k.trim().to_owned(), v.trim().to_owned()));
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    fn raw(&self, key: &str) -> Option<&str> {
        self.pairs.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn usize(&self, key: &str) -> Result<Option<usize>> {
        self.raw(key)
            .map(|v| v.parse::<usize>().map_err(|e| err(format!("--set {key}={v}: {e}"))))
            .transpose()
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.raw(key)
            .map(|v| match v {
                "true" | "1" | "on" | "yes" => Ok(true),
                "false" | "0" | "off" | "no" => Ok(false),
                _ => Err(err(format!("--set {key}={v}: expected true/false"))),
            })
            .transpose()
    }

    /// Fails on any key that the peer does not understand.
    pub fn ensure_known(&self, known: &[&str]) -> Result<()> {
        for (k, _) in &self.pairs {
            if !known.contains(&k.as_str()) {
                return Err(err(format!(
                    "unknown --set key {k:?} for this system (known: {})",
                    known.join(", ")
                )));
            }
        }
        Ok(())
    }
}

/// Parsed command line.
#[derive(Debug)]
pub struct Opts {
    pub scenario: Scenario,
    pub url: String,
    /// Task count for the enqueue and drain scenarios.
    pub tasks: usize,
    /// Batch size for `enqueue-batch`.
    pub batch: usize,
    /// Number of probes for `latency`.
    pub samples: usize,
    pub settings: Settings,
    /// Upper bound on any wait for the peer (drain, completion, shutdown).
    pub timeout: Duration,
    pub overrides: Overrides,
}

/// The single JSON line printed on stdout.
#[derive(Debug)]
pub struct Report {
    map: Map<String, Value>,
}

impl Report {
    pub fn new(system: &str, scenario: Scenario, settings: &str, tasks: usize) -> Self {
        let mut map = Map::new();
        map.insert("system".into(), system.into());
        map.insert("scenario".into(), scenario.name().into());
        map.insert("settings".into(), settings.into());
        map.insert("tasks".into(), tasks.into());
        Self { map }
    }

    pub fn set(&mut self, key: &str, value: impl Into<Value>) -> &mut Self {
        self.map.insert(key.to_owned(), value.into());
        self
    }

    /// Records throughput and CPU figures from a metered section.
    pub fn measured(&mut self, tasks: usize, m: &Measured) -> &mut Self {
        self.set("tasks_per_s", round(tasks as f64 / m.wall_s, 1))
            .set("wall_s", round(m.wall_s, 4))
            .set("cpu_s", round(m.cpu_s, 3))
            .set("cpu_cores", round(m.cpu_cores(), 3))
    }

    pub fn print(&self) {
        println!("{}", Value::Object(self.map.clone()));
    }
}

pub fn round(x: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (x * f).round() / f
}

/// This process's CPU time (user + system) in seconds, from /proc/self/stat.
pub fn process_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // The command name (field 2) may contain spaces; count fields after ')'.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return f64::NAN;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime field 15.
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    match (ticks(14 - 3), ticks(15 - 3)) {
        (Some(u), Some(s)) => (u + s) as f64 / 100.0,
        _ => f64::NAN,
    }
}

/// Wall clock and CPU at the start of a timed section.
#[derive(Debug, Clone, Copy)]
pub struct Meter {
    pub wall0: Instant,
    cpu0: f64,
}

#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub wall_s: f64,
    pub cpu_s: f64,
}

impl Measured {
    pub fn cpu_cores(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.cpu_s / self.wall_s
        } else {
            f64::NAN
        }
    }
}

impl Meter {
    pub fn start() -> Self {
        Self { cpu0: process_cpu_seconds(), wall0: Instant::now() }
    }

    pub fn elapsed_s(&self) -> f64 {
        self.wall0.elapsed().as_secs_f64()
    }

    pub fn finish(&self) -> Measured {
        let wall_s = self.wall0.elapsed().as_secs_f64();
        Measured { wall_s, cpu_s: process_cpu_seconds() - self.cpu0 }
    }
}

/// Handed to the peers' handlers: counts executions and, for latency runs,
/// records when each sequence number first started.
#[derive(Clone, Debug)]
pub struct Probe {
    inner: Arc<ProbeInner>,
}

#[derive(Debug)]
struct ProbeInner {
    handled: AtomicUsize,
    target: usize,
    all_handled: Notify,
    starts: Mutex<Vec<Option<Instant>>>,
}

impl Probe {
    pub fn new(target: usize) -> Self {
        Self {
            inner: Arc::new(ProbeInner {
                handled: AtomicUsize::new(0),
                target,
                all_handled: Notify::new(),
                starts: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A probe that also records a start instant for each of `samples` seqs.
    pub fn with_starts(samples: usize) -> Self {
        let probe = Self::new(samples);
        *probe.inner.starts.lock().expect("probe lock") = vec![None; samples];
        probe
    }

    /// Called once per handler execution.
    pub fn hit(&self) {
        if self.inner.handled.fetch_add(1, Ordering::AcqRel) + 1 == self.inner.target {
            self.inner.all_handled.notify_one();
        }
    }

    /// Called at the top of a latency handler.
    pub fn started(&self, seq: usize) {
        let now = Instant::now();
        let first = {
            let mut starts = self.inner.starts.lock().expect("probe lock");
            match starts.get_mut(seq) {
                Some(slot @ None) => {
                    *slot = Some(now);
                    true
                }
                _ => false,
            }
        };
        // Re-executions (retries, double delivery) do not count towards "seen".
        if first {
            self.hit();
        }
    }

    pub fn handled(&self) -> usize {
        self.inner.handled.load(Ordering::Acquire)
    }

    /// Waits until `target` executions were counted; false on timeout.
    pub async fn wait_all(&self, timeout: Duration) -> bool {
        if self.handled() >= self.inner.target {
            return true;
        }
        // notify_one keeps a permit, so a hit racing this call is not lost.
        tokio::time::timeout(timeout, self.inner.all_handled.notified()).await.is_ok()
            || self.handled() >= self.inner.target
    }

    pub fn starts(&self) -> Vec<Option<Instant>> {
        self.inner.starts.lock().expect("probe lock").clone()
    }
}

/// Spacing between latency probes.
pub const LATENCY_GAP: Duration = Duration::from_millis(20);
/// Idle time given to a freshly started worker before probing latency.
pub const LATENCY_WARMUP: Duration = Duration::from_millis(500);
/// How long to wait for the last latency probes after submitting them all.
pub const LATENCY_WAIT: Duration = Duration::from_secs(30);

/// Submits `samples` tasks 20 ms apart with `submit(seq)` and fills the report
/// with per-seq latency (handler start minus submit-returned) in ms. The
/// worker must already be running and idle.
pub async fn drive_latency<F, Fut>(
    report: &mut Report,
    probe: &Probe,
    samples: usize,
    mut submit: F,
) -> Result<()>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let meter = Meter::start();
    let t0 = tokio::time::Instant::now();
    let mut submitted: Vec<Instant> = Vec::with_capacity(samples);
    for seq in 0..samples {
        tokio::time::sleep_until(t0 + LATENCY_GAP * seq as u32).await;
        submit(seq).await?;
        submitted.push(Instant::now());
    }
    let all_seen = probe.wait_all(LATENCY_WAIT).await;
    let measured = meter.finish();

    let starts = probe.starts();
    let mut latencies = Vec::with_capacity(samples);
    let mut missing = 0usize;
    for (seq, submit_at) in submitted.iter().enumerate() {
        match starts.get(seq).copied().flatten() {
            Some(start) => latencies.push(signed_ms(start, *submit_at)),
            None => missing += 1,
        }
    }
    if !all_seen {
        eprintln!(
            "warning: {missing} of {samples} latency probes were not seen within {}s",
            LATENCY_WAIT.as_secs()
        );
    }
    let mut sorted = latencies.clone();
    sorted.sort_by(f64::total_cmp);
    report
        .set("tasks_per_s", Value::Null)
        .set("wall_s", round(measured.wall_s, 4))
        .set("cpu_s", round(measured.cpu_s, 3))
        .set("cpu_cores", round(measured.cpu_cores(), 3))
        .set("seen", latencies.len())
        .set("missing", missing)
        .set("latency_p50_ms", percentile(&sorted, 50.0))
        .set("latency_p90_ms", percentile(&sorted, 90.0))
        .set("latency_p99_ms", percentile(&sorted, 99.0))
        .set("latency_max_ms", sorted.last().map(|v| round(*v, 3)))
        .set("latency_ms", latencies.iter().map(|v| round(*v, 3)).collect::<Vec<_>>());
    Ok(())
}

/// `a - b` in milliseconds, negative if `a` came first.
fn signed_ms(a: Instant, b: Instant) -> f64 {
    match a.checked_duration_since(b) {
        Some(d) => d.as_secs_f64() * 1e3,
        None => -(b.duration_since(a).as_secs_f64() * 1e3),
    }
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(round(sorted[rank.clamp(1, sorted.len()) - 1], 3))
}

/// The timed part of `drain`, after the worker was started at `meter.wall0`:
/// waits until the handlers ran `tasks` times, then until `remaining()` (the
/// peer's own record of unfinished tasks) reaches zero. Returns false (after
/// filling in the partial rate) if the handlers did not finish in `timeout`.
pub async fn finish_drain<F, Fut>(
    report: &mut Report,
    meter: &Meter,
    probe: &Probe,
    tasks: usize,
    timeout: Duration,
    mut remaining: F,
) -> Result<bool>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<i64>>,
{
    if !probe.wait_all(timeout).await {
        // Not a harness failure: the peer is too slow with these settings to
        // drain N in time. Report the rate it managed, clearly marked.
        let measured = meter.finish();
        let handled = probe.handled();
        eprintln!(
            "warning: drain incomplete after {}s: handlers ran {handled} of {tasks} tasks; \
             reporting the partial rate",
            timeout.as_secs()
        );
        report
            .set("complete", false)
            .set("tasks_per_s", round(handled as f64 / measured.wall_s, 1))
            .set("wall_s", round(measured.wall_s, 4))
            .set("cpu_s", round(measured.cpu_s, 3))
            .set("cpu_cores", round(measured.cpu_cores(), 3))
            .set("handler_runs", handled)
            .set(
                "note",
                format!(
                    "timed out after {}s with {handled}/{tasks} handled; tasks_per_s is handled/wall over that window",
                    timeout.as_secs()
                ),
            );
        return Ok(false);
    }
    let handled_s = meter.elapsed_s();
    let deadline = Instant::now() + timeout;
    loop {
        let left = remaining().await?;
        if left <= 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err(err(format!(
                "all {tasks} tasks ran but {left} were still not recorded as completed after {}s",
                timeout.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let measured = meter.finish();
    report
        .set("complete", true)
        .measured(tasks, &measured)
        .set("handled_s", round(handled_s, 4))
        .set("completed_s", round(measured.wall_s, 4))
        .set("handled_tasks_per_s", round(tasks as f64 / handled_s, 1))
        .set("handler_runs", probe.handled());
    Ok(true)
}

/// Splits `0..n` into consecutive ranges of at most `size`.
pub fn chunks(n: usize, size: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let size = size.max(1);
    (0..n).step_by(size).map(move |s| s..(s + size).min(n))
}
