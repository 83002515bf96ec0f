//! Cron slots across the daylight-saving changes of Europe/Paris and
//! America/New_York, on the arithmetic alone: each test is a pure function
//! of the instants it gives, no clock and no waiting.
//!
//! 2026 changes: Paris springs forward on 03-29 at 01:00Z (02:00 CET ->
//! 03:00 CEST) and falls back on 10-25 at 01:00Z (03:00 CEST -> 02:00 CET,
//! local 02:00-02:59 twice: 00:00Z-00:59Z, then 01:00Z-01:59Z). New York
//! springs forward on 03-08 at 07:00Z (02:00 EST -> 03:00 EDT) and falls
//! back on 11-01 at 06:00Z (02:00 EDT -> 01:00 EST, local 01:00-01:59
//! twice: 05:00Z-05:59Z, then 06:00Z-06:59Z).

use chrono::DateTime;

use crate::every::{slot_label, Every};

fn at(s: &str) -> i64 {
    DateTime::parse_from_rfc3339(s).unwrap_or_else(|e| panic!("{s}: {e}")).timestamp_millis()
}

/// The `n` slots after `from`, walked with `next_after`, as labels.
fn walk(every: &Every, from: &str, n: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(n);
    let mut ms = at(from);
    for _ in 0..n {
        ms = every.next_after(ms).unwrap_or_else(|| {
            panic!("{}: no slot after {} ({out:?} so far)", every.describe(), slot_label(ms))
        });
        out.push(slot_label(ms));
    }
    out
}

/// Checks the walk forward from `from` and the walk back from its last
/// slot against `expected` (UTC, whole seconds, `Z` implied).
fn check(zone: &str, expr: &str, from: &str, expected: &[&str]) {
    let every = Every::cron(expr, zone).expect("a good schedule");
    let expected: Vec<String> = expected.iter().map(|s| slot_label(at(&format!("{s}Z")))).collect::<Vec<_>>();
    assert_eq!(walk(&every, from, expected.len()), expected, "{expr:?} in {zone}, forward from {from}");
    let last = at(&expected[expected.len() - 1]);
    let back: Vec<String> =
        every.last_at_or_before(last, expected.len()).into_iter().map(slot_label).collect();
    assert_eq!(back, expected, "{expr:?} in {zone}, backward from {}", expected[expected.len() - 1]);
}

const SECOND: &str = "* * * * * *";
const MINUTE: &str = "0 * * * * *";
const QUARTER: &str = "0 */15 * * * *";
const HOURLY: &str = "0 0 * * * *";

#[test]
fn paris_fall_back() {
    let z = "Europe/Paris";
    // Expressions that fire every hour follow instants: both passes of
    // the repeated hour have their slots, evenly spaced.
    check(
        z,
        SECOND,
        "2026-10-25T00:59:58Z",
        &["2026-10-25T00:59:59", "2026-10-25T01:00:00", "2026-10-25T01:00:01"],
    );
    check(z, SECOND, "2026-10-25T01:05:00Z", &["2026-10-25T01:05:01", "2026-10-25T01:05:02"]);
    check(
        z,
        SECOND,
        "2026-10-25T01:59:58Z",
        &["2026-10-25T01:59:59", "2026-10-25T02:00:00", "2026-10-25T02:00:01"],
    );
    check(z, MINUTE, "2026-10-25T01:05:00Z", &["2026-10-25T01:06:00", "2026-10-25T01:07:00"]);
    check(
        z,
        QUARTER,
        "2026-10-25T00:30:00Z",
        &[
            "2026-10-25T00:45:00",
            "2026-10-25T01:00:00",
            "2026-10-25T01:15:00",
            "2026-10-25T01:30:00",
            "2026-10-25T01:45:00",
            "2026-10-25T02:00:00",
        ],
    );
    check(
        z,
        HOURLY,
        "2026-10-24T22:30:00Z",
        &["2026-10-24T23:00:00", "2026-10-25T00:00:00", "2026-10-25T01:00:00", "2026-10-25T02:00:00"],
    );
    // An expression naming a wall-clock time fires once, at its first
    // occurrence.
    check(z, "0 30 2 * * *", "2026-10-24T12:00:00Z", &["2026-10-25T00:30:00", "2026-10-26T01:30:00"]);
    check(z, "0 30 2 * * *", "2026-10-25T01:00:00Z", &["2026-10-26T01:30:00"]);
    check(
        z,
        "0 */15 2 * * *",
        "2026-10-24T23:00:00Z",
        &[
            "2026-10-25T00:00:00",
            "2026-10-25T00:15:00",
            "2026-10-25T00:30:00",
            "2026-10-25T00:45:00",
            "2026-10-26T01:00:00",
        ],
    );
}

#[test]
fn paris_spring_forward() {
    let z = "Europe/Paris";
    check(
        z,
        SECOND,
        "2026-03-29T00:59:58Z",
        &["2026-03-29T00:59:59", "2026-03-29T01:00:00", "2026-03-29T01:00:01"],
    );
    check(
        z,
        QUARTER,
        "2026-03-29T00:20:00Z",
        &["2026-03-29T00:30:00", "2026-03-29T00:45:00", "2026-03-29T01:00:00", "2026-03-29T01:15:00"],
    );
    check(
        z,
        HOURLY,
        "2026-03-28T22:30:00Z",
        &["2026-03-28T23:00:00", "2026-03-29T00:00:00", "2026-03-29T01:00:00", "2026-03-29T02:00:00"],
    );
    // A wall-clock time the change skips fires once, when the gap ends
    // (03:00 CEST); several such times in one gap are one slot.
    check(
        z,
        "0 30 2 * * *",
        "2026-03-28T00:00:00Z",
        &["2026-03-28T01:30:00", "2026-03-29T01:00:00", "2026-03-30T00:30:00"],
    );
    check(
        z,
        "0 */15 2 * * *",
        "2026-03-29T00:00:00Z",
        &["2026-03-29T01:00:00", "2026-03-30T00:00:00", "2026-03-30T00:15:00"],
    );
    check(
        z,
        "0 30 2,4 * * *",
        "2026-03-28T23:00:00Z",
        &["2026-03-29T01:00:00", "2026-03-29T02:30:00", "2026-03-30T00:30:00"],
    );
}

#[test]
fn new_york_fall_back() {
    let z = "America/New_York";
    check(
        z,
        SECOND,
        "2026-11-01T05:59:58Z",
        &["2026-11-01T05:59:59", "2026-11-01T06:00:00", "2026-11-01T06:00:01"],
    );
    check(z, SECOND, "2026-11-01T06:30:00Z", &["2026-11-01T06:30:01", "2026-11-01T06:30:02"]);
    check(
        z,
        QUARTER,
        "2026-11-01T05:40:00Z",
        &[
            "2026-11-01T05:45:00",
            "2026-11-01T06:00:00",
            "2026-11-01T06:15:00",
            "2026-11-01T06:30:00",
            "2026-11-01T06:45:00",
            "2026-11-01T07:00:00",
        ],
    );
    check(
        z,
        HOURLY,
        "2026-11-01T03:30:00Z",
        &["2026-11-01T04:00:00", "2026-11-01T05:00:00", "2026-11-01T06:00:00", "2026-11-01T07:00:00"],
    );
    check(
        z,
        "0 30 1 * * *",
        "2026-10-31T00:00:00Z",
        &["2026-10-31T05:30:00", "2026-11-01T05:30:00", "2026-11-02T06:30:00"],
    );
    check(z, "0 30 1 * * *", "2026-11-01T06:10:00Z", &["2026-11-02T06:30:00"]);
}

#[test]
fn new_york_spring_forward() {
    let z = "America/New_York";
    check(
        z,
        SECOND,
        "2026-03-08T06:59:58Z",
        &["2026-03-08T06:59:59", "2026-03-08T07:00:00", "2026-03-08T07:00:01"],
    );
    check(
        z,
        QUARTER,
        "2026-03-08T06:20:00Z",
        &["2026-03-08T06:30:00", "2026-03-08T06:45:00", "2026-03-08T07:00:00", "2026-03-08T07:15:00"],
    );
    check(
        z,
        HOURLY,
        "2026-03-08T05:30:00Z",
        &["2026-03-08T06:00:00", "2026-03-08T07:00:00", "2026-03-08T08:00:00"],
    );
    check(
        z,
        "0 30 2 * * *",
        "2026-03-07T00:00:00Z",
        &["2026-03-07T07:30:00", "2026-03-08T07:00:00", "2026-03-09T06:30:00"],
    );
}

/// Every minute through a whole change day, from every second of the
/// repeated (or skipped) hour: always a slot, 60 s after the minute.
#[test]
fn every_minute_has_a_next_slot_all_through_each_change() {
    for (zone, change) in [
        ("Europe/Paris", "2026-10-25T01:00:00Z"),
        ("Europe/Paris", "2026-03-29T01:00:00Z"),
        ("America/New_York", "2026-11-01T06:00:00Z"),
        ("America/New_York", "2026-03-08T07:00:00Z"),
    ] {
        let every = Every::cron(MINUTE, zone).unwrap();
        let change = at(change);
        let mut ms = change - 2 * 3_600_000;
        while ms < change + 2 * 3_600_000 {
            let next =
                every.next_after(ms).unwrap_or_else(|| panic!("{zone}: no slot after {}", slot_label(ms)));
            assert_eq!(next, (ms.div_euclid(60_000) + 1) * 60_000, "{zone}: after {}", slot_label(ms));
            ms += 1_000;
        }
    }
}

/// Walking forward and walking back give the same slots around every
/// change, for expressions of both kinds, strictly increasing.
#[test]
fn the_walks_forward_and_back_agree_around_each_change() {
    let exprs = [SECOND, QUARTER, HOURLY, "0 30 2 * * *", "0 */15 2 * * *", "0 0 */2 * * *", "* * 1-2 * * *"];
    for (zone, change) in [
        ("Europe/Paris", "2026-10-25T01:00:00Z"),
        ("Europe/Paris", "2026-03-29T01:00:00Z"),
        ("America/New_York", "2026-11-01T06:00:00Z"),
        ("America/New_York", "2026-03-08T07:00:00Z"),
    ] {
        for expr in exprs {
            let every = Every::cron(expr, zone).unwrap();
            let (start, end) = (at(change) - 3 * 3_600_000, at(change) + 3 * 3_600_000);
            let mut forward = Vec::new();
            let mut ms = start;
            while let Some(next) = every.next_after(ms).filter(|&n| n <= end) {
                assert!(next > ms, "{expr:?} in {zone}: {} after {}", slot_label(next), slot_label(ms));
                forward.push(next);
                ms = next;
            }
            let back = every.last_at_or_before(end, forward.len() + 1);
            let back: Vec<i64> = back.into_iter().filter(|&b| b > start).collect();
            assert_eq!(back, forward, "{expr:?} in {zone} around {change}");
        }
    }
}
