//! What a subscriber hears, and the receiver it hears it on.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{FutureExt as _, Stream, StreamExt as _};
use tokio::sync::broadcast::{self, error::RecvError};

/// One event of a hub. Either way it means "re-read now": the tables are the
/// truth, an event only says when to look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A `NOTIFY` on one of the hub's channels.
    Notification {
        /// The channel, as the hub listens on it.
        channel: String,
        /// The payload (empty when none was given).
        payload: String,
    },
    /// Notifications may have been lost: the hub reconnected (any LISTEN
    /// after its first), came out of standby, or this subscriber fell more
    /// than the event buffer behind. Re-read everything you watch.
    MayHaveMissed,
}

type Pending = Pin<Box<dyn Future<Output = (Result<Event, RecvError>, broadcast::Receiver<Event>)> + Send>>;

enum Receiving {
    Idle(broadcast::Receiver<Event>),
    Waiting(Pending),
    Ended,
}

/// The events of one hub for one subscriber, from the moment it subscribed.
///
/// A subscription keeps its hub open (as a handle or a lease does). It ends
/// (`None`) when the hub is closed for good:
/// [`Closed`](crate::HubState::Closed) or
/// [`Unavailable`](crate::HubState::Unavailable); from then on, poll.
/// [`recv`](Self::recv) is cancel safe, and the subscription is a
/// [`Stream`] of the same events.
pub struct Subscription {
    state: Receiving,
    _owner: Arc<dyn Any + Send + Sync>,
}

impl Subscription {
    pub(crate) fn new(events: Option<broadcast::Receiver<Event>>, owner: Arc<dyn Any + Send + Sync>) -> Self {
        let state = events.map_or(Receiving::Ended, Receiving::Idle);
        Subscription { state, _owner: owner }
    }

    /// The next event; `None` once the hub is closed for good.
    pub async fn recv(&mut self) -> Option<Event> {
        self.next().await
    }
}

impl Stream for Subscription {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        loop {
            match std::mem::replace(&mut self.state, Receiving::Ended) {
                Receiving::Ended => return Poll::Ready(None),
                Receiving::Idle(mut events) => {
                    self.state = Receiving::Waiting(
                        async move {
                            let event = events.recv().await;
                            (event, events)
                        }
                        .boxed(),
                    );
                }
                Receiving::Waiting(mut pending) => match pending.poll_unpin(cx) {
                    Poll::Pending => {
                        self.state = Receiving::Waiting(pending);
                        return Poll::Pending;
                    }
                    Poll::Ready((result, events)) => {
                        let event = match result {
                            Ok(event) => event,
                            Err(RecvError::Lagged(_)) => Event::MayHaveMissed,
                            Err(RecvError::Closed) => return Poll::Ready(None),
                        };
                        self.state = Receiving::Idle(events);
                        return Poll::Ready(Some(event));
                    }
                },
            }
        }
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            Receiving::Idle(_) => "idle",
            Receiving::Waiting(_) => "waiting",
            Receiving::Ended => "ended",
        };
        f.debug_struct("Subscription").field("state", &state).finish_non_exhaustive()
    }
}
