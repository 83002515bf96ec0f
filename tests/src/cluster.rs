//! Finding or starting the PostgreSQL server the tests run against.
//!
//! `DATABASE_URL` wins when set. Otherwise a throwaway cluster is created
//! under `target/waymark-pg` from the local PostgreSQL binaries and started on
//! port 54329 (`WAYMARK_PG_PORT` overrides); it keeps running between test
//! binaries and is reused. `initdb` and `pg_ctl` refuse to run as root, so as
//! root they run as the `postgres` user.

use std::fs::{self, File};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// Port of the throwaway cluster.
pub fn throwaway_port() -> u16 {
    std::env::var("WAYMARK_PG_PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(54329)
}

/// The workspace's `target` directory.
pub fn target_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target")
}

/// A URL for the server's `postgres` database: `DATABASE_URL` if set, else
/// the throwaway cluster, started if needed. Panics with the reason when no
/// server can be had: a test without a database must fail loudly.
pub fn server_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => ensure_throwaway().unwrap_or_else(|e| panic!("no PostgreSQL for the tests: {e}")),
    })
    .clone()
}

/// Starts the throwaway cluster if it is not running, and returns its URL.
pub fn ensure_throwaway() -> Result<String, String> {
    let port = throwaway_port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    if port_open(port) {
        return Ok(url);
    }
    let as_root = is_root();
    let root = cluster_root(as_root)?;
    // One process sets the cluster up; others wait on the lock, then find it up.
    let lock = File::create(root.join("setup.lock")).map_err(|e| format!("lock file: {e}"))?;
    lock.lock().map_err(|e| format!("locking {}: {e}", root.display()))?;
    if port_open(port) {
        return Ok(url);
    }
    let bin = pg_bindir()?;
    let data = root.join("data");
    if !data.join("PG_VERSION").exists() {
        let _ = fs::remove_dir_all(&data);
        initdb(&bin, &data, as_root)?;
    }
    let log = root.join("server.log");
    let options = format!(
        "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c max_connections=300 \
         -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c shared_buffers=128MB",
        root.display()
    );
    let mut start = pg_command(&bin.join("pg_ctl"), as_root);
    start.args(["start", "-w", "-t", "60", "-D"]).arg(&data).arg("-l").arg(&log).args(["-o", &options]);
    run(&mut start).map_err(|e| {
        let tail = fs::read_to_string(&log).unwrap_or_default();
        format!("{e}\nserver log:\n{}", tail.lines().rev().take(20).collect::<Vec<_>>().join("\n"))
    })?;
    if crate::poll_blocking(Duration::from_secs(30), || port_open(port).then_some(())).is_none() {
        return Err(format!("the throwaway cluster did not open port {port}; see {}", log.display()));
    }
    Ok(url)
}

/// Where the cluster lives: `target/waymark-pg`, or, when the `postgres` user
/// cannot reach that (a checkout under a private home directory), a folder
/// under the system temp directory named after this checkout.
fn cluster_root(as_root: bool) -> Result<PathBuf, String> {
    runtime_root("waymark-pg", as_root)
}

/// A folder `name` for server files that the `postgres` user can write when
/// we are root: `target/<name>`, else `<temp>/<name>-<hash of this checkout>`.
pub fn runtime_root(name: &str, as_root: bool) -> Result<PathBuf, String> {
    let preferred = target_dir().join(name);
    let fallback = std::env::temp_dir().join(format!("{name}-{:x}", path_hash(&target_dir())));
    for root in [preferred, fallback] {
        fs::create_dir_all(&root).map_err(|e| format!("creating {}: {e}", root.display()))?;
        if !as_root {
            return Ok(root);
        }
        run(Command::new("chown").arg("postgres:postgres").arg(&root))?;
        // What is inside too (a folder left by an earlier run as root), on a
        // best-effort basis: another test's sweep may remove a folder under
        // it while `chown -R` walks, and that must not fail this one.
        let _ = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&root).output();
        let reachable = Command::new("runuser")
            .args(["-u", "postgres", "--", "test", "-w"])
            .arg(&root)
            .status()
            .is_ok_and(|s| s.success());
        if reachable {
            return Ok(root);
        }
    }
    Err("the postgres user can reach neither target/waymark-pg nor the temp directory".to_owned())
}

fn path_hash(path: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    h.finish()
}

/// Creates a cluster's data directory: superuser `postgres`, trust auth.
pub fn initdb(bin: &Path, data: &Path, as_root: bool) -> Result<(), String> {
    let mut cmd = pg_command(&bin.join("initdb"), as_root);
    cmd.args(["-D"]).arg(data).args(["-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-sync"]);
    run(&mut cmd)
}

/// The file a test-owned server folder names its owning test process in.
pub const OWNER_FILE: &str = "owner.pid";

/// Whether a test-owned server folder has lost its owner: the process named
/// in its owner file is gone, or (a start killed half-way) it has no owner
/// file and is over an hour old.
pub fn is_orphaned(entry: &fs::DirEntry) -> bool {
    match fs::read_to_string(entry.path().join(OWNER_FILE)) {
        Ok(pid) => pid.trim().parse().is_ok_and(|pid| !process_alive(pid)),
        Err(_) => entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| std::time::SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age > Duration::from_secs(3600)),
    }
}

/// Whether a process with this id is alive.
pub fn process_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The directory of the newest installed PostgreSQL server binaries.
pub fn pg_bindir() -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var("WAYMARK_PG_BINDIR") {
        return Ok(PathBuf::from(dir));
    }
    let mut found: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| {
            format!("no PostgreSQL server binaries under /usr/lib/postgresql ({e}); install postgresql")
        })?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_string_lossy().parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).ok_or_else(|| "no initdb under /usr/lib/postgresql/*/bin".to_owned())
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0\n")).unwrap_or(false)
}

/// A command for a server binary, run as `postgres` when we are root.
pub fn pg_command(program: &Path, as_root: bool) -> Command {
    if as_root {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

/// Runs `cmd`, failing with its output when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("running {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
pub fn port_open(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(300)).is_ok()
}
