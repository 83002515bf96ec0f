//! The claim loop: claims for free slots, wakes on signals, starts runs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use waymark_store::{Error, PgExecutor, Signal};

use crate::plan::Drawn;
use crate::run::start_call;
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
    /// Claims under way, and the slots each asked for (by task id, so that
    /// a claim task that panicked still gives its slots back).
    claims: JoinSet<Drawn>,
    /// Per claim under way: the slots it asked for, and whether it was to
    /// probe.
    asked: HashMap<tokio::task::Id, (usize, bool)>,
    /// Slots asked for by the claims under way.
    reserved: usize,
    /// Set when a claim came back short: wait for a wakeup before the next.
    dry: bool,
    /// Whether draws are bounded by resources or handler limits: then a
    /// call that ends is a reason to claim again.
    limited: bool,
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
        ClaimLoop {
            shared,
            settler,
            claims: JoinSet::new(),
            asked: HashMap::new(),
            reserved: 0,
            dry: false,
            limited: shared.planner.limited(),
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
                        Err(e) => (e.id(), Drawn { error: Some(claim_panicked(e)), ..Drawn::default() }),
                    };
                    self.claimed(id, out, runs);
                }
                // With limits, a call that ends may free what a draw lacked.
                _ = shared.state.slot_freed.notified(), if slots_full || (self.limited && self.dry) => {
                    self.dry = false;
                }
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
        let shared = self.shared.clone();
        self.reserved += free;
        let handle = self.claims.spawn(async move { shared.planner.draw(&shared.store, free, probe).await });
        self.asked.insert(handle.id(), (free, probe));
    }

    /// A claim came back: its slots are no longer reserved, a short answer
    /// means dry, a failure schedules a retry; what it claimed starts.
    fn claimed(&mut self, id: tokio::task::Id, out: Drawn, runs: &mut JoinSet<()>) {
        let (slots, asked_probe) = self.asked.remove(&id).unwrap_or((0, false));
        self.reserved -= slots;
        self.dry = out.error.is_some() || out.calls.len() < slots;
        // A failed claim may have been the one that probed, and a turn
        // whose draws were all at capacity probed nothing: the next one
        // probes (and so recovers leases) instead.
        self.probe_due |= out.error.is_some() || (asked_probe && !out.probed);
        if out.error.as_ref().is_some_and(Error::is_store_closed) {
            // Nothing more can be claimed or settled: stop, and report it.
            // (Close the worker before its store: its runs' tasks now come
            // back only when their leases run out.)
            self.shared.state.stop.send_replace(true);
        }
        if out.error.is_some() {
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
    drawn: Drawn,
) {
    for call in drawn.calls {
        start_call(shared, settler, runs, call);
    }
    if let Some(e) = drawn.error {
        shared.report("claim", e);
    }
}
