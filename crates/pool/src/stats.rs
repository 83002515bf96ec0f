//! Pool statistics: counters, acquire-wait percentiles and peaks.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::breaker::BreakerState;

/// How many recent acquire waits the percentiles are computed over.
const WAIT_SAMPLES: usize = 4096;

/// A snapshot of the pool's statistics.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolStats {
    /// Calls admitted (a permit and a connection obtained).
    pub acquires: u64,
    /// Median wait for admission plus a connection.
    pub acquire_wait_p50: Duration,
    /// 95th percentile of that wait.
    pub acquire_wait_p95: Duration,
    /// Calls refused with `Saturated` (queue full or acquire timeout).
    pub saturated: u64,
    /// Server capacity errors (53300 and kin).
    pub capacity_errors: u64,
    /// Calls refused because the breaker was open.
    pub breaker_rejections: u64,
    /// Connection-class failures (each also counted toward the breaker).
    pub connection_errors: u64,
    /// Errors the server returned for a statement.
    pub query_errors: u64,
    /// Client-side query timeouts.
    pub timeouts: u64,
    /// Calls sent again after a retryable failure.
    pub retries: u64,
    /// Calls holding a connection right now.
    pub in_use: usize,
    /// Callers waiting for admission right now.
    pub waiting: usize,
    /// Most calls that ever held a connection at once.
    pub peak_in_use: usize,
    /// Most callers that ever waited at once.
    pub peak_waiting: usize,
    /// The breaker's state.
    pub breaker: BreakerState,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub acquires: AtomicU64,
    pub saturated: AtomicU64,
    pub capacity_errors: AtomicU64,
    pub breaker_rejections: AtomicU64,
    pub connection_errors: AtomicU64,
    pub query_errors: AtomicU64,
    pub timeouts: AtomicU64,
    pub retries: AtomicU64,
    waits: Mutex<VecDeque<Duration>>,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_wait(&self, wait: Duration) {
        Counters::bump(&self.acquires);
        let mut waits = self.waits.lock().unwrap_or_else(|p| p.into_inner());
        if waits.len() == WAIT_SAMPLES {
            waits.pop_front();
        }
        waits.push_back(wait);
    }

    pub(crate) fn wait_percentiles(&self) -> (Duration, Duration) {
        let mut waits: Vec<Duration> =
            self.waits.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect();
        if waits.is_empty() {
            return (Duration::ZERO, Duration::ZERO);
        }
        waits.sort();
        let at = |q: f64| waits[((waits.len() - 1) as f64 * q).round() as usize];
        (at(0.50), at(0.95))
    }

    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
