//! A cron expression's slots as instants, in a time zone whose offset
//! changes (daylight saving, or a zone moving its standard time).
//!
//! The expression is matched against local wall-clock times, which the
//! cron crate walks here as plain dates in UTC (so it never meets a clock
//! change itself); this module turns each into an instant, one stretch of
//! constant offset at a time. The convention, Vixie cron's:
//!
//! - An expression whose hour field is `*` (it fires every hour, or more
//!   often) follows instants: in a repeated hour (a fall-back) its slots
//!   fall in both passes; in a skipped hour (a spring-forward) the wall
//!   times do not exist and nothing falls there. Its slots stay evenly
//!   spaced in real time.
//! - Any other expression names wall-clock times: a repeated time fires
//!   once, at its first occurrence; a skipped time fires once when the gap
//!   ends (the first instant after the change, 03:00 local for a change
//!   at 02:00), however many of its times the gap held.

use chrono::{DateTime, LocalResult, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use cron::TimeUnitSpec;

/// How far apart the offset is probed when looking for a change: no zone
/// changes its offset twice within this.
const PROBE_STEP: i64 = 3_600_000;

/// The first slot strictly after `ms` (epoch milliseconds), if any.
pub(crate) fn next_after(schedule: &cron::Schedule, zone: &Tz, ms: i64) -> Option<i64> {
    let follow = schedule.hours().is_all();
    let mut from = ms;
    // Each turn either answers or moves `from` forward (past a change, or
    // past a repeated time already fired), so the walk ends: at a slot, or
    // where the expression has no more wall times (None).
    loop {
        let offset = offset_at(zone, from + 1)?;
        let wall = first_wall_after(schedule, from + offset)?;
        let instant = wall - offset;
        if let Some((change, new_offset)) = first_change(zone, from + 1, instant) {
            // The offset changes before that wall time comes.
            if new_offset > offset && !follow && wall < change + new_offset {
                // The wall time lies in the gap the change skips: it
                // fires as the gap ends.
                return Some(change);
            }
            from = change - 1;
            continue;
        }
        if !follow && second_occurrence(zone, instant) {
            from = instant;
            continue;
        }
        return Some(instant);
    }
}

/// The last slot at or before `ms`, if any: the same slots `next_after`
/// walks, walked back.
pub(crate) fn last_at_or_before(schedule: &cron::Schedule, zone: &Tz, ms: i64) -> Option<i64> {
    let follow = schedule.hours().is_all();
    let mut to = ms;
    loop {
        let offset = offset_at(zone, to)?;
        let wall = last_wall_at_or_before(schedule, to + offset)?;
        let instant = wall - offset;
        if let Some((change, old_offset)) = last_change(zone, instant, to) {
            // `to`'s stretch of this offset begins after that wall time,
            // and holds no slot of its own, but the gap's if it has one.
            if offset > old_offset
                && !follow
                && first_wall_after(schedule, change + old_offset - 1).is_some_and(|w| w < change + offset)
            {
                return Some(change);
            }
            to = change - 1;
            continue;
        }
        if !follow && second_occurrence(zone, instant) {
            to = instant - 1;
            continue;
        }
        return Some(instant);
    }
}

/// The zone's offset from UTC at instant `ms`, in milliseconds.
fn offset_at(zone: &Tz, ms: i64) -> Option<i64> {
    let at = DateTime::<Utc>::from_timestamp_millis(ms)?;
    Some(i64::from(zone.offset_from_utc_datetime(&at.naive_utc()).fix().local_minus_utc()) * 1000)
}

/// The first wall time the expression names strictly after `wall` (wall
/// times as milliseconds, read as if in UTC).
fn first_wall_after(schedule: &cron::Schedule, wall: i64) -> Option<i64> {
    let at = DateTime::<Utc>::from_timestamp_millis(wall)?;
    schedule.after(&at).next().map(|t| t.timestamp_millis())
}

/// The last wall time the expression names at or before `wall`.
fn last_wall_at_or_before(schedule: &cron::Schedule, wall: i64) -> Option<i64> {
    // The cron crate walks back from a whole second exclusively, from
    // within a second inclusively of that second.
    let at = DateTime::<Utc>::from_timestamp_millis(wall.checked_add(1)?)?;
    schedule.after(&at).next_back().map(|t| t.timestamp_millis())
}

/// The first instant in `(from, to]` where the offset differs from the
/// one at `from`, and the offset there.
fn first_change(zone: &Tz, from: i64, to: i64) -> Option<(i64, i64)> {
    let offset = offset_at(zone, from)?;
    let mut below = from;
    while below < to {
        let probe = below.saturating_add(PROBE_STEP).min(to);
        if offset_at(zone, probe)? != offset {
            // One change in (below, probe]: find its first instant.
            let differs = bisect(below, probe, |ms| Some(offset_at(zone, ms)? == offset))?;
            return Some((differs, offset_at(zone, differs)?));
        }
        below = probe;
    }
    None
}

/// The start of `to`'s stretch of constant offset when it lies in
/// `(from, to]`, and the offset just before it.
fn last_change(zone: &Tz, from: i64, to: i64) -> Option<(i64, i64)> {
    let offset = offset_at(zone, to)?;
    let mut above = to;
    while above > from {
        let probe = above.saturating_sub(PROBE_STEP).max(from);
        if offset_at(zone, probe)? != offset {
            let same = bisect(probe, above, |ms| Some(offset_at(zone, ms)? != offset))?;
            return Some((same, offset_at(zone, same - 1)?));
        }
        above = probe;
    }
    None
}

/// The first instant in `(low, high]` where `before` stops holding, given
/// that it holds at `low`, not at `high`, and changes once between them.
fn bisect(mut low: i64, mut high: i64, before: impl Fn(i64) -> Option<bool>) -> Option<i64> {
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if before(mid)? {
            low = mid;
        } else {
            high = mid;
        }
    }
    Some(high)
}

/// Whether `ms` is the second occurrence of a local time that a clock set
/// back makes fall twice in `zone`.
fn second_occurrence(zone: &Tz, ms: i64) -> bool {
    let Some(at) = DateTime::<Utc>::from_timestamp_millis(ms) else { return false };
    let local = at.with_timezone(zone).naive_local();
    match zone.from_local_datetime(&local) {
        LocalResult::Ambiguous(first, _) => first.timestamp_millis() != ms,
        _ => false,
    }
}
