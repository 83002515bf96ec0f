//! Live counts: one task per served dashboard follows the store's watch of
//! every queue, reads the counts at most every [`LEAST_BETWEEN`] (a burst
//! of signals takes one read) and only while a page is open, and publishes
//! them when they changed; each open page streams them as server-sent
//! events. The task lives as long as `Dashboard::serve`: when that ends,
//! the sender goes with it and every stream ends.

use std::convert::Infallible;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use tokio::sync::{watch, Notify};
use waymark_store::{PgExecutor, Store};

use crate::App;

/// Counts are read at most this often: a busy queue signals thousands of
/// times a second, and each read counts rows (about 120 ms on a table of a
/// million tasks, `cargo xtask bench dashboard`).
const LEAST_BETWEEN: Duration = Duration::from_secs(1);

/// How often the counts are read with no signal at all.
const POLL: Duration = Duration::from_secs(5);

type Counts = watch::Sender<Option<Arc<str>>>;

/// The running task; aborted on drop.
pub(crate) struct Live {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the handlers hold: a weak handle on the counts (the task owns
/// them, so the streams end with it) and the bell a new page rings.
pub(crate) struct Feed {
    counts: Weak<Counts>,
    page_opened: Arc<Notify>,
}

impl Live {
    pub(crate) fn start<E: PgExecutor + 'static>(store: Arc<Store<E>>) -> (Live, Feed) {
        let counts: Arc<Counts> = Arc::new(watch::channel(None).0);
        let page_opened = Arc::new(Notify::new());
        let feed = Feed { counts: Arc::downgrade(&counts), page_opened: page_opened.clone() };
        let task = tokio::spawn(async move {
            let mut signals = store.watch_every_queue(POLL);
            let mut last = Instant::now() - LEAST_BETWEEN;
            loop {
                tokio::select! {
                    _ = signals.next() => {}
                    () = page_opened.notified() => {}
                }
                if counts.receiver_count() == 0 {
                    continue; // nobody looks: no read
                }
                // Real time: reads are spaced, whatever the signals' rate;
                // what came meanwhile is answered by this one read.
                tokio::time::sleep(LEAST_BETWEEN.saturating_sub(last.elapsed())).await;
                signals.skip_pending();
                last = Instant::now();
                match store.stats(None).await {
                    Ok(now) => {
                        let doc: Arc<str> = serde_json::to_string(&now).expect("counts serialise").into();
                        counts.send_if_modified(|seen| {
                            let changed = seen.as_deref() != Some(&*doc);
                            if changed {
                                *seen = Some(doc.clone());
                            }
                            changed
                        });
                    }
                    Err(e) if e.is_store_closed() => return,
                    Err(e) => {
                        tracing::warn!(error = %e, "waymark dashboard: reading the counts failed; trying at the next signal");
                    }
                }
            }
        });
        (Live { task }, feed)
    }
}

/// `GET /api/live`: the counts now, then at each change; ends when the
/// dashboard stops.
pub(crate) async fn events<E: PgExecutor + 'static>(
    State(app): State<Arc<App<E>>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let rx = app.feed.counts.upgrade().map(|counts| {
        let mut rx = counts.subscribe();
        rx.mark_changed();
        rx
    });
    // The counts may be stale (nobody looked): read them now.
    app.feed.page_opened.notify_one();
    let stream = futures::stream::unfold(rx, |rx| async move {
        let mut rx = rx?;
        loop {
            rx.changed().await.ok()?;
            let now = rx.borrow_and_update().clone();
            if let Some(doc) = now {
                return Some((Ok(Event::default().event("counts").data(&*doc)), Some(rx)));
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}
