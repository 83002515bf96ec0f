//! The dashboard in a real headless Chromium, on a real PostgreSQL: the
//! counts change on the page as a worker runs the tasks (pushed, not
//! reloaded), a failed task is retried with its button and succeeds; and
//! the guard: the bind rule, the token, the host, the action header, and
//! filters that only ever reach the database as values. The screenshot is
//! left at `target/waymark-dashboard.png`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use waymark_pool::PgPool;
use waymark_store::{NewTask, Store, TaskStatus};
use waymark_tests::browser::Browser;
use waymark_tests::{pool_store, test_worker, TestSchema, TestWorker};
use waymark_ui::{BindError, Dashboard};
use waymark_worker::TaskError;

const WAIT: Duration = Duration::from_secs(30);

/// Serves a dashboard over `store` on a free loopback port.
async fn serve(dashboard: Dashboard<PgPool>) -> SocketAddr {
    let listener = dashboard.bind("127.0.0.1:0".parse().unwrap()).await.expect("bind");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(dashboard.serve(listener));
    addr
}

/// One raw HTTP/1.1 request (so the test sets any header it likes, Host
/// included); answers the status code and the body.
fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    let mut req = format!("{method} {path} HTTP/1.1\r\nconnection: close\r\ncontent-length: 0\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_follows_a_worker_live_and_a_failed_task_is_retried_with_its_button() {
    let schema = TestSchema::new().await;
    let store: Arc<Store<PgPool>> = Arc::new(pool_store(&schema).await);
    let mut ok = Vec::new();
    for i in 0..3 {
        ok.push(store.submit(NewTask::new("ui.ok", json!({ "i": i })).queue("ui")).await.unwrap().id);
    }
    let flaky = store.submit(NewTask::new("ui.flaky", json!({"card": "4242"})).queue("ui")).await.unwrap();
    let addr = serve(Dashboard::new(store.clone())).await;

    let browser = Browser::start();
    browser.goto(&format!("http://{addr}/"));
    let queued = "#counts tr[data-queue='ui'] td[data-status='queued']";
    browser.wait_text(queued, "four queued on the page", WAIT, |t| t == "4").await;
    browser.wait_text("#conn", "the live stream open", WAIT, |t| t == "live").await;

    // A worker runs them; the page hears it without a reload.
    let worker = test_worker(&store, "ui")
        .task("ui.ok", |_ctx, p: serde_json::Value| async move { Ok(p) })
        .task("ui.flaky", |ctx, _p: serde_json::Value| async move {
            if ctx.attempt() == 1 {
                return Err(TaskError::permanent("card declined"));
            }
            Ok(json!("charged"))
        })
        .start();
    let cell = |status: &str| format!("#counts tr[data-queue='ui'] td[data-status='{status}']");
    browser.wait_text(&cell("succeeded"), "three succeeded on the page", WAIT, |t| t == "3").await;
    browser.wait_text(&cell("failed"), "one failed on the page", WAIT, |t| t == "1").await;
    browser.wait_text(&cell("queued"), "none queued", WAIT, |t| t == "0").await;

    // The failed count filters the list; the task's detail has a Retry.
    browser.click(&cell("failed"));
    let row = format!("#tasks tr[data-id='{}'] a", flaky.id);
    browser.wait_text(&row, "the failed task listed", WAIT, |t| t == flaky.id).await;
    browser.click(&row);
    browser.wait_text("#detail dd[data-field='status']", "its detail", WAIT, |t| t == "failed").await;
    let detail = browser.text("#detail-body").unwrap_or_default();
    assert!(
        detail.contains("card declined") && detail.contains("4242"),
        "envelope and payload shown: {detail}"
    );
    browser.click("#retry");
    browser
        .wait_text("#detail dd[data-field='status']", "the retried task succeeded", WAIT, |t| {
            t == "succeeded"
        })
        .await;
    browser.wait_text(&cell("succeeded"), "four succeeded", WAIT, |t| t == "4").await;
    let done = store.fetch(&flaky.id).await.unwrap();
    assert_eq!((done.status, done.attempt, done.result), (TaskStatus::Succeeded, 2, Some(json!("charged"))));
    // A row another client wrote that waymark cannot read shows why.
    let odd = "task_01UIUNREADABLEPAYLOAD0000";
    waymark_store::PgExecutor::execute_script(
        store.executor(),
        &format!(
            "insert into cairnq_tasks (id, name, queue, status, payload, run_at_ms, root_id, created_at_ms, \
             updated_at_ms) values ('{odd}', 'ui.odd', 'ui-odd', 'queued', '{{\"n\": 1e400}}', 0, '{odd}', 0, 0)"
        ),
    )
    .await
    .unwrap();
    browser.execute(&format!("show('{odd}')"));
    browser.wait_text("#detail dd[data-field='id']", "the odd task's detail", WAIT, |t| t == odd).await;
    let detail = browser.text("#detail-body").unwrap_or_default();
    assert!(detail.contains("unreadable: "), "the unreadable payload says so: {detail}");
    // Every task of the queue, for the screenshot.
    browser.execute(
        "document.getElementById('f-status').value = ''; document.getElementById('filters').requestSubmit();",
    );
    browser.wait_text("#page", "the queue's four tasks listed", WAIT, |t| t == "1 to 4").await;
    let shot = waymark_tests::cluster::target_dir().join("waymark-dashboard.png");
    browser.screenshot(&shot);
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a screenshot of the page");
    drop(browser);
    worker.stop().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_refuses_what_a_dashboard_must_not_do() {
    let schema = TestSchema::new().await;
    let store: Arc<Store<PgPool>> = Arc::new(pool_store(&schema).await);
    let failed = {
        let t = store.submit(NewTask::new("g", json!({})).queue("g")).await.unwrap();
        store.cancel(&t.id).await.unwrap();
        t
    };

    // Anything but loopback needs a token; an empty token is refused.
    let open = Dashboard::new(store.clone());
    let e = open.bind("0.0.0.0:0".parse().unwrap()).await.expect_err("no token");
    assert!(matches!(e, BindError::NeedsToken(_)) && e.to_string().contains("without a token"), "{e}");
    let e = Dashboard::new(store.clone())
        .token("")
        .bind("127.0.0.1:0".parse().unwrap())
        .await
        .expect_err("empty");
    assert!(matches!(e, BindError::EmptyToken), "{e}");

    // A token fit for a cookie and a query only; and serve() keeps the
    // bind rule for a listener bound elsewhere.
    let e = Dashboard::new(store.clone())
        .token("a b;c")
        .bind("127.0.0.1:0".parse().unwrap())
        .await
        .expect_err("bad");
    assert!(matches!(e, BindError::BadToken), "{e}");
    let wide = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let e = Dashboard::new(store.clone()).serve(wide).await.expect_err("no token on 0.0.0.0");
    assert!(e.to_string().contains("without a token"), "{e}");

    let addr = serve(open).await;
    let page = request(addr, "GET", "/", &[]);
    assert_eq!(page.0, 200);
    // A link from another site opens the page; its API stays closed to it.
    let link = [("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "navigate")];
    assert_eq!(request(addr, "GET", "/", &link).0, 200);
    assert_eq!(request(addr, "GET", "/api/stats", &link).0, 403);
    let csrf = page
        .1
        .split("const CSRF = \"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("the page's value")
        .to_owned();
    // Another host name (a rebound DNS name) is refused.
    assert_eq!(request(addr, "GET", "/api/stats", &[("host", "evil.example:80")]).0, 421);
    // An action without the page's value, or marked cross-site, is refused
    // and changes nothing.
    let retry = format!("/api/tasks/{}/retry", failed.id);
    assert_eq!(request(addr, "POST", &retry, &[]).0, 403);
    assert_eq!(request(addr, "POST", &retry, &[("x-waymark-csrf", "guess")]).0, 403);
    assert_eq!(
        request(addr, "POST", &retry, &[("x-waymark-csrf", &csrf), ("sec-fetch-site", "cross-site")]).0,
        403
    );
    assert_eq!(store.fetch(&failed.id).await.unwrap().status, TaskStatus::Canceled);
    let (status, body) = request(addr, "POST", &retry, &[("x-waymark-csrf", &csrf)]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(store.fetch(&failed.id).await.unwrap().status, TaskStatus::Queued);
    let (status, body) = request(addr, "POST", &retry, &[("x-waymark-csrf", &csrf)]);
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("is queued: it cannot be retried"), "{body}");
    // Filters are values, never SQL; a bad one is a 400 naming it.
    let (status, body) = request(addr, "GET", "/api/tasks?queue=g%27%20or%201%3D1--", &[]);
    assert_eq!((status, body.as_str()), (200, "[]"));
    let (status, body) = request(addr, "GET", "/api/tasks?status=nope", &[]);
    assert_eq!(status, 400);
    assert!(body.contains("unknown status \\\"nope\\\""), "{body}");
    assert_eq!(request(addr, "GET", "/api/tasks?limit=100000", &[]).0, 400);
    assert_eq!(request(addr, "GET", "/api/tasks/task_nope", &[]).0, 404);

    // With a token: nothing without it; a bearer header or the cookie from
    // /?token=... lets a request through, on any host name.
    let addr = serve(Dashboard::new(store.clone()).token("s3cret")).await;
    assert_eq!(request(addr, "GET", "/api/stats", &[]).0, 401);
    assert_eq!(request(addr, "GET", "/api/stats", &[("authorization", "Bearer wrong")]).0, 401);
    assert_eq!(
        request(addr, "GET", "/api/stats", &[("authorization", "Bearer s3cret"), ("host", "queue.internal")])
            .0,
        200
    );
    let (status, _) = request(addr, "GET", "/?token=s3cret", &[]);
    assert_eq!(status, 303, "the token is traded for a cookie");
    assert_eq!(request(addr, "GET", "/api/stats", &[("cookie", "waymark_token=s3cret")]).0, 200);
    assert_eq!(request(addr, "GET", "/api/stats", &[("authorization", "bearer s3cret")]).0, 200, "any case");
    schema.drop().await;
}

/// One raw request whose answer is read as it comes, with a deadline.
fn stream_until(stream: &mut TcpStream, seen: &str, limit: Duration) -> String {
    stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let started = std::time::Instant::now();
    let mut got = String::new();
    let mut buf = [0u8; 4096];
    while !got.contains(seen) {
        assert!(started.elapsed() < limit, "no {seen:?} within {limit:?}; got {got:?}");
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(_) => {} // the read timeout: look again
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_dashboard_ends_its_live_streams_and_sends_safe_headers() {
    let schema = TestSchema::new().await;
    let store: Arc<Store<PgPool>> = Arc::new(pool_store(&schema).await);
    let dashboard = Dashboard::new(store.clone());
    let listener = dashboard.bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(dashboard.serve(listener));
    let mut live = TcpStream::connect(addr).unwrap();
    write!(live, "GET /api/live HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").unwrap();
    let head = tokio::task::block_in_place(|| stream_until(&mut live, "event: counts", WAIT));
    let lower = head.to_ascii_lowercase();
    assert!(
        lower.contains("x-frame-options: deny") && lower.contains("x-content-type-options: nosniff"),
        "{head}"
    );
    assert!(lower.contains("content-security-policy: frame-ancestors 'none'"), "{head}");
    // The embedder stops serving: the open stream ends too (the counts'
    // task and the store are not kept alive by a browser tab).
    server.abort();
    let rest = tokio::task::block_in_place(|| stream_until(&mut live, "\r\n0\r\n\r\n", WAIT));
    assert!(rest.ends_with("0\r\n\r\n"), "the chunked stream ended: {rest:?}");
    schema.drop().await;
}

/// On port 80 a browser names the host without the port (`Host:
/// 127.80.0.1`); the page, its API and its live stream answer it, and a
/// foreign name without a port is still refused. Binding port 80 needs
/// the right to: without it the test says so and checks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_reaches_a_tokenless_dashboard_on_port_80() {
    let schema = TestSchema::new().await;
    let store: Arc<Store<PgPool>> = Arc::new(pool_store(&schema).await);
    store.submit(NewTask::new("ui.port80", json!({})).queue("port80")).await.unwrap();
    let dashboard = Dashboard::new(store.clone());
    // A loopback address of its own, so nothing else on 127.0.0.1:80 is in the way.
    let listener = match dashboard.bind("127.80.0.1:80".parse().unwrap()).await {
        Ok(listener) => listener,
        Err(BindError::Io(_, e)) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            eprintln!("SKIPPED: binding port 80 is not permitted here ({e})");
            return schema.drop().await;
        }
        Err(e) => panic!("{e}"),
    };
    let addr = listener.local_addr().unwrap();
    tokio::spawn(dashboard.serve(listener));
    assert_eq!(request(addr, "GET", "/api/stats", &[("host", "127.80.0.1")]).0, 200);
    assert_eq!(request(addr, "GET", "/api/stats", &[("host", "localhost")]).0, 200);
    assert_eq!(request(addr, "GET", "/api/stats", &[("host", "evil.example")]).0, 421);

    let browser = Browser::start();
    browser.goto("http://127.80.0.1/");
    let queued = "#counts tr[data-queue='port80'] td[data-status='queued']";
    browser.wait_text(queued, "the queued task on the page", WAIT, |t| t == "1").await;
    browser.wait_text("#conn", "the live stream open", WAIT, |t| t == "live").await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_shows_as_a_tree_of_its_tasks_and_a_held_task_is_released_with_its_button() {
    let schema = TestSchema::new().await;
    let store: Arc<Store<PgPool>> = Arc::new(pool_store(&schema).await);
    let task = |name: &str| NewTask::new(name, json!({})).queue("ui-flow");
    let mut flow = waymark_store::Flow::new();
    let charge = flow.add(task("charge"));
    let ship = flow.add(task("ship").after([&charge]));
    let email = flow.add(task("email").after([&ship]).on_event("ui.paid"));
    store.submit_flow(&flow).await.expect("flow");
    let addr = serve(Dashboard::new(store.clone())).await;

    let browser = Browser::start();
    browser.goto(&format!("http://{addr}/"));
    let held_row = |id: &str| format!("#held-tasks tr[data-id='{id}']");
    let waits = browser
        .wait_text(&format!("{} td.waits", held_row(&email)), "email held", WAIT, |t| !t.is_empty())
        .await;
    assert!(waits.contains(&ship) && waits.contains("event ui.paid"), "{waits}");
    // Clicked from the page's script: the live stream redraws the table
    // under WebDriver's element references.
    let click = |css: String| browser.execute(&format!("document.querySelector(\"{css}\").click()"));
    click(format!("{} a.flow-link", held_row(&ship)));
    // The tree: charge (released, queued) > ship (held) > email (held).
    let state = |id: &str| format!("#flow-tree li[data-id='{id}'] > span .status");
    browser.wait_text(&state(&charge), "charge queued in the tree", WAIT, |t| t == "queued").await;
    let nested = format!("#flow-tree li[data-id='{charge}'] li[data-id='{ship}'] li[data-id='{email}']");
    browser
        .wait_text(&format!("{nested} > span .status"), "email under ship under charge", WAIT, |t| {
            t == "held"
        })
        .await;

    // The operator releases email out of turn with its button.
    click(format!("{} button[data-action='release']", held_row(&email)));
    browser.wait_text(&state(&email), "email released", WAIT, |t| t == "queued").await;
    assert_eq!(store.fetch(&email).await.expect("released").status, TaskStatus::Queued);
    assert_eq!(store.held(&ship).await.unwrap().unwrap().state, waymark_store::HeldState::Held);
    let shot = waymark_tests::cluster::target_dir().join("waymark-dashboard-flow.png");
    browser.screenshot(&shot);
    drop(browser);
    schema.drop().await;
}
