//! One listener session: open it, take the leader lock, LISTEN, prove
//! delivery with a probe, then hand out notifications until it ends.
//!
//! Every statement is sent while the session's [`MessageStream`] is polled
//! ([`Driver::drive`]), because that stream is what moves the connection:
//! a statement whose connection nobody polls never completes, and a
//! notification nobody polls for is never read.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use futures::StreamExt as _;
use rand::Rng as _;
use tokio::time::{timeout, Instant};
use tokio_postgres::types::Type;
use tokio_postgres::{AsyncMessage, Client};

use crate::backoff::is_capacity_error;
use crate::connector::{Connector, MessageStream};
use crate::options::HubOptions;
use waymark_protocol::listener as sql;

/// The payload prefix of probe notifications. A probe is sent on the hub's
/// first channel, where every listener of the database sees it: a consumer
/// that treats any notification as "re-read" (as it should) is unharmed, and
/// the prefix is neither a queue name nor a task id. Hubs never deliver a
/// payload with this prefix to their subscribers.
pub const PROBE_PREFIX: &str = "waymark-probe:";

/// Why a session ended or could not be opened: the text for logs and
/// [`HubState::Down`](crate::HubState::Down), and whether the server was
/// full (which picks the slower backoff).
#[derive(Debug, Clone)]
pub(crate) struct SessionError {
    pub(crate) reason: String,
    pub(crate) capacity: bool,
}

impl SessionError {
    fn other(reason: String) -> SessionError {
        let capacity = is_capacity_error(None, &reason);
        SessionError { reason, capacity }
    }

    fn postgres(context: &str, e: &tokio_postgres::Error) -> SessionError {
        let text = describe(e);
        let capacity = is_capacity_error(e.code().map(|c| c.code()), &text);
        SessionError { reason: format!("{context}: {text}"), capacity }
    }
}

/// A tokio-postgres error with what its `Display` leaves out: the server's
/// message and SQLSTATE, or the chain of causes (the I/O error behind
/// "error connecting to server").
fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {} (SQLSTATE {})", db.severity(), db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// How [`open`] went.
pub(crate) enum Opened {
    /// LISTEN is in place (and proven, when a probe was asked for).
    Listening(Box<Listener>),
    /// Another session holds the leader lock; this one is closed.
    Standby,
    /// The probe did not come back: this path cannot deliver notifications.
    Unavailable(String),
}

/// A notification as the hub passes it on.
pub(crate) type Note = (String, String);

/// Polls a session's messages: keeps its notifications (less probes) in an
/// inbox, and notes whether the probe it waits for came back.
pub(crate) struct Driver {
    messages: MessageStream,
    inbox: VecDeque<Note>,
    probe: Option<String>,
    probe_seen: bool,
}

impl Driver {
    fn new(messages: MessageStream) -> Driver {
        Driver { messages, inbox: VecDeque::new(), probe: None, probe_seen: false }
    }

    /// Runs `fut` to completion while polling the messages. Fails if the
    /// session ends first.
    async fn drive<F: Future>(&mut self, fut: F) -> Result<F::Output, SessionError> {
        let mut fut = pin!(fut);
        loop {
            tokio::select! {
                biased;
                out = &mut fut => return Ok(out),
                message = self.messages.next() => self.take(message)?,
            }
        }
    }

    /// The next notification. Cancel safe.
    pub(crate) async fn next(&mut self) -> Result<Note, SessionError> {
        loop {
            if let Some(note) = self.inbox.pop_front() {
                return Ok(note);
            }
            let message = self.messages.next().await;
            self.take(message)?;
        }
    }

    /// Waits up to `within` for the probe to come back.
    async fn probe_came_back(&mut self, within: Duration) -> Result<bool, SessionError> {
        let deadline = Instant::now() + within;
        while !self.probe_seen {
            match tokio::time::timeout_at(deadline, self.messages.next()).await {
                Ok(message) => self.take(message)?,
                Err(_) => return Ok(false),
            }
        }
        Ok(true)
    }

    fn take(
        &mut self,
        message: Option<Result<AsyncMessage, tokio_postgres::Error>>,
    ) -> Result<(), SessionError> {
        match message {
            Some(Ok(AsyncMessage::Notification(n))) => {
                if n.payload().starts_with(PROBE_PREFIX) {
                    // Ours or another hub's: never a subscriber's business.
                    if self.probe.as_deref() == Some(n.payload()) {
                        self.probe_seen = true;
                    }
                } else {
                    self.inbox.push_back((n.channel().to_owned(), n.payload().to_owned()));
                }
                Ok(())
            }
            Some(Ok(AsyncMessage::Notice(notice))) => {
                tracing::debug!(
                    severity = notice.severity(),
                    "notice on the listener session: {}",
                    notice.message()
                );
                Ok(())
            }
            Some(Ok(_)) => Ok(()),
            Some(Err(e)) => Err(SessionError::postgres("connection lost", &e)),
            None => Err(SessionError::other("connection closed by the server".to_owned())),
        }
    }

    /// Polls until the connection has shut down, at most `within`.
    async fn drain(&mut self, within: Duration) {
        // Past errors too (a closed socket may show as one before the end):
        // only `None` says the connection is shut.
        let _ = timeout(within, async { while self.messages.next().await.is_some() {} }).await;
    }
}

/// An open session that listens on the hub's channels.
pub(crate) struct Listener {
    client: Client,
    pub(crate) driver: Driver,
}

impl Listener {
    /// Runs `select 1`, at most `within`: a session that cannot answer is
    /// treated as lost.
    pub(crate) async fn health_check(&mut self, within: Duration) -> Result<(), SessionError> {
        match timeout(within, self.driver.drive(self.client.batch_execute(sql::health_check()))).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(SessionError::postgres("health check", &e)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(SessionError::other(format!("health check: no answer within {within:?}"))),
        }
    }

    /// Ends the session politely: the client goes (which sends Terminate),
    /// and the connection is polled until it has shut down, at most
    /// `within`. After this the socket is closed.
    pub(crate) async fn close(self, within: Duration) {
        let Listener { client, mut driver } = self;
        drop(client);
        driver.drain(within).await;
    }

    /// `unlisten *` (best effort), then [`close`](Self::close). Behind a
    /// pooler this leaves no LISTEN behind on whichever server connection
    /// takes it.
    async fn unlisten_and_close(mut self, within: Duration) {
        let _ = timeout(within, self.driver.drive(self.client.batch_execute(sql::unlisten_all()))).await;
        self.close(within).await;
    }
}

/// A fresh probe payload: [`PROBE_PREFIX`] and 128 random bits.
fn probe_token() -> String {
    format!("{PROBE_PREFIX}{:032x}", rand::thread_rng().gen::<u128>())
}

/// Opens a session and gets it listening.
///
/// With `probe` (until a probe of the hub has come back once), delivery is proven before the session counts as listening:
/// a second, short-lived session (`<application_name>:probe`) sends
/// `pg_notify(first channel, probe token)`, and the listener must hear it
/// within the probe timeout. The notification comes from another session
/// on purpose: through PgBouncer in transaction mode, a session that
/// notifies itself usually does hear the echo (PgBouncer hands the same
/// server connection back to an idle client), yet notifications from
/// anyone else go to whichever client holds that server connection, or
/// nowhere. Only a notification from elsewhere proves what subscribers
/// need.
pub(crate) async fn open(
    connector: &Connector,
    channels: &[String],
    options: &HubOptions,
    probe: bool,
) -> Result<Opened, SessionError> {
    let within = options.connect_timeout;
    let deadline = Instant::now() + within;
    let timed_out = |step: &str| SessionError::other(format!("{step}: no answer within {within:?}"));

    let (client, messages) =
        match tokio::time::timeout_at(deadline, connector.connect_as(&options.application_name)).await {
            Ok(Ok(session)) => session,
            Ok(Err(e)) => return Err(SessionError::postgres("connecting", &e)),
            Err(_) => return Err(timed_out("connecting")),
        };
    let mut listener = Listener { client, driver: Driver::new(messages) };

    if let Some(key) = options.leader_lock {
        let locked = tokio::time::timeout_at(
            deadline,
            listener.driver.drive(listener.client.query_typed(sql::leader_lock(), &[(&key, Type::INT8)])),
        )
        .await
        .map_err(|_| timed_out("taking the leader lock"))??
        .map_err(|e| SessionError::postgres("taking the leader lock", &e))?;
        let won = locked.first().and_then(|row| row.try_get::<_, bool>(0).ok()).unwrap_or(false);
        if !won {
            listener.close(within).await;
            return Ok(Opened::Standby);
        }
    }

    let script = sql::listen_script(channels);
    tokio::time::timeout_at(deadline, listener.driver.drive(listener.client.batch_execute(&script)))
        .await
        .map_err(|_| timed_out("listen"))??
        .map_err(|e| SessionError::postgres("listen", &e))?;

    if !probe {
        return Ok(Opened::Listening(Box::new(listener)));
    }

    let token = probe_token();
    listener.driver.probe = Some(token.clone());
    let probe_name = format!("{}:probe", options.application_name);
    let sent =
        listener.driver.drive(send_probe(connector, &probe_name, &channels[0], &token, within)).await?;
    sent?;
    let came_back = listener.driver.probe_came_back(options.probe_timeout).await?;
    listener.driver.probe = None;
    if came_back {
        return Ok(Opened::Listening(Box::new(listener)));
    }
    listener.unlisten_and_close(within).await;
    Ok(Opened::Unavailable(format!(
        "LISTEN through {} does not deliver notifications: a probe notification on channel {:?} did not \
         come back within {:?}. A transaction-mode pooler such as PgBouncer accepts LISTEN but never \
         delivers; give the hub a direct URL to PostgreSQL, not the pooler",
        connector.label(),
        channels[0],
        options.probe_timeout
    )))
}

/// Opens the probe session, sends the probe, and closes the session.
async fn send_probe(
    connector: &Connector,
    application_name: &str,
    channel: &str,
    token: &str,
    within: Duration,
) -> Result<(), SessionError> {
    let deadline = Instant::now() + within;
    let timed_out = || SessionError::other(format!("probe session: no answer within {within:?}"));
    let (client, messages) = tokio::time::timeout_at(deadline, connector.connect_as(application_name))
        .await
        .map_err(|_| timed_out())?
        .map_err(|e| SessionError::postgres("opening the probe session", &e))?;
    let mut prober = Listener { client, driver: Driver::new(messages) };
    // One round trip, no prepared statement: safe behind any pooler.
    let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] =
        [(&channel, Type::TEXT), (&token, Type::TEXT)];
    let sent = tokio::time::timeout_at(
        deadline,
        prober.driver.drive(prober.client.query_typed(sql::probe_notify(), &params)),
    )
    .await;
    prober.close(within).await;
    sent.map_err(|_| timed_out())??.map_err(|e| SessionError::postgres("sending the probe", &e))?;
    Ok(())
}
