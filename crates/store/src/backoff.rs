//! Retry backoff of protocol v1: window `w = min(max, base * 2^(attempt - 1))`
//! with the attempt already incremented by the claim, delay uniform in
//! `[w/2, w)`, in whole milliseconds.

use std::time::Duration;

use rand::Rng;

/// Backoff bounds. Defaults: base 1 s, max 30 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBackoff {
    /// The first retry's window.
    pub base: Duration,
    /// The largest window.
    pub max: Duration,
}

impl Default for RetryBackoff {
    fn default() -> Self {
        RetryBackoff { base: Duration::from_secs(1), max: Duration::from_secs(30) }
    }
}

impl RetryBackoff {
    /// The window for `attempt` (1 for the first run; values below 1 count as 1).
    pub fn window(&self, attempt: i32) -> Duration {
        Duration::from_millis(self.window_ms(attempt))
    }

    /// A delay drawn uniformly from `[w/2, w)` for `attempt`.
    pub fn delay(&self, attempt: i32) -> Duration {
        let w = self.window_ms(attempt);
        if w <= 1 {
            return Duration::from_millis(w);
        }
        // The first whole millisecond at or past w/2: for an odd window,
        // w/2 rounded down would lie half a millisecond below it.
        let low = w - w / 2;
        Duration::from_millis(rand::thread_rng().gen_range(low..w))
    }

    fn window_ms(&self, attempt: i32) -> u64 {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let doublings = attempt.clamp(1, 64) as u32 - 1;
        let grown = ms(self.base).checked_mul(1u64.checked_shl(doublings).unwrap_or(u64::MAX));
        grown.unwrap_or(u64::MAX).min(ms(self.max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn windows_double_up_to_the_cap() {
        let b = RetryBackoff::default();
        assert_eq!(b.window(1), S(1));
        assert_eq!(b.window(2), S(2));
        assert_eq!(b.window(5), S(16));
        assert_eq!(b.window(6), S(30));
        assert_eq!(b.window(0), S(1));
        assert_eq!(b.window(i32::MAX), S(30));
    }

    #[test]
    fn an_odd_window_never_draws_below_its_half() {
        // A window of 3 ms: [1.5, 3) holds only 2 ms in whole milliseconds.
        let b = RetryBackoff { base: Duration::from_millis(3), max: Duration::from_millis(3) };
        for _ in 0..200 {
            assert_eq!(b.delay(1), Duration::from_millis(2));
        }
    }

    proptest! {
        #[test]
        fn delay_lies_in_the_upper_half_of_the_window(attempt in -5i32..100, base in 0u64..10_000, max in 0u64..100_000) {
            let b = RetryBackoff { base: Duration::from_millis(base), max: Duration::from_millis(max) };
            let w = b.window(attempt);
            let d = b.delay(attempt);
            prop_assert!(w <= Duration::from_millis(max));
            if w > Duration::from_millis(1) {
                prop_assert!(d >= w / 2 && d < w, "delay {:?} outside [{:?}, {:?})", d, w / 2, w);
            } else {
                prop_assert_eq!(d, w);
            }
        }

        #[test]
        fn windows_never_shrink(attempt in 1i32..80) {
            let b = RetryBackoff::default();
            prop_assert!(b.window(attempt + 1) >= b.window(attempt));
        }
    }
}
