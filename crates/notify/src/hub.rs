//! A hub: one direct listener session for one connector and one set of
//! channels, kept alive by a task (`task.rs`), shared by any number of
//! subscribers.
//!
//! ```text
//!            +-------------------------------------------+
//!            v                                           |
//! spawn -> Connecting --LISTEN, probe ok--> Listening --lost--> Down --backoff--+
//!            |   |  \                                     ^                      |
//!            |   |   +--attempt failed--------------------+                      |
//!            |   +--leader lock taken--> Standby --standby_retry--> Connecting <-+
//!            +--probe did not come back--> Unavailable (the task ends)
//! close, or the last handle gone --> Closed (the task ends)
//! ```

mod task;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{broadcast, watch};

use crate::channel::validate_all;
use crate::connector::Connector;
use crate::error::HubError;
use crate::options::HubOptions;
use crate::subscription::{Event, Subscription};
use task::Task;

/// Where a hub is; read it from [`Hub::state`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HubState {
    /// Opening a session, taking the lock, listening, probing.
    Connecting,
    /// Listening: notifications are delivered.
    Listening,
    /// Another session holds the leader lock; this hub tries again every
    /// [`standby_retry`](HubOptions::standby_retry), holding no connection
    /// meanwhile.
    Standby,
    /// Between two connection attempts.
    Down {
        /// Why the last attempt failed or the session was lost.
        reason: String,
    },
    /// The path cannot deliver notifications (ListenUnavailable: the probe
    /// did not come back, as behind a transaction-mode pooler). Terminal:
    /// the hub does not retry; callers poll.
    Unavailable {
        /// What happened, and how to fix it.
        reason: String,
    },
    /// Closed on request, or because every handle was dropped. Terminal.
    Closed,
}

impl HubState {
    /// Whether the hub is done for good ([`Unavailable`](Self::Unavailable)
    /// or [`Closed`](Self::Closed)).
    pub fn is_terminal(&self) -> bool {
        matches!(self, HubState::Unavailable { .. } | HubState::Closed)
    }
}

/// Counters of one hub since it started, for tests and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HubStats {
    /// Sessions opened or tried.
    pub connect_attempts: u64,
    /// Attempts that failed before listening.
    pub failed_attempts: u64,
    /// Of those, failures because the server was full.
    pub capacity_errors: u64,
    /// Times the hub reached [`HubState::Listening`].
    pub listens: u64,
    /// Listening sessions that were lost.
    pub disconnects: u64,
    /// Times the leader lock was held by another session.
    pub standbys: u64,
    /// Notifications passed to subscribers (not counting probes).
    pub notifications: u64,
}

#[derive(Debug, Default)]
struct Counters {
    connect_attempts: AtomicU64,
    failed_attempts: AtomicU64,
    capacity_errors: AtomicU64,
    listens: AtomicU64,
    disconnects: AtomicU64,
    standbys: AtomicU64,
    notifications: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> HubStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        HubStats {
            connect_attempts: get(&self.connect_attempts),
            failed_attempts: get(&self.failed_attempts),
            capacity_errors: get(&self.capacity_errors),
            listens: get(&self.listens),
            disconnects: get(&self.disconnects),
            standbys: get(&self.standbys),
            notifications: get(&self.notifications),
        }
    }
}

static NEXT_HUB_ID: AtomicU64 = AtomicU64::new(1);

/// What every handle of one hub shares. When the last one goes, so does the
/// shutdown sender, and the task ends.
struct Shared {
    id: u64,
    label: String,
    channels: Vec<String>,
    shutdown: watch::Sender<bool>,
    state: watch::Receiver<HubState>,
    events: broadcast::WeakSender<Event>,
    counters: Arc<Counters>,
}

/// A handle to a hub; clones share it. The hub closes when
/// [`close`](Self::close) is called or when its last handle and last
/// [`Subscription`] are dropped.
#[derive(Clone)]
pub struct Hub {
    shared: Arc<Shared>,
}

impl Hub {
    /// Starts a hub on `channels` (at least one; the first carries the
    /// probe) as a task of the current tokio runtime. It connects in the
    /// background: watch [`state`](Self::state). The hub ends with that
    /// runtime; a [`Registry`](crate::Registry) runs its hubs on a thread of
    /// its own instead.
    pub fn spawn<I, S>(connector: Connector, channels: I, options: HubOptions) -> Result<Hub, HubError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let channels = validate_all(channels)?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| HubError::NoRuntime)?;
        Ok(Hub::spawn_on(&runtime, connector, channels, options))
    }

    /// Starts a hub as a task of `runtime`, on channels already validated.
    pub(crate) fn spawn_on(
        runtime: &tokio::runtime::Handle,
        connector: Connector,
        channels: Vec<String>,
        options: HubOptions,
    ) -> Hub {
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let (state_tx, state_rx) = watch::channel(HubState::Connecting);
        let (events_tx, _) = broadcast::channel(options.event_buffer);
        let counters = Arc::new(Counters::default());
        let shared = Arc::new(Shared {
            id: NEXT_HUB_ID.fetch_add(1, Ordering::Relaxed),
            label: connector.label().to_owned(),
            channels: channels.clone(),
            shutdown: shutdown_tx,
            state: state_rx,
            events: events_tx.downgrade(),
            counters: counters.clone(),
        });
        let task = Task {
            label: shared.label.clone(),
            connector,
            channels,
            options,
            state: state_tx,
            events: events_tx,
            shutdown: shutdown_rx,
            counters,
        };
        runtime.spawn(task.run());
        Hub { shared }
    }

    /// A process-unique id (tests tell hubs apart with it).
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// The connector's label: `user@host:port/database`.
    pub fn label(&self) -> &str {
        &self.shared.label
    }

    /// The channels, without repeats, in the order given.
    pub fn channels(&self) -> &[String] {
        &self.shared.channels
    }

    /// A new subscriber: every event from now on. Subscribing to a hub that
    /// has ended gives a subscription that ends at once.
    pub fn subscribe(&self) -> Subscription {
        self.subscribe_for(self.shared.clone())
    }

    /// A subscription that keeps `owner` alive.
    pub(crate) fn subscribe_for(&self, owner: Arc<dyn std::any::Any + Send + Sync>) -> Subscription {
        let events = self.shared.events.upgrade().map(|sender| sender.subscribe());
        Subscription::new(events, owner)
    }

    /// The hub's state, to read or to wait on
    /// ([`watch::Receiver::wait_for`]). Its sender is dropped when the task
    /// has ended, connection closed.
    pub fn state(&self) -> watch::Receiver<HubState> {
        self.shared.state.clone()
    }

    /// The state now.
    pub fn current_state(&self) -> HubState {
        self.shared.state.borrow().clone()
    }

    /// The hub's counters.
    pub fn stats(&self) -> HubStats {
        self.shared.counters.snapshot()
    }

    /// Asks the hub to close: its task ends its session and stops.
    /// Subscriptions then end. Does not wait; see [`finished`](Self::finished).
    pub fn close(&self) {
        self.shared.shutdown.send_replace(true);
    }

    /// Whether the task has ended (its connection is gone).
    pub fn is_finished(&self) -> bool {
        self.shared.state.has_changed().is_err()
    }

    /// Waits until the task has ended (its connection is gone).
    pub async fn finished(&self) {
        let mut state = self.state();
        while state.changed().await.is_ok() {}
    }
}

impl fmt::Debug for Hub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hub")
            .field("id", &self.shared.id)
            .field("label", &self.shared.label)
            .field("channels", &self.shared.channels)
            .field("state", &*self.shared.state.borrow())
            .finish()
    }
}
