//! How long a hub waits before its next connection attempt: full-jitter
//! exponential backoff, with a slower base when the server said it is full.
//!
//! Full jitter (a delay drawn uniformly from zero to the exponential
//! ceiling) spreads a fleet's reconnects after an outage instead of having
//! every process knock at the same instants. A capacity error (SQLSTATE
//! 53300, "too many clients") means the server is up but has no slot: backing
//! off from a larger base leaves the slots to the work that holds them.

use std::time::Duration;

use rand::Rng;

/// Whether an error means "the server has no connection slot for you": the
/// SQLSTATE 53300 (`too_many_connections`), or a message PostgreSQL or a
/// pooler uses for it when no SQLSTATE came with it.
pub(crate) fn is_capacity_error(sqlstate: Option<&str>, message: &str) -> bool {
    if sqlstate == Some("53300") {
        return true;
    }
    let message = message.to_ascii_lowercase();
    [
        "too many clients",
        "too many connections",
        "remaining connection slots are reserved",
        // PgBouncer at max_client_conn.
        "no more connections allowed",
    ]
    .iter()
    .any(|needle| message.contains(needle))
}

/// The largest delay of attempt `attempt` (0 for the first retry):
/// `base * 2^attempt`, at most `max`.
pub(crate) fn ceiling(attempt: u32, base: Duration, max: Duration) -> Duration {
    // 2^31 times any base over a nanosecond is past any sane cap already.
    let factor = 1u32 << attempt.min(31);
    base.checked_mul(factor).map_or(max, |d| d.min(max))
}

/// The backoff of one hub: how many attempts failed in a row since the last
/// successful LISTEN, and the bases to grow from.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    base: Duration,
    capacity_base: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    pub(crate) fn new(base: Duration, capacity_base: Duration, max: Duration) -> Backoff {
        Backoff { base, capacity_base, max, failures: 0 }
    }

    /// The delay before the next attempt after one more failure; `capacity`
    /// picks the slower base.
    pub(crate) fn next_delay(&mut self, capacity: bool) -> Duration {
        let base = if capacity { self.capacity_base } else { self.base };
        let top = ceiling(self.failures, base, self.max);
        self.failures = self.failures.saturating_add(1);
        let top_nanos = u64::try_from(top.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rand::thread_rng().gen_range(0..=top_nanos))
    }

    /// Called after a successful LISTEN: the next failure starts from the
    /// base again.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }

    /// Failed attempts since the last reset.
    #[cfg(test)]
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_ceiling_doubles_from_the_base_up_to_the_cap() {
        let (base, max) = (250 * MS, 30_000 * MS);
        let ceilings: Vec<_> = (0..10).map(|n| ceiling(n, base, max)).collect();
        assert_eq!(
            ceilings,
            [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000].map(|ms| ms * MS).to_vec()
        );
        assert_eq!(ceiling(u32::MAX, base, max), max, "no overflow on a long outage");
        assert_eq!(ceiling(40, Duration::from_secs(u64::MAX / 2), max), max);
    }

    #[test]
    fn delays_are_jittered_below_the_ceiling() {
        let mut backoff = Backoff::new(250 * MS, 2000 * MS, 30_000 * MS);
        let mut seen_below_half = false;
        for attempt in 0..200 {
            let delay = backoff.next_delay(false);
            let top = ceiling(attempt, 250 * MS, 30_000 * MS);
            assert!(delay <= top, "attempt {attempt}: {delay:?} over {top:?}");
            seen_below_half |= delay < top / 2;
        }
        assert!(seen_below_half, "full jitter draws from zero, not from half the ceiling");
    }

    #[test]
    fn capacity_errors_back_off_from_the_slower_base() {
        let (base, slow, max) = (250 * MS, 2000 * MS, 30_000 * MS);
        // The first delay after a capacity error may reach the slow base; an
        // ordinary one never passes the fast base.
        let firsts = |capacity: bool| {
            (0..500).map(move |_| Backoff::new(base, slow, max).next_delay(capacity)).max().unwrap()
        };
        assert!(firsts(false) <= base);
        let slow_max = firsts(true);
        assert!(slow_max > base && slow_max <= slow, "{slow_max:?}");

        let mut backoff = Backoff::new(base, slow, max);
        for _ in 0..20 {
            assert!(backoff.next_delay(true) <= max);
        }
    }

    #[test]
    fn a_reset_starts_again_from_the_base() {
        let mut backoff = Backoff::new(250 * MS, 2000 * MS, 30_000 * MS);
        for _ in 0..8 {
            backoff.next_delay(false);
        }
        assert_eq!(backoff.failures(), 8);
        backoff.reset();
        assert_eq!(backoff.failures(), 0);
        assert!(backoff.next_delay(false) <= 250 * MS);
    }

    #[test]
    fn capacity_errors_are_recognised_by_sqlstate_or_message() {
        assert!(is_capacity_error(Some("53300"), "whatever"));
        assert!(is_capacity_error(None, "FATAL: sorry, too many clients already"));
        assert!(is_capacity_error(
            None,
            "db error: FATAL: remaining connection slots are reserved for roles with the SUPERUSER attribute"
        ));
        assert!(is_capacity_error(None, "too many connections for role \"app\""));
        assert!(is_capacity_error(None, "no more connections allowed (max_client_conn)"));
        assert!(!is_capacity_error(Some("08006"), "connection refused"));
        assert!(!is_capacity_error(Some("57P01"), "terminating connection due to administrator command"));
        assert!(!is_capacity_error(None, "error connecting to server: Connection refused (os error 111)"));
    }
}
