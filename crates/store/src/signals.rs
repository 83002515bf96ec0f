//! Wakeups from the executor's LISTEN stream, routed to the waiters and
//! watchers of one store.
//!
//! A signal means "re-read now": the tables stay the truth, and every waiter
//! backs its signal with a timer, so a lost, late or early notification costs
//! at most one interval, never a wrong answer. One stream per channel serves
//! a store (thousands of waits share one listener session): `cairnq_done`
//! wakes the waiters of that task id, `cairnq_queued` the watchers, and "may
//! have missed" (a reconnect, a lagging consumer, the end of a stream) wakes
//! everyone.
//!
//! Each channel is listened to from its first user on: `cairnq_queued` from
//! the first watch, `cairnq_done` from the first wait (or a watch that asks
//! for done signals). A worker process that never waits so never hears the
//! done notification of every task the fleet settles.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::{broadcast, watch};

use crate::closing::Life;
use crate::executor::{ListenEvent, NotificationStream, PgExecutor};

/// The protocol's notification channels.
pub(crate) const QUEUED_CHANNEL: &str = "cairnq_queued";
pub(crate) const DONE_CHANNEL: &str = "cairnq_done";

/// How long after a failed or lost listen the store asks the executor again.
const RELISTEN_AFTER: Duration = Duration::from_secs(2);

/// What a watcher hears; see [`crate::Store::watch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signal {
    /// A task became queued in this queue (submitted, retried or put back).
    Queued(String),
    /// This task reached a terminal status.
    Done(String),
    /// Re-read everything: the poll interval passed, or notifications may
    /// have been missed (a reconnect, a lagging watcher, no listener).
    Poll,
}

/// A notification channel the store listens to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Channel {
    /// `cairnq_queued`: watches.
    Queued,
    /// `cairnq_done`: waits.
    Done,
}

impl Channel {
    fn name(self) -> &'static str {
        match self {
            Channel::Queued => QUEUED_CHANNEL,
            Channel::Done => DONE_CHANNEL,
        }
    }
}

/// The stream of one channel.
#[derive(Debug, Default)]
struct Slot {
    /// Whether a stream is being consumed now.
    listening: bool,
    /// Whether that stream has said it delivers (its first "may have
    /// missed" marks listening begun).
    live: bool,
    /// When the store last asked the executor to listen.
    last_attempt: Option<Instant>,
}

#[derive(Debug, Default)]
struct State {
    queued: Slot,
    done_stream: Slot,
    /// Per task id: a counter bumped on each done signal.
    done: HashMap<String, watch::Sender<u64>>,
}

impl State {
    fn slot(&mut self, channel: Channel) -> &mut Slot {
        match channel {
            Channel::Queued => &mut self.queued,
            Channel::Done => &mut self.done_stream,
        }
    }
}

/// The router; shared by the clones of one store.
#[derive(Debug)]
pub(crate) struct Signals {
    state: Mutex<State>,
    /// Bumped on "may have missed": every waiter re-reads.
    everyone: watch::Sender<u64>,
    /// Every signal, for watchers.
    events: broadcast::Sender<Signal>,
    /// Bounds the waits' probes in flight, so thousands of waiters queue
    /// here rather than crowding the executor's callers (claims, settles).
    pub(crate) probes: tokio::sync::Semaphore,
}

/// Wait probes in flight at once, per store.
const PROBES_IN_FLIGHT: usize = 2;

impl Default for Signals {
    fn default() -> Self {
        Signals {
            state: Mutex::default(),
            everyone: watch::channel(0).0,
            events: broadcast::channel(4096).0,
            probes: tokio::sync::Semaphore::new(PROBES_IN_FLIGHT),
        }
    }
}

impl Signals {
    /// Starts consuming the executor's LISTEN stream of `channel` unless one
    /// is being consumed, or was asked for within [`RELISTEN_AFTER`]. Costs
    /// nothing while listening; without a listener the caller simply polls.
    /// A closed store listens no more.
    pub(crate) async fn ensure_listening<E: PgExecutor>(
        self: &Arc<Self>,
        exec: &E,
        life: &Life,
        channel: Channel,
    ) {
        if life.check().is_err() {
            return;
        }
        {
            let mut st = self.state.lock().expect("signals lock");
            let slot = st.slot(channel);
            if slot.listening || slot.last_attempt.is_some_and(|t| t.elapsed() < RELISTEN_AFTER) {
                return;
            }
            slot.last_attempt = Some(Instant::now());
            // Claimed now, so concurrent callers do not listen twice.
            slot.listening = true;
        }
        // Cancel safe: if the caller is dropped during the await below, the
        // guard gives the claim back, so a later call listens again.
        let mut claim = ListenClaim { signals: Some(self), channel, answered: false };
        let answer = exec.listen(&[channel.name()]).await;
        claim.answered = true;
        match answer {
            Ok(Some(stream)) => {
                // The consumer owns the flag now. Its guard is made before
                // the spawn: a task dropped before its first poll (its
                // runtime shutting down) still gives the flag back.
                claim.signals = None;
                let consuming = Consuming { signals: Arc::downgrade(self), channel, unfinished: true };
                tokio::spawn(consume(consuming, stream, life.closed()));
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "listen failed; waits poll until it comes back"),
        }
    }

    /// Whether the stream of `channel` is being consumed and has begun
    /// delivering.
    pub(crate) fn is_listening(&self, channel: Channel) -> bool {
        self.state.lock().expect("signals lock").slot(channel).live
    }

    /// Registers for the done signal of `task_id`. Register before reading
    /// the row: a signal that lands between the read and the wait is kept.
    pub(crate) fn subscribe_done(self: &Arc<Self>, task_id: &str) -> DoneSubscription {
        let mut st = self.state.lock().expect("signals lock");
        let rx = st.done.entry(task_id.to_owned()).or_insert_with(|| watch::channel(0).0).subscribe();
        DoneSubscription {
            task_id: task_id.to_owned(),
            rx,
            everyone: self.everyone.subscribe(),
            signals: self.clone(),
        }
    }

    /// Every signal from now on, for a watcher.
    pub(crate) fn events(&self) -> broadcast::Receiver<Signal> {
        self.events.subscribe()
    }

    fn dispatch(&self, event: ListenEvent, channel: Channel) {
        match event {
            ListenEvent::Notification(n) if n.channel == DONE_CHANNEL => {
                if let Some(tx) = self.state.lock().expect("signals lock").done.get(&n.payload) {
                    tx.send_modify(|c| *c += 1);
                }
                let _ = self.events.send(Signal::Done(n.payload));
            }
            ListenEvent::Notification(n) if n.channel == QUEUED_CHANNEL => {
                let _ = self.events.send(Signal::Queued(n.payload));
            }
            ListenEvent::Notification(_) => {}
            ListenEvent::MayHaveMissed => {
                self.state.lock().expect("signals lock").slot(channel).live = true;
                self.wake_everyone();
            }
        }
    }

    pub(crate) fn wake_everyone(&self) {
        self.everyone.send_modify(|c| *c += 1);
        let _ = self.events.send(Signal::Poll);
    }
}

/// Resets `listening` unless disarmed: a listen attempt that failed, said
/// no, or was cancelled. A cancelled one (its caller dropped before the
/// executor answered) also wakes everyone once [`RELISTEN_AFTER`] has
/// passed: no attempt is made before then, and a watch would otherwise try
/// again only at its next poll.
struct ListenClaim<'a> {
    signals: Option<&'a Arc<Signals>>,
    channel: Channel,
    answered: bool,
}

impl Drop for ListenClaim<'_> {
    fn drop(&mut self) {
        let Some(s) = self.signals else { return };
        s.state.lock().unwrap_or_else(|p| p.into_inner()).slot(self.channel).listening = false;
        if !self.answered {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(wake_when_listening_may_retry(Arc::downgrade(s), self.channel));
            }
        }
    }
}

/// Wakes everyone once [`RELISTEN_AFTER`] has passed, unless `channel` is
/// listening again by then: the first moment a watch may try again.
async fn wake_when_listening_may_retry(signals: Weak<Signals>, channel: Channel) {
    tokio::time::sleep(RELISTEN_AFTER).await;
    if let Some(s) = signals.upgrade() {
        if !s.state.lock().expect("signals lock").slot(channel).listening {
            s.wake_everyone();
        }
    }
}

/// Routes one LISTEN stream until it ends, the store closes (the stream is
/// dropped then, and with it the executor's listener), or the store is gone.
async fn consume(
    mut consuming: Consuming,
    mut stream: NotificationStream,
    closed: impl std::future::Future<Output = ()>,
) {
    let (signals, channel) = (consuming.signals.clone(), consuming.channel);
    let mut closed = std::pin::pin!(closed);
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            // Dropping the stream releases the executor's listener.
            () = &mut closed => {
                consuming.unfinished = false;
                return;
            }
        };
        let Some(event) = event else { break };
        let Some(s) = signals.upgrade() else { return };
        s.dispatch(event, channel);
    }
    // Live or not yet, the stream is gone (its hub ended, or the executor's
    // own stream did): everyone re-reads, and watches listen again at once
    // (at most one attempt per RELISTEN_AFTER), rather than at their next
    // poll.
    tracing::debug!("the listen stream ended; waits poll until it comes back");
    consuming.unfinished = false;
    drop(consuming);
    // That first try may fall inside RELISTEN_AFTER of the last one: wake
    // once more when it has passed, so a watch tries again then.
    wake_when_listening_may_retry(signals, channel).await;
}

/// Gives back a consumer's claim on its channel however the consumer ends,
/// and wakes everyone to re-read and listen again: also when its task is
/// dropped unfinished (the runtime it was spawned on has ended, while the
/// store lives on in another), or the store would think itself listening
/// for good and never listen again. Dropped unfinished, it also lifts the
/// [`RELISTEN_AFTER`] pause: the stream did not fail, and no delayed wake
/// can be scheduled on a runtime that is going away.
struct Consuming {
    signals: Weak<Signals>,
    channel: Channel,
    unfinished: bool,
}

impl Drop for Consuming {
    fn drop(&mut self) {
        let Some(s) = self.signals.upgrade() else { return };
        {
            let mut st = s.state.lock().unwrap_or_else(|p| p.into_inner());
            let slot = st.slot(self.channel);
            (slot.listening, slot.live) = (false, false);
            if self.unfinished {
                slot.last_attempt = None;
            }
        }
        s.wake_everyone();
    }
}

/// A waiter's registration for one task's done signal.
#[derive(Debug)]
pub(crate) struct DoneSubscription {
    task_id: String,
    rx: watch::Receiver<u64>,
    everyone: watch::Receiver<u64>,
    signals: Arc<Signals>,
}

impl DoneSubscription {
    /// Waits for a signal for this task (or for everyone), at most `limit`.
    /// Returns at once if one came since the last call.
    pub(crate) async fn wait(&mut self, limit: Duration) {
        let _ = tokio::time::timeout(limit, async {
            tokio::select! {
                _ = self.rx.changed() => {}
                _ = self.everyone.changed() => {}
            }
        })
        .await;
    }
}

impl Drop for DoneSubscription {
    fn drop(&mut self) {
        let mut st = self.signals.state.lock().expect("signals lock");
        // This receiver still counts until it is dropped after this body.
        if st.done.get(&self.task_id).is_some_and(|tx| tx.receiver_count() <= 1) {
            st.done.remove(&self.task_id);
        }
    }
}
