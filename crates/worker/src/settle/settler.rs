//! The settle stage's way in ([`Settler`]): settlements go to the batching
//! task, or straight to the store when batching is off or the batcher has
//! closed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{Error, ExecError, ExecErrorKind, PgExecutor, Result, Settled, Settlement, Store, Task};

use super::outcome::{settlement_for, HandlerEnd};
use crate::shared::{Running, Shared, Slot};

/// What is left to do after a settlement's first answer: its rare paths
/// (a resend, a refused result's failure, a lost lease's read).
pub(crate) type FollowUp = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Where a settlement's outcome goes.
pub(crate) enum Reply<E> {
    /// A caller that waits for it.
    Wait(oneshot::Sender<Result<Settled>>),
    /// A one-task call that ended without waiting, with what is left of it
    /// (its slot, which holds its run): the outcome is recorded, and the
    /// slot dropped, which ends the call.
    Handoff(Slot<E>),
}

/// The batcher's own sender, weak: held by the batching task, a strong one
/// would keep its channel open after every settler has gone.
pub(crate) type Again<E> = mpsc::WeakUnboundedSender<Item<E>>;

pub(crate) type Item<E> = (Settlement, Reply<E>);

/// Sends settlements to the batching task, or straight to the store.
pub(crate) struct Settler<E> {
    pub(super) shared: Arc<Shared<E>>,
    pub(super) tx: Option<mpsc::UnboundedSender<Item<E>>>,
}

impl<E> Clone for Settler<E> {
    fn clone(&self) -> Self {
        Settler { shared: self.shared.clone(), tx: self.tx.clone() }
    }
}

impl<E> std::fmt::Debug for Settler<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settler").field("batched", &self.tx.is_some()).finish()
    }
}

impl<E: PgExecutor + 'static> Settler<E> {
    /// Writes one settlement and answers its outcome.
    pub(super) async fn write(&self, s: &Settlement) -> Result<Settled> {
        // The direct paths are boxed: a statement's future is large, and
        // inline it would make every run's future large too, even when the
        // batcher settles it (one allocation per task, of the size of the
        // largest path). The batcher gets a copy, made before any await, so
        // the run's future holds only the reference.
        let store = &self.shared.store;
        let Some(tx) = &self.tx else { return Box::pin(settle_one(store, s)).await };
        let (reply, answer) = oneshot::channel();
        if tx.send((s.clone(), Reply::Wait(reply))).is_err() {
            return Box::pin(settle_one(store, s)).await;
        }
        match answer.await {
            Ok(out) => out,
            // The batcher stopped mid-flush: the outcome is unknown, and the
            // lease decides (an unsettled task is run again after it).
            Err(_) => Err(Error::Executor(ExecError::new(
                ExecErrorKind::Connection,
                "the settlement batcher stopped before answering; the outcome is unknown",
            ))),
        }
    }

    /// Whether settlements go to a batcher (which a call may hand its
    /// settlement off to).
    pub(crate) fn is_batched(&self) -> bool {
        self.tx.is_some()
    }

    /// What a run's end settles, or `None` when it settles nothing (see
    /// [`settlement_for`]).
    pub(crate) fn settlement_for(
        &self,
        task: &Task,
        running: &Running,
        end: Option<HandlerEnd>,
    ) -> Option<Settlement> {
        settlement_for(self.shared.settings.backoff, task, running, end)
    }

    /// Sends a settlement to the batcher with what is left of its call,
    /// which the flush ends. Gives both back when there is no batcher (or
    /// it has closed).
    pub(super) fn send_handoff(&self, s: Settlement, slot: Slot<E>) -> Option<(Settlement, Slot<E>)> {
        let Some(tx) = &self.tx else { return Some((s, slot)) };
        match tx.send((s, Reply::Handoff(slot))) {
            Ok(()) => None,
            Err(mpsc::error::SendError((s, Reply::Handoff(slot)))) => Some((s, slot)),
            Err(_) => unreachable!("a handoff comes back as it was sent"),
        }
    }
}

pub(super) async fn settle_one<E: PgExecutor>(store: &Store<E>, s: &Settlement) -> Result<Settled> {
    Ok(Settled::from(&store.settle(s).await?))
}
