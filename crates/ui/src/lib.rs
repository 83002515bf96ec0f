//! waymark's web dashboard, a layer on the store: live counts per queue and
//! status pushed to the page (server-sent events fed by the store's
//! `watch`), task lists with filters and paging, a task in full (payload,
//! result, error envelope, attempts, times, parent and children), and
//! cancel and retry. Every read and write is one of the store's operations,
//! so the store's statements are the only SQL and a filter only ever
//! reaches the database as a bound value.
//!
//! ```no_run
//! # async fn demo(store: waymark_store::Store<waymark_pool::PgPool>) -> Result<(), Box<dyn std::error::Error>> {
//! let dashboard = waymark_ui::Dashboard::new(store);
//! let listener = dashboard.bind("127.0.0.1:8080".parse()?).await?;
//! println!("dashboard on http://{}", listener.local_addr()?);
//! dashboard.serve(listener).await?;
//! # Ok(()) }
//! ```
//!
//! # Safety on a network
//!
//! It binds 127.0.0.1 unless told otherwise, and refuses any other address
//! without a token ([`Dashboard::token`]), in [`Dashboard::bind`] and in
//! [`Dashboard::serve`] alike: a request must then carry it, as a bearer
//! header or as the cookie a visit to `/?token=...` sets. Without a token,
//! requests naming a host other than a loopback one are refused (DNS
//! rebinding). Actions are POSTs that carry a per-process value the page
//! holds, which a page on another site can neither read nor send; the
//! browser's cross-site requests are refused but for a link to the page,
//! which is never framed. It speaks plain HTTP: put a TLS proxy in front of
//! one on a network.

mod api;
mod guard;
mod held;
mod live;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;
use waymark_store::{PgExecutor, Store};

pub use guard::{check_bind, BindError};

/// The dashboard over one store; see the crate docs.
pub struct Dashboard<E> {
    store: Arc<Store<E>>,
    token: Option<String>,
}

impl<E> std::fmt::Debug for Dashboard<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .finish_non_exhaustive()
    }
}

/// What the handlers share.
pub(crate) struct App<E> {
    pub(crate) store: Arc<Store<E>>,
    pub(crate) guard: guard::Guard,
    pub(crate) feed: live::Feed,
}

impl<E: PgExecutor + 'static> Dashboard<E> {
    /// A dashboard over `store`, without a token (so for loopback only).
    pub fn new(store: impl Into<Arc<Store<E>>>) -> Self {
        Dashboard { store: store.into(), token: None }
    }

    /// Requires `token` of every request (as `Authorization: Bearer ...`,
    /// or the cookie `/?token=...` sets). Needed to bind anything but a
    /// loopback address.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Binds `addr`: refused for an address other than loopback without a
    /// token, or an empty token.
    pub async fn bind(&self, addr: SocketAddr) -> Result<tokio::net::TcpListener, BindError> {
        guard::check_bind(addr, self.token.as_deref())?;
        tokio::net::TcpListener::bind(addr).await.map_err(|e| BindError::Io(addr, e))
    }

    /// Serves the dashboard on `listener` until the future is dropped
    /// (open pages' live streams end with it). The bind rule holds for a
    /// listener bound elsewhere too: one on an address other than loopback
    /// is refused without a token.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        let addr = listener.local_addr()?;
        guard::check_bind(addr, self.token.as_deref())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        // Owned here, so the counts' task (and with it every page's stream)
        // ends when this future does.
        let (_live, feed) = live::Live::start(self.store.clone());
        let app = Arc::new(App { store: self.store, guard: guard::Guard::new(addr, self.token), feed });
        axum::serve(listener, router(app)).await
    }
}

fn router<E: PgExecutor + 'static>(app: Arc<App<E>>) -> Router {
    Router::new()
        .route("/", get(api::page::<E>))
        .route("/api/stats", get(api::stats::<E>))
        .route("/api/live", get(live::events::<E>))
        .route("/api/tasks", get(api::list::<E>))
        .route("/api/tasks/{id}", get(api::task::<E>))
        .route("/api/tasks/{id}/cancel", post(api::cancel::<E>))
        .route("/api/tasks/{id}/retry", post(api::retry::<E>))
        .route("/api/held", get(held::list::<E>))
        .route("/api/held/{id}", get(held::one::<E>))
        .route("/api/held/{id}/{action}", post(held::act::<E>))
        .route("/api/flows/{id}", get(held::flow::<E>))
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard::check::<E>))
        .with_state(app)
}
