//! The claim loop: claims for free slots, wakes on signals, starts runs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use waymark_store::{Error, PgExecutor, Signal};

use super::plan::{claim_panicked, Drawn, Planner};
use super::ready::Ready;
use crate::call::Runs;
use crate::settle::FLUSHES_IN_FLIGHT;
use crate::shared::Shared;

/// How long the claim loop waits at most for more free slots before it
/// claims for the few that are free.
const CLAIM_GATHER: Duration = Duration::from_millis(10);

/// How long it waits for the next slot to free while gathering: slots
/// freeing further apart than this are not worth a later claim.
const CLAIM_GATHER_GAP: Duration = Duration::from_millis(1);

/// The first pause before a failed claim is tried again; it doubles up
/// to the poll interval while claims keep failing.
const CLAIM_RETRY_FIRST: Duration = Duration::from_millis(50);

/// Claim transactions under way at once: while one commits, the next
/// draws, and a signal that comes while one is under way sends the other.
const CLAIMS_IN_FLIGHT: usize = 2;

/// The fewest calls a claim asks for (see [`ClaimLoop::ask`]).
const CLAIM_ASK_MIN: usize = 16;

/// How many tasks may be settling (their handlers ended, their
/// settlements on their way) before the worker stops claiming: enough for
/// the settlement batcher's flushes in flight, and never fewer than the
/// worker's slots. A slot is free once its handler ends, so a worker of
/// few slots claims again without waiting on its settlements' commits;
/// this keeps a slow settlement path from letting claimed work pile up.
pub(crate) fn settling_bound(concurrency: usize, settle_batch: usize) -> usize {
    concurrency.max(settle_batch.saturating_mul(FLUSHES_IN_FLIGHT))
}

/// Runs the claim loop until shutdown begins; what it claimed is started.
pub(crate) async fn claim_loop<E: PgExecutor + 'static>(
    shared: &Arc<Shared<E>>,
    planner: Arc<Planner>,
    runs: &Runs<E>,
) {
    ClaimLoop::new(shared, planner).run(runs).await;
}

/// The claim loop and everything it keeps between turns.
struct ClaimLoop<'a, E> {
    shared: &'a Arc<Shared<E>>,
    planner: Arc<Planner>,
    /// Claims under way, and the slots each asked for (by task id, so that
    /// a claim task that panicked still gives its slots back).
    claims: JoinSet<Drawn>,
    /// Per claim under way: what it asked for (see [`Asked`]).
    asked: HashMap<tokio::task::Id, Asked>,
    /// Calls asked for by the claims under way, and how many of them for
    /// free slots: a claim's part for slots is what the slots leave after
    /// the claims under way took theirs, not their room ahead too (only a
    /// plain handler's draw fills that, and a batch draw would get none).
    reserved: usize,
    reserved_slots: usize,
    /// Set when a claim came back short: wait for a wakeup before the next.
    dry: bool,
    /// Wakeups so far (a signal, a poll, a retry due, a freed slot or unit
    /// that ended a dry spell), and their count when the latest claim went
    /// out: a wakeup since is worth a claim beside it. Their count when the
    /// latest claim that draws from every source went out (one with a part
    /// for free slots, or any in a worker without limited draws): a claim
    /// that comes back short after a later wakeup does not make the loop
    /// dry (its snapshot may predate the signal's row, or its draw the
    /// freed unit), and a claim with a part for free slots goes out.
    wakeups: u64,
    wakeups_at_claim: u64,
    wakeups_covered: u64,
    /// The most calls the next claim asks for (see [`ClaimLoop::ask`]).
    ask_limit: usize,
    /// Whether draws are bounded by resources, handler limits or batches
    /// (a batch draw takes free slots only, never room ahead): then a call
    /// that ends is a reason to claim again.
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
    /// See [`settling_bound`].
    settling_bound: usize,
    /// The calls drawn, waiting for a slot (or given back).
    ready: Ready<E>,
}

impl<'a, E: PgExecutor + 'static> ClaimLoop<'a, E> {
    fn new(shared: &'a Arc<Shared<E>>, planner: Arc<Planner>) -> Self {
        ClaimLoop {
            shared,
            limited: planner.limited(),
            planner,
            claims: JoinSet::new(),
            asked: HashMap::new(),
            reserved: 0,
            reserved_slots: 0,
            dry: false,
            wakeups: 0,
            wakeups_at_claim: 0,
            wakeups_covered: 0,
            ask_limit: CLAIM_ASK_MIN,
            probe_due: true,
            last_probe: Instant::now(),
            retry_at: None,
            retry_pause: CLAIM_RETRY_FIRST,
            settling_bound: settling_bound(shared.settings.concurrency, shared.settings.settle_batch),
            ready: Ready::new(shared),
        }
    }

    async fn run(mut self, runs: &Runs<E>) {
        let shared = self.shared;
        let mut stop = shared.state.stop.subscribe();
        let mut watch =
            shared.store.watch_queues(shared.settings.queues.iter().cloned(), shared.settings.poll_interval);
        // The watch's first answer is "read now".
        let _ = watch.next().await;
        loop {
            self.ready.start(runs);
            self.ready.give_back_stale();
            if *stop.borrow() {
                self.start_what_is_claimed(runs).await;
                return;
            }
            let free = self.gather_free_slots().await;
            if !self.dry && free > 0 && self.claims.len() < CLAIMS_IN_FLIGHT && self.worth_another() {
                self.spawn_claim(free);
                continue;
            }
            // Read twice (a handler on another thread may end between the
            // reads): full by either, it listens for a freed slot, or a slot
            // freed in between would be heard by no one.
            let slots_full = free == 0 || self.free_slots() == 0;
            // A freed slot or unit is a reason to claim again.
            let refill = slots_full || (self.limited && self.dry);
            let stale_at = self.ready.stale_at();
            tokio::select! {
                _ = stop.changed() => {}
                Some(done) = self.claims.join_next_with_id(), if !self.claims.is_empty() => {
                    let (id, out) = match done {
                        Ok((id, out)) => (id, out),
                        Err(e) => (e.id(), Drawn { error: Some(claim_panicked(e)), ..Drawn::default() }),
                    };
                    self.claimed(id, out, runs);
                }
                // A call that ends frees a slot for a call claimed ahead;
                // with limits, it may free what a draw lacked.
                _ = shared.state.slot_freed.notified(), if refill || !self.ready.is_empty() => {
                    // It counts as a wakeup when it ends a dry spell or may
                    // free what a limited draw lacked; a plain worker's
                    // freed slot is no news to a claim under way.
                    if refill && (self.dry || self.limited) {
                        self.wakeups += 1;
                    }
                    self.dry &= !refill;
                }
                // A call claimed ahead may wait so long: then it goes back.
                _ = sleep_until_some(stale_at), if stale_at.is_some() => {}
                () = self.ready.returned(), if self.ready.returning() => {}
                _ = sleep_until_some(self.retry_at), if self.retry_at.is_some() => {
                    (self.dry, self.retry_at) = (false, None);
                    self.wakeups += 1;
                }
                // A queued signal or a poll (a queue watch yields no done signals).
                signal = watch.next(), if !slots_full => {
                    self.dry = false;
                    self.wakeups += 1;
                    self.probe_due |= signal == Signal::Poll;
                }
            }
        }
    }

    /// Calls to claim for: the slots no handler holds, nor a claim under
    /// way asked for, nor a call claimed ahead waits for; with short calls,
    /// some more ahead of them (`ready::claim_ahead`). None while the settling
    /// tasks are at their bound.
    fn free_slots(&self) -> usize {
        let settling = self.shared.state.settling.load(std::sync::atomic::Ordering::SeqCst);
        if settling >= self.settling_bound {
            return 0;
        }
        let room = self.ready.room(self.planner.claims_ahead());
        room.saturating_sub(self.shared.running_count() + self.reserved + self.ready.len())
    }

    /// The slots free now. Claims go in batches: with a few slots free while
    /// others run, wait for more to free up, so one claim transaction fills
    /// many, but only while they keep freeing fast (each within
    /// [`CLAIM_GATHER_GAP`] of the last, and all within [`CLAIM_GATHER`]):
    /// short handlers fill a claim, and a slot freed among long ones is
    /// claimed for at once.
    async fn gather_free_slots(&self) -> usize {
        let shared = self.shared;
        let mut free = self.free_slots();
        let batch = (shared.settings.concurrency / 2).max(1);
        let busy = shared.running_count() + self.reserved > 0;
        // Calls claimed ahead take freed slots first: no gathering then.
        let gather =
            self.ready.is_empty() && busy && self.claims.len() < CLAIMS_IN_FLIGHT && self.worth_another();
        if !self.dry && free > 0 && free < batch && gather {
            let deadline = tokio::time::Instant::now() + CLAIM_GATHER;
            loop {
                let gap = (tokio::time::Instant::now() + CLAIM_GATHER_GAP).min(deadline);
                if free >= batch
                    || tokio::time::timeout_at(gap, shared.state.slot_freed.notified()).await.is_err()
                {
                    break;
                }
                free = self.free_slots();
            }
            free = self.free_slots();
        }
        free
    }

    /// How many of `free` calls to claim for. After a short answer, at
    /// most twice what it found (and never fewer than [`CLAIM_ASK_MIN`]);
    /// after a full one, all. A claim reserves the slots it asks for until
    /// it answers, so one that asked for every free slot while a trickle of
    /// work comes in would leave a signal arriving meanwhile no slot to
    /// send a second claim for: the signal's task would wait for the first
    /// to answer (whose snapshot may predate it) and then for a claim of
    /// its own. A backlog costs one small claim before the full ones.
    fn ask(&self, free: usize) -> usize {
        free.min(self.ask_limit)
    }

    /// Whether a claim may go out beside the one under way: while a
    /// backlog is claimed in full (one commits while the next draws), or
    /// after a wakeup since it went out (its snapshot may miss a signal's
    /// task). Else it would race the first for the same rows, and skip the
    /// probe the first one ran.
    ///
    /// A claim with no part for free slots draws for the room ahead only,
    /// which a limited draw (a batch) never takes: a wakeup it did not
    /// cover sends one with such a part as soon as slots allow.
    fn worth_another(&self) -> bool {
        self.claims.is_empty()
            || self.ask_limit == usize::MAX
            || self.wakeups != self.wakeups_at_claim
            || (self.wakeups != self.wakeups_covered && self.slots_part() > 0)
    }

    /// The free slots not yet asked for by a claim under way nor held by a
    /// call claimed ahead: what the next claim may draw for slots.
    fn slots_part(&self) -> usize {
        let taken = self.shared.running_count() + self.reserved_slots + self.ready.len();
        self.shared.settings.concurrency.saturating_sub(taken)
    }

    fn spawn_claim(&mut self, free: usize) {
        let free = self.ask(free);
        let probe = self.probe_due || self.last_probe.elapsed() >= self.shared.settings.poll_interval;
        if probe {
            (self.probe_due, self.last_probe) = (false, Instant::now());
        }
        let (shared, planner) = (self.shared.clone(), self.planner.clone());
        // The part of `free` that slots can take now; the rest is ahead.
        let plain = self.slots_part().min(free);
        // A claim covers the wakeups so far only if it draws from every
        // source: one with no free-slot part draws for the room ahead,
        // which a limited draw (a batch) never takes, so a batch task's
        // signal would be spent on a claim that cannot take it.
        self.wakeups_at_claim = self.wakeups;
        if plain > 0 || !self.limited {
            self.wakeups_covered = self.wakeups;
        }
        self.reserved += free;
        self.reserved_slots += plain;
        let handle = self.claims.spawn(async move {
            shared.statements.run(planner.draw(&shared.store, plain, free - plain, probe)).await
        });
        self.asked.insert(handle.id(), Asked { calls: free, for_slots: plain, probe, wakeups: self.wakeups });
    }

    /// A claim came back: its slots are no longer reserved, a short answer
    /// means dry, a failure schedules a retry; what it claimed starts.
    fn claimed(&mut self, id: tokio::task::Id, out: Drawn, runs: &Runs<E>) {
        let asked = self.asked.remove(&id).unwrap_or_default();
        self.reserved -= asked.calls;
        self.reserved_slots -= asked.for_slots;
        // Short: no claim statement of the turn got all it asked for (a
        // batch draw never fills the room ahead, so calls against slots
        // would not tell). That means "nothing more is due" only if no
        // wakeup came since the latest claim that covers them went out:
        // else this one may have missed that signal's task, and no other
        // claim covers it.
        let short = !out.full;
        // One with no free-slot part (see `spawn_claim`) covers no wakeup,
        // but sent again at once it would find no more: short with no
        // wakeup since it went out, it makes the loop dry until a slot or
        // unit frees.
        let covered = self.wakeups == self.wakeups_covered
            || (asked.for_slots == 0 && self.limited && self.wakeups == asked.wakeups);
        self.dry = out.error.is_some() || (short && covered);
        if out.error.is_none() {
            self.ask_limit =
                if short { out.calls.len().saturating_mul(2).max(CLAIM_ASK_MIN) } else { usize::MAX };
        }
        // A failed claim may have been the one that probed, and a turn
        // whose draws were all at capacity probed nothing: the next one
        // probes (and so recovers leases) instead.
        self.probe_due |= out.error.is_some() || (asked.probe && !out.probed);
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
        // A draw that missed its turn under a fleet limit claims again then.
        self.retry_at = out.turn_at.into_iter().chain(self.retry_at).min();
        self.take(out);
        self.ready.start(runs);
    }

    /// Registers what a claim drew, to start as slots free.
    fn take(&mut self, drawn: Drawn) {
        self.ready.take(drawn.calls);
        if let Some(e) = drawn.error {
            self.shared.report("claim", e);
        }
    }

    /// At shutdown: claimed tasks are ours, so what the claims under way
    /// draw is taken too; then the calls waiting start or go back (see
    /// [`Ready::finish`]).
    async fn start_what_is_claimed(&mut self, runs: &Runs<E>) {
        while let Some(done) = self.claims.join_next().await {
            match done {
                Ok(out) => self.take(out),
                Err(e) => self.shared.report("claim", claim_panicked(e)),
            }
        }
        self.ready.finish(runs).await;
    }
}

/// What a claim under way asked for: its calls, how many of them for free
/// slots (the rest ahead of one), whether it was to probe, and the wakeups
/// counted when it went out.
#[derive(Debug, Default, Clone, Copy)]
struct Asked {
    calls: usize,
    for_slots: usize,
    probe: bool,
    wakeups: u64,
}

async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settling_is_bounded_by_the_flushes_and_never_below_the_slots() {
        assert_eq!(settling_bound(10, 64), 64 * FLUSHES_IN_FLIGHT);
        assert_eq!(settling_bound(4096, 64), 4096);
    }
}
