//! How many of its claim and settlement statements a worker runs at once.
//!
//! Claims and settlement flushes each write hundreds of rows of the same
//! table, near the same index pages. On the bench's two-core server, two
//! such statements at once drained fastest: a third added waits on the
//! server's buffer locks, not work (docs/benchmarks.md, "Where the time
//! goes, and what limits it"). So claims and flushes share one budget of places, and a claim
//! or a flush waits for a place; a worker whose claims and flushes went
//! apart ran up to six at once, three on average.
//!
//! Heartbeats, give-backs, and settlements that do not go through the
//! batcher (with batching off, once it has closed at shutdown, and the
//! handler's own `complete`, `fail`, `snooze` and `complete_in`) are outside the
//! budget: they are small, and a lease must never wait behind a claim.

use std::future::Future;
use std::time::Duration;

use tokio::sync::Semaphore;

/// A statement that has held its place this long gives it up and runs on
/// outside the budget: a claim or flush takes milliseconds, so one this
/// slow waits on something (a row lock, a lost connection's timeout) and
/// must not hold back the worker's other statements meanwhile.
const HOLD_AT_MOST: Duration = Duration::from_secs(1);

/// The worker's places for claim and settlement statements.
#[derive(Debug)]
pub(crate) struct StatementBudget {
    places: Semaphore,
}

impl StatementBudget {
    /// The most places a budget has (the builder refuses more).
    pub(crate) const MAX_PLACES: usize = Semaphore::MAX_PERMITS;

    /// `places` is 1 to [`Self::MAX_PLACES`] (the builder checks it).
    pub(crate) fn new(places: usize) -> Self {
        StatementBudget { places: Semaphore::new(places.clamp(1, Self::MAX_PLACES)) }
    }

    /// Runs `statement` once a place is free, first come first served.
    pub(crate) async fn run<F: Future>(&self, statement: F) -> F::Output {
        let place = self.places.acquire().await.expect("the budget's semaphore is never closed");
        tokio::pin!(statement);
        tokio::select! {
            biased;
            out = &mut statement => return out,
            () = tokio::time::sleep(HOLD_AT_MOST) => {}
        }
        tracing::debug!(held = ?HOLD_AT_MOST, "a claim or flush gave up its place in the statement budget");
        drop(place);
        statement.await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn no_more_than_its_places_run_at_once() {
        let budget = Arc::new(StatementBudget::new(2));
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut all = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let (budget, now, most) = (budget.clone(), now.clone(), most.clone());
            all.spawn(async move {
                budget
                    .run(async {
                        let at = now.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(at, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        now.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
            });
        }
        while all.join_next().await.is_some() {}
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_statement_that_hangs_gives_its_place_up() {
        let budget = Arc::new(StatementBudget::new(1));
        let (holding, held) = tokio::sync::oneshot::channel();
        let hung = tokio::spawn({
            let budget = budget.clone();
            async move {
                budget
                    .run(async move {
                        let _ = holding.send(());
                        std::future::pending::<()>().await
                    })
                    .await
            }
        });
        held.await.expect("the first statement holds the place");
        // With the clock paused, time jumps ahead once every task is idle:
        // the second statement runs only when the first has let go.
        let asked = tokio::time::Instant::now();
        let second = tokio::time::timeout(HOLD_AT_MOST * 2, budget.run(async { 7 })).await;
        assert_eq!(second, Ok(7));
        assert!(asked.elapsed() >= HOLD_AT_MOST - Duration::from_millis(1), "{:?}", asked.elapsed());
        hung.abort();
    }
}
