//! Waiting in tests on what can be observed (a row, a count, a state), not
//! on a fixed time.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often the helpers here look again.
const LOOK_EVERY: Duration = Duration::from_millis(10);

/// Looks until `look` answers `Some`, and returns it; panics naming `what`
/// past `limit`.
pub async fn until_some<T, F, Fut>(limit: Duration, what: &str, mut look: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(found) = look().await {
            return found;
        }
        assert!(started.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        // The one pause of every wait here: between two looks.
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// Looks until `check` holds; panics naming `what` past `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    until_some(limit, what, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await
}
