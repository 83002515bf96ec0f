//! One schedule's slots, as arithmetic on the database times the scheduler
//! reads: the next slot to come, the slots due and not yet submitted, and
//! which are kept when some were missed. No clock and no I/O of its own.
//!
//! The slot that falls while all is well is the slot on time, always kept.
//! A slot is missed when it fell before the scheduler started, or when it
//! was due while the schedule was behind: after a failed submit or clock
//! read, until a pass submits everything pending. Of the missed slots, the
//! newest the [`CatchUp`] policy names are kept (none for `Skip`); the rest
//! are counted, never walked one by one, and reported once per pass. A
//! failed submit never drops the slot it tried by itself: the newest slot
//! pending is tried again until a newer slot falls due, whatever the
//! policy (a passing failure must not cost a `Skip` schedule its slot).

use std::collections::VecDeque;

use crate::every::{slot_label, Every};
use crate::periodic::CatchUp;

/// The most slots of a cron schedule counted for one report of skipped
/// slots (an interval's are counted by arithmetic, however many).
const COUNT_CAP: u64 = 10_000;

/// One schedule's slots.
#[derive(Debug)]
pub(crate) struct Slots {
    next: Option<i64>,
    pending: VecDeque<i64>,
    /// A submit or clock read failed since the last pass that submitted
    /// everything pending.
    behind: bool,
    /// How many missed slots are kept.
    missed: usize,
    /// Pending slots whose key another submit held past the lock wait:
    /// tried after the others.
    held: Vec<i64>,
}

/// Slots passed over in one pass: how many, and the oldest and newest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Skipped {
    pub(crate) count: u64,
    /// False when the count stopped at its cap (at least that many).
    pub(crate) exact: bool,
    pub(crate) first: i64,
    pub(crate) last: i64,
}

impl Skipped {
    fn add(this: &mut Option<Skipped>, count: u64, exact: bool, first: i64, last: i64) {
        if count == 0 {
            return;
        }
        let s = this.get_or_insert(Skipped { count: 0, exact: true, first, last });
        s.count += count;
        s.exact &= exact;
        s.first = s.first.min(first);
        s.last = s.last.max(last);
    }

    /// Logs the skipped slots of schedule `id`: once, whatever their number.
    pub(crate) fn log(self, id: &str, catch_up: CatchUp) {
        let count = if self.exact { self.count.to_string() } else { format!("more than {}", self.count) };
        tracing::warn!(
            schedule = %id,
            skipped = self.count,
            first = %slot_label(self.first),
            last = %slot_label(self.last),
            "{count} missed slots skipped, from {} to {}: past the catch-up policy ({catch_up:?})",
            slot_label(self.first),
            slot_label(self.last),
        );
    }
}

impl Slots {
    /// The slots at the start, at database time `now`: the missed slots
    /// the policy catches up (the last before `now`), and the next to come.
    pub(crate) fn start(every: &Every, catch_up: CatchUp, now: i64) -> Slots {
        let missed = catch_up.keeps();
        Slots {
            next: every.next_after(now),
            pending: every.last_at_or_before(now, missed).into(),
            behind: false,
            missed,
            held: Vec::new(),
        }
    }

    /// The next slot to come, if the schedule has one.
    pub(crate) fn next(&self) -> Option<i64> {
        self.next
    }

    /// The slots pending, in the order to try them: oldest first, those
    /// whose key was held elsewhere last.
    pub(crate) fn in_order(&self) -> Vec<i64> {
        let (held, free): (Vec<i64>, Vec<i64>) = self.pending.iter().partition(|s| self.held.contains(s));
        free.into_iter().chain(held).collect()
    }

    /// Done with `slot` (submitted, found, or refused).
    pub(crate) fn done(&mut self, slot: i64) {
        self.pending.retain(|&s| s != slot);
        self.held.retain(|&s| s != slot);
    }

    /// `slot`'s key was held by another submit past the lock wait.
    pub(crate) fn held_elsewhere(&mut self, slot: i64) {
        if !self.held.contains(&slot) {
            self.held.push(slot);
        }
    }

    /// Takes the slots at or before `now` among the pending ones: when all
    /// is well, the newest is on time and up to the policy's missed slots
    /// before it are kept; when behind, every one is missed. Answers the
    /// slots passed over, if any.
    pub(crate) fn due(&mut self, every: &Every, now: i64) -> Option<Skipped> {
        let keep = self.missed + usize::from(!self.behind);
        let mut skipped = None;
        let Some(first) = self.next.filter(|&n| n <= now) else {
            // No newer slot: what a failure kept is still tried.
            self.bound(keep.max(self.kept_on_failure()), &mut skipped);
            return skipped;
        };
        let kept: Vec<i64> = every.last_at_or_before(now, keep).into_iter().filter(|&s| s >= first).collect();
        let (count, exact) = every.count_in(first, now, COUNT_CAP);
        let passed = count.saturating_sub(kept.len() as u64);
        if passed > 0 {
            let before_kept = kept.first().map_or(now, |&k| k - 1);
            let last = every.last_at_or_before(before_kept, 1).pop().unwrap_or(first);
            Skipped::add(&mut skipped, passed, exact, first, last);
        }
        self.pending.extend(kept);
        self.next = every.next_after(now);
        self.bound(keep, &mut skipped);
        skipped
    }

    /// A submit or a clock read failed: the schedule is behind, and what is
    /// pending is missed (the policy's newest kept, and at least the newest
    /// slot, tried again until a newer one falls due). Answers the slots
    /// passed over, if any.
    pub(crate) fn failed(&mut self) -> Option<Skipped> {
        self.behind = true;
        let mut skipped = None;
        self.bound(self.kept_on_failure(), &mut skipped);
        skipped
    }

    /// How many pending slots a failure keeps: the policy's missed slots,
    /// and at least the newest, which the failure did not make stale.
    fn kept_on_failure(&self) -> usize {
        self.missed.max(1)
    }

    /// Everything pending was submitted: the next slot is on time again.
    pub(crate) fn caught_up(&mut self) {
        debug_assert!(self.pending.is_empty());
        self.behind = false;
    }

    fn bound(&mut self, keep: usize, skipped: &mut Option<Skipped>) {
        while self.pending.len() > keep {
            if let Some(slot) = self.pending.pop_front() {
                self.held.retain(|&s| s != slot);
                Skipped::add(skipped, 1, true, slot, slot);
            }
        }
    }

    #[cfg(test)]
    fn pending(&self) -> Vec<i64> {
        self.pending.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use tracing::{span, Event, Level, Metadata, Subscriber};

    use super::*;

    const S: i64 = 1_000;
    /// 2027-01-15T08:00:00Z, a whole second.
    const T0: i64 = 1_800_000_000_000;

    fn seconds() -> Every {
        Every::interval(Duration::from_secs(1)).unwrap()
    }

    /// Submits everything pending (the database takes it all).
    fn submit_all(slots: &mut Slots) -> Vec<i64> {
        let out = slots.in_order();
        for &slot in &out {
            slots.done(slot);
        }
        slots.caught_up();
        out
    }

    #[test]
    fn a_slot_held_elsewhere_is_tried_after_the_newer_ones() {
        let every = seconds();
        let mut slots = Slots::start(&every, CatchUp::Missed(3), T0 + 500);
        assert_eq!(slots.in_order(), [T0 - 2 * S, T0 - S, T0]);
        slots.held_elsewhere(T0 - 2 * S);
        assert_eq!(slots.in_order(), [T0 - S, T0, T0 - 2 * S]);
        slots.done(T0 - S);
        slots.done(T0);
        assert_eq!(slots.in_order(), [T0 - 2 * S]);
        assert_eq!(submit_all(&mut slots), [T0 - 2 * S]);
    }

    #[test]
    fn on_time_each_slot_is_submitted_and_a_start_catches_up_its_policy() {
        let every = seconds();
        let mut slots = Slots::start(&every, CatchUp::Missed(2), T0 + 500);
        assert_eq!(slots.pending(), [T0 - S, T0], "the last two before the start");
        assert_eq!(submit_all(&mut slots), [T0 - S, T0]);
        for k in 1..4 {
            assert_eq!(slots.due(&every, T0 + k * S + 3), None);
            assert_eq!(submit_all(&mut slots), [T0 + k * S], "on time");
        }
        let mut skip = Slots::start(&every, CatchUp::Skip, T0 + 500);
        assert_eq!(skip.pending(), Vec::<i64>::new());
        assert_eq!(skip.next(), Some(T0 + S));
        assert_eq!(skip.due(&every, T0 + S), None);
        assert_eq!(submit_all(&mut skip), [T0 + S]);
    }

    /// The slot at T0+1s is due; its submit fails; the database is away
    /// until T0+6.5s, the clock unread meanwhile.
    fn outage(policy: CatchUp) -> (Vec<i64>, Option<Skipped>, Option<Skipped>) {
        let every = seconds();
        let mut slots = Slots::start(&every, policy, T0 + 500);
        submit_all(&mut slots);
        assert_eq!(slots.due(&every, T0 + S + 2), None);
        let on_failure = slots.failed();
        // Later failures (of clock reads) add nothing.
        assert_eq!(slots.failed(), None);
        let at_return = slots.due(&every, T0 + 6 * S + 500);
        (submit_all(&mut slots), on_failure, at_return)
    }

    #[test]
    fn skip_submits_nothing_that_fell_during_an_outage() {
        let (submitted, on_failure, at_return) = outage(CatchUp::Skip);
        assert_eq!(submitted, Vec::<i64>::new(), "neither the pending slot nor the newest missed one");
        assert_eq!(on_failure, None, "the slot tried is kept until a newer one falls due");
        assert_eq!(at_return, Some(Skipped { count: 6, exact: true, first: T0 + S, last: T0 + 6 * S }));
    }

    /// A submit fails once and the next try, before the next slot, works:
    /// under every policy the slot tried is submitted, late, once.
    #[test]
    fn a_slot_whose_submit_failed_once_is_submitted_on_the_next_try() {
        for policy in [CatchUp::Skip, CatchUp::Missed(0), CatchUp::Missed(1), CatchUp::Missed(3)] {
            let every = seconds();
            let mut slots = Slots::start(&every, policy, T0 + 500);
            submit_all(&mut slots);
            assert_eq!(slots.due(&every, T0 + S + 2), None);
            assert_eq!(slots.failed(), None, "{policy:?}: nothing passed over");
            assert_eq!(slots.due(&every, T0 + S + 300), None, "{policy:?}: no newer slot yet");
            assert_eq!(submit_all(&mut slots), [T0 + S], "{policy:?}: the slot tried, once");
            assert_eq!(slots.due(&every, T0 + 2 * S + 1), None);
            assert_eq!(submit_all(&mut slots), [T0 + 2 * S], "{policy:?}: on time again");
        }
    }

    #[test]
    fn missed_n_submits_the_newest_n_of_an_outage() {
        let (submitted, on_failure, at_return) = outage(CatchUp::Missed(2));
        assert_eq!(submitted, [T0 + 5 * S, T0 + 6 * S], "two, not three");
        assert_eq!(on_failure, None, "the pending slot is within the bound until newer ones come");
        assert_eq!(at_return, Some(Skipped { count: 4, exact: true, first: T0 + S, last: T0 + 4 * S }));
        let (submitted, ..) = outage(CatchUp::Missed(10));
        assert_eq!(submitted, (1..=6).map(|k| T0 + k * S).collect::<Vec<_>>(), "all six, oldest first");
        let (submitted, ..) = outage(CatchUp::Missed(0));
        assert_eq!(submitted, Vec::<i64>::new(), "Missed(0) is Skip");
    }

    /// Counts the warnings logged.
    struct Warnings(Arc<AtomicUsize>);

    impl Subscriber for Warnings {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
            span::Id::from_u64(1)
        }
        fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
        fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
        fn event(&self, e: &Event<'_>) {
            if *e.metadata().level() == Level::WARN {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        fn enter(&self, _: &span::Id) {}
        fn exit(&self, _: &span::Id) {}
    }

    #[test]
    fn an_hour_missed_at_one_millisecond_is_counted_and_logged_once() {
        let every = Every::interval(Duration::from_millis(1)).unwrap();
        let mut slots = Slots::start(&every, CatchUp::Missed(3), T0);
        submit_all(&mut slots);
        assert!(slots.failed().is_none());
        let warnings = Arc::new(AtomicUsize::new(0));
        let started = std::time::Instant::now();
        tracing::subscriber::with_default(Warnings(warnings.clone()), || {
            if let Some(skipped) = slots.due(&every, T0 + 3_600_000) {
                skipped.log("fast", CatchUp::Missed(3));
            }
        });
        assert_eq!(warnings.load(Ordering::SeqCst), 1, "one warning for the hour");
        assert_eq!(slots.pending(), [T0 + 3_599_998, T0 + 3_599_999, T0 + 3_600_000]);
        assert!(started.elapsed() < Duration::from_secs(1), "counted, not walked: {:?}", started.elapsed());
        // A cron schedule is counted slot by slot, up to a cap.
        let cron = Every::cron("* * * * * *", "UTC").unwrap();
        let mut slots = Slots::start(&cron, CatchUp::Skip, T0);
        slots.failed();
        let skipped = slots.due(&cron, T0 + 86_400_000).expect("a day skipped");
        assert_eq!((skipped.count, skipped.exact), (COUNT_CAP, false));
        assert_eq!((skipped.first, skipped.last), (T0 + S, T0 + 86_400_000));
    }
}
