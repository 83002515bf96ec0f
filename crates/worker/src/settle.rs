//! Settlement, batched: settlements that arrive within a short window go
//! to the database in one transaction (each still ownership-checked, each
//! caller told its own outcome), flushed when the batch is full or the
//! window closes. A caller hears "settled" only after the commit.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use waymark_store::{ExecError, PgExecutor, Result, Settled, Settlement, Store};

type Reply = oneshot::Sender<Result<Settled>>;

/// Sends settlements to the batching task, or straight to the store.
#[derive(Debug, Clone)]
pub(crate) struct Settler {
    tx: Option<mpsc::UnboundedSender<(Settlement, Reply)>>,
}

impl Settler {
    /// With `max_batch` <= 1 every settlement is its own statement.
    pub(crate) fn start<E: PgExecutor + 'static>(
        store: Arc<Store<E>>,
        max_batch: usize,
        window: Duration,
    ) -> (Self, Option<Batcher>) {
        if max_batch <= 1 {
            return (Settler { tx: None }, None);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let (close, closing) = watch::channel(false);
        let task = tokio::spawn(batch_loop(store, rx, closing, max_batch, window));
        (Settler { tx: Some(tx) }, Some(Batcher { task, close }))
    }

    pub(crate) async fn settle<E: PgExecutor>(&self, store: &Store<E>, s: &Settlement) -> Result<Settled> {
        // The direct paths are boxed: a statement's future is large, and
        // inline it would make every run's future large too, even when the
        // batcher settles it (one allocation per task, of the size of the
        // largest path). The batcher gets a copy, made before any await, so
        // the run's future holds only the reference.
        let Some(tx) = &self.tx else { return Box::pin(settle_one(store, s)).await };
        let (reply, answer) = oneshot::channel();
        if tx.send((s.clone(), reply)).is_err() {
            return Box::pin(settle_one(store, s)).await;
        }
        match answer.await {
            Ok(out) => out,
            // The batcher stopped mid-flush: the outcome is unknown, and the
            // lease decides (an unsettled task is run again after it).
            Err(_) => Err(waymark_store::Error::Executor(waymark_store::ExecError::new(
                waymark_store::ExecErrorKind::Connection,
                "the settlement batcher stopped before answering; the outcome is unknown",
            ))),
        }
    }
}

async fn settle_one<E: PgExecutor>(store: &Store<E>, s: &Settlement) -> Result<Settled> {
    Ok(Settled::from(&store.settle(s).await?))
}

/// The batching task, stopped by [`Batcher::finish`].
pub(crate) struct Batcher {
    task: tokio::task::JoinHandle<()>,
    close: watch::Sender<bool>,
}

impl Batcher {
    /// Flushes what is queued and waits for every flush to be answered.
    /// It does not wait for the senders to go away: a run stuck in
    /// blocking code may hold one for good (a later settlement goes
    /// straight to the store).
    pub(crate) async fn finish(self) {
        self.close.send_replace(true);
        let _ = self.task.await;
    }
}

/// Batches in flight at once: while one commits, the next fills.
pub(crate) const FLUSHES_IN_FLIGHT: usize = 4;

/// The longest a batch short of its size waits for the flushes in flight
/// to commit, after its window has closed.
const HOLD_MAX: Duration = Duration::from_millis(50);

async fn batch_loop<E: PgExecutor + 'static>(
    store: Arc<Store<E>>,
    mut rx: mpsc::UnboundedReceiver<(Settlement, Reply)>,
    mut closing: watch::Receiver<bool>,
    max_batch: usize,
    window: Duration,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(FLUSHES_IN_FLIGHT));
    let mut flushes = tokio::task::JoinSet::new();
    loop {
        let first = tokio::select! {
            biased;
            item = rx.recv() => match item {
                Some(item) => item,
                None => break,
            },
            _ = closing.wait_for(|closed| *closed) => {
                // Later sends fail and go straight to the store; what was
                // queued before this is flushed below.
                rx.close();
                match rx.try_recv() {
                    Ok(item) => item,
                    Err(_) => break,
                }
            }
        };
        // Sized once (up to a bound): a batch of hundreds would otherwise
        // move each time it grew.
        let mut batch = Vec::with_capacity(max_batch.min(1024));
        batch.push(first);
        let deadline = tokio::time::Instant::now() + window;
        while batch.len() < max_batch {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(item)) => batch.push(item),
                Ok(None) | Err(_) => break,
            }
        }
        // A batch the window closed on short waits, still filling, for the
        // flushes in flight to commit: under a trickle of settlements the
        // worker then commits about once per commit's time, not once per
        // window. Every commit here notifies (`cairnq_done`), and the server
        // serialises notifying commits, the producers' submits among them.
        // A full batch goes at once, so a drain keeps its flushes overlapped;
        // and a flush that hangs (a row lock, a lost connection) holds the
        // next one back [`HOLD_MAX`] at most.
        let held_until = tokio::time::Instant::now() + HOLD_MAX;
        while batch.len() < max_batch && !flushes.is_empty() {
            tokio::select! {
                item = rx.recv() => match item {
                    Some(item) => batch.push(item),
                    None => break,
                },
                _ = flushes.join_next() => {}
                () = tokio::time::sleep_until(held_until) => break,
            }
        }
        let permit = slots.clone().acquire_owned().await.expect("the semaphore is never closed");
        let store = store.clone();
        flushes.spawn(async move {
            flush(&store, batch).await;
            drop(permit);
        });
        while flushes.try_join_next().is_some() {}
    }
    while flushes.join_next().await.is_some() {}
}

async fn flush<E: PgExecutor>(store: &Store<E>, batch: Vec<(Settlement, Reply)>) {
    if batch.len() == 1 {
        let (s, reply) = batch.into_iter().next().expect("one");
        let _ = reply.send(settle_one(store, &s).await);
        return;
    }
    let (items, replies): (Vec<Settlement>, Vec<Reply>) = batch.into_iter().unzip();
    match store.settle_batch(&items).await {
        Ok(outcomes) => {
            for (reply, out) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(out);
            }
        }
        Err(e) => {
            // The transaction failed as a whole: settle each on its own, so
            // one bad settlement cannot fail the others. If the batch did
            // commit after all (its answer lost), each re-run finds its task
            // settled and reports a lost lease; the rows are right either way.
            tracing::warn!(error = %e, size = items.len(), "batched settlement failed; settling one by one");
            // A snooze cannot be resent blind when the batch may have
            // committed: it gives the attempt back, so its fence also
            // matches this worker's re-claim of the task. Its run resends
            // it (`run::settle_again`), which stops once a re-claim here
            // has marked that run lost.
            let unknown = e.is_transient().then(|| e.exec_kind()).flatten();
            for (s, reply) in items.iter().zip(replies) {
                let out = match (s, unknown) {
                    (Settlement::Snooze { .. }, Some(kind)) => {
                        Err(ExecError::new(kind, e.to_string()).into())
                    }
                    _ => settle_one(store, s).await,
                };
                let _ = reply.send(out);
            }
        }
    }
}
