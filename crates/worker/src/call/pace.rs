//! Which quick handlers' calls run in groups (see `runners` and
//! `HandlerOptions::quick`): those whose latest calls each finished in
//! their first poll, quickly.
//!
//! A call that finishes in its first poll gains nothing from a runner of
//! its own, and waking one costs more than a short handler: a group of
//! such calls goes to one runner, which polls each once where it is. The
//! price is that a call in a group waits for the polls before its own, so
//! only a handler declared quick whose calls have shown they end at once
//! joins one. A call that awaits in its first poll sends the handler back
//! to a runner per call until it shows it again; so do first polls longer
//! than [`FIRST_POLL_MAX`], the second of two close together (one is
//! forgiven: a thread preempted, a page faulted in). Calls already in a
//! group run there still.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The longest first poll that still counts as ending at once: at this
/// pace a group of 32 calls holds its last call up for a few milliseconds
/// (a forgiven longer poll adds its own length). Handlers that run longer
/// go to a runner per call, where the runtime's threads share them out.
pub(crate) const FIRST_POLL_MAX: Duration = Duration::from_micros(100);

/// How many calls in a row must end at once, each in its first poll,
/// before a handler's calls run in groups. A new handler starts with none,
/// so a handler declared quick that blocks its thread from its first call
/// never holds up a group.
pub(crate) const SHOWN: u32 = 16;

/// The most a handler's record counts, and what one first poll over
/// [`FIRST_POLL_MAX`] takes off it: a handler whose calls end at once
/// stays in groups through one such poll (a thread preempted, a page
/// faulted in), and a handler whose calls run long leaves them after two.
const RECORD_MAX: u32 = 4 * SHOWN;
const LONG_POLL_COST: u32 = 2 * SHOWN + 1;

/// One handler's record of its first polls.
#[derive(Debug, Default)]
pub(crate) struct Pace {
    /// Calls whose first poll ended the call within [`FIRST_POLL_MAX`],
    /// up to [`RECORD_MAX`], less [`LONG_POLL_COST`] for each that took
    /// longer; none since a call last awaited in its first poll.
    record: AtomicU32,
}

impl Pace {
    /// Whether the handler's next calls may run in a group.
    pub(crate) fn groups(&self) -> bool {
        self.record.load(Ordering::Relaxed) >= SHOWN
    }

    /// A call's first poll: whether it ended the call, and how long it
    /// took. (Relaxed: a hint, read and written by whichever runner polls;
    /// a lost update only moves a call between a group and a runner.)
    pub(crate) fn first_poll(&self, ended: bool, took: Duration) {
        let record = self.record.load(Ordering::Relaxed);
        let next = match (ended, took <= FIRST_POLL_MAX) {
            (true, true) => (record + 1).min(RECORD_MAX),
            (true, false) => record.saturating_sub(LONG_POLL_COST),
            // It awaits: its next calls would too, and gain nothing here.
            (false, _) => 0,
        };
        if next != record {
            self.record.store(next, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handler_joins_groups_after_its_calls_show_they_end_at_once() {
        let pace = Pace::default();
        let quick = Duration::from_micros(2);
        for _ in 0..SHOWN - 1 {
            pace.first_poll(true, quick);
        }
        assert!(!pace.groups(), "not before {SHOWN} calls in a row");
        pace.first_poll(true, quick);
        assert!(pace.groups());
        pace.first_poll(true, quick);
        assert!(pace.groups(), "stays while calls end at once");
    }

    #[test]
    fn a_call_that_awaits_sends_the_handler_back_at_once() {
        let pace = Pace::default();
        let quick = Duration::from_micros(2);
        for _ in 0..RECORD_MAX {
            pace.first_poll(true, quick);
        }
        pace.first_poll(false, quick);
        assert!(!pace.groups(), "a call that awaited in its first poll");
        for _ in 0..SHOWN - 1 {
            pace.first_poll(true, quick);
        }
        assert!(!pace.groups(), "shown again only after {SHOWN} more");
    }

    #[test]
    fn one_long_poll_is_forgiven_two_are_not() {
        let pace = Pace::default();
        let (quick, long) = (Duration::from_micros(2), FIRST_POLL_MAX + Duration::from_micros(1));
        for _ in 0..RECORD_MAX {
            pace.first_poll(true, quick);
        }
        pace.first_poll(true, long);
        assert!(pace.groups(), "one long poll among quick ones");
        pace.first_poll(true, long);
        assert!(!pace.groups(), "a second one in a row");
        // A handler that runs long from its first call never joins.
        let slow = Pace::default();
        for _ in 0..10 * RECORD_MAX {
            slow.first_poll(true, long);
        }
        assert!(!slow.groups());
    }
}
