//! A PostgreSQL cluster owned by one test, for fault tests that stop, restart
//! or exhaust a server — which must never be done to the shared cluster of
//! [`crate::cluster`].
//!
//! The API is synchronous: starting and stopping run `pg_ctl` and wait for it
//! (a fraction of a second with the cached template). Call it from a
//! `multi_thread` tokio test, or from `spawn_blocking`, when a blocked worker
//! thread matters.
//!
//! `initdb` runs once per checkout and PostgreSQL version: its data directory
//! is kept as a template under `target/waymark-private` and each cluster
//! starts from a copy of it, in a folder of its own
//! (`target/waymark-private/<name>-<random>`, or under the temp directory when
//! the `postgres` user cannot reach `target/`). As root, the server binaries
//! run as the `postgres` user. Every cluster records the process that owns
//! it; a later start stops and removes clusters whose owner died without
//! dropping them (a test binary killed by a timeout, say).
//!
//! ```no_run
//! use waymark_tests::private_cluster::PrivateCluster;
//!
//! let pg = PrivateCluster::builder().max_connections(8).setting("statement_timeout", "5s").start("faults");
//! let url = pg.url("postgres");
//! pg.stop(); // connections now fail
//! pg.start_again(); // same data, same port
//! drop(pg); // stopped, folder removed
//! # let _ = url;
//! ```

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rand::Rng;

use crate::cluster::{
    initdb, is_orphaned, is_root, pg_bindir, pg_command, port_open, run, runtime_root, OWNER_FILE,
};

/// Name of the folder (under `target/`) that holds the template and the
/// private clusters.
const ROOT_NAME: &str = "waymark-private";

/// Longest socket directory for which a Unix socket is still made: the socket
/// path (`<dir>/.s.PGSQL.<port>`) must fit in 107 bytes.
const MAX_SOCKET_DIR: usize = 90;

/// Options for a [`PrivateCluster`]; [`PrivateClusterBuilder::start`] starts it.
#[derive(Debug, Clone)]
pub struct PrivateClusterBuilder {
    max_connections: u32,
    settings: Vec<(String, String)>,
}

impl Default for PrivateClusterBuilder {
    fn default() -> Self {
        PrivateClusterBuilder { max_connections: 50, settings: Vec::new() }
    }
}

impl PrivateClusterBuilder {
    /// `max_connections` of the server (default 50). PostgreSQL needs it above
    /// `superuser_reserved_connections` (3), so at least 4. The tests connect
    /// as the superuser `postgres`, who may use the reserved slots too: the
    /// connection after `max_connections` is refused with SQLSTATE 53300.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// An extra server setting, as with `postgres -c name=value`. Written to
    /// `postgresql.conf` after the defaults, so it overrides them (`fsync`,
    /// say), and kept across [`PrivateCluster::start_again`].
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Creates and starts the cluster. `name` (letters, digits, `-` and `_`
    /// kept, at most 32 of them) begins its folder's name. Panics with the
    /// reason, and the end of the server log, when it cannot.
    pub fn start(self, name: &str) -> PrivateCluster {
        PrivateCluster::create(name, self).unwrap_or_else(|e| panic!("private cluster {name:?}: {e}"))
    }
}

/// A running (or deliberately stopped) PostgreSQL cluster owned by one test.
/// Dropping it stops the server and removes its folder.
#[derive(Debug)]
pub struct PrivateCluster {
    dir: PathBuf,
    data: PathBuf,
    log: PathBuf,
    port: u16,
    bin: PathBuf,
    as_root: bool,
}

impl PrivateCluster {
    /// Options for a cluster; see [`PrivateClusterBuilder`].
    pub fn builder() -> PrivateClusterBuilder {
        PrivateClusterBuilder::default()
    }

    /// Creates and starts a cluster with the default options.
    pub fn start(name: &str) -> PrivateCluster {
        Self::builder().start(name)
    }

    /// URL of `database` on this cluster, as the superuser `postgres`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The TCP port, the same for the cluster's whole life.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's folder (data directory, server log, socket).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data directory (relative server paths such as `ssl_cert_file`
    /// resolve against it).
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// Writes `contents` to `name` in the data directory, readable only by
    /// the server's user (as PostgreSQL wants of a private key).
    pub fn write_private_file(&self, name: &str, contents: &[u8]) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.data.join(name);
        fs::write(&path, contents).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod 600");
        if self.as_root {
            run(Command::new("chown").arg("postgres:postgres").arg(&path)).expect("chown postgres");
        }
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops the server at once, like a crash (`pg_ctl stop -m immediate`):
    /// every connection breaks and the next start runs crash recovery. Panics
    /// if `pg_ctl` fails, e.g. when the server is not running.
    pub fn stop(&self) {
        self.pg_ctl_stop("immediate").unwrap_or_else(|e| panic!("stopping {}: {e}", self.dir.display()));
    }

    /// Stops the server cleanly (`pg_ctl stop -m fast`): sessions are ended,
    /// a shutdown checkpoint is written.
    pub fn stop_fast(&self) {
        self.pg_ctl_stop("fast").unwrap_or_else(|e| panic!("stopping {}: {e}", self.dir.display()));
    }

    /// Starts the stopped server again, on the same data directory and port.
    pub fn start_again(&self) {
        self.pg_ctl_start().unwrap_or_else(|e| panic!("starting {} again: {e}", self.dir.display()));
    }

    /// Stops the server at once (as [`stop`](Self::stop)) if it runs, then
    /// starts it again.
    pub fn restart(&self) {
        if self.is_running() {
            self.stop();
        }
        self.start_again();
    }

    /// Whether the server runs (`pg_ctl status`).
    pub fn is_running(&self) -> bool {
        pg_command(&self.bin.join("pg_ctl"), self.as_root)
            .args(["status", "-D"])
            .arg(&self.data)
            .output()
            .is_ok_and(|o| o.status.success())
    }

    fn create(name: &str, options: PrivateClusterBuilder) -> Result<PrivateCluster, String> {
        let as_root = is_root();
        let root = runtime_root(ROOT_NAME, as_root)?;
        let bin = pg_bindir()?;
        sweep_orphans(&root, &bin, as_root);
        let template = ensure_template(&root, &bin, as_root)?;

        let name: String =
            name.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_').take(32).collect();
        let suffix: u64 = rand::thread_rng().gen();
        let dir = root.join(format!("{name}-{suffix:016x}"));
        fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        fs::write(dir.join(OWNER_FILE), std::process::id().to_string())
            .map_err(|e| format!("writing the owner file: {e}"))?;
        let data = dir.join("data");
        // Pre-built so that dropping on an error below still cleans up.
        let mut cluster = PrivateCluster { log: dir.join("server.log"), dir, data, port: 0, bin, as_root };

        // `cp -a` keeps the modes PostgreSQL insists on (0700) and, as root,
        // the `postgres` owner of the template.
        run(Command::new("cp").arg("-a").arg(&template).arg(&cluster.data))?;
        if as_root {
            run(Command::new("chown").args(["-R", "postgres:postgres"]).arg(&cluster.dir))?;
        }
        let socket_dir = if cluster.dir.as_os_str().len() <= MAX_SOCKET_DIR {
            cluster.dir.display().to_string()
        } else {
            String::new() // TCP only
        };

        // The port is free when we look, but another process may take it
        // before the server binds it: try a few.
        let mut last_error = String::new();
        for _ in 0..3 {
            cluster.port = free_port()?;
            write_settings(&cluster.data, cluster.port, &socket_dir, &options)?;
            match cluster.pg_ctl_start() {
                Ok(()) => return Ok(cluster),
                Err(e) => last_error = e,
            }
            if cluster.is_running() {
                let _ = cluster.pg_ctl_stop("immediate");
            }
        }
        Err(last_error)
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        let mut start = pg_command(&self.bin.join("pg_ctl"), self.as_root);
        start.args(["start", "-w", "-t", "60", "-D"]).arg(&self.data).arg("-l").arg(&self.log);
        run(&mut start).map_err(|e| {
            let log = self.log();
            format!("{e}\nserver log (end):\n{}", log.lines().rev().take(20).collect::<Vec<_>>().join("\n"))
        })?;
        if crate::poll_blocking(Duration::from_secs(30), || port_open(self.port).then_some(())).is_none() {
            return Err(format!("the server did not open port {}; see {}", self.port, self.log.display()));
        }
        Ok(())
    }

    fn pg_ctl_stop(&self, mode: &str) -> Result<(), String> {
        let mut stop = pg_command(&self.bin.join("pg_ctl"), self.as_root);
        stop.args(["stop", "-w", "-t", "60", "-m", mode, "-D"]).arg(&self.data);
        run(&mut stop)
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        if self.data.join("postmaster.pid").exists() {
            let _ = self.pg_ctl_stop("immediate");
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The initialised data directory the clusters are copied from, made once
/// (under a lock, so concurrent test binaries wait for the first) per
/// PostgreSQL binary directory.
fn ensure_template(root: &Path, bin: &Path, as_root: bool) -> Result<PathBuf, String> {
    let key = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        bin.hash(&mut h);
        h.finish()
    };
    let template = root.join(format!("template-{key:016x}"));
    if template.join("PG_VERSION").exists() {
        return Ok(template);
    }
    let lock = File::create(root.join("template.lock")).map_err(|e| format!("template lock file: {e}"))?;
    lock.lock().map_err(|e| format!("locking the template: {e}"))?;
    if template.join("PG_VERSION").exists() {
        return Ok(template);
    }
    // initdb into a side folder, renamed when complete: a half-made template
    // (initdb killed) is never taken for a whole one.
    let partial = root.join(format!("template-{key:016x}.partial"));
    let _ = fs::remove_dir_all(&partial);
    initdb(bin, &partial, as_root)?;
    fs::rename(&partial, &template).map_err(|e| format!("renaming the template: {e}"))?;
    Ok(template)
}

/// Appends the cluster's settings to its `postgresql.conf` (the last setting
/// of a name wins, so a retry's port replaces the previous one).
fn write_settings(
    data: &Path,
    port: u16,
    socket_dir: &str,
    options: &PrivateClusterBuilder,
) -> Result<(), String> {
    let mut settings: Vec<(String, String)> = vec![
        ("port".into(), port.to_string()),
        ("listen_addresses".into(), "127.0.0.1".into()),
        ("unix_socket_directories".into(), socket_dir.into()),
        ("max_connections".into(), options.max_connections.to_string()),
        // Off: data reaches the OS but is never flushed, which survives any
        // server stop or crash, only not a crash of the machine. Commits stay
        // synchronous: a commit acknowledged before `stop()` must survive it.
        ("fsync".into(), "off".into()),
        ("full_page_writes".into(), "off".into()),
        ("shared_buffers".into(), "32MB".into()),
    ];
    settings.extend(options.settings.iter().cloned());
    let mut text = String::from("\n# waymark PrivateCluster\n");
    for (name, value) in settings {
        text.push_str(&format!("{name} = '{}'\n", value.replace('\'', "''")));
    }
    let path = data.join("postgresql.conf");
    let mut file = OpenOptions::new()
        .append(true)
        .open(&path)
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    file.write_all(text.as_bytes()).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("finding a free port: {e}"))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| format!("finding a free port: {e}"))
}

/// Stops and removes clusters whose owning process is gone, and folders
/// left without an owner file (a start killed half-way) for over an hour.
fn sweep_orphans(root: &Path, bin: &Path, as_root: bool) {
    let Ok(entries) = fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let dir = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !dir.is_dir() || name.starts_with("template-") {
            continue;
        }
        if !is_orphaned(&entry) {
            continue;
        }
        let data = dir.join("data");
        if data.join("postmaster.pid").exists() {
            let _ = pg_command(&bin.join("pg_ctl"), as_root)
                .args(["stop", "-w", "-t", "30", "-m", "immediate", "-D"])
                .arg(&data)
                .output();
        }
        let _ = fs::remove_dir_all(&dir);
    }
}
