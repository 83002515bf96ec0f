//! How a hub behaves: timings, the leader lock, the listener's name.

use std::time::Duration;

/// The `application_name` of a hub's listener session unless
/// [`HubOptions::application_name`] says otherwise.
pub const DEFAULT_APPLICATION_NAME: &str = "waymark-notify";

/// Options for a [`Hub`](crate::Hub); each method's doc says its default.
///
/// ```
/// use std::time::Duration;
/// use waymark_notify::HubOptions;
///
/// let options = HubOptions::new().leader_lock(0x7761_796d).probe_timeout(Duration::from_secs(5));
/// # let _ = options;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubOptions {
    pub(crate) probe_timeout: Duration,
    pub(crate) backoff_base: Duration,
    pub(crate) capacity_backoff_base: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) leader_lock: Option<i64>,
    pub(crate) standby_retry: Duration,
    pub(crate) application_name: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) health_check_interval: Option<Duration>,
    pub(crate) event_buffer: usize,
}

impl Default for HubOptions {
    fn default() -> Self {
        HubOptions {
            probe_timeout: Duration::from_secs(2),
            backoff_base: Duration::from_millis(250),
            capacity_backoff_base: Duration::from_secs(2),
            backoff_max: Duration::from_secs(30),
            leader_lock: None,
            standby_retry: Duration::from_secs(5),
            application_name: DEFAULT_APPLICATION_NAME.to_owned(),
            connect_timeout: Duration::from_secs(10),
            health_check_interval: Some(Duration::from_secs(30)),
            event_buffer: 1024,
        }
    }
}

impl HubOptions {
    /// The defaults.
    pub fn new() -> HubOptions {
        HubOptions::default()
    }

    /// How long the hub waits, after its first LISTEN, for its probe
    /// notification (sent from a second session) to come back before it
    /// declares the path unable to deliver
    /// ([`HubState::Unavailable`](crate::HubState::Unavailable), for good).
    /// Once a probe came back, later sessions of the hub are not probed.
    /// Defaults to 2 s.
    pub fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.probe_timeout = timeout;
        self
    }

    /// The base of the reconnect backoff: the n-th failed attempt in a row
    /// waits a random time between zero and `base * 2^n` (capped by
    /// [`backoff_max`](Self::backoff_max)). Defaults to 250 ms.
    pub fn backoff_base(mut self, base: Duration) -> Self {
        self.backoff_base = base;
        self
    }

    /// The base used instead after a capacity error (SQLSTATE 53300, "too
    /// many clients", "remaining connection slots are reserved"): the server
    /// is up but full, and a slower retry leaves its slots to the work that
    /// holds them. Defaults to 2 s.
    pub fn capacity_backoff_base(mut self, base: Duration) -> Self {
        self.capacity_backoff_base = base;
        self
    }

    /// The longest wait between two attempts. Defaults to 30 s.
    pub fn backoff_max(mut self, max: Duration) -> Self {
        self.backoff_max = max;
        self
    }

    /// Makes the hub take the session advisory lock `key`
    /// (`pg_try_advisory_lock`) before it listens: only the session that
    /// holds it listens, so a fleet of processes with the same key holds
    /// one listener session between them. A hub that loses goes
    /// [`Standby`](crate::HubState::Standby), closes its connection and tries
    /// again every [`standby_retry`](Self::standby_retry). Defaults to no
    /// lock.
    pub fn leader_lock(mut self, key: i64) -> Self {
        self.leader_lock = Some(key);
        self
    }

    /// How often a standby hub tries the leader lock again. Defaults to 5 s.
    pub fn standby_retry(mut self, interval: Duration) -> Self {
        self.standby_retry = interval;
        self
    }

    /// The `application_name` of the listener session, which is how an
    /// operator finds it in `pg_stat_activity` (the short-lived probe
    /// session is named `<name>:probe`). It replaces any name in the
    /// connector's config. Defaults to `waymark-notify`.
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = name.into();
        self
    }

    /// How long one connection attempt may take, from the TCP connect to
    /// the end of LISTEN (and the probe session's connect); a health check
    /// gets as long. Defaults to 10 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How often a listening hub runs `select 1` on its session, so that a
    /// connection that died silently (a dropped NAT entry, a load balancer's
    /// idle timeout) is noticed and replaced instead of listening to
    /// nothing. `None` turns it off. Defaults to every 30 s.
    pub fn health_check_interval(mut self, interval: Option<Duration>) -> Self {
        self.health_check_interval = interval;
        self
    }

    /// How many events a subscriber may fall behind before it gets
    /// [`Event::MayHaveMissed`](crate::Event::MayHaveMissed) instead of the
    /// ones it missed. At least 1. Defaults to 1024.
    pub fn event_buffer(mut self, events: usize) -> Self {
        self.event_buffer = events.max(1);
        self
    }

    /// The leader lock key, if any.
    pub fn leader_lock_key(&self) -> Option<i64> {
        self.leader_lock
    }
}
