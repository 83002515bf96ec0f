//! The hub's task: it owns the hub's sessions, one at a time, and moves
//! the hub through the states of the diagram in `hub.rs`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{broadcast, watch};
use tokio::time::{Instant, MissedTickBehavior};

use super::{Counters, HubState};
use crate::backoff::Backoff;
use crate::connector::Connector;
use crate::options::HubOptions;
use crate::session::{self, Listener, Opened, SessionError};
use crate::subscription::Event;

/// How a listening session ended.
enum Ended {
    Shutdown,
    Lost(SessionError),
}

/// The hub's task: owns the sessions, one at a time.
pub(super) struct Task {
    pub(super) label: String,
    pub(super) connector: Connector,
    pub(super) channels: Vec<String>,
    pub(super) options: HubOptions,
    pub(super) state: watch::Sender<HubState>,
    pub(super) events: broadcast::Sender<Event>,
    pub(super) shutdown: watch::Receiver<bool>,
    pub(super) counters: Arc<Counters>,
}

impl Task {
    pub(super) async fn run(mut self) {
        let o = &self.options;
        let mut backoff = Backoff::new(o.backoff_base, o.capacity_backoff_base, o.backoff_max);
        // The probe came back once: the path delivers, later sessions on it
        // need no proof (and cost one connection, not two).
        let mut proven = false;
        // A LISTEN after this is a re-LISTEN: subscribers may have missed
        // notifications in between.
        let mut interrupted = false;
        loop {
            self.set(HubState::Connecting);
            Counters::bump(&self.counters.connect_attempts);
            let opened = tokio::select! {
                biased;
                () = shutdown_requested(&mut self.shutdown) => break,
                opened = session::open(&self.connector, &self.channels, &self.options, !proven) => opened,
            };
            let retry_in = match opened {
                Ok(Opened::Listening(listener)) => {
                    proven = true;
                    backoff.reset();
                    Counters::bump(&self.counters.listens);
                    self.set(HubState::Listening);
                    tracing::info!(hub = %self.label, channels = ?self.channels, "listening");
                    if interrupted {
                        let _ = self.events.send(Event::MayHaveMissed);
                    }
                    interrupted = true;
                    match self.listen(*listener).await {
                        Ended::Shutdown => break,
                        Ended::Lost(e) => {
                            Counters::bump(&self.counters.disconnects);
                            let delay = backoff.next_delay(e.capacity);
                            tracing::warn!(hub = %self.label, retry_in = ?delay, "listener session lost: {}", e.reason);
                            self.set(HubState::Down { reason: e.reason });
                            delay
                        }
                    }
                }
                Ok(Opened::Standby) => {
                    Counters::bump(&self.counters.standbys);
                    interrupted = true;
                    tracing::debug!(hub = %self.label, "standby: another session holds the leader lock");
                    self.set(HubState::Standby);
                    self.options.standby_retry
                }
                Ok(Opened::Unavailable(reason)) => {
                    warn_unavailable(&self.label, &reason);
                    self.set(HubState::Unavailable { reason });
                    // Dropping the task's senders ends every subscription.
                    return;
                }
                Err(e) => {
                    Counters::bump(&self.counters.failed_attempts);
                    if e.capacity {
                        Counters::bump(&self.counters.capacity_errors);
                    }
                    let delay = backoff.next_delay(e.capacity);
                    tracing::info!(hub = %self.label, retry_in = ?delay, "listener session: {}", e.reason);
                    self.set(HubState::Down { reason: e.reason });
                    delay
                }
            };
            tokio::select! {
                biased;
                () = shutdown_requested(&mut self.shutdown) => break,
                () = tokio::time::sleep(retry_in) => {}
            }
        }
        self.set(HubState::Closed);
        tracing::debug!(hub = %self.label, "closed");
    }

    /// Passes notifications on until the session ends or the hub closes.
    async fn listen(&mut self, mut listener: Listener) -> Ended {
        let mut health = self.options.health_check_interval.map(|every| {
            let mut interval = tokio::time::interval_at(Instant::now() + every, every);
            interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
            interval
        });
        loop {
            let health_due = async {
                match health.as_mut() {
                    Some(interval) => {
                        interval.tick().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = shutdown_requested(&mut self.shutdown) => {
                    // Closed for subscribers at once; the task (and with it
                    // the hub's registry slot) ends once the socket is shut.
                    self.set(HubState::Closed);
                    listener.close(self.options.connect_timeout).await;
                    return Ended::Shutdown;
                }
                note = listener.driver.next() => match note {
                    Ok((channel, payload)) => {
                        Counters::bump(&self.counters.notifications);
                        let _ = self.events.send(Event::Notification { channel, payload });
                    }
                    Err(e) => return Ended::Lost(e),
                },
                () = health_due => {
                    if let Err(e) = listener.health_check(self.options.connect_timeout).await {
                        return Ended::Lost(e);
                    }
                }
            }
        }
    }

    fn set(&self, state: HubState) {
        self.state.send_if_modified(|current| {
            if *current == state {
                return false;
            }
            *current = state;
            true
        });
    }
}

/// Resolves once a close was asked for or every handle is gone.
async fn shutdown_requested(shutdown: &mut watch::Receiver<bool>) {
    // An error means the sender (the last handle) was dropped: close too.
    let _ = shutdown.wait_for(|closing| *closing).await;
}

/// Logs a ListenUnavailable at warn level the first time for each label in
/// this process (a registry may start a new hub for it after an idle
/// close), at info level after that.
fn warn_unavailable(label: &str, reason: &str) {
    static WARNED: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let first = WARNED.get_or_init(Mutex::default).lock().map(|mut seen| seen.insert(label.to_owned()));
    if first.unwrap_or(true) {
        tracing::warn!(hub = %label, "listen unavailable, polling instead: {reason}");
    } else {
        tracing::info!(hub = %label, "listen unavailable again, polling instead");
    }
}
