//! Hubs leased from a bounded registry: one hub per (connector label,
//! channel set, leader lock key), shared by reference count, closed after an
//! idle period, at most `max_hubs` at once.
//!
//! Invariants:
//! - one key has at most one hub that can be leased;
//! - a hub's slot is taken from its first lease until its task has ended
//!   (its connection is gone): a hub that is closing still counts, so the
//!   registry never holds more than `max_hubs` connections;
//! - the mutex is never held across an await;
//! - hubs and idle timers run on the registry's own thread
//!   ([`Background`]), never on a caller's runtime, so a hub outlives the
//!   runtime of the caller that leased it first.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::background::Background;
use crate::channel::validate_all;
use crate::connector::Connector;
use crate::error::RegistryError;
use crate::hub::{Hub, HubState, HubStats};
use crate::options::HubOptions;
use crate::subscription::Subscription;

/// Limits of a [`Registry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegistryOptions {
    /// Most hubs (so listener connections) at once, counting hubs in use,
    /// idle ones and ones still closing. Defaults to 8.
    pub max_hubs: usize,
    /// How long a hub without leases stays open, so that a caller that
    /// comes back soon finds it listening. Defaults to 30 s.
    pub idle_timeout: Duration,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions { max_hubs: 8, idle_timeout: Duration::from_secs(30) }
    }
}

/// Where a registry's slots are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistryStats {
    /// Slots taken: `leased + idle + closing`.
    pub hubs: usize,
    /// Hubs with at least one lease.
    pub leased: usize,
    /// Hubs without leases, waiting out the idle timeout.
    pub idle: usize,
    /// Hubs closed whose task has not ended yet.
    pub closing: usize,
    /// The registry's `max_hubs`.
    pub max_hubs: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct HubKey {
    label: String,
    /// Sorted, without repeats.
    channels: Vec<String>,
    leader_lock: Option<i64>,
}

struct Entry {
    hub: Hub,
    leases: usize,
    /// When the last lease went, if none is held now.
    idle_since: Option<Instant>,
}

#[derive(Default)]
struct Slots {
    hubs: HashMap<HubKey, Entry>,
    closing: Vec<Hub>,
    /// Started at the first hub.
    background: Option<Background>,
}

struct Inner {
    options: RegistryOptions,
    slots: Mutex<Slots>,
}

/// A set of shared hubs; cheap to clone. Most programs use
/// [`Registry::global`].
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

impl Registry {
    /// An empty registry.
    pub fn new(options: RegistryOptions) -> Registry {
        Registry { inner: Arc::new(Inner { options, slots: Mutex::default() }) }
    }

    /// The registry of this process, with the default
    /// [`RegistryOptions`].
    pub fn global() -> &'static Registry {
        static GLOBAL: OnceLock<Registry> = OnceLock::new();
        GLOBAL.get_or_init(|| Registry::new(RegistryOptions::default()))
    }

    /// The registry's limits.
    pub fn options(&self) -> RegistryOptions {
        self.inner.options
    }

    /// A lease on the hub for `connector` and `channels` (in any order)
    /// with `options`' leader lock: the open one if there is one (its other
    /// options are those of the acquire that started it), else a new one.
    /// Fails with [`RegistryError::Full`] when every slot is taken; the
    /// caller then polls, and may try again later.
    ///
    /// A new hub runs on the registry's own thread (started at the first
    /// hub), not on the caller's runtime: it lives on when that runtime
    /// ends, for the other leases on it. So `acquire` may be called from
    /// any thread, inside a runtime or not. That thread runs a
    /// current-thread runtime shared by all the registry's hubs: a
    /// [`Connector::from_fn`] function runs there, and must not block
    /// (nor call `block_in_place`).
    ///
    /// When the registry is full, the hub without leases that has been
    /// idle longest is closed, so that a later try finds its slot.
    pub fn acquire<I, S>(
        &self,
        connector: &Connector,
        channels: I,
        options: HubOptions,
    ) -> Result<HubLease, RegistryError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let given = validate_all(channels)?;
        let mut sorted = given.clone();
        sorted.sort();
        let key = HubKey {
            label: connector.label().to_owned(),
            channels: sorted,
            leader_lock: options.leader_lock,
        };
        let mut slots = self.inner.lock();
        self.inner.sweep(&mut slots);
        if let Some(entry) = slots.hubs.get_mut(&key) {
            entry.leases += 1;
            entry.idle_since = None;
            let hub = entry.hub.clone();
            drop(slots);
            return Ok(self.lease(key, hub));
        }
        let max = self.inner.options.max_hubs;
        if slots.hubs.len() + slots.closing.len() >= max {
            // An idle hub gives way to a caller who needs one: closed now,
            // its slot is free once its session is gone, for a later try.
            self.inner.close_longest_idle(&mut slots);
            return Err(RegistryError::Full { max });
        }
        if slots.background.is_none() {
            let started = Background::start().map_err(|e| RegistryError::Thread { reason: e.to_string() })?;
            slots.background = Some(started);
        }
        let Some(background) = slots.background.as_ref() else { unreachable!("started above") };
        let hub = Hub::spawn_on(background.handle(), connector.clone(), given, options);
        slots.hubs.insert(key.clone(), Entry { hub: hub.clone(), leases: 1, idle_since: None });
        drop(slots);
        Ok(self.lease(key, hub))
    }

    /// Where the slots are.
    pub fn stats(&self) -> RegistryStats {
        let mut slots = self.inner.lock();
        self.inner.sweep(&mut slots);
        let leased = slots.hubs.values().filter(|e| e.leases > 0).count();
        let idle = slots.hubs.len() - leased;
        let closing = slots.closing.len();
        RegistryStats {
            hubs: leased + idle + closing,
            leased,
            idle,
            closing,
            max_hubs: self.inner.options.max_hubs,
        }
    }

    /// Slots taken: hubs in use, idle or still closing.
    pub fn open_hubs(&self) -> usize {
        self.stats().hubs
    }

    fn lease(&self, key: HubKey, hub: Hub) -> HubLease {
        HubLease { inner: Arc::new(LeaseInner { registry: self.inner.clone(), key, hub }) }
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("options", &self.inner.options)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes the hubs idle for the whole idle timeout, and idle ones that
    /// are down, connecting or in standby (kept warm for nothing: a server
    /// gone, a database dropped); forgets closing hubs whose task has
    /// ended, and hubs whose task ended on its own without a verdict (a
    /// panic in it). An
    /// [`Unavailable`](HubState::Unavailable) hub stays while leased, so
    /// that its callers keep polling instead of probing again.
    fn sweep(&self, slots: &mut Slots) {
        let now = Instant::now();
        let idle_timeout = self.options.idle_timeout;
        let expired: Vec<HubKey> = slots
            .hubs
            .iter()
            .filter(|(_, e)| {
                let idle_over = e.idle_since.is_some_and(|since| now.duration_since(since) >= idle_timeout);
                // An Unavailable verdict is kept warm too: it spares the
                // next caller a probe that would fail the same way.
                let idle_deaf = e.leases == 0
                    && matches!(
                        e.hub.current_state(),
                        HubState::Down { .. } | HubState::Connecting | HubState::Standby
                    );
                let lost =
                    e.hub.is_finished() && !matches!(e.hub.current_state(), HubState::Unavailable { .. });
                idle_over || idle_deaf || lost
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in expired {
            close(slots, &key, "closing an idle hub");
        }
        slots.closing.retain(|hub| !hub.is_finished());
    }

    /// Closes the hub without leases that has been idle longest, if any.
    fn close_longest_idle(&self, slots: &mut Slots) {
        let oldest = slots
            .hubs
            .iter()
            .filter_map(|(key, e)| e.idle_since.filter(|_| e.leases == 0).map(|since| (since, key)))
            .min_by_key(|(since, _)| *since)
            .map(|(_, key)| key.clone());
        if let Some(key) = oldest {
            close(slots, &key, "closing an idle hub for a new key");
        }
    }

    /// One lease on `key`'s hub `id` is gone.
    fn release(self: &Arc<Self>, key: &HubKey, id: u64) {
        let mut slots = self.lock();
        let Some(entry) = slots.hubs.get_mut(key).filter(|e| e.hub.id() == id) else { return };
        entry.leases = entry.leases.saturating_sub(1);
        if entry.leases > 0 {
            return;
        }
        let since = Instant::now();
        entry.idle_since = Some(since);
        // Closes it now if it is not listening (or the timeout is zero).
        self.sweep(&mut slots);
        if self.options.idle_timeout.is_zero() {
            return;
        }
        // A hub is there, so the thread is too.
        let Some(runtime) = slots.background.as_ref().map(|b| b.handle().clone()) else { return };
        drop(slots);
        let registry: Weak<Inner> = Arc::downgrade(self);
        // A timeout past any clock (Duration::MAX, "never") sets no timer.
        let Some(due) = since.checked_add(self.options.idle_timeout) else { return };
        let due = tokio::time::Instant::from_std(due);
        runtime.spawn(async move {
            tokio::time::sleep_until(due).await;
            let closing = {
                let Some(registry) = registry.upgrade() else { return };
                let mut slots = registry.lock();
                registry.sweep(&mut slots);
                slots.closing.iter().find(|hub| hub.id() == id).cloned()
            };
            // Sweep again once the hub is really gone, so that the slot
            // shows free without waiting for a caller.
            if let Some(hub) = closing {
                hub.finished().await;
                drop(hub);
                if let Some(registry) = registry.upgrade() {
                    registry.sweep(&mut registry.lock());
                }
            }
        });
    }
}

/// Closes `key`'s hub, if it has one: it leaves the leasable hubs and keeps
/// its slot among the closing ones until its task has ended.
fn close(slots: &mut Slots, key: &HubKey, why: &str) {
    if let Some(entry) = slots.hubs.remove(key) {
        entry.hub.close();
        tracing::debug!(hub = %entry.hub.label(), id = entry.hub.id(), "{why}");
        slots.closing.push(entry.hub);
    }
}

/// A shared hold on one hub of a [`Registry`]; clones share the hold. When
/// the last clone (and the last [`Subscription`] taken from it) of the last
/// lease on a hub is dropped, the hub's idle timeout starts.
#[derive(Clone)]
pub struct HubLease {
    inner: Arc<LeaseInner>,
}

struct LeaseInner {
    registry: Arc<Inner>,
    key: HubKey,
    hub: Hub,
}

impl Drop for LeaseInner {
    fn drop(&mut self) {
        self.registry.release(&self.key, self.hub.id());
    }
}

impl HubLease {
    /// A new subscriber of the hub; it holds this lease.
    pub fn subscribe(&self) -> Subscription {
        self.inner.hub.subscribe_for(self.inner.clone())
    }

    /// The hub's state, to read or wait on.
    pub fn state(&self) -> watch::Receiver<HubState> {
        self.inner.hub.state()
    }

    /// The hub's state now.
    pub fn current_state(&self) -> HubState {
        self.inner.hub.current_state()
    }

    /// The hub's counters.
    pub fn stats(&self) -> HubStats {
        self.inner.hub.stats()
    }

    /// The hub's process-unique id.
    pub fn hub_id(&self) -> u64 {
        self.inner.hub.id()
    }

    /// Whether both leases hold the same hub.
    pub fn is_same_hub(&self, other: &HubLease) -> bool {
        self.hub_id() == other.hub_id()
    }

    /// The connector's label.
    pub fn label(&self) -> &str {
        self.inner.hub.label()
    }

    /// The hub's channels.
    pub fn channels(&self) -> &[String] {
        self.inner.hub.channels()
    }
}

impl fmt::Debug for HubLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HubLease").field("hub", &self.inner.hub).finish()
    }
}
