//! Who may use the dashboard: the bind rule, the token, the host a request
//! names, and the proof an action came from the page itself.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use crate::App;

/// The header an action must carry, with the value the page was served.
pub(crate) const CSRF_HEADER: &str = "x-waymark-csrf";
const COOKIE: &str = "waymark_token";

/// Why the dashboard would not bind.
#[derive(Debug)]
#[non_exhaustive]
pub enum BindError {
    /// An address other than loopback, without a token.
    NeedsToken(SocketAddr),
    /// A token that is empty.
    EmptyToken,
    /// A token with a character other than letters, digits and `-._~`.
    BadToken,
    /// The bind itself failed.
    Io(SocketAddr, std::io::Error),
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BindError::NeedsToken(addr) => write!(
                f,
                "refusing to serve the dashboard on {addr} without a token: anyone who can reach it could \
                 cancel and retry tasks (set a token, or bind 127.0.0.1)"
            ),
            BindError::EmptyToken => f.write_str("the dashboard token must not be empty"),
            BindError::BadToken => f.write_str("the dashboard token may hold only letters, digits and -._~"),
            BindError::Io(addr, e) => write!(f, "binding the dashboard to {addr}: {e}"),
        }
    }
}

impl std::error::Error for BindError {}

/// The bind rule, for a caller that checks its input before anything
/// else: an address other than loopback needs a token; a token must be
/// letters, digits and `-._~` (so it travels in a cookie and a query as is).
pub fn check_bind(addr: SocketAddr, token: Option<&str>) -> Result<(), BindError> {
    match token {
        Some("") => Err(BindError::EmptyToken),
        Some(t) if !t.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b)) => {
            Err(BindError::BadToken)
        }
        None if !addr.ip().is_loopback() => Err(BindError::NeedsToken(addr)),
        _ => Ok(()),
    }
}

pub(crate) struct Guard {
    /// The hosts a tokenless dashboard answers to; any, with a token.
    hosts: Option<Vec<String>>,
    token: Option<String>,
    pub(crate) csrf: String,
}

impl Guard {
    pub(crate) fn new(bound: SocketAddr, token: Option<String>) -> Self {
        let port = bound.port();
        // Without a token only loopback is bound; a page of another site
        // reaching it through a rebound DNS name names that site's host.
        // A browser leaves out the scheme's default port (plain HTTP: 80),
        // so on that port the bare names are answered too.
        let hosts = token.is_none().then(|| {
            let ip = match bound {
                SocketAddr::V4(a) => a.ip().to_string(),
                SocketAddr::V6(a) => format!("[{}]", a.ip()),
            };
            let names = ["127.0.0.1".to_owned(), "localhost".to_owned(), "[::1]".to_owned(), ip];
            let bare = if port == 80 { names.to_vec() } else { Vec::new() };
            names.into_iter().map(|n| format!("{n}:{port}")).chain(bare).collect()
        });
        let csrf = format!("{:032x}", rand::random::<u128>());
        Guard { hosts, token, csrf }
    }

    /// Whether a request naming `host` is answered: any, with a token.
    fn allows_host(&self, host: &str) -> bool {
        self.hosts.as_ref().is_none_or(|hosts| hosts.iter().any(|h| h.eq_ignore_ascii_case(host)))
    }

    fn token_in(&self, headers: &HeaderMap) -> bool {
        let Some(token) = &self.token else { return true };
        // The scheme is case-insensitive (RFC 7235).
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim());
        let cookie = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|kv| kv.trim().strip_prefix(COOKIE).and_then(|rest| rest.strip_prefix('=')))
            .find(|v| same(v, token));
        bearer.is_some_and(|b| same(b, token)) || cookie.is_some()
    }
}

/// Compares without stopping at the first difference.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn refuse(status: StatusCode, why: &str) -> Response {
    (status, axum::Json(serde_json::json!({ "error": why }))).into_response()
}

/// Runs before every route.
pub(crate) async fn check<E: Send + Sync + 'static>(
    State(app): State<Arc<App<E>>>,
    request: Request,
    next: Next,
) -> Response {
    let guard = &app.guard;
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    if !guard.allows_host(host) {
        return refuse(
            StatusCode::MISDIRECTED_REQUEST,
            "this dashboard answers on its loopback address only",
        );
    }
    // A link from another site may open the page; nothing else may come
    // from one (the API, the actions).
    let navigation = request.method() == Method::GET
        && request.uri().path() == "/"
        && headers.get("sec-fetch-mode").is_some_and(|v| v == "navigate");
    if !navigation && headers.get("sec-fetch-site").is_some_and(|v| v == "cross-site") {
        return refuse(StatusCode::FORBIDDEN, "cross-site requests are refused");
    }
    if !guard.token_in(headers) {
        // A visit to /?token=... trades the token for a cookie.
        let offered = request
            .uri()
            .query()
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("token=")).map(str::to_owned));
        if let (Some(offered), Some(token)) = (offered, &guard.token) {
            if request.uri().path() == "/" && same(&offered, token) {
                // Lax, so a link to the page still sends it; actions need
                // the page's own value besides.
                let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Lax; Path=/");
                return ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response();
            }
        }
        return refuse(
            StatusCode::UNAUTHORIZED,
            "a token is required: open /?token=... or send Authorization: Bearer",
        );
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let sent = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !same(sent, &guard.csrf) {
            return refuse(StatusCode::FORBIDDEN, "an action must come from the dashboard's own page");
        }
    }
    let mut response = next.run(request).await;
    // Never framed (clickjacking), never sniffed.
    let h = response.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, header::HeaderValue::from_static("DENY"));
    h.insert(header::CONTENT_SECURITY_POLICY, header::HeaderValue::from_static("frame-ancestors 'none'"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, header::HeaderValue::from_static("nosniff"));
    response
}

#[cfg(test)]
mod tests {
    use super::Guard;

    fn allows(bound: &str, host: &str) -> bool {
        Guard::new(bound.parse().unwrap(), None).allows_host(host)
    }

    #[test]
    fn on_port_80_a_loopback_host_without_its_port_is_answered_and_a_foreign_one_is_not() {
        // Browsers leave out a scheme's default port: http://127.0.0.1/
        // sends `Host: 127.0.0.1`.
        for host in ["127.0.0.1", "localhost", "LocalHost", "[::1]", "127.0.0.1:80", "localhost:80"] {
            assert!(allows("127.0.0.1:80", host), "{host} on port 80");
        }
        assert!(allows("[::1]:80", "[::1]"));
        assert!(allows("127.0.0.2:80", "127.0.0.2"));
        // DNS rebinding: another name is refused, with or without a port.
        for host in ["evil.example", "evil.example:80", "127.0.0.1.evil.example", "", "127.0.0.1:8080", "::1"]
        {
            assert!(!allows("127.0.0.1:80", host), "{host:?} on port 80");
        }
    }

    #[test]
    fn on_another_port_the_host_must_name_it() {
        assert!(allows("127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(allows("127.0.0.1:8080", "localhost:8080"));
        for host in ["127.0.0.1", "localhost", "127.0.0.1:80", "evil.example:8080"] {
            assert!(!allows("127.0.0.1:8080", host), "{host:?} on port 8080");
        }
    }
}
