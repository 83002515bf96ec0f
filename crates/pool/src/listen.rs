//! `PgExecutor::listen` for the pool: a lease on the process's LISTEN hub
//! for the pool's session URL (waymark-notify), never a pooled connection
//! (bb8's connections do not deliver notifications, and a pooler in
//! transaction mode never does).

use futures::StreamExt;
use tokio::sync::watch;
use waymark_notify::{Event, HubLease, HubOptions, HubState, Registry, RegistryError, Subscription};
use waymark_store::{ExecError, ExecErrorKind, ListenEvent, Notification, NotificationStream};

/// What the stream is waiting on.
struct Listen {
    // Held for the stream's life: it keeps the hub open.
    _lease: HubLease,
    state: watch::Receiver<HubState>,
    events: Subscription,
}

/// A stream of the hub's events for `channels`, or `None` when the
/// registry is full (the store then polls).
pub(crate) fn listen(
    connector: &waymark_notify::Connector,
    channels: &[&str],
) -> Result<Option<NotificationStream>, ExecError> {
    let lease = match Registry::global().acquire(connector, channels.iter().copied(), HubOptions::new()) {
        Ok(lease) => lease,
        Err(RegistryError::Full { max }) => {
            tracing::debug!(max, "every LISTEN hub slot is taken; waits poll");
            return Ok(None);
        }
        Err(e) => return Err(ExecError::new(ExecErrorKind::Query, format!("listen: {e}")).with_source(e)),
    };
    let mut state = lease.state();
    if state.borrow().is_terminal() {
        // Unavailable for good (a pooler in the way): nothing to stream.
        return Ok(None);
    }
    // "Listening now" is the first event; a hub already listening counts.
    let listening_now = matches!(*state.borrow_and_update(), HubState::Listening);
    let start = Listen { events: lease.subscribe(), state, _lease: lease };
    let head = futures::stream::iter(listening_now.then_some(ListenEvent::MayHaveMissed));
    let rest = futures::stream::unfold(start, |mut l| async move {
        loop {
            tokio::select! {
                changed = l.state.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                    // Each (re)start of listening: re-read what may have passed.
                    if matches!(*l.state.borrow_and_update(), HubState::Listening) {
                        return Some((ListenEvent::MayHaveMissed, l));
                    }
                }
                event = l.events.recv() => {
                    return match event? {
                        Event::Notification { channel, payload } => {
                            Some((ListenEvent::Notification(Notification { channel, payload }), l))
                        }
                        Event::MayHaveMissed => Some((ListenEvent::MayHaveMissed, l)),
                    };
                }
            }
        }
    });
    Ok(Some(head.chain(rest).boxed()))
}
