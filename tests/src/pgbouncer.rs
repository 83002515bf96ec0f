//! A PgBouncer in front of a PostgreSQL server, owned by one test.
//!
//! The `pgbouncer` binary comes from the system (`apt-get install -y
//! pgbouncer`); it is looked up on `PATH`, then at `/usr/sbin/pgbouncer`
//! (`WAYMARK_PGBOUNCER` overrides). It runs in the foreground as a child
//! process of the test, killed when the [`PgBouncer`] is dropped. PgBouncer
//! refuses to run as root, so as root it runs as the `postgres` user.
//!
//! Clients authenticate with `auth_type = trust`, as the users of the auth
//! file: `postgres` by default, more with [`PgBouncerBuilder::user`].
//! PgBouncer logs in to the server with the same user and the password given
//! there. Every database name is forwarded to the server (`* = host=… port=…`);
//! the admin console is the database `pgbouncer`, for `postgres`.
//!
//! The API is synchronous: starting waits (briefly) for the port to accept.
//!
//! ```no_run
//! use waymark_tests::pgbouncer::{host_and_port, PgBouncer};
//!
//! let (host, port) = host_and_port(&waymark_tests::cluster::server_url());
//! let bouncer = PgBouncer::start(&host, port, "transaction");
//! let url = bouncer.url("postgres");
//! # let _ = url;
//! ```

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::Duration;

use rand::Rng;

use crate::cluster::{is_orphaned, is_root, port_open, run, runtime_root, OWNER_FILE};
use crate::private_cluster::free_port;

/// Name of the folder (under `target/`) that holds each PgBouncer's files.
const ROOT_NAME: &str = "waymark-pgbouncer";

/// The (first) host and port of a `postgres://` URL or key=value connection
/// string, for [`PgBouncer::start`]: a host name, or a Unix socket directory,
/// which PgBouncer takes as `host=` too. Panics if it names no host.
pub fn host_and_port(url: &str) -> (String, u16) {
    let config = tokio_postgres::Config::from_str(url).unwrap_or_else(|e| panic!("parsing {url}: {e}"));
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(dir)) => dir.display().to_string(),
        None => panic!("{url} names no host"),
    };
    (host, config.get_ports().first().copied().unwrap_or(5432))
}

/// Options for a [`PgBouncer`]; [`PgBouncerBuilder::start`] starts it.
#[derive(Debug, Clone)]
pub struct PgBouncerBuilder {
    default_pool_size: u32,
    max_client_conn: u32,
    users: Vec<(String, String)>,
    settings: Vec<(String, String)>,
}

impl Default for PgBouncerBuilder {
    fn default() -> Self {
        PgBouncerBuilder {
            default_pool_size: 10,
            max_client_conn: 200,
            users: vec![("postgres".into(), String::new())],
            settings: Vec::new(),
        }
    }
}

impl PgBouncerBuilder {
    /// Server connections per user and database (default 10). A pool of 1
    /// makes transaction pooling observable: every client shares one backend.
    pub fn default_pool_size(mut self, n: u32) -> Self {
        self.default_pool_size = n;
        self
    }

    /// Client connections PgBouncer accepts (default 200).
    pub fn max_client_conn(mut self, n: u32) -> Self {
        self.max_client_conn = n;
        self
    }

    /// Lets `user` connect too; PgBouncer logs in to the server with
    /// `password` (empty for none).
    pub fn user(mut self, user: &str, password: &str) -> Self {
        self.users.retain(|(u, _)| u != user);
        self.users.push((user.to_owned(), password.to_owned()));
        self
    }

    /// An extra line `name = value` in the `[pgbouncer]` section.
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Starts PgBouncer in front of `upstream_host:upstream_port` with
    /// `pool_mode` (`session`, `transaction` or `statement`). Panics with the
    /// reason (and PgBouncer's output) when it cannot.
    pub fn start(self, upstream_host: &str, upstream_port: u16, pool_mode: &str) -> PgBouncer {
        assert!(
            matches!(pool_mode, "session" | "transaction" | "statement"),
            "pool_mode must be session, transaction or statement, not {pool_mode:?}"
        );
        PgBouncer::create(upstream_host, upstream_port, pool_mode, self)
            .unwrap_or_else(|e| panic!("pgbouncer: {e}"))
    }
}

/// A PgBouncer process owned by one test; dropping it kills the process and
/// removes its folder.
#[derive(Debug)]
pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl PgBouncer {
    /// Options for a PgBouncer; see [`PgBouncerBuilder`].
    pub fn builder() -> PgBouncerBuilder {
        PgBouncerBuilder::default()
    }

    /// Starts PgBouncer with the default options; see
    /// [`PgBouncerBuilder::start`].
    pub fn start(upstream_host: &str, upstream_port: u16, pool_mode: &str) -> PgBouncer {
        Self::builder().start(upstream_host, upstream_port, pool_mode)
    }

    /// URL of `database` through PgBouncer, as `postgres`. The database
    /// `pgbouncer` is the admin console (simple query protocol only).
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The port PgBouncer listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The PgBouncer process's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// PgBouncer's output (its log) so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    fn create(
        upstream_host: &str,
        upstream_port: u16,
        pool_mode: &str,
        options: PgBouncerBuilder,
    ) -> Result<PgBouncer, String> {
        let binary = find_binary()?;
        let as_root = is_root();
        let root = runtime_root(ROOT_NAME, as_root)?;
        sweep_orphans(&root);
        let suffix: u64 = rand::thread_rng().gen();
        let dir = root.join(format!("{suffix:016x}"));
        fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let result = Self::spawn(&binary, &dir, upstream_host, upstream_port, pool_mode, &options, as_root);
        if result.is_err() {
            let _ = fs::remove_dir_all(&dir);
        }
        result
    }

    fn spawn(
        binary: &Path,
        dir: &Path,
        upstream_host: &str,
        upstream_port: u16,
        pool_mode: &str,
        options: &PgBouncerBuilder,
        as_root: bool,
    ) -> Result<PgBouncer, String> {
        fs::write(dir.join(OWNER_FILE), std::process::id().to_string())
            .map_err(|e| format!("writing the owner file: {e}"))?;
        let auth_file = dir.join("userlist.txt");
        let users: String = options
            .users
            .iter()
            .map(|(u, p)| format!("\"{}\" \"{}\"\n", u.replace('"', "\"\""), p.replace('"', "\"\"")))
            .collect();
        fs::write(&auth_file, users).map_err(|e| format!("writing {}: {e}", auth_file.display()))?;
        let ids = if as_root { Some(postgres_ids()?) } else { None };

        // The port was free a moment ago; another process may take it before
        // PgBouncer binds it, so try a few.
        let mut last_error = String::new();
        for _ in 0..3 {
            let port = free_port()?;
            let ini = dir.join("pgbouncer.ini");
            let mut text = format!(
                "[databases]\n\
                 * = host={upstream_host} port={upstream_port}\n\
                 \n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {auth}\n\
                 admin_users = postgres\n\
                 stats_users = postgres\n\
                 pool_mode = {pool_mode}\n\
                 max_client_conn = {max_client}\n\
                 default_pool_size = {pool}\n\
                 min_pool_size = 0\n\
                 reserve_pool_size = 0\n\
                 ignore_startup_parameters = extra_float_digits,options,application_name\n",
                auth = auth_file.display(),
                max_client = options.max_client_conn,
                pool = options.default_pool_size,
            );
            for (name, value) in &options.settings {
                text.push_str(&format!("{name} = {value}\n"));
            }
            fs::write(&ini, text).map_err(|e| format!("writing {}: {e}", ini.display()))?;

            let log_path = dir.join("pgbouncer.log");
            let log = File::create(&log_path).map_err(|e| format!("creating {}: {e}", log_path.display()))?;
            let log2 = log.try_clone().map_err(|e| format!("log file: {e}"))?;
            let mut cmd = Command::new(binary);
            cmd.arg(&ini).stdin(Stdio::null()).stdout(log).stderr(log2);
            if let Some((uid, gid)) = ids {
                // Not through runuser: the child must be PgBouncer itself, so
                // that killing it on drop leaves nothing behind.
                use std::os::unix::process::CommandExt as _;
                cmd.uid(uid).gid(gid);
            }
            let mut child = cmd.spawn().map_err(|e| format!("running {}: {e}", binary.display()))?;
            fs::write(dir.join(CHILD_FILE), child.id().to_string())
                .map_err(|e| format!("writing the pid file: {e}"))?;

            // Up (the port open) or gone (exited, perhaps the port was taken).
            let up = crate::poll_blocking(Duration::from_secs(15), || {
                if let Ok(Some(status)) = child.try_wait() {
                    return Some(Err(status));
                }
                port_open(port).then_some(Ok(()))
            });
            match up {
                Some(Ok(())) => return Ok(PgBouncer { child, dir: dir.to_owned(), port }),
                Some(Err(status)) => {
                    last_error = format!(
                        "{} exited ({status}):\n{}",
                        binary.display(),
                        fs::read_to_string(&log_path).unwrap_or_default()
                    );
                }
                None => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "did not open port {port} in 15 s:\n{}",
                        fs::read_to_string(&log_path).unwrap_or_default()
                    ));
                }
            }
        }
        Err(last_error)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The file in a PgBouncer's folder that holds PgBouncer's own process id.
const CHILD_FILE: &str = "pgbouncer.pid";

/// The `pgbouncer` binary: `WAYMARK_PGBOUNCER`, else on `PATH`, else
/// `/usr/sbin/pgbouncer` (where Debian puts it, often off a user's `PATH`).
/// `cargo xtask setup` looks with this too.
pub fn find_binary() -> Result<PathBuf, String> {
    if let Ok(path) = std::env::var("WAYMARK_PGBOUNCER") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("WAYMARK_PGBOUNCER={} is not a file", path.display()))
        };
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).map(|p| p.join("pgbouncer")).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path.into_iter().chain([PathBuf::from("/usr/sbin/pgbouncer")]).find(|p| p.is_file()).ok_or_else(|| {
        "no pgbouncer binary (looked on PATH and at /usr/sbin/pgbouncer); install it: \
             apt-get install -y pgbouncer (cargo xtask setup does)"
            .to_owned()
    })
}

/// The `postgres` user's uid and gid.
fn postgres_ids() -> Result<(u32, u32), String> {
    let id = |flag: &str| -> Result<u32, String> {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .map_err(|e| format!("running id {flag} postgres: {e}"))?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| format!("no postgres user: {}", String::from_utf8_lossy(&out.stderr)))
    };
    Ok((id("-u")?, id("-g")?))
}

/// Kills PgBouncers whose owning process is gone and removes their folders,
/// and folders left without an owner file for over an hour.
fn sweep_orphans(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let dir = entry.path();
        if !dir.is_dir() {
            continue;
        }
        if !is_orphaned(&entry) {
            continue;
        }
        if let Some(pid) =
            fs::read_to_string(dir.join(CHILD_FILE)).ok().and_then(|p| p.trim().parse::<u32>().ok())
        {
            // Only if that process still is a pgbouncer (its id may be reused).
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "pgbouncer" {
                let _ = run(Command::new("kill").args(["-KILL", &pid.to_string()]));
            }
        }
        let _ = fs::remove_dir_all(&dir);
    }
}
