//! The state of one run as a value, [`RunState`], kept behind one atomic
//! ([`AtomicRunState`]): its token, its lease, its settlement, its future,
//! its blocking closure, and whether the observer has heard how it ended.
//! Every change is one transition of the whole value, so a reader sees the
//! parts together (a lease lost and the settlement taken, say), never one
//! part of a change half made.

use std::sync::atomic::{AtomicU16, Ordering};

/// Why a task's token fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelReason {
    /// Someone asked for the task to stop (`Store::cancel`); a settlement
    /// now ends it `canceled`.
    Requested,
    /// The lease is gone (it ran out, or another worker took the task):
    /// every later write of this run is a no-op, so stop.
    LeaseLost,
    /// The worker is shutting down past its grace period; the task will be
    /// given back to the queue.
    Shutdown,
    /// The handler ran past the worker's `max_run_time`: the task is
    /// failed (and retried if attempts remain), so stop. An async handler
    /// is dropped then; a blocking closure cannot be, and should return.
    TimedOut,
}

/// Where the task's one settlement stands. A settlement is taken once: by
/// the worker's settlement of the handler's end, by a give-back, or by the
/// handler's own write (`TaskContext::complete` and the like).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum SettleState {
    /// Not taken yet.
    #[default]
    Open,
    /// Taken; nothing of it is kept.
    Taken,
    /// Taken, with the handler's own settlement kept (`Running`'s pending
    /// one) until its write answers, or until the worker makes it.
    Writing,
    /// The handler's own settlement whose write failed without an answer,
    /// or whose future was dropped mid-write: open again, and kept, so the
    /// worker makes it rather than the one the handler's return maps to.
    HandedBack,
}

impl SettleState {
    /// Taken: no other settlement may follow.
    pub(crate) fn is_taken(self) -> bool {
        matches!(self, SettleState::Taken | SettleState::Writing)
    }

    /// The handler's own settlement is kept.
    pub(crate) fn is_pending(self) -> bool {
        matches!(self, SettleState::Writing | SettleState::HandedBack)
    }

    fn of(taken: bool, pending: bool) -> Self {
        match (taken, pending) {
            (false, false) => SettleState::Open,
            (true, false) => SettleState::Taken,
            (true, true) => SettleState::Writing,
            (false, true) => SettleState::HandedBack,
        }
    }
}

/// Where the run's future stands, for shutdown to tell a run stuck in
/// blocking code (inside a poll that never returns) from one merely
/// waiting to be polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum PollState {
    /// Not being polled.
    #[default]
    Idle,
    /// Inside a poll that has not returned.
    InPoll,
    /// Over: finished or dropped. Polls marked after it change nothing.
    Ended,
}

/// One run's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RunState {
    /// The token: the first reason it fired for, `None` while it has not.
    pub(crate) token: Option<CancelReason>,
    /// The lease is lost: every later write of the run is refused.
    pub(crate) lost: bool,
    pub(crate) settlement: SettleState,
    pub(crate) future: PollState,
    /// A blocking handler's closure is running on a blocking thread (it
    /// may outlive the run's future).
    pub(crate) blocking: bool,
    /// The store's observer has been told how the run ended (once).
    pub(crate) observed: bool,
}

impl RunState {
    /// Takes the settlement; false if it was taken already.
    pub(crate) fn take_settlement(&mut self) -> bool {
        let open = !self.settlement.is_taken();
        self.settlement = SettleState::of(true, self.settlement.is_pending());
        open
    }

    /// Undoes [`RunState::take_settlement`] (a write that failed without
    /// an answer, a give-back that failed): the handler's own settlement,
    /// if one is kept, stays kept.
    pub(crate) fn give_back_settlement(&mut self) {
        self.settlement = SettleState::of(false, self.settlement.is_pending());
    }

    /// The handler's own settlement is kept from now on, or no longer.
    pub(crate) fn keep_pending(&mut self, kept: bool) {
        self.settlement = SettleState::of(self.settlement.is_taken(), kept);
    }

    /// Marks a poll begun or returned, unless the future is over.
    pub(crate) fn poll(&mut self, polling: bool) {
        if self.future != PollState::Ended {
            self.future = if polling { PollState::InPoll } else { PollState::Idle };
        }
    }

    /// Inside a poll that never returns, or running a blocking closure:
    /// seen after shutdown's bound, stuck in blocking code.
    pub(crate) fn is_stuck(self) -> bool {
        self.future == PollState::InPoll || self.blocking
    }

    fn pack(self) -> u16 {
        let token = match self.token {
            None => 0,
            Some(CancelReason::Requested) => 1,
            Some(CancelReason::LeaseLost) => 2,
            Some(CancelReason::Shutdown) => 3,
            Some(CancelReason::TimedOut) => 4,
        };
        let settlement = match self.settlement {
            SettleState::Open => 0,
            SettleState::Taken => 1,
            SettleState::Writing => 2,
            SettleState::HandedBack => 3,
        };
        let future = match self.future {
            PollState::Idle => 0,
            PollState::InPoll => 1,
            PollState::Ended => 2,
        };
        token
            | u16::from(self.lost) << 3
            | settlement << 4
            | future << 6
            | u16::from(self.blocking) << 8
            | u16::from(self.observed) << 9
    }

    fn unpack(word: u16) -> Self {
        RunState {
            token: match word & 0b111 {
                1 => Some(CancelReason::Requested),
                2 => Some(CancelReason::LeaseLost),
                3 => Some(CancelReason::Shutdown),
                4 => Some(CancelReason::TimedOut),
                _ => None,
            },
            lost: word & 1 << 3 != 0,
            settlement: match word >> 4 & 0b11 {
                0 => SettleState::Open,
                1 => SettleState::Taken,
                2 => SettleState::Writing,
                _ => SettleState::HandedBack,
            },
            future: match word >> 6 & 0b11 {
                0 => PollState::Idle,
                1 => PollState::InPoll,
                _ => PollState::Ended,
            },
            blocking: word & 1 << 8 != 0,
            observed: word & 1 << 9 != 0,
        }
    }
}

/// A [`RunState`] behind one atomic.
#[derive(Debug, Default)]
pub(crate) struct AtomicRunState(AtomicU16);

impl AtomicRunState {
    pub(crate) fn load(&self) -> RunState {
        RunState::unpack(self.0.load(Ordering::SeqCst))
    }

    /// Changes the state as `change` says, in one step; answers the state
    /// before it.
    pub(crate) fn update(&self, mut change: impl FnMut(&mut RunState)) -> RunState {
        let before = self.0.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |word| {
            let mut state = RunState::unpack(word);
            change(&mut state);
            Some(state.pack())
        });
        RunState::unpack(before.unwrap_or_else(|word| word))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_state() -> Vec<RunState> {
        let tokens = [
            None,
            Some(CancelReason::Requested),
            Some(CancelReason::LeaseLost),
            Some(CancelReason::Shutdown),
            Some(CancelReason::TimedOut),
        ];
        let settlements =
            [SettleState::Open, SettleState::Taken, SettleState::Writing, SettleState::HandedBack];
        let mut all = Vec::new();
        for token in tokens {
            for settlement in settlements {
                for future in [PollState::Idle, PollState::InPoll, PollState::Ended] {
                    for bits in 0..8u8 {
                        all.push(RunState {
                            token,
                            lost: bits & 1 != 0,
                            settlement,
                            future,
                            blocking: bits & 2 != 0,
                            observed: bits & 4 != 0,
                        });
                    }
                }
            }
        }
        all
    }

    #[test]
    fn every_state_comes_back_as_it_was_packed() {
        for state in every_state() {
            assert_eq!(RunState::unpack(state.pack()), state);
        }
    }

    /// The settlement is two facts, taken and pending (the handler's own
    /// kept), each set and cleared on its own, as two flags were.
    #[test]
    fn the_settlement_moves_as_its_two_facts_do() {
        for state in every_state() {
            let (taken, pending) = (state.settlement.is_taken(), state.settlement.is_pending());
            let mut s = state;
            assert_eq!(s.take_settlement(), !taken);
            assert_eq!((s.settlement.is_taken(), s.settlement.is_pending()), (true, pending));
            let mut s = state;
            s.give_back_settlement();
            assert_eq!((s.settlement.is_taken(), s.settlement.is_pending()), (false, pending));
            for kept in [false, true] {
                let mut s = state;
                s.keep_pending(kept);
                assert_eq!((s.settlement.is_taken(), s.settlement.is_pending()), (taken, kept));
            }
        }
    }

    /// Stuck as before: in a poll and not ended, or blocking; a poll
    /// marked after the end changes nothing.
    #[test]
    fn a_run_is_stuck_only_inside_a_poll_before_its_end_or_while_blocking() {
        let mut s = RunState::default();
        assert!(!s.is_stuck());
        s.poll(true);
        assert!(s.is_stuck());
        s.future = PollState::Ended;
        assert!(!s.is_stuck(), "a future dropped mid-poll (a panic) is over");
        s.poll(true);
        assert_eq!(s.future, PollState::Ended);
        s.blocking = true;
        assert!(s.is_stuck(), "a blocking closure outlives its future");
    }

    #[test]
    fn an_update_answers_the_state_before_it() {
        let state = AtomicRunState::default();
        let before = state.update(|s| s.lost = true);
        assert!(!before.lost);
        assert!(state.load().lost);
    }
}
