//! A real Prometheus server for the metrics exporter's test (Debian's
//! package, which `cargo xtask setup` installs; `WAYMARK_PROMETHEUS` names
//! another binary): it scrapes one target every second, keeps its data in a
//! temporary folder, answers queries over its HTTP API, and ends on drop.
//! Also [`serve_metrics`], the scrape target: `GET /metrics` answered with
//! what a closure renders. Panics, naming what failed, when Prometheus is
//! missing or does not start: a test that cannot run must fail loudly.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value as Json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::private_cluster::free_port;

/// The `prometheus` binary: `WAYMARK_PROMETHEUS`, else on `PATH`.
pub fn find_binary() -> Result<PathBuf, String> {
    if let Ok(path) = std::env::var("WAYMARK_PROMETHEUS") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("WAYMARK_PROMETHEUS={} is not a file", path.display()))
        };
    }
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|p| p.join("prometheus")).find(|p| p.is_file()))
        .ok_or_else(|| {
            "no prometheus binary on PATH; install it: apt-get install -y prometheus (cargo xtask setup does)"
                .to_owned()
        })
}

/// A running Prometheus.
pub struct Prometheus {
    child: Child,
    dir: PathBuf,
    base: String,
}

impl std::fmt::Debug for Prometheus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prometheus").field("base", &self.base).finish_non_exhaustive()
    }
}

impl Prometheus {
    /// Starts Prometheus scraping `target` (`host:port`, path `/metrics`)
    /// every second, and waits until it is ready.
    pub fn start(target: &str) -> Prometheus {
        let binary = find_binary().unwrap_or_else(|e| panic!("{e}"));
        let port = free_port().expect("a port for Prometheus");
        let dir = std::env::temp_dir().join(format!("waymark-prometheus-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("Prometheus's folder");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: waymark\n    static_configs:\n      - targets: ['{target}']\n"
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("Prometheus's config");
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("Prometheus's log");
        let child = Command::new(&binary)
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let prometheus = Prometheus { child, dir, base: format!("http://127.0.0.1:{port}") };
        let started = Instant::now();
        while !prometheus.ready() {
            if started.elapsed() > Duration::from_secs(30) {
                let log = std::fs::read_to_string(prometheus.dir.join("prometheus.log")).unwrap_or_default();
                panic!("Prometheus did not become ready on {} within 30 s:\n{log}", prometheus.base);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        prometheus
    }

    fn ready(&self) -> bool {
        ureq::get(&format!("{}/-/ready", self.base)).call().is_ok()
    }

    /// The value of an instant query's one sample (`sum(...)` of a
    /// counter, say), or `None` while there is none.
    pub fn value(&self, query: &str) -> Option<f64> {
        let answer: Json = ureq::get(&format!("{}/api/v1/query", self.base))
            .query("query", query)
            .call()
            .ok()?
            .into_json()
            .ok()?;
        assert_eq!(answer["status"], "success", "the query {query:?} failed: {answer}");
        let result = answer["data"]["result"].as_array()?;
        assert!(result.len() <= 1, "{query:?} answered more than one sample: {answer}");
        result.first()?["value"][1].as_str()?.parse().ok()
    }

    /// The health of the one scrape target, as Prometheus reports it.
    pub fn target_health(&self) -> Option<String> {
        let answer: Json =
            ureq::get(&format!("{}/api/v1/targets", self.base)).call().ok()?.into_json().ok()?;
        Some(answer["data"]["activeTargets"].get(0)?["health"].as_str()?.to_owned())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Serves `GET /metrics` on 127.0.0.1 (any other path: 404) with what
/// `render` returns, in Prometheus's text format; returns `host:port`.
/// The server lives as long as the runtime.
pub async fn serve_metrics(render: impl Fn() -> String + Send + Sync + 'static) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port for the metrics");
    let addr = listener.local_addr().expect("its address").to_string();
    let render = std::sync::Arc::new(render);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let render = render.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                // The request line and headers; a scrape sends no body.
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&request);
                let (status, body) = if head.starts_with("GET /metrics ") {
                    ("200 OK", render())
                } else {
                    ("404 Not Found", String::new())
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    addr
}
