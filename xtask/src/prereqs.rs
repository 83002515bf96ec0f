//! What the test suite needs beside a Rust toolchain, found or installed.
//!
//! The suite starts PostgreSQL clusters of its own (the throwaway one, and
//! private ones for the fault tests even when `DATABASE_URL` names a server),
//! PgBouncers in front of them, a TLS CA made with `openssl`, and a venv with
//! the cairnq SDK; as root it runs the server binaries and PgBouncer as the
//! `postgres` user, through `runuser`; the CLI's `watch` runs under `tmux`, the dashboard in headless Chromium
//! through ChromeDriver, and a real Prometheus scrapes the metrics of the
//! telemetry test. [`ensure`] looks for each the way the
//! harness will. As root with `apt-get` it installs what is missing; otherwise
//! it fails with one message naming everything missing and the command that
//! installs it, before any test is built. `WAYMARK_PREREQS_NO_INSTALL=1` makes
//! it report instead of installing. `.ci/run` calls it through
//! `cargo xtask setup`, so the list lives here only.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use waymark_tests::cluster::{is_root, pg_bindir};

/// One requirement: how to find it, and which Debian packages provide it.
struct Need {
    what: &'static str,
    packages: &'static [&'static str],
    /// The variable that points the harness elsewhere: when set, apt-get cannot help.
    var: Option<&'static str>,
    /// Where it is ("at /usr/bin/openssl"), or why it was not found.
    find: fn() -> Result<String, String>,
    /// Needed only when the tests run as root.
    root_only: bool,
}

impl Need {
    /// Whether its variable is set, so that the harness looks nowhere else.
    fn overridden(&self) -> bool {
        self.var.is_some_and(|v| std::env::var_os(v).is_some())
    }
}

const NEEDS: &[Need] = &[
    Need {
        what: "PostgreSQL server binaries",
        packages: &["postgresql"],
        var: Some("WAYMARK_PG_BINDIR"),
        find: find_pg_bindir,
        root_only: false,
    },
    Need {
        what: "the postgres user",
        packages: &["postgresql"],
        var: None,
        find: find_postgres_user,
        root_only: true,
    },
    Need {
        what: "pgbouncer",
        packages: &["pgbouncer"],
        var: Some("WAYMARK_PGBOUNCER"),
        find: find_pgbouncer,
        root_only: false,
    },
    Need {
        what: "openssl",
        packages: &["openssl"],
        var: None,
        find: || found_on_path("openssl"),
        root_only: false,
    },
    Need {
        what: "python3 with venv",
        packages: &["python3", "python3-venv", "python3-pip"],
        var: Some("WAYMARK_PYTHON"),
        find: find_python,
        root_only: false,
    },
    Need {
        what: "tmux (the terminal the CLI's watch is tested in)",
        packages: &["tmux"],
        var: None,
        find: || found_on_path("tmux"),
        root_only: false,
    },
    Need {
        what: "Chromium and ChromeDriver (the dashboard's browser test)",
        packages: &["chromium", "chromium-driver"],
        var: None,
        find: || {
            found_on_path("chromium").and_then(|c| found_on_path("chromedriver").map(|d| format!("{c}, {d}")))
        },
        root_only: false,
    },
    Need {
        what: "Prometheus (scrapes the metrics exporter in the telemetry test)",
        packages: &["prometheus"],
        var: Some("WAYMARK_PROMETHEUS"),
        find: find_prometheus,
        root_only: false,
    },
    Need {
        what: "runuser",
        packages: &["util-linux"],
        var: None,
        find: || found_on_path("runuser"),
        root_only: true,
    },
];

/// Finds everything the tests need, installing what is missing when it can.
/// `label` starts each line printed ("xtask test").
pub fn ensure(label: &str) -> Result<(), String> {
    let root = is_root();
    let needs: Vec<&Need> = NEEDS.iter().filter(|n| root || !n.root_only).collect();
    let missing = check(label, &needs);
    if missing.is_empty() {
        return Ok(());
    }
    let apt_get = on_path("apt-get");
    let no_install =
        std::env::var_os("WAYMARK_PREREQS_NO_INSTALL").is_some_and(|v| !v.is_empty() && v != "0");
    // A variable pointing at nothing is the user's choice, and no package fixes it.
    let overridden = missing.iter().any(|(need, _)| need.overridden());
    if !root || apt_get.is_none() || no_install || overridden {
        return Err(report(&missing, root, apt_get.is_some()));
    }
    let packages = packages(&missing);
    println!("{label}: installing {} with apt-get", packages.join(" "));
    apt(&["update", "-qq"])?;
    let mut install = vec!["install", "-y", "-qq"];
    install.extend(packages.iter().copied());
    apt(&install)?;
    let installed: Vec<&Need> = missing.iter().map(|(need, _)| *need).collect();
    let still = check(label, &installed);
    if still.is_empty() {
        Ok(())
    } else {
        Err(format!("after apt-get install -y {}, still missing:\n{}", packages.join(" "), list(&still)))
    }
}

/// Looks for each need, printing where each found one is; hands back the rest
/// with why each was not found.
fn check<'a>(label: &str, needs: &[&'a Need]) -> Vec<(&'a Need, String)> {
    let mut missing = Vec::new();
    for need in needs {
        match (need.find)() {
            Ok(at) => println!("{label}: {} {at}", need.what),
            Err(why) => missing.push((*need, why)),
        }
    }
    missing
}

/// The one message for a machine where we cannot install: what is missing, and how to get it.
fn report(missing: &[(&Need, String)], root: bool, apt_get: bool) -> String {
    let mut message = format!("missing what the tests need:\n{}", list(missing));
    let vars: Vec<&str> =
        missing.iter().filter(|(need, _)| need.overridden()).filter_map(|(need, _)| need.var).collect();
    let installable: Vec<(&Need, String)> = missing
        .iter()
        .filter(|(need, _)| !need.overridden())
        .map(|(need, why)| (*need, why.clone()))
        .collect();
    if !installable.is_empty() {
        let sudo = if root { "" } else { "sudo " };
        message.push_str(&format!(
            "\ninstall with:\n  {sudo}apt-get install -y {}",
            packages(&installable).join(" ")
        ));
        if !apt_get {
            message.push_str(
                "\n(Debian and Ubuntu package names; there is no apt-get here, so use the system's own)",
            );
        }
    }
    if !vars.is_empty() {
        message.push_str(&format!("\nor fix or unset {}", vars.join(", ")));
    }
    message
}

fn list(missing: &[(&Need, String)]) -> String {
    let lines: Vec<String> = missing.iter().map(|(need, why)| format!("  {}: {why}", need.what)).collect();
    lines.join("\n")
}

/// The packages for `missing`, each once, in the order first needed.
fn packages(missing: &[(&Need, String)]) -> Vec<&'static str> {
    let mut packages: Vec<&'static str> = Vec::new();
    for package in missing.iter().flat_map(|(need, _)| need.packages.iter().copied()) {
        if !packages.contains(&package) {
            packages.push(package);
        }
    }
    packages
}

fn apt(args: &[&str]) -> Result<(), String> {
    // apt-get's progress lines would bury the log; its errors go to stderr.
    let status = Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("running apt-get {}: {e}", args.join(" ")))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("apt-get {} failed ({status})", args.join(" ")))
    }
}

/// The harness's own lookup: `WAYMARK_PG_BINDIR`, else the newest `/usr/lib/postgresql/*/bin`.
fn find_pg_bindir() -> Result<String, String> {
    let bin = pg_bindir()?;
    for program in ["initdb", "pg_ctl", "postgres"] {
        if !bin.join(program).is_file() {
            let from =
                if std::env::var_os("WAYMARK_PG_BINDIR").is_some() { " (WAYMARK_PG_BINDIR)" } else { "" };
            return Err(format!("no {program} in {}{from}", bin.display()));
        }
    }
    Ok(format!("at {}", bin.display()))
}

fn find_postgres_user() -> Result<String, String> {
    let out = Command::new("id").args(["-u", "postgres"]).output().map_err(|e| format!("running id: {e}"))?;
    if out.status.success() {
        Ok(format!("is uid {}", String::from_utf8_lossy(&out.stdout).trim()))
    } else {
        Err("no such user (the server binaries and pgbouncer run as postgres when we are root)".to_owned())
    }
}

/// Where the PgBouncer tests will look (tests/src/pgbouncer.rs).
fn find_prometheus() -> Result<String, String> {
    waymark_tests::prometheus::find_binary().map(|p| format!("at {}", p.display()))
}

fn find_pgbouncer() -> Result<String, String> {
    waymark_tests::pgbouncer::find_binary().map(|p| format!("at {}", p.display()))
}

/// The interpreter the venv is made from (`WAYMARK_PYTHON`, else `python3`),
/// able to make a venv with pip in it.
fn find_python() -> Result<String, String> {
    let python = std::env::var("WAYMARK_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let script = "import sys, venv, ensurepip; print(f'at {sys.executable} ({sys.version.split()[0]})')";
    let out = Command::new(&python)
        .args(["-c", script])
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!("{python} cannot import venv and ensurepip"))
    }
}

/// Where the harness will find `name`: on `PATH`, as it runs it by name.
fn found_on_path(name: &str) -> Result<String, String> {
    if let Some(path) = on_path(name) {
        return Ok(format!("at {}", path.display()));
    }
    // sbin is often off a user's PATH, and no package fixes that.
    let elsewhere =
        ["/usr/sbin", "/sbin"].iter().map(|dir| Path::new(dir).join(name)).find(|p| is_executable(p));
    Err(match elsewhere {
        Some(path) => format!("not on PATH, though {} exists (add its directory to PATH)", path.display()),
        None => "not on PATH".to_owned(),
    })
}

/// The first executable file called `name` on `PATH`.
fn on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths).map(|dir| dir.join(name)).find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
