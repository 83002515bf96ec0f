//! Backpressure: a soft depth limit per queue that submits wait on.
//!
//! A producer that outruns its workers would otherwise be bounded only by
//! disk. With a limit, each queue's submits spend a local grant read from
//! `queue_depth` (at most [`MAX_GRANT`] per read); when it is spent, one
//! submit probes again while the others of that queue wait for its answer,
//! and while the queue is full they back off from 250 ms to 5 s, up to the
//! maximum wait, then fail with [`Error::QueueFull`].
//!
//! The limit is soft: a probe and the inserts it allows are not one
//! transaction, and each producer (each store) holds its own grant, so N
//! producers can overshoot by up to (N - 1) x 64 tasks (a batch counts as
//! its size). An exact limit would put a count inside every insert's
//! transaction and serialise the submits of a queue.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Most submits one `queue_depth` read allows (a larger batch takes its
/// size).
pub const MAX_GRANT: i64 = 64;

/// The first pause while a queue is full; it doubles up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(250);
const LONGEST_PAUSE: Duration = Duration::from_secs(5);

/// The default of [`Backpressure::max_wait`].
pub const DEFAULT_MAX_QUEUE_WAIT: Duration = Duration::from_secs(600);

/// Depth limits on queues, for [`ConnectOptions::backpressure`]: a submit
/// to a queue at its limit waits for room, up to the maximum wait, then
/// fails with [`Error::QueueFull`], having submitted nothing.
///
/// [`ConnectOptions::backpressure`]: crate::ConnectOptions::backpressure
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backpressure {
    limits: Limits,
    max_wait: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Limits {
    /// One limit for every queue.
    Every(i64),
    /// Only the queues named are limited.
    PerQueue(HashMap<String, i64>),
}

impl Backpressure {
    /// At most `limit` queued tasks (delayed ones included) in every queue.
    pub fn max_depth(limit: i64) -> Self {
        Backpressure { limits: Limits::Every(limit), max_wait: DEFAULT_MAX_QUEUE_WAIT }
    }

    /// A limit for each queue named; other queues are not limited.
    pub fn per_queue<Q: Into<String>>(limits: impl IntoIterator<Item = (Q, i64)>) -> Self {
        let limits = limits.into_iter().map(|(q, n)| (q.into(), n)).collect();
        Backpressure { limits: Limits::PerQueue(limits), max_wait: DEFAULT_MAX_QUEUE_WAIT }
    }

    /// How long a submit waits for room before [`Error::QueueFull`].
    /// Defaults to 600 s.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The limit on `queue`, or `None` when it is not limited.
    pub fn limit_for(&self, queue: &str) -> Option<i64> {
        match &self.limits {
            Limits::Every(n) => Some(*n),
            Limits::PerQueue(limits) => limits.get(queue).copied(),
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        // A limit of 0 would hold every submit for the whole wait: never
        // what anyone means, so it is refused up front.
        let bad = |queue: &str, n: i64| {
            Err(Error::invalid(format!("the depth limit of {queue} must be at least 1, got {n}")))
        };
        match &self.limits {
            Limits::Every(n) if *n < 1 => bad("every queue", *n),
            Limits::PerQueue(limits) => match limits.iter().find(|(q, n)| q.is_empty() || **n < 1) {
                Some((q, _)) if q.is_empty() => Err(Error::invalid("a depth limit names an empty queue")),
                Some((q, n)) => bad(&format!("queue {q:?}"), *n),
                None => Ok(()),
            },
            Limits::Every(_) => Ok(()),
        }
    }
}

/// The store's gate: each limited queue's grant.
#[derive(Debug)]
pub(crate) struct Gate {
    config: Backpressure,
    queues: Mutex<HashMap<String, Arc<QueueGrant>>>,
}

#[derive(Debug, Default)]
struct QueueGrant {
    /// Submits left on the last probe's word. Held across a probe, so one
    /// probe of a queue is in flight at a time.
    left: tokio::sync::Mutex<i64>,
    /// Probes finished; a submit that waited on `left` while one finished
    /// takes that answer instead of probing again.
    probes: AtomicU64,
}

impl Gate {
    pub(crate) fn new(config: Backpressure) -> Result<Self> {
        config.check()?;
        Ok(Gate { config, queues: Mutex::default() })
    }

    pub(crate) fn config(&self) -> &Backpressure {
        &self.config
    }

    /// Whether submits to `queue` pass through the gate.
    pub(crate) fn limits(&self, queue: &str) -> bool {
        self.config.limit_for(queue).is_some()
    }

    fn grant(&self, queue: &str) -> Arc<QueueGrant> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.entry(queue.to_owned()).or_default().clone()
    }

    /// Waits until `queue` has room for `n` more tasks and takes it, or
    /// fails: [`Error::QueueFull`] past the maximum wait,
    /// [`Error::InvalidArgument`] for a batch larger than the limit (it
    /// could never fit). Cancel safe: a dropped wait takes nothing.
    /// `started` is when the submit began to wait (one time for all the
    /// queues of a batch, so the maximum wait bounds the whole submit).
    /// `headroom(limit)` reads the room left in `queue` under `limit`
    /// (the store's `queue_depth`).
    pub(crate) async fn admit<F, P>(&self, queue: &str, n: i64, started: Instant, headroom: F) -> Result<()>
    where
        F: Fn(i64) -> P,
        P: std::future::Future<Output = Result<i64>>,
    {
        let Some(limit) = self.config.limit_for(queue) else { return Ok(()) };
        if n > limit {
            return Err(Error::invalid(format!(
                "a batch of {n} tasks for queue {queue:?} can never fit its depth limit of {limit}"
            )));
        }
        let grant = self.grant(queue);
        let full = |waited| Error::QueueFull { queue: queue.to_owned(), limit, waited };
        let mut pause = FIRST_PAUSE;
        loop {
            let seen = grant.probes.load(Ordering::Acquire);
            let mut left = grant.left.lock().await;
            if *left < n && grant.probes.load(Ordering::Acquire) == seen {
                // No probe answered while this submit waited: ask, within
                // what is left of the wait (the others of the queue wait
                // on this probe, so it must not outlast the bound).
                let rest = self.config.max_wait.saturating_sub(started.elapsed());
                let room = match tokio::time::timeout(rest, headroom(limit)).await {
                    Ok(room) => room?,
                    Err(_) => return Err(full(started.elapsed())),
                };
                *left = room.min(MAX_GRANT.max(n));
                grant.probes.fetch_add(1, Ordering::Release);
            }
            if *left >= n {
                *left -= n;
                return Ok(());
            }
            drop(left);
            let waited = started.elapsed();
            if waited >= self.config.max_wait {
                return Err(full(waited));
            }
            // A full queue does not drain in one pause; probing tightly
            // would add reads to a database that is already behind.
            tokio::time::sleep(pause.min(self.config.max_wait - waited)).await;
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }
}
