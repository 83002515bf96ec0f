//! A handler's future, supervised: its panics caught, bounded by the
//! worker's `max_run_time`, and stopped past the shutdown grace.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;

use crate::settle::HandlerEnd;
use crate::shared::{panic_message, Shared};

/// How long a handler may take to stop by itself once shutdown fires its
/// token, before its future is dropped.
pub(crate) const STOP_GRACE: Duration = Duration::from_millis(500);

/// Runs a call's future with its panics caught, bounded by the worker's
/// `max_run_time`, and stopped past the shutdown grace: `None` when it was
/// stopped (shutdown gives its tasks back), a panic or the time limit as
/// their [`HandlerEnd`].
pub(super) async fn supervise<E, T>(
    shared: &Shared<E>,
    fut: impl Future<Output = T>,
) -> Option<Result<T, HandlerEnd>> {
    let run = AssertUnwindSafe(fut).catch_unwind();
    // The timers here are boxed, made only when they are needed (a time
    // limit, a shutdown past its grace): inline, each would widen every
    // call's future, which is moved into its runner per call (a tokio timer
    // is large).
    let bounded = async {
        match shared.settings.max_run_time {
            Some(limit) => Box::pin(tokio::time::timeout(limit, run)).await.map_err(|_| limit),
            None => Ok(run.await),
        }
    };
    // The stop first: a call started under `stop_now` past the grace is
    // dropped before its handler is polled at all.
    if *shared.state.past_grace.borrow() && *shared.state.stop_now.borrow() {
        return None;
    }
    // Then one poll without the stop's watchers: most calls end in it, and
    // subscribing (and registering a waiter, and taking it out again) on
    // the worker-wide watches costs more than a short handler.
    let mut bounded = std::pin::pin!(bounded);
    if let std::task::Poll::Ready(r) = futures::poll!(bounded.as_mut()) {
        return Some(ended(r));
    }
    // Past the shutdown grace the token fires; the handler gets a moment to
    // stop by itself (none when told to stop now), then its future is
    // dropped and the task given back.
    // Boxed, as the timers above: only a call that outlives its first poll
    // pays for it, where inline every call's future would carry it.
    let (mut past_grace, mut now) = (shared.state.past_grace.subscribe(), shared.state.stop_now.subscribe());
    let mut stopped = Box::pin(async move {
        if past_grace.wait_for(|past| *past).await.is_err() {
            std::future::pending::<()>().await;
        }
        Box::pin(async move {
            tokio::select! {
                () = tokio::time::sleep(STOP_GRACE) => {}
                Ok(_) = now.wait_for(|now| *now) => {}
            }
        })
        .await;
    });
    // The stop first at every poll; the handler not again at once, since it
    // was polled just now (its waker, this task's, is registered).
    let mut polled = true;
    let r = std::future::poll_fn(|cx| {
        if stopped.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(None);
        }
        if std::mem::take(&mut polled) {
            return std::task::Poll::Pending;
        }
        bounded.as_mut().poll(cx).map(Some)
    })
    .await?;
    Some(ended(r))
}

/// A supervised call's end: its output, or its panic or time limit as a
/// [`HandlerEnd`].
pub(super) fn ended<T>(
    r: Result<Result<T, Box<dyn std::any::Any + Send>>, Duration>,
) -> Result<T, HandlerEnd> {
    match r {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(panic)) => Err(HandlerEnd::Panicked(panic_message(&panic))),
        Err(limit) => Err(HandlerEnd::TimedOut(limit)),
    }
}
