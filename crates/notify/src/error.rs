//! The errors of this crate: refused input and a full registry. Connection
//! failures are never errors of a call; they are hub states
//! ([`HubState::Down`](crate::HubState::Down),
//! [`HubState::Unavailable`](crate::HubState::Unavailable)).

/// Why a hub could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HubError {
    /// A channel name PostgreSQL would refuse or change.
    #[error("invalid channel {channel:?}: {reason}")]
    InvalidChannel {
        /// The name as given.
        channel: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// No channel was given.
    #[error("a hub needs at least one channel")]
    NoChannels,
    /// Called outside a tokio runtime: the hub runs as a task.
    #[error("a hub must be started inside a tokio runtime")]
    NoRuntime,
}

/// Why [`Registry::acquire`](crate::Registry::acquire) gave no lease.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Every slot is taken (by hubs in use, idle or still closing): poll
    /// instead, and try again later.
    #[error("the notify registry is full ({max} hubs); poll instead")]
    Full {
        /// The registry's `max_hubs`.
        max: usize,
    },
    /// The hub could not be started: its channels were refused.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// The registry's thread, on which its hubs run, could not be started
    /// (the process is out of threads or memory). Poll instead, and try
    /// again later.
    #[error("could not start the notify registry's thread: {reason}")]
    Thread {
        /// The operating system's error.
        reason: String,
    },
}
