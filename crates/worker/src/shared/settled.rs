//! How many tasks a worker has settled, and waiting for that count to
//! reach a number ([`WorkerHandle::until_settled`](crate::WorkerHandle::until_settled))
//! without polling it.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

/// No waiter's goal: the count is never past it.
const NO_GOAL: u64 = u64::MAX;

/// The settled count, with the lowest number a waiter waits for. A
/// settlement costs an atomic add and a load; only the one that reaches
/// the goal wakes the waiters, who then set their goals again.
pub(crate) struct SettledCount {
    count: AtomicU64,
    goal: AtomicU64,
    reached: Notify,
}

impl Default for SettledCount {
    fn default() -> Self {
        SettledCount { count: AtomicU64::new(0), goal: AtomicU64::new(NO_GOAL), reached: Notify::new() }
    }
}

impl SettledCount {
    /// Counts one more settled task.
    pub(crate) fn add_one(&self) {
        let now = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        let mut goal = self.goal.load(Ordering::SeqCst);
        // A waiter may lower the goal between the load and the swap: try
        // again with what it set, or its wait could outlast the last task.
        while now >= goal {
            match self.goal.compare_exchange(goal, NO_GOAL, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => {
                    self.reached.notify_waiters();
                    return;
                }
                Err(lowered) => goal = lowered,
            }
        }
    }

    pub(crate) fn get(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Until the count is at least `n`.
    pub(crate) async fn until(&self, n: u64) {
        loop {
            // Registered before the count is read, so a goal reached in
            // between still wakes this waiter.
            let reached = self.reached.notified();
            let mut reached = std::pin::pin!(reached);
            reached.as_mut().enable();
            if self.get() >= n {
                return;
            }
            self.goal.fetch_min(n, Ordering::SeqCst);
            // A settlement that read the goal before it was set did not
            // wake anyone: if it reached `n`, this read sees it.
            if self.get() >= n {
                return;
            }
            reached.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn waiters_wake_as_their_numbers_are_reached_and_not_before() {
        let count = Arc::new(SettledCount::default());
        let waiter = |n: u64| {
            let count = count.clone();
            tokio::spawn(async move { count.until(n).await })
        };
        let (three, five) = (waiter(3), waiter(5));
        tokio::task::yield_now().await;
        count.add_one();
        count.add_one();
        assert!(!three.is_finished() && !five.is_finished());
        count.add_one();
        tokio::time::timeout(Duration::from_secs(5), three).await.expect("3 reached").expect("joined");
        assert!(!five.is_finished(), "5 is not reached at 3");
        count.add_one();
        count.add_one();
        tokio::time::timeout(Duration::from_secs(5), five).await.expect("5 reached").expect("joined");
        // A number already reached answers at once.
        tokio::time::timeout(Duration::from_secs(5), count.until(4)).await.expect("already reached");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_waiter_is_missed_while_settlements_race_with_it() {
        for round in 0..200u64 {
            let count = Arc::new(SettledCount::default());
            let adder = {
                let count = count.clone();
                tokio::spawn(async move {
                    for _ in 0..50 {
                        count.add_one();
                        tokio::task::yield_now().await;
                    }
                })
            };
            let waits: Vec<_> = [10, 25, 50]
                .into_iter()
                .map(|n| {
                    let count = count.clone();
                    tokio::spawn(async move { count.until(n).await })
                })
                .collect();
            adder.await.expect("adder");
            for w in waits {
                tokio::time::timeout(Duration::from_secs(5), w)
                    .await
                    .unwrap_or_else(|_| panic!("round {round}: a waiter missed its number"))
                    .expect("joined");
            }
        }
    }
}
