//! When a schedule's slots fall: a cron expression in a time zone, or a
//! fixed interval counted from the Unix epoch (so every scheduler agrees
//! on the slots without talking to the others).

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use waymark_store::{Error, Result};

use crate::zoned;

/// A schedule's slots.
#[derive(Debug, Clone)]
pub enum Every {
    /// A cron expression with seconds (`sec min hour day-of-month month
    /// day-of-week [year]`), read in a time zone.
    Cron {
        /// The expression as given.
        expr: String,
        /// Its parsed form.
        schedule: Box<cron::Schedule>,
        /// The zone its fields are read in.
        zone: Tz,
    },
    /// Every `period`, at whole multiples of it since the Unix epoch.
    Interval(Duration),
}

impl Every {
    /// A cron schedule: `"0 */5 * * * *"` (every five minutes) in `zone`
    /// (an IANA name such as `"Europe/Paris"`, or `"UTC"`).
    ///
    /// Across a clock change (Vixie cron's convention): an expression
    /// whose hour field is `*` (it fires every hour, or more often)
    /// follows instants, so its slots stay evenly spaced: both passes of
    /// a repeated hour have them, a skipped hour has none. Any other
    /// expression names wall-clock times: a time that falls twice fires
    /// once, at its first occurrence; a time the change skips fires once
    /// as the gap ends (03:00 local for a change from 02:00 to 03:00),
    /// however many of its times the gap held.
    pub fn cron(expr: &str, zone: &str) -> Result<Every> {
        let schedule = cron::Schedule::from_str(expr)
            .map_err(|e| Error::InvalidArgument(format!("cron expression {expr:?}: {e}")))?;
        let zone = Tz::from_str(zone).map_err(|_| {
            Error::InvalidArgument(format!("unknown time zone {zone:?} (an IANA name, or UTC)"))
        })?;
        let every = Every::Cron { expr: expr.to_owned(), schedule: Box::new(schedule), zone };
        if every.next_after(0).is_none() {
            return Err(Error::InvalidArgument(format!("cron expression {expr:?} has no slot after 1970")));
        }
        Ok(every)
    }

    /// A fixed interval: slots at whole multiples of `period` since the
    /// Unix epoch (every 10 s falls on :00, :10, ...). At least 1 ms, in
    /// whole milliseconds.
    pub fn interval(period: Duration) -> Result<Every> {
        if period < Duration::from_millis(1) || !period.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(Error::InvalidArgument(format!(
                "an interval must be whole milliseconds, at least 1 ms, got {period:?}"
            )));
        }
        if period > Duration::from_secs(100 * 365 * 24 * 3600) {
            return Err(Error::InvalidArgument(format!(
                "an interval of {period:?} is longer than 100 years"
            )));
        }
        Ok(Every::Interval(period))
    }

    /// The first slot strictly after `ms` (epoch milliseconds), if any:
    /// `None` only when the expression names no time after `ms` at all
    /// (a year field that has passed, say).
    pub fn next_after(&self, ms: i64) -> Option<i64> {
        match self {
            Every::Interval(period) => {
                let p = period_ms(*period);
                Some((ms.div_euclid(p) + 1) * p)
            }
            Every::Cron { schedule, zone, .. } => zoned::next_after(schedule, zone, ms),
        }
    }

    /// Up to `n` slots at or before `ms`, oldest first (the catch-up's).
    pub fn last_at_or_before(&self, ms: i64, n: usize) -> Vec<i64> {
        let mut slots = Vec::with_capacity(n.min(1024));
        match self {
            Every::Interval(period) => {
                let p = period_ms(*period);
                let mut slot = ms.div_euclid(p) * p;
                while slots.len() < n && slot >= 0 {
                    slots.push(slot);
                    slot -= p;
                }
            }
            Every::Cron { schedule, zone, .. } => {
                let mut at = ms;
                while slots.len() < n {
                    let Some(slot) = zoned::last_at_or_before(schedule, zone, at) else { break };
                    slots.push(slot);
                    at = slot - 1;
                }
            }
        }
        slots.reverse();
        slots
    }

    /// How many slots fall in `[from, to]`, counting up to `cap` (a cron
    /// schedule is counted slot by slot): the count, and whether it is
    /// exact (false: at least that many).
    pub(crate) fn count_in(&self, from: i64, to: i64, cap: u64) -> (u64, bool) {
        if to < from {
            return (0, true);
        }
        match self {
            Every::Interval(period) => {
                let p = period_ms(*period);
                let first = from.div_euclid(p) + i64::from(from.rem_euclid(p) != 0);
                let last = to.div_euclid(p);
                (u64::try_from(last - first + 1).unwrap_or(0), true)
            }
            Every::Cron { .. } => {
                let (mut count, mut at) = (0, from - 1);
                while let Some(slot) = self.next_after(at).filter(|&s| s <= to) {
                    if count == cap {
                        return (count, false);
                    }
                    count += 1;
                    at = slot;
                }
                (count, true)
            }
        }
    }

    /// How the schedule reads, for logs and errors.
    pub fn describe(&self) -> String {
        match self {
            Every::Cron { expr, zone, .. } => format!("cron {expr:?} in {zone}"),
            Every::Interval(p) => format!("every {p:?}"),
        }
    }
}

fn period_ms(period: Duration) -> i64 {
    i64::try_from(period.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// A slot's time as its key spells it: RFC 3339 in UTC, with milliseconds.
pub(crate) fn slot_label(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map_or_else(|| ms.to_string(), |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_fall_on_multiples_of_the_period() {
        let every = Every::interval(Duration::from_secs(10)).unwrap();
        assert_eq!(every.next_after(0), Some(10_000));
        assert_eq!(every.next_after(10_000), Some(20_000));
        assert_eq!(every.next_after(19_999), Some(20_000));
        assert_eq!(every.last_at_or_before(25_000, 3), vec![0, 10_000, 20_000]);
        assert_eq!(every.last_at_or_before(5_000, 3), vec![0], "never before the epoch");
        assert!(Every::interval(Duration::from_micros(1500)).is_err());
        assert!(Every::interval(Duration::ZERO).is_err());
    }

    #[test]
    fn slots_are_counted_without_walking_an_interval() {
        let every = Every::interval(Duration::from_millis(1)).unwrap();
        assert_eq!(every.count_in(1_000, 3_600_999, 10), (3_600_000, true));
        let ten = Every::interval(Duration::from_secs(10)).unwrap();
        assert_eq!(ten.count_in(5_000, 35_000, 10), (3, true));
        assert_eq!(ten.count_in(10_000, 9_999, 10), (0, true));
        let cron = Every::cron("* * * * * *", "UTC").unwrap();
        assert_eq!(cron.count_in(1_000, 5_000, 10), (5, true));
        assert_eq!(cron.count_in(1_000, 60_000, 10), (10, false), "at least the cap");
    }

    #[test]
    fn cron_reads_its_fields_in_its_zone() {
        // 09:30:15 on weekdays, Paris time.
        let every = Every::cron("15 30 9 * * Mon-Fri", "Europe/Paris").unwrap();
        // Thursday 2026-12-03 00:00 UTC.
        let start = DateTime::parse_from_rfc3339("2026-12-03T00:00:00Z").unwrap().timestamp_millis();
        let next = every.next_after(start).unwrap();
        // Paris is UTC+1 in December.
        assert_eq!(slot_label(next), "2026-12-03T08:30:15.000Z");
        let after = every.next_after(next).unwrap();
        assert_eq!(slot_label(after), "2026-12-04T08:30:15.000Z");
        // Friday's then Monday's: the weekend has none.
        assert_eq!(slot_label(every.next_after(after).unwrap()), "2026-12-07T08:30:15.000Z");
        assert_eq!(every.last_at_or_before(after, 2), vec![next, after]);
        assert_eq!(every.last_at_or_before(after - 1, 1), vec![next]);
    }

    #[test]
    fn a_wall_clock_time_fires_once_a_day_across_both_changes() {
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis();
        let labels = |v: Vec<i64>| v.into_iter().map(slot_label).collect::<Vec<_>>();
        // 02:30 Paris time: skipped on 2026-03-29 (02:00 -> 03:00), where
        // it fires as the gap ends; twice on 2026-10-25 (03:00 -> 02:00),
        // where the first one counts.
        let every = Every::cron("0 30 2 * * *", "Europe/Paris").unwrap();
        let two_from = |s: &str| {
            let first = every.next_after(at(s)).unwrap();
            labels(vec![first, every.next_after(first).unwrap()])
        };
        assert_eq!(
            two_from("2026-03-28T12:00:00Z"),
            ["2026-03-29T01:00:00.000Z", "2026-03-30T00:30:00.000Z"],
            "on the 29th at 03:00 CEST, as the gap ends"
        );
        assert_eq!(
            two_from("2026-10-24T12:00:00Z"),
            ["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"],
            "once on the 25th"
        );
        // From inside the repeated hour: the next slot is still ahead.
        for inside in ["2026-10-25T00:45:00Z", "2026-10-25T01:00:00Z", "2026-10-25T01:30:00Z"] {
            let next = every.next_after(at(inside)).unwrap();
            assert_eq!(slot_label(next), "2026-10-26T01:30:00.000Z", "after {inside}");
        }
        // The catch-up walks back over the same slots as the walk forward.
        assert_eq!(
            labels(every.last_at_or_before(at("2026-10-25T03:00:00Z"), 2)),
            ["2026-10-24T00:30:00.000Z", "2026-10-25T00:30:00.000Z"]
        );
        assert_eq!(
            labels(every.last_at_or_before(at("2026-03-30T03:00:00Z"), 2)),
            ["2026-03-29T01:00:00.000Z", "2026-03-30T00:30:00.000Z"]
        );
    }

    #[test]
    fn bad_schedules_say_what_is_wrong() {
        let e = Every::cron("every minute", "UTC").unwrap_err().to_string();
        assert!(e.contains("cron expression \"every minute\""), "{e}");
        let e = Every::cron("0 * * * * *", "Mars/Olympus").unwrap_err().to_string();
        assert!(e.contains("unknown time zone \"Mars/Olympus\""), "{e}");
        let e = Every::cron("0 0 0 1 1 * 1960", "UTC").unwrap_err().to_string();
        assert!(e.contains("cron expression \"0 0 0 1 1 * 1960\""), "a slot before 1970 is refused: {e}");
    }
}
