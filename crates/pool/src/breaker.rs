//! The circuit breaker. After `threshold` consecutive connection-class
//! failures it opens: calls fail at once, without touching the network,
//! carrying the last cause. After `open_for`, one call goes through as a
//! half-open trial; its success closes the breaker, its failure opens it
//! again. Capacity errors and query errors never count.

use std::sync::{Arc, Mutex};
use std::time::Duration;

// tokio's clock: the same as std's, except that tests can pause and advance it.
use tokio::time::Instant;

/// The breaker's state, as stats report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls flow.
    Closed,
    /// Calls fail fast.
    Open,
    /// One trial call is in flight.
    HalfOpen,
}

#[derive(Debug)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant, cause: String },
    HalfOpen { cause: String },
}

#[derive(Debug, Clone)]
pub(crate) struct Breaker {
    state: Arc<Mutex<State>>,
    threshold: u32,
    open_for: Duration,
}

/// Permission to make one call. A trial that is dropped without an outcome
/// (its caller gave up) counts as a failure, so the breaker never sticks in
/// half-open.
#[derive(Debug)]
pub(crate) struct Pass {
    breaker: Breaker,
    trial: bool,
    settled: bool,
}

impl Pass {
    /// The call reached the server (whatever the server answered).
    pub(crate) fn success(mut self) {
        self.settled = true;
        *self.breaker.lock() = State::Closed { failures: 0 };
    }

    /// The call failed with a connection-class error.
    pub(crate) fn connection_failure(mut self, cause: &str) {
        self.settled = true;
        self.breaker.fail(self.trial, cause);
    }

    /// The call ended in a way that says nothing about the connection path
    /// (capacity, saturation, a timeout on our side).
    pub(crate) fn neutral(mut self) {
        self.settled = true;
        if self.trial {
            // Give the next caller the trial.
            let mut st = self.breaker.lock();
            if let State::HalfOpen { cause } = &*st {
                *st = State::Open { until: Instant::now(), cause: cause.clone() };
            }
        }
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        if !self.settled && self.trial {
            self.breaker.fail(true, "the half-open trial was abandoned");
        }
    }
}

impl Breaker {
    pub(crate) fn new(threshold: u32, open_for: Duration) -> Self {
        Breaker {
            state: Arc::new(Mutex::new(State::Closed { failures: 0 })),
            threshold: threshold.max(1),
            open_for,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A pass for one call, or the last cause while the breaker is open.
    pub(crate) fn check(&self) -> Result<Pass, String> {
        let mut st = self.lock();
        let trial = match &*st {
            State::Closed { .. } => false,
            State::Open { until, cause } if Instant::now() < *until => return Err(cause.clone()),
            State::Open { cause, .. } => {
                *st = State::HalfOpen { cause: cause.clone() };
                true
            }
            State::HalfOpen { cause } => return Err(cause.clone()),
        };
        Ok(Pass { breaker: self.clone(), trial, settled: false })
    }

    /// A connection failure seen outside any pass (a statement inside a
    /// transaction, after its BEGIN settled the pass).
    pub(crate) fn record_failure(&self, cause: &str) {
        self.fail(false, cause);
    }

    fn fail(&self, trial: bool, cause: &str) {
        let mut st = self.lock();
        let failures = match &*st {
            State::Closed { failures } if !trial => failures + 1,
            _ => self.threshold,
        };
        *st = if failures >= self.threshold {
            if !matches!(&*st, State::Open { .. }) {
                tracing::warn!(
                    cause,
                    open_for_ms = self.open_for.as_millis() as u64,
                    "circuit breaker opened"
                );
            }
            State::Open { until: Instant::now() + self.open_for, cause: cause.to_owned() }
        } else {
            State::Closed { failures }
        };
    }

    pub(crate) fn state(&self) -> BreakerState {
        match &*self.lock() {
            State::Closed { .. } => BreakerState::Closed,
            State::Open { .. } => BreakerState::Open,
            State::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn opens_after_the_threshold_and_closes_after_a_good_trial() {
        let b = Breaker::new(3, Duration::from_millis(30));
        for _ in 0..2 {
            b.check().expect("closed").connection_failure("refused");
        }
        assert_eq!(b.state(), BreakerState::Closed);
        b.check().expect("closed").connection_failure("refused");
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.check().expect_err("open"), "refused");
        tokio::time::advance(Duration::from_millis(40)).await;
        let trial = b.check().expect("half-open trial");
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(b.check().is_err(), "one trial at a time");
        trial.success();
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_or_abandoned_trial_reopens() {
        let b = Breaker::new(1, Duration::from_millis(10));
        b.check().expect("closed").connection_failure("down");
        tokio::time::advance(Duration::from_millis(15)).await;
        b.check().expect("trial").connection_failure("still down");
        assert_eq!(b.check().expect_err("open again"), "still down");
        tokio::time::advance(Duration::from_millis(15)).await;
        drop(b.check().expect("trial"));
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn success_resets_the_count() {
        let b = Breaker::new(2, Duration::from_secs(1));
        b.check().expect("closed").connection_failure("x");
        b.check().expect("closed").success();
        b.check().expect("closed").connection_failure("x");
        assert_eq!(b.state(), BreakerState::Closed);
    }
}
