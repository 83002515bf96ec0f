//! LISTEN hubs for waymark: one direct PostgreSQL session per connector and
//! channel set, shared by every subscriber of a process, leased from a
//! bounded registry.
//!
//! ```no_run
//! use waymark_notify::{Connector, Event, HubOptions, HubState, Registry};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // A direct URL to PostgreSQL: not PgBouncer, not any transaction-mode pooler.
//! let config: tokio_postgres::Config = "postgres://app@db-primary:5432/jobs".parse()?;
//! let connector = Connector::no_tls(config);
//!
//! let lease = Registry::global().acquire(&connector, ["cairnq_queued", "cairnq_done"], HubOptions::new())?;
//! let mut events = lease.subscribe();
//! while let Some(event) = events.recv().await {
//!     match event {
//!         // A hint: re-read what it names (the payload is a queue or a task id).
//!         Event::Notification { channel, payload } => println!("re-read {channel}: {payload}"),
//!         // Something may have been lost (a reconnect, a slow subscriber): re-read it all.
//!         Event::MayHaveMissed => println!("re-read everything"),
//!     }
//! }
//! // The hub is done for good: closed, or unable to deliver on this path.
//! if let HubState::Unavailable { reason } = lease.current_state() {
//!     eprintln!("polling instead: {reason}");
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # The delivery contract: a signal means re-read; the tables are the truth
//!
//! PostgreSQL drops notifications for a session that is not connected when
//! they are sent, and a hub's session can always be lost. So an event never
//! carries state: it says *when* to look, and the tables say *what is*. A
//! consumer re-reads on [`Event::Notification`], re-reads everything on
//! [`Event::MayHaveMissed`] (sent after every re-LISTEN following a lost
//! session or a standby, and to a subscriber that fell more than the event
//! buffer behind), and backs both with a periodic re-read, so a lost, late
//! or early notification costs at most one interval, never a wrong answer.
//! Re-reading on a notification that turns out to mean nothing is always
//! harmless.
//!
//! # Why a direct URL, and what happens behind PgBouncer
//!
//! LISTEN belongs to a session, and only a session that stays connected
//! hears anything. A pooled connection is the wrong place for it:
//! tokio-postgres drops notifications unless the connection is driven with
//! `poll_message` (which a pool does not do), and a transaction-mode pooler
//! such as PgBouncer hands the server connection that ran LISTEN to other
//! clients after each transaction. Through such a pooler LISTEN *succeeds*,
//! but notifications from other sessions reach whichever client holds that
//! server connection at the time, or nobody.
//!
//! A hub therefore proves delivery before it reports
//! [`HubState::Listening`]: after LISTEN it opens a short second session
//! (`<application_name>:probe`) that sends `pg_notify(<first channel>,
//! 'waymark-probe:<random>')`, and waits up to
//! [`probe_timeout`](HubOptions::probe_timeout) for the listener to hear it.
//! (A session notifying itself is no proof: behind PgBouncer it usually
//! hears its own echo, because an idle client gets the same server
//! connection back.) When the probe does not come back, the hub reports
//! [`HubState::Unavailable`], logs once at warn level what to do, closes its
//! subscriptions and never retries: callers poll. The fix is to give the
//! hub a direct URL to PostgreSQL (the pool may keep its pooled URL).
//! Once a probe has come back, the hub's later sessions (after a reconnect)
//! skip it: the path is proven, and a reconnect costs one connection.
//!
//! The probe is a real notification on a real channel, seen by every
//! listener of the database: its payload starts with [`PROBE_PREFIX`]
//! (`waymark-probe:`), which is neither a queue name nor a task id, so a
//! consumer that re-reads on any signal is unharmed. Hubs never pass such a
//! payload to their subscribers.
//!
//! # Pieces
//!
//! - [`Connector`]: how to open a session (config plus TLS, erased), with a
//!   label (`user@host:port/database`, no password) for logs and keys.
//! - [`Hub`]: one session in a task; states on a [`tokio::sync::watch`]
//!   channel ([`HubState`]); reconnects with full-jitter exponential backoff
//!   (slower after capacity errors); an optional leader lock
//!   ([`HubOptions::leader_lock`]) so a fleet holds one listener session.
//! - [`Subscription`]: one subscriber's [`Event`]s, by
//!   [`recv`](Subscription::recv) or as a [`Stream`](futures::Stream).
//! - [`Registry`]: hubs shared by key (connector label, channel set, leader
//!   lock key), closed after an idle timeout, at most `max_hubs`
//!   ([`RegistryError::Full`] past it: poll). A registry runs its hubs on a
//!   thread of its own, so a hub shared by callers on several runtimes
//!   outlives each of them.
//!
//! This crate depends on tokio-postgres and, for the statements a listening
//! session sends, on `waymark-protocol`; never on the store.

mod background;
mod backoff;
mod channel;
mod connector;
mod error;
mod hub;
mod options;
mod registry;
mod session;
mod subscription;

pub use channel::MAX_CHANNEL_BYTES;
pub use connector::{message_stream, Connector, MessageStream, Session};
pub use error::{HubError, RegistryError};
pub use hub::{Hub, HubState, HubStats};
pub use options::{HubOptions, DEFAULT_APPLICATION_NAME};
pub use registry::{HubLease, Registry, RegistryOptions, RegistryStats};
pub use session::PROBE_PREFIX;
pub use subscription::{Event, Subscription};
