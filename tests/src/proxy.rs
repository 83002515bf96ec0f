//! A TCP proxy in front of PostgreSQL that can lose one answer on purpose:
//! armed with a marker, it forwards the first client message that holds the
//! marker, lets the server finish it (up to its ReadyForQuery, so an
//! autocommit statement has committed), then drops the server's answer and
//! closes both sides. The client sees a dead connection after a write that
//! did commit: the "unknown outcome" case a retry must answer correctly.
//!
//! Plain connections only (`sslmode=disable`): it reads the server's
//! message framing.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug)]
struct Shared {
    marker: Mutex<Option<Vec<u8>>>,
    cuts: AtomicUsize,
    connections: AtomicUsize,
    /// While true, every connection is cut and new ones are closed at once:
    /// to the client, the server is gone.
    down: tokio::sync::watch::Sender<bool>,
    /// Client messages seen that contain the counted marker.
    counted: Mutex<Option<Vec<u8>>>,
    count: AtomicUsize,
    refused: AtomicUsize,
    /// Connections piped now, both ways.
    open: tokio::sync::watch::Sender<usize>,
}

/// A running proxy; dropping it stops accepting (open connections end when
/// either side closes).
#[derive(Debug)]
pub struct AnswerCuttingProxy {
    port: u16,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

impl AnswerCuttingProxy {
    /// Starts a proxy on 127.0.0.1 in front of `upstream` (`host:port`).
    pub async fn start(upstream: String) -> AnswerCuttingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared {
            marker: Mutex::default(),
            cuts: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            down: tokio::sync::watch::channel(false).0,
            counted: Mutex::default(),
            count: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            open: tokio::sync::watch::channel(0).0,
        });
        let s = shared.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *s.down.borrow() {
                    s.refused.fetch_add(1, Ordering::SeqCst);
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream).await else { continue };
                s.connections.fetch_add(1, Ordering::SeqCst);
                s.open.send_modify(|n| *n += 1);
                let mut down = s.down.subscribe();
                let piped = pipe(client, server, s.clone());
                let shared = s.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = piped => {}
                        _ = down.wait_for(|down| *down) => {}
                    }
                    shared.open.send_modify(|n| *n -= 1);
                });
            }
        });
        AnswerCuttingProxy { port, shared, accept }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Loses the answer to the next client message containing `marker`.
    pub fn arm(&self, marker: &str) {
        *self.shared.marker.lock().expect("marker") = Some(marker.as_bytes().to_vec());
    }

    /// Takes the server away (`true`: every open connection is cut, new
    /// ones are closed at once) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.shared.down.send_replace(down);
    }

    /// Takes the server away, as `set_down(true)`, and returns once every
    /// open connection is cut both ways: no client message sent after
    /// this reaches the server.
    pub async fn take_down(&self) {
        self.set_down(true);
        let mut open = self.shared.open.subscribe();
        let _ = open.wait_for(|n| *n == 0).await;
    }

    /// Counts from now on the client messages that contain `marker`.
    pub fn count(&self, marker: &str) {
        *self.shared.counted.lock().expect("counted") = Some(marker.as_bytes().to_vec());
        self.shared.count.store(0, Ordering::SeqCst);
    }

    /// Client messages seen so far that contain the counted marker.
    pub fn counted(&self) -> usize {
        self.shared.count.load(Ordering::SeqCst)
    }

    /// Answers lost so far.
    pub fn cuts(&self) -> usize {
        self.shared.cuts.load(Ordering::SeqCst)
    }

    /// Connections closed at once so far because the server was down.
    pub fn refused(&self) -> usize {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }
}

impl Drop for AnswerCuttingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn pipe(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let cutting = Arc::new(AtomicBool::new(false));

    let flag = cutting.clone();
    let s = shared.clone();
    // Aborted as this pipe ends or is dropped (the server taken away): a
    // client message must not go on reaching the server once its answers
    // no longer come back.
    let _upstream = AbortOnDrop(tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if let Some(m) = s.counted.lock().expect("counted").as_ref() {
                if buf[..n].windows(m.len()).any(|w| w == m.as_slice()) {
                    s.count.fetch_add(1, Ordering::SeqCst);
                }
            }
            {
                let mut marker = s.marker.lock().expect("marker");
                if let Some(m) = marker.as_ref() {
                    if buf[..n].windows(m.len()).any(|w| w == m.as_slice()) {
                        *marker = None;
                        flag.store(true, Ordering::SeqCst);
                    }
                }
            }
            if server_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }));

    // Server to client, frame by frame: type byte, then a length that
    // counts itself.
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match server_rx.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        let mut forward_until = 0;
        let mut cut = false;
        while pending.len() >= forward_until + 5 {
            let len = u32::from_be_bytes(pending[forward_until + 1..forward_until + 5].try_into().unwrap())
                as usize;
            let end = forward_until + 1 + len;
            if pending.len() < end {
                break;
            }
            let ready_for_query = pending[forward_until] == b'Z';
            forward_until = end;
            if ready_for_query && cutting.load(Ordering::SeqCst) {
                cut = true;
                break;
            }
        }
        if cut {
            shared.cuts.fetch_add(1, Ordering::SeqCst);
            break; // the answer is dropped with `pending`; both sides close
        }
        if !cutting.load(Ordering::SeqCst) {
            if client_tx.write_all(&pending[..forward_until]).await.is_err() {
                break;
            }
            pending.drain(..forward_until);
        }
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `url` with its host and port replaced by the proxy's, TLS off (the
/// proxy reads the server's framing).
pub fn url_through(proxy: &AnswerCuttingProxy, url: &str) -> String {
    let (host, port) = crate::pgbouncer::host_and_port(url);
    let through = url.replacen(&format!("{host}:{port}"), &format!("127.0.0.1:{}", proxy.port()), 1);
    let sep = if through.contains('?') { '&' } else { '?' };
    format!("{through}{sep}sslmode=disable")
}

/// A pool builder in `schema` whose connections go through `proxy`.
pub fn pool_through(proxy: &AnswerCuttingProxy, schema: &crate::TestSchema) -> waymark_pool::PgPoolBuilder {
    waymark_pool::PgPool::builder(url_through(proxy, &schema.url)).schema(&schema.schema)
}

/// A store in `schema` whose statements go through `proxy`, with no
/// retries inside the pool (each try the proxy refuses or cuts is one of
/// the caller's own), and LISTEN straight to the server (signals still
/// arrive, and nothing else talks through the proxy).
pub async fn store_behind(
    proxy: &AnswerCuttingProxy,
    schema: &crate::TestSchema,
) -> waymark_store::Store<waymark_pool::PgPool> {
    let pool = pool_through(proxy, schema)
        .max_size(4)
        .retry_attempts(0)
        .listen_url(&schema.url)
        .build()
        .expect("pool");
    crate::connect_in(pool, schema).await
}

/// A proxy in front of the server of `url`.
pub async fn proxy_for(url: &str) -> AnswerCuttingProxy {
    let (host, port) = crate::pgbouncer::host_and_port(url);
    AnswerCuttingProxy::start(format!("{host}:{port}")).await
}
