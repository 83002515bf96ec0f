//! The claim loop: claims for free slots, wakes on signals, starts runs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use waymark_store::{ClaimRequest, Error, PgExecutor, Signal, Task};

use crate::run::start_run;
use crate::settle::Settler;
use crate::worker::Shared;

/// How long the claim loop waits for more free slots before it claims for
/// the few that are free.
const CLAIM_GATHER: Duration = Duration::from_millis(10);

/// The first pause before a failed claim is tried again; it doubles up
/// to the poll interval while claims keep failing.
const CLAIM_RETRY_FIRST: Duration = Duration::from_millis(50);

/// Claim transactions under way at once: while one commits, the next
/// draws.
const CLAIMS_IN_FLIGHT: usize = 2;

/// Runs the claim loop until shutdown begins; what it claimed is started.
pub(crate) async fn claim_loop<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    settler: &Settler,
    runs: &mut JoinSet<()>,
) {
    ClaimLoop::new(shared, settler).run(runs).await;
}

/// The claim loop and everything it keeps between turns.
struct ClaimLoop<'a, E> {
    shared: &'a Arc<Shared<E>>,
    settler: &'a Settler,
    request: ClaimRequest,
    /// Claims under way, and the slots each asked for (by task id, so that
    /// a claim task that panicked still gives its slots back).
    claims: JoinSet<Result<Vec<Task>, Error>>,
    asked: HashMap<tokio::task::Id, usize>,
    /// Slots asked for by the claims under way.
    reserved: usize,
    /// Set when a claim came back short: wait for a wakeup before the next.
    dry: bool,
    /// The probe (and the lease recovery it starts) runs on a poll, and at
    /// least once per poll interval; a claim after a full claim or a queued
    /// signal knows work is due and goes straight to the claim statement.
    probe_due: bool,
    last_probe: Instant,
    /// After a failed claim, when to try again: soon, backing off to the
    /// poll interval, not at the next signal (which may be a poll away).
    retry_at: Option<tokio::time::Instant>,
    retry_pause: Duration,
}

impl<'a, E: PgExecutor + 'static> ClaimLoop<'a, E> {
    fn new(shared: &'a Arc<Shared<E>>, settler: &'a Settler) -> Self {
        let settings = &shared.settings;
        let request = ClaimRequest::new(settings.worker_id.to_string(), settings.queues.iter().cloned())
            .names(shared.task_names())
            .lease(settings.lease);
        ClaimLoop {
            shared,
            settler,
            request,
            claims: JoinSet::new(),
            asked: HashMap::new(),
            reserved: 0,
            dry: false,
            probe_due: true,
            last_probe: Instant::now(),
            retry_at: None,
            retry_pause: CLAIM_RETRY_FIRST,
        }
    }

    async fn run(mut self, runs: &mut JoinSet<()>) {
        let shared = self.shared;
        let mut stop = shared.state.stop.subscribe();
        let mut watch =
            shared.store.watch_queues(shared.settings.queues.iter().cloned(), shared.settings.poll_interval);
        // The watch's first answer is "read now".
        let _ = watch.next().await;
        loop {
            while runs.try_join_next().is_some() {}
            if *stop.borrow() {
                self.start_what_is_claimed(runs).await;
                return;
            }
            let free = self.gather_free_slots().await;
            if !self.dry && free > 0 && self.claims.len() < CLAIMS_IN_FLIGHT {
                self.spawn_claim(free);
                continue;
            }
            let slots_full = shared.settings.concurrency <= shared.running_count() + self.reserved;
            tokio::select! {
                _ = stop.changed() => {}
                Some(done) = self.claims.join_next_with_id(), if !self.claims.is_empty() => {
                    let (id, out) = match done {
                        Ok((id, out)) => (id, out),
                        Err(e) => (e.id(), Err(claim_panicked(e))),
                    };
                    self.claimed(id, out, runs);
                }
                _ = shared.state.slot_freed.notified(), if slots_full => {}
                _ = sleep_until_some(self.retry_at), if self.retry_at.is_some() => {
                    (self.dry, self.retry_at) = (false, None);
                }
                // A queued signal or a poll (a queue watch yields no done signals).
                signal = watch.next(), if !slots_full => {
                    self.dry = false;
                    self.probe_due |= signal == Signal::Poll;
                }
            }
        }
    }

    fn free_slots(&self) -> usize {
        self.shared.settings.concurrency.saturating_sub(self.shared.running_count() + self.reserved)
    }

    /// The slots free now. Claims go in batches: with a few slots free while
    /// others run, wait a moment for more to free up, so one claim
    /// transaction fills many.
    async fn gather_free_slots(&self) -> usize {
        let shared = self.shared;
        let mut free = self.free_slots();
        let batch = (shared.settings.concurrency / 4).max(1);
        let busy = shared.running_count() + self.reserved > 0;
        if !self.dry && free > 0 && free < batch && busy && self.claims.len() < CLAIMS_IN_FLIGHT {
            let deadline = tokio::time::Instant::now() + CLAIM_GATHER;
            while free < batch
                && tokio::time::timeout_at(deadline, shared.state.slot_freed.notified()).await.is_ok()
            {
                free = self.free_slots();
            }
            free = self.free_slots();
        }
        free
    }

    fn spawn_claim(&mut self, free: usize) {
        let probe = self.probe_due || self.last_probe.elapsed() >= self.shared.settings.poll_interval;
        if probe {
            (self.probe_due, self.last_probe) = (false, Instant::now());
        }
        let limit = i64::try_from(free).unwrap_or(i64::MAX);
        let (store, req) = (self.shared.store.clone(), self.request.clone().limit(limit).probe(probe));
        self.reserved += free;
        let handle = self.claims.spawn(async move { store.claim(&req).await });
        self.asked.insert(handle.id(), free);
    }

    /// A claim came back: its slots are no longer reserved, a short answer
    /// means dry, a failure schedules a retry; what it claimed starts.
    fn claimed(&mut self, id: tokio::task::Id, out: Result<Vec<Task>, Error>, runs: &mut JoinSet<()>) {
        let slots = self.asked.remove(&id).unwrap_or(0);
        self.reserved -= slots;
        self.dry = !matches!(&out, Ok(tasks) if tasks.len() == slots);
        // A failed claim may have been the one that probed: the next one
        // probes (and so recovers leases) instead.
        self.probe_due |= out.is_err();
        if out.as_ref().is_err_and(Error::is_store_closed) {
            // Nothing more can be claimed or settled: stop, and report it.
            // (Close the worker before its store: its runs' tasks now come
            // back only when their leases run out.)
            self.shared.state.stop.send_replace(true);
        }
        if out.is_err() {
            self.retry_at = Some(tokio::time::Instant::now() + self.retry_pause);
            self.retry_pause = (self.retry_pause * 2).min(self.shared.settings.poll_interval);
        } else {
            self.retry_pause = CLAIM_RETRY_FIRST;
        }
        start_all(self.shared, self.settler, runs, out);
    }

    /// At shutdown: claimed tasks are ours, so run them, and shutdown
    /// settles or gives them back like the rest.
    async fn start_what_is_claimed(&mut self, runs: &mut JoinSet<()>) {
        while let Some(done) = self.claims.join_next().await {
            match done {
                Ok(out) => start_all(self.shared, self.settler, runs, out),
                Err(e) => self.shared.report("claim", claim_panicked(e)),
            }
        }
    }
}

async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A claim task that panicked or was cancelled: what it claimed, if
/// anything, comes back when the leases expire.
fn claim_panicked(e: tokio::task::JoinError) -> Error {
    Error::Internal(format!(
        "the claim task ended abnormally ({e}); its claims, if any, return on lease expiry"
    ))
}

fn start_all<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    settler: &Settler,
    runs: &mut JoinSet<()>,
    claimed: Result<Vec<Task>, Error>,
) {
    match claimed {
        Ok(tasks) => {
            for task in tasks {
                start_run(shared, settler, runs, task);
            }
        }
        Err(e) => shared.report("claim", e),
    }
}
