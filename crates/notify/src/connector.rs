//! How a hub opens a session, without being generic over TLS.
//!
//! A [`Connector`] is a connection config plus a cloneable boxed async
//! function that opens one session with it. It hands back the
//! [`tokio_postgres::Client`] and the connection turned into a
//! [`MessageStream`]: the connection driven with
//! [`Connection::poll_message`](tokio_postgres::Connection::poll_message),
//! the only way notifications come out of tokio-postgres (awaiting the
//! connection as a future drops them).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use futures::future::BoxFuture;
use futures::{FutureExt as _, Stream};
use tokio_postgres::config::Host;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Socket};

/// The messages of one session, in the order the server sent them:
/// notifications and notices. `None` or an error ends it; it is never polled
/// after that.
pub type MessageStream =
    Pin<Box<dyn Stream<Item = Result<AsyncMessage, tokio_postgres::Error>> + Send + 'static>>;

/// What opening a session gives: the client to send statements with, and
/// the stream that drives the connection (which must be polled for those
/// statements to complete).
pub type Session = (Client, MessageStream);

type OpenFn = dyn Fn(Config) -> BoxFuture<'static, Result<Session, tokio_postgres::Error>> + Send + Sync;

/// Opens sessions to one PostgreSQL database; cheap to clone.
///
/// The hub sets `application_name` on a copy of the config before each
/// session (see [`HubOptions::application_name`](crate::HubOptions::application_name)).
#[derive(Clone)]
pub struct Connector {
    config: Config,
    label: Arc<str>,
    open: Arc<OpenFn>,
}

impl Connector {
    /// A connector that opens sessions with `config` over `tls` (any
    /// tokio-postgres TLS implementation: `tokio-postgres-rustls`,
    /// `postgres-native-tls`, or [`NoTls`]).
    pub fn new<T>(config: Config, tls: T) -> Connector
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        Connector::from_fn(config, move |config: Config| {
            let tls = tls.clone();
            async move {
                let (client, connection) = config.connect(tls).await?;
                Ok((client, message_stream(connection)))
            }
        })
    }

    /// A connector without TLS.
    pub fn no_tls(config: Config) -> Connector {
        Connector::new(config, NoTls)
    }

    /// A connector whose sessions are opened by `open`, given the config
    /// to use (`config`, with the hub's `application_name` set). For
    /// connections made some other way (a socket of your own, a wrapped
    /// stream); [`message_stream`] turns a
    /// [`Connection`](tokio_postgres::Connection) into the stream it returns.
    ///
    /// A hub leased from a [`Registry`](crate::Registry) runs on the
    /// registry's own current-thread runtime, shared by its hubs: `open`
    /// and the stream must not block it (nor call `block_in_place`).
    pub fn from_fn<F, Fut>(config: Config, open: F) -> Connector
    where
        F: Fn(Config) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Session, tokio_postgres::Error>> + Send + 'static,
    {
        let label = label_of(&config).into();
        Connector { config, label, open: Arc::new(move |config| open(config).boxed()) }
    }

    /// `user@host:port/database`, never the password: for logs, and (with
    /// the channels) the key under which the registry shares hubs. Two
    /// connectors with one label are taken to reach the same database.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The connection config sessions start from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Opens one session with the config as it is.
    pub async fn connect(&self) -> Result<Session, tokio_postgres::Error> {
        (self.open)(self.config.clone()).await
    }

    /// Opens one session as `application_name`.
    pub(crate) async fn connect_as(&self, application_name: &str) -> Result<Session, tokio_postgres::Error> {
        let mut config = self.config.clone();
        config.application_name(application_name);
        (self.open)(config).await
    }
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector").field("label", &self.label).finish_non_exhaustive()
    }
}

/// Turns a connection into the [`MessageStream`] that drives it with
/// `poll_message`. The stream ends (and stays ended) after the first `None`
/// or error, as `poll_message` asks.
pub fn message_stream<S, T>(mut connection: tokio_postgres::Connection<S, T>) -> MessageStream
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut ended = false;
    Box::pin(futures::stream::poll_fn(move |cx| {
        if ended {
            return Poll::Ready(None);
        }
        let polled = connection.poll_message(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            ended = true;
        }
        polled
    }))
}

/// `user@host:port/database` of a config; several hosts are joined with `,`.
fn label_of(config: &Config) -> String {
    let ports = config.get_ports();
    let port_of = |i: usize| ports.get(i).or_else(|| ports.first()).copied().unwrap_or(5432);
    let mut hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| match host {
            Host::Tcp(name) => format!("{name}:{}", port_of(i)),
            Host::Unix(dir) => format!("{}:{}", dir.display(), port_of(i)),
        })
        .collect();
    if hosts.is_empty() {
        hosts =
            config.get_hostaddrs().iter().enumerate().map(|(i, a)| format!("{a}:{}", port_of(i))).collect();
    }
    let user = config.get_user().unwrap_or("");
    // PostgreSQL's default database is the user's name.
    let database = config.get_dbname().unwrap_or(user);
    let at = if user.is_empty() { String::new() } else { format!("{user}@") };
    format!("{at}{}/{database}", hosts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(url: &str) -> String {
        label_of(&url.parse().unwrap())
    }

    #[test]
    fn labels_name_user_host_port_and_database_but_no_password() {
        for (url, expected) in [
            ("postgres://app:secret@db.internal:6543/jobs", "app@db.internal:6543/jobs"),
            ("postgres://app@db/jobs", "app@db:5432/jobs"),
            ("postgres://app@db", "app@db:5432/app"),
            ("host=a,b port=1,2 user=u dbname=d password=p", "u@a:1,b:2/d"),
            ("host=/run/postgresql user=u dbname=d", "u@/run/postgresql:5432/d"),
        ] {
            assert_eq!(label(url), expected, "{url}");
        }
        assert!(!label("postgres://app:hunter2@db/jobs").contains("hunter2"));
    }

    #[test]
    fn connectors_are_debug_by_label() {
        let c = Connector::no_tls("postgres://app:pw@db/jobs".parse().unwrap());
        let text = format!("{c:?}");
        assert!(text.contains("app@db:5432/jobs") && !text.contains("pw"), "{text}");
    }
}
