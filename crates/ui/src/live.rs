//! Live counts: one task per dashboard follows the store's `watch` (every
//! queue it has seen, done signals included), reads the counts at most
//! every [`LEAST_BETWEEN`], and publishes them when they changed; each open
//! page streams them as server-sent events. One count per change, however
//! many pages are open.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use tokio::sync::watch;
use waymark_store::{PgExecutor, Store};

use crate::App;

/// Counts are read at most this often: a busy queue signals thousands of
/// times a second, and each read counts rows (about 120 ms on a table of a
/// million tasks, `cargo xtask bench dashboard`).
const LEAST_BETWEEN: Duration = Duration::from_secs(1);

/// How often the counts are read with no signal at all.
const POLL: Duration = Duration::from_secs(5);

pub(crate) struct Live {
    counts: watch::Receiver<Option<Arc<str>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Live {
    pub(crate) fn start<E: PgExecutor + 'static>(store: Arc<Store<E>>) -> Live {
        let (tx, counts) = watch::channel(None);
        let task = tokio::spawn(async move {
            let mut queues: Vec<String> = Vec::new();
            let mut signals = store.watch(queues.clone(), POLL);
            let mut last = Instant::now() - LEAST_BETWEEN;
            loop {
                let _ = signals.next().await;
                // Real time: reads are spaced, whatever the signals' rate.
                tokio::time::sleep(LEAST_BETWEEN.saturating_sub(last.elapsed())).await;
                last = Instant::now();
                match store.stats(None).await {
                    Ok(now) => {
                        if now.keys().ne(queues.iter()) {
                            queues = now.keys().cloned().collect();
                            signals = store.watch(queues.clone(), POLL);
                        }
                        let doc: Arc<str> = serde_json::to_string(&now).expect("counts serialise").into();
                        // Only a change reaches the pages (each then reloads its list).
                        tx.send_if_modified(|last| {
                            let changed = last.as_deref() != Some(&*doc);
                            if changed {
                                *last = Some(doc.clone());
                            }
                            changed
                        });
                    }
                    Err(e) => {
                        if e.is_store_closed() {
                            return;
                        }
                        tracing::warn!(error = %e, "waymark dashboard: reading the counts failed; trying at the next signal");
                    }
                }
            }
        });
        Live { counts, task }
    }
}

/// `GET /api/live`: the counts now, then at each change.
pub(crate) async fn events<E: PgExecutor + 'static>(
    State(app): State<Arc<App<E>>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut rx = app.live.counts.clone();
    rx.mark_changed();
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            let now = rx.borrow_and_update().clone();
            if let Some(doc) = now {
                return Some((Ok(Event::default().event("counts").data(&*doc)), rx));
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}
