//! A real headless Chromium for the dashboard's tests, driven through
//! ChromeDriver's WebDriver protocol (both from Debian's packages, which
//! `cargo xtask setup` installs): open a page, find, read and click
//! elements, take a screenshot. Panics, naming what failed, when either is
//! missing: a browser test that cannot run must fail loudly.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};

/// The W3C name of an element reference in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A browser session; the driver and the browser end on drop.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    profile: std::path::PathBuf,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser").field("session", &self.session).finish_non_exhaustive()
    }
}

/// Runs blocking WebDriver I/O off the async threads (the page's server
/// may share the runtime).
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => tokio::task::block_in_place(f),
        Err(_) => f(),
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

impl Browser {
    /// Starts ChromeDriver and a headless Chromium session.
    pub fn start() -> Browser {
        blocking(|| {
            let port = free_port();
            let driver = Command::new("chromedriver")
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("chromedriver from Debian's chromium-driver (cargo xtask setup installs it)");
            let base = format!("http://127.0.0.1:{port}");
            let started = Instant::now();
            while ureq::get(&format!("{base}/status")).call().is_err() {
                assert!(started.elapsed() < Duration::from_secs(20), "chromedriver did not start on {base}");
                std::thread::sleep(Duration::from_millis(50));
            }
            let profile =
                std::env::temp_dir().join(format!("waymark-chromium-{}-{port}", std::process::id()));
            // The flags Chromium needs as root on a machine with no network
            // beyond the package registries: no sandbox, no background calls.
            let args = [
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--window-size=1400,900",
            ];
            let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
            args.push(format!("--user-data-dir={}", profile.display()));
            let caps = json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args}
            }}});
            let answer = post(&format!("{base}/session"), &caps);
            let session = answer["value"]["sessionId"]
                .as_str()
                .unwrap_or_else(|| panic!("no WebDriver session: {answer}"))
                .to_owned();
            Browser { driver, base, session, profile }
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}/session/{}{path}", self.base, self.session)
    }

    /// Opens `url`.
    pub fn goto(&self, url: &str) {
        blocking(|| post(&self.url("/url"), &json!({ "url": url })));
    }

    /// The first element matching `css`, if any.
    fn element(&self, css: &str) -> Option<String> {
        let answer =
            blocking(|| try_post(&self.url("/element"), &json!({"using": "css selector", "value": css})));
        answer.ok().and_then(|a| a["value"][ELEMENT].as_str().map(str::to_owned))
    }

    /// The visible text of the first element matching `css`.
    pub fn text(&self, css: &str) -> Option<String> {
        let id = self.element(css)?;
        let answer = blocking(|| try_get(&self.url(&format!("/element/{id}/text"))));
        answer.ok().and_then(|a| a["value"].as_str().map(str::to_owned))
    }

    /// Clicks the first element matching `css`; panics if there is none.
    pub fn click(&self, css: &str) {
        let id = self.element(css).unwrap_or_else(|| panic!("nothing on the page matches {css:?}"));
        blocking(|| post(&self.url(&format!("/element/{id}/click")), &json!({})));
    }

    /// Runs `script` in the page and answers what it returns.
    pub fn execute(&self, script: &str) -> Json {
        blocking(|| post(&self.url("/execute/sync"), &json!({ "script": script, "args": [] })))["value"]
            .clone()
    }

    /// Waits (looking every 50 ms) until the text of `css` satisfies `ok`,
    /// and returns it; panics naming `what` after `limit`.
    pub async fn wait_text(
        &self,
        css: &str,
        what: &str,
        limit: Duration,
        ok: impl Fn(&str) -> bool,
    ) -> String {
        let started = Instant::now();
        loop {
            if let Some(text) = self.text(css).filter(|t| ok(t)) {
                return text;
            }
            assert!(
                started.elapsed() < limit,
                "timed out after {limit:?} waiting for {what} ({css:?} reads {:?})",
                self.text(css)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Saves a PNG of the window to `path`.
    pub fn screenshot(&self, path: &Path) {
        use base64_png::decode;
        let answer = blocking(|| get(&self.url("/screenshot")));
        let png = decode(answer["value"].as_str().expect("a screenshot"));
        std::fs::write(path, png).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = ureq::delete(&self.url("")).call();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

fn try_post(url: &str, body: &Json) -> Result<Json, String> {
    ureq::post(url).send_json(body.clone()).map_err(|e| e.to_string())?.into_json().map_err(|e| e.to_string())
}

fn try_get(url: &str) -> Result<Json, String> {
    ureq::get(url).call().map_err(|e| e.to_string())?.into_json().map_err(|e| e.to_string())
}

fn post(url: &str, body: &Json) -> Json {
    try_post(url, body).unwrap_or_else(|e| panic!("WebDriver POST {url}: {e}"))
}

fn get(url: &str) -> Json {
    try_get(url).unwrap_or_else(|e| panic!("WebDriver GET {url}: {e}"))
}

/// Standard base64, for the screenshot WebDriver sends (the one decode the
/// tests need; no crate for it).
mod base64_png {
    pub fn decode(text: &str) -> Vec<u8> {
        let value = |c: u8| match c {
            b'A'..=b'Z' => Some(c - b'A'),
            b'a'..=b'z' => Some(c - b'a' + 26),
            b'0'..=b'9' => Some(c - b'0' + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        };
        let mut out = Vec::with_capacity(text.len() * 3 / 4);
        let (mut acc, mut bits) = (0u32, 0u32);
        for v in text.bytes().filter_map(value) {
            acc = (acc << 6) | u32::from(v);
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
            }
        }
        out
    }
}
