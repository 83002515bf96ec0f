//! Retry backoff of protocol v1: window `w = min(max, base * 2^(attempt - 1))`
//! with the attempt already incremented by the claim, delay uniform in
//! `[w/2, w)`.

use rand::Rng;

/// Backoff bounds. Defaults: base 1000 ms, max 30000 ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBackoff {
    /// The first retry's window, in milliseconds.
    pub base_ms: i64,
    /// The largest window, in milliseconds.
    pub max_ms: i64,
}

impl Default for RetryBackoff {
    fn default() -> Self {
        RetryBackoff { base_ms: 1000, max_ms: 30_000 }
    }
}

impl RetryBackoff {
    /// The window for `attempt` (1 for the first run; values below 1 count as 1).
    pub fn window_ms(&self, attempt: i32) -> i64 {
        let doublings = attempt.clamp(1, 64) as u32 - 1;
        let grown = self.base_ms.max(0).checked_mul(1i64.checked_shl(doublings).unwrap_or(i64::MAX));
        grown.unwrap_or(i64::MAX).min(self.max_ms.max(0))
    }

    /// A delay drawn uniformly from `[w/2, w)` for `attempt`.
    pub fn delay_ms(&self, attempt: i32) -> i64 {
        let w = self.window_ms(attempt);
        if w <= 1 {
            return w.max(0);
        }
        rand::thread_rng().gen_range(w / 2..w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn windows_double_up_to_the_cap() {
        let b = RetryBackoff::default();
        assert_eq!(b.window_ms(1), 1000);
        assert_eq!(b.window_ms(2), 2000);
        assert_eq!(b.window_ms(5), 16_000);
        assert_eq!(b.window_ms(6), 30_000);
        assert_eq!(b.window_ms(0), 1000);
        assert_eq!(b.window_ms(i32::MAX), 30_000);
    }

    proptest! {
        #[test]
        fn delay_lies_in_the_upper_half_of_the_window(attempt in -5i32..100, base in 0i64..10_000, max in 0i64..100_000) {
            let b = RetryBackoff { base_ms: base, max_ms: max };
            let w = b.window_ms(attempt);
            let d = b.delay_ms(attempt);
            prop_assert!(w <= max);
            if w > 1 {
                prop_assert!(d >= w / 2 && d < w, "delay {} outside [{}, {})", d, w / 2, w);
            } else {
                prop_assert_eq!(d, w);
            }
        }

        #[test]
        fn windows_never_shrink(attempt in 1i32..80) {
            let b = RetryBackoff::default();
            prop_assert!(b.window_ms(attempt + 1) >= b.window_ms(attempt));
        }
    }
}
