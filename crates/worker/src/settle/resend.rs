//! Sending a worker's write again after a passing failure.

use std::future::Future;
use std::time::{Duration, Instant};

use waymark_store::Error;

/// Tries a write again after a passing failure, waiting 20 ms doubling to
/// 1 s in between, while the next try would start before `deadline` and
/// `stop` says nothing changed; answers the last outcome.
pub(crate) async fn while_passing<T, Fut>(
    mut out: Result<T, Error>,
    deadline: Instant,
    stop: impl Fn() -> bool,
    task: &str,
    mut again: impl FnMut() -> Fut,
) -> Result<T, Error>
where
    Fut: Future<Output = Result<T, Error>>,
{
    let mut pause = Duration::from_millis(20);
    while let Err(error) = &out {
        if !error.is_transient() || Instant::now() + pause >= deadline || stop() {
            break;
        }
        tracing::debug!(task, error = %error, "a worker write failed; trying again");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
        if stop() {
            break; // the lease went meanwhile: a resend could only do harm
        }
        out = again().await;
    }
    out
}
