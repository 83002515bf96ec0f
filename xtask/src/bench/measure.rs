//! What one round of a scenario measures, and how rounds combine: CPU of
//! this process and of the rest of the machine, submit-to-start stamps,
//! medians.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One round of one system in one scenario.
#[derive(Debug, Clone, Default)]
pub struct Round {
    pub tasks_per_s: f64,
    /// Submit-commit to handler-start samples, in ms.
    pub latency_ms: Vec<f64>,
    /// This process's CPU over the round, in cores.
    pub cpu: f64,
    /// The rest of the machine over the round, in cores: on the bench's
    /// machine, mostly PostgreSQL.
    pub other_cpu: f64,
    /// What the contestant said of its run (a peer's version and
    /// settings), added to its row's settings.
    pub note: Option<String>,
}

/// CPU counters at the start of a round.
pub struct CpuClock {
    own: f64,
    machine: f64,
    wall: Instant,
}

impl CpuClock {
    pub fn start() -> Self {
        CpuClock { own: own_cpu_seconds(), machine: machine_busy_seconds(), wall: Instant::now() }
    }

    /// (own cores, rest of the machine in cores) since the start.
    pub fn cores(&self) -> (f64, f64) {
        let wall = self.wall.elapsed().as_secs_f64().max(1e-9);
        let own = own_cpu_seconds() - self.own;
        if own.is_nan() {
            // Unread at either end: say so, rather than a figure from two
            // different clocks (or from none).
            return (f64::NAN, f64::NAN);
        }
        let own = own.max(0.0);
        let machine = (machine_busy_seconds() - self.machine).max(0.0);
        (own / wall, (machine - own).max(0.0) / wall)
    }

    /// A round of `tasks` finished now.
    pub fn round(&self, tasks: usize) -> Round {
        let (cpu, other_cpu) = self.cores();
        Round {
            tasks_per_s: rate(tasks, self.wall.elapsed()),
            latency_ms: Vec::new(),
            cpu,
            other_cpu,
            note: None,
        }
    }
}

pub fn rate(n: usize, took: Duration) -> f64 {
    n as f64 / took.as_secs_f64()
}

/// CPU seconds this process has used (user + system, every thread,
/// ended ones included), to the nanosecond: /proc's ticks of 10 ms are
/// half a microsecond per task of a 20,000-task round of a second. NaN
/// when the clock cannot be read (never seen on Linux).
fn own_cpu_seconds() -> f64 {
    cpu_time::ProcessTime::try_now().map_or(f64::NAN, |t| t.as_duration().as_secs_f64())
}

/// CPU seconds (user + system) the process `pid` of this machine has used,
/// in ticks of 10 ms; NaN when it cannot be read.
pub fn process_cpu_seconds(pid: u32) -> f64 {
    match std::fs::metadata(format!("/proc/{pid}/stat")) {
        Ok(_) => cpu_seconds_of(&pid.to_string()),
        Err(_) => f64::NAN,
    }
}

fn cpu_seconds_of(proc: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{proc}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU seconds the whole machine spent busy (every state but idle and
/// iowait), over all cores.
fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else { return 0.0 };
    let ticks: Vec<f64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    let total: f64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0.0) + ticks.get(4).copied().unwrap_or(0.0);
    (total - idle) / 100.0
}

pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.into_iter().collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// p50, p95 and p99 of `samples`.
pub fn percentiles(samples: &[f64]) -> [f64; 3] {
    let mut ms = samples.to_vec();
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms.get(((ms.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(f64::NAN);
    [at(0.50), at(0.95), at(0.99)]
}

/// Submit-commit and handler-start instants, by sequence number.
#[derive(Default)]
pub struct Stamps {
    committed: Mutex<HashMap<u64, Instant>>,
    started: Mutex<HashMap<u64, Instant>>,
}

impl Stamps {
    pub fn committed(&self, seq: u64) {
        self.committed.lock().unwrap().insert(seq, Instant::now());
    }

    /// The hook a handler calls with its payload (`{"seq": n}`).
    pub fn on_start(self: &Arc<Self>) -> Arc<dyn Fn(&serde_json::Value) + Send + Sync> {
        let me = self.clone();
        Arc::new(move |p| {
            if let Some(seq) = p["seq"].as_u64() {
                me.started.lock().unwrap().entry(seq).or_insert_with(Instant::now);
            }
        })
    }

    /// Commit-to-start times in ms of the tasks seen to start.
    pub fn samples(&self) -> Vec<f64> {
        let committed = self.committed.lock().unwrap();
        let started = self.started.lock().unwrap();
        committed
            .iter()
            .filter_map(|(seq, c)| {
                started.get(seq).map(|s| s.saturating_duration_since(*c).as_secs_f64() * 1e3)
            })
            .collect()
    }

    /// Like [`Stamps::samples`], and forgets the tasks it measured: the
    /// next call has only what started since (a start seen before its
    /// commit stamp waits for it).
    pub fn take_samples(&self) -> Vec<f64> {
        let mut committed = self.committed.lock().unwrap();
        let mut started = self.started.lock().unwrap();
        let mut samples = Vec::new();
        started.retain(|seq, s| match committed.remove(seq) {
            Some(c) => {
                samples.push(s.saturating_duration_since(c).as_secs_f64() * 1e3);
                false
            }
            None => true,
        });
        samples
    }

    pub fn seen(&self) -> usize {
        self.started.lock().unwrap().len()
    }
}
