//! The calls the claims drew, registered and waiting for a slot, oldest
//! first ([`Ready`]): a call drawn for a free slot starts at once, one
//! claimed ahead of a slot when a slot frees, or goes back to its queue if
//! it waits too long.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use waymark_store::PgExecutor;

use super::plan::DrawnCall;
use super::register::{give_back, register_calls, Registered};
use crate::call::Runs;
use crate::shared::Shared;

/// With short calls, the next claim's round trip, not the handlers, would
/// bound a worker of few slots. So the worker claims ahead of its free
/// slots what its slots will get through in this long, by the calls'
/// average time, and holds it (leases renewed) until a slot frees: a
/// claimed-ahead task waits about this long at most. Calls longer than
/// this are claimed only into free slots, so no worker holds work another
/// could start.
const CLAIM_AHEAD_WINDOW: Duration = Duration::from_millis(5);

/// The most calls claimed ahead.
const CLAIM_AHEAD_MAX: usize = 256;

/// A call claimed ahead that has waited this long for a slot goes back to
/// its queue (released, its attempt unspent) for any worker to take: the
/// calls it waits behind turned long. The worker then claims nothing
/// ahead until as many calls as it has slots have ended since, telling
/// how long calls take now.
const CLAIM_AHEAD_HOLD: Duration = Duration::from_millis(100);

/// How many calls to claim ahead of the free slots (see
/// [`CLAIM_AHEAD_WINDOW`]): none until a call has ended.
pub(super) fn claim_ahead(concurrency: usize, average: Option<Duration>) -> usize {
    let Some(average) = average else { return 0 };
    let per_slot = CLAIM_AHEAD_WINDOW.as_micros() / average.as_micros().max(1);
    usize::try_from(per_slot).unwrap_or(usize::MAX).saturating_mul(concurrency).min(CLAIM_AHEAD_MAX)
}

/// Calls queued for the runners together (`Ready::start`).
const START_GROUP: usize = 32;

/// The registered calls waiting for a slot, and those being given back.
pub(super) struct Ready<E> {
    shared: Arc<Shared<E>>,
    /// Oldest first, with when they were claimed (see
    /// [`CLAIM_AHEAD_WINDOW`]); `None` for one whose give back failed,
    /// which waits to run, never to be given back again.
    calls: VecDeque<(Option<Instant>, Registered)>,
    /// Gives back under way; each answers the call if it failed.
    returning: JoinSet<Option<Registered>>,
    /// Set when calls claimed ahead were given back: the count of ended
    /// calls then. Nothing is claimed ahead until as many more calls as
    /// the worker has slots have ended.
    paused_at: Option<u64>,
}

impl<E: PgExecutor + 'static> Ready<E> {
    pub(super) fn new(shared: &Arc<Shared<E>>) -> Self {
        Ready { shared: shared.clone(), calls: VecDeque::new(), returning: JoinSet::new(), paused_at: None }
    }

    pub(super) fn len(&self) -> usize {
        self.calls.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// The calls the worker may hold unsettled-and-unended: its slots, and
    /// those it claims ahead of them, if any draw can (`claims_ahead`).
    pub(super) fn room(&self, claims_ahead: bool) -> usize {
        let concurrency = self.shared.settings.concurrency;
        let calls = &self.shared.state.call_time;
        let resumes_at = |at: u64| at.saturating_add(u64::try_from(concurrency).unwrap_or(u64::MAX));
        // Nothing ahead while paused, or when no draw could fill it.
        if self.paused_at.is_some_and(|at| calls.ended() < resumes_at(at)) || !claims_ahead {
            return concurrency;
        }
        concurrency + claim_ahead(concurrency, calls.average())
    }

    /// Registers what a claim drew, to start as slots free.
    pub(super) fn take(&mut self, drawn: Vec<DrawnCall>) {
        // A call drawn for a free slot goes before those claimed ahead.
        let now = Instant::now();
        let mut first = 0;
        for call in register_calls(&self.shared, drawn) {
            if call.ahead {
                self.calls.push_back((Some(now), call));
            } else {
                self.calls.insert(first, (Some(now), call));
                first += 1;
            }
        }
    }

    /// When the oldest call claimed ahead will have waited too long (the
    /// calls are in the order claimed, a returned one first).
    pub(super) fn stale_at(&self) -> Option<tokio::time::Instant> {
        let oldest = self.calls.iter().find_map(|(at, _)| *at)?;
        Some(tokio::time::Instant::from_std(oldest + CLAIM_AHEAD_HOLD))
    }

    /// Gives back the calls claimed ahead that waited [`CLAIM_AHEAD_HOLD`]
    /// for a slot, and pauses claiming ahead.
    pub(super) fn give_back_stale(&mut self) {
        if self.stale_at().is_none_or(|at| at > tokio::time::Instant::now()) {
            return;
        }
        let mut keep = VecDeque::with_capacity(self.calls.len());
        let mut stale = 0;
        for (at, call) in self.calls.drain(..) {
            if at.is_some_and(|at| at.elapsed() >= CLAIM_AHEAD_HOLD) {
                self.returning.spawn(give_back(self.shared.clone(), call));
                stale += 1;
            } else {
                keep.push_back((at, call));
            }
        }
        self.calls = keep;
        self.paused_at = Some(self.shared.state.call_time.ended());
        tracing::debug!(calls = stale, "calls claimed ahead waited too long for a slot; giving them back");
    }

    /// Whether gives back are under way.
    pub(super) fn returning(&self) -> bool {
        !self.returning.is_empty()
    }

    /// Until a give back under way ends; a call whose give back failed
    /// waits to run, first. (Cancel-safe: a call is taken in the poll that
    /// ends.)
    pub(super) async fn returned(&mut self) {
        if let Some(Ok(Some(call))) = self.returning.join_next().await {
            self.calls.push_front((None, call));
        }
    }

    /// Starts calls, oldest first, while slots are free.
    pub(super) fn start(&mut self, runs: &Runs<E>) {
        // Queued a few dozen at a time: the runners' queue is locked once
        // for each group, and the first calls' runners start on the other
        // threads while the rest are prepared. (Called on every turn of the
        // loop: nothing is allocated unless a call starts.)
        let mut started = Vec::new();
        while !self.calls.is_empty() && self.shared.running_count() < self.shared.settings.concurrency {
            let (_, call) = self.calls.pop_front().expect("not empty");
            if call.all_lost() {
                // Its leases went while it waited: nothing to run or give
                // back, only its entries to clear.
                self.returning.spawn(give_back(self.shared.clone(), call));
                continue;
            }
            started.extend(runs.start(call.into_call(&self.shared)));
            if started.len() == START_GROUP {
                runs.start_all(&mut started);
            }
        }
        runs.start_all(&mut started);
    }

    /// At shutdown, once the claims under way have answered: claimed tasks
    /// are ours, so run what has a slot (and shutdown settles or gives it
    /// back like the rest), and give back what was claimed ahead of one,
    /// running any whose give back failed.
    pub(super) async fn finish(&mut self, runs: &Runs<E>) {
        while let Some(back) = self.returning.join_next().await {
            if let Ok(Some(call)) = back {
                self.calls.push_front((None, call));
            }
        }
        self.start(runs);
        let left =
            std::mem::take(&mut self.calls).into_iter().map(|(_, call)| give_back(self.shared.clone(), call));
        let mut back: Vec<Registered> = futures::future::join_all(left).await.into_iter().flatten().collect();
        // What `start` just sent back (calls whose leases all went) ends
        // here too: dropped with the loop, it would leave their entries in
        // the running map.
        while let Some(done) = self.returning.join_next().await {
            back.extend(done.ok().flatten());
        }
        runs.start_all(
            &mut back.into_iter().filter_map(|call| runs.start(call.into_call(&self.shared))).collect(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_claimed_ahead_for_the_window_only_while_short() {
        let ms = Duration::from_millis;
        assert_eq!(claim_ahead(10, None), 0, "nothing ahead before a call has ended");
        assert_eq!(claim_ahead(10, Some(ms(1))), 50, "five calls per slot in 5 ms");
        assert_eq!(claim_ahead(10, Some(Duration::from_micros(20))), CLAIM_AHEAD_MAX, "capped");
        assert_eq!(claim_ahead(10, Some(ms(5))), 10, "one per slot at the window");
        assert_eq!(claim_ahead(10, Some(ms(6))), 0, "none for calls longer than the window");
        assert_eq!(claim_ahead(10, Some(Duration::ZERO)), CLAIM_AHEAD_MAX);
    }
}
