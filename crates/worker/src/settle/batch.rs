//! Settlement, batched: settlements that arrive within a short window go
//! to the database in one transaction (each still ownership-checked, each
//! outcome answered on its own), flushed when the batch is full or the
//! window closes. An outcome is known only after the commit.
//!
//! A one-task call does not wait for its answer: it hands its settlement
//! off with what is left of the call (its slot, which holds its run) and
//! ends, and the flush ends the call when the commit answers
//! (`handed_answer`). A call's task then ends on the poll its handler
//! returns in, with no channel or wakeup of its own for the answer.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{PgExecutor, Result, Settled, Settlement, Store};

use super::answer::handed_answer;
use super::settler::{settle_one, Again, FollowUp, Item, Reply, Settler};
use crate::shared::{Ended, Shared};

impl<E: PgExecutor + 'static> Settler<E> {
    /// Starts the settle stage: a batcher, unless `settle_batch` is 1 or
    /// less (then every settlement is its own statement).
    pub(crate) fn start(shared: &Arc<Shared<E>>) -> (Self, Option<Batcher>) {
        let (max_batch, window) = (shared.settings.settle_batch, shared.settings.settle_window);
        if max_batch <= 1 {
            return (Settler { shared: shared.clone(), tx: None }, None);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let (close, closing) = watch::channel(false);
        let task = tokio::spawn(batch_loop(shared.clone(), rx, tx.downgrade(), closing, max_batch, window));
        (Settler { shared: shared.clone(), tx: Some(tx) }, Some(Batcher { task, close }))
    }
}

impl<E: PgExecutor + 'static> Reply<E> {
    /// `again` is the batcher's own way in, for a follow-up's resends.
    fn answer(
        self,
        settlement: Settlement,
        out: Result<Settled>,
        again: &Again<E>,
        ended: &mut Ended<E>,
        follow_ups: &mut Vec<FollowUp>,
    ) {
        match self {
            Reply::Wait(reply) => {
                let _ = reply.send(out);
            }
            Reply::Handoff(slot) => {
                // Recording it calls the observer and the error hook, whose
                // panics are caught where they are called
                // (`Running::observe_end`, `Shared::report`).
                let settler =
                    |shared: &Arc<Shared<E>>| Settler { shared: shared.clone(), tx: again.upgrade() };
                follow_ups.extend(handed_answer(slot, settlement, out, settler, ended));
            }
        }
    }
}

/// The batching task, stopped by [`Batcher::finish`].
pub(crate) struct Batcher {
    task: tokio::task::JoinHandle<()>,
    close: watch::Sender<bool>,
}

impl Batcher {
    /// Flushes what is queued and waits for every flush to be answered,
    /// and for what the answers left to do (resends, which stop past
    /// shutdown's grace).
    /// It does not wait for the senders to go away: a run stuck in
    /// blocking code may hold one for good (a later settlement goes
    /// straight to the store).
    pub(crate) async fn finish(self) {
        self.close.send_replace(true);
        let _ = self.task.await;
    }
}

/// Batches in flight at once: while one commits, the next fills. Each
/// also waits for a place in the worker's statement budget, which its
/// claims share, so fewer than this may run at once.
pub(crate) const FLUSHES_IN_FLIGHT: usize = 4;

/// The longest a batch short of its size waits for the flushes in flight
/// to commit, after its window has closed.
const HOLD_MAX: Duration = Duration::from_millis(50);

async fn batch_loop<E: PgExecutor + 'static>(
    shared: Arc<Shared<E>>,
    mut rx: mpsc::UnboundedReceiver<Item<E>>,
    again: Again<E>,
    mut closing: watch::Receiver<bool>,
    max_batch: usize,
    window: Duration,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(FLUSHES_IN_FLIGHT));
    // Flushes answer what their answers leave to do, which runs apart: a
    // follow-up (a resend may wait for most of a lease) is no flush in
    // flight, which a short batch waits for below.
    let mut flushes: JoinSet<Vec<FollowUp>> = JoinSet::new();
    let mut follow_ups: JoinSet<()> = JoinSet::new();
    let mut follow = |done: Result<Vec<FollowUp>, tokio::task::JoinError>| {
        let done = done.unwrap_or_else(|e| {
            // Its calls ended as it unwound; what they left to do is lost,
            // and their leases decide.
            tracing::error!(error = %e, "a settlement flush panicked");
            Vec::new()
        });
        for f in done {
            follow_ups.spawn(f);
        }
        while follow_ups.try_join_next().is_some() {}
    };
    loop {
        let received = tokio::select! {
            biased;
            item = rx.recv() => Some(item),
            // A flush's follow-ups start as it ends, settlements or not.
            Some(done) = flushes.join_next(), if !flushes.is_empty() => {
                follow(done);
                continue;
            }
            _ = closing.wait_for(|closed| *closed) => None,
        };
        let first = match received {
            Some(Some(item)) => item,
            Some(None) => break,
            None => {
                // Later sends fail and go straight to the store; what was
                // queued before this is flushed below. (`recv`, not
                // `try_recv`: a send under way as it closed is waited for,
                // not dropped.)
                rx.close();
                match rx.recv().await {
                    Some(item) => item,
                    None => break,
                }
            }
        };
        // A task released from the held ledger, settled while no flush is
        // in flight, goes at once with what is queued: what waits for it
        // is released by this commit, and on an idle worker a window
        // would only delay it.
        let at_once = first.0.lease().is_from_held() && flushes.is_empty();
        // Sized once (up to a bound): a batch of hundreds would otherwise
        // move each time it grew.
        let mut batch = Vec::with_capacity(max_batch.min(1024));
        batch.push(first);
        // One timer for the window, and what is queued taken at once: a
        // timer or a wakeup per settlement costs more than its share of the
        // statement.
        let window_closed = tokio::time::sleep(window);
        tokio::pin!(window_closed);
        while batch.len() < max_batch && !at_once {
            let room = max_batch - batch.len();
            tokio::select! {
                biased;
                taken = rx.recv_many(&mut batch, room) => if taken == 0 { break },
                () = &mut window_closed => break,
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
        let held = tokio::time::sleep(HOLD_MAX);
        tokio::pin!(held);
        while at_once && batch.len() < max_batch {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        while batch.len() < max_batch && !flushes.is_empty() {
            let room = max_batch - batch.len();
            tokio::select! {
                taken = rx.recv_many(&mut batch, room) => if taken == 0 { break },
                Some(done) = flushes.join_next() => follow(done),
                () = &mut held => break,
            }
        }
        let permit = slots.clone().acquire_owned().await.expect("the semaphore is never closed");
        let (shared, again) = (shared.clone(), again.clone());
        flushes.spawn(async move {
            // In flight, and so holding later short batches back, while it
            // waits for its place in the worker's statement budget too.
            let follow_ups = shared.statements.run(flush(&shared.store, &again, batch)).await;
            drop(permit);
            follow_ups
        });
        while let Some(done) = flushes.try_join_next() {
            follow(done);
        }
    }
    while let Some(done) = flushes.join_next().await {
        follow(done);
    }
    while follow_ups.join_next().await.is_some() {}
}

/// Settles one batch and answers each of its settlements; what the
/// answers leave to do comes back.
async fn flush<E: PgExecutor + 'static>(
    store: &Store<E>,
    again: &Again<E>,
    batch: Vec<Item<E>>,
) -> Vec<FollowUp> {
    let mut follow_ups = Vec::new();
    // Dropped on return, after every answer: ends the calls recorded.
    let mut ended = Ended::with_capacity(batch.len());
    if batch.len() == 1 {
        let (s, reply) = batch.into_iter().next().expect("one");
        let out = settle_one(store, &s).await;
        reply.answer(s, out, again, &mut ended, &mut follow_ups);
        return follow_ups;
    }
    let (items, replies): (Vec<Settlement>, Vec<Reply<E>>) = batch.into_iter().unzip();
    match store.settle_batch(&items).await {
        Ok(outcomes) => {
            for ((s, reply), out) in items.into_iter().zip(replies).zip(outcomes) {
                reply.answer(s, out, again, &mut ended, &mut follow_ups);
            }
        }
        Err(e) => {
            // The transaction failed as a whole: settle each on its own, so
            // one bad settlement cannot fail the others. If the batch did
            // commit after all (its answer lost), each re-run finds its task
            // settled and reports a lost lease; the rows are right either way.
            tracing::warn!(error = %e, size = items.len(), "batched settlement failed; settling one by one");
            // Every settlement, a snooze too, is fenced to its claim's own
            // worker id: a resend of one that committed answers a lost
            // lease, even after this worker claimed the task again.
            for (s, reply) in items.into_iter().zip(replies) {
                let out = settle_one(store, &s).await;
                // One by one, each call ends as it is answered.
                reply.answer(s, out, again, &mut Ended::with_capacity(1), &mut follow_ups);
            }
        }
    }
    follow_ups
}
