//! A Python with the cairnq SDK, for the interop tests.
//!
//! [`venv_python`] makes sure a virtualenv at `target/waymark-py` holds
//! `cairnq[postgres]` 0.15, `asyncpg` and OpenTelemetry's Python SDK (for
//! the trace-context test) from PyPI, creating or repairing it
//! when needed, and returns its interpreter. A file lock next to the venv keeps
//! parallel test binaries from installing over each other; once installed the
//! check is one `import` and costs a fraction of a second. There is no skip:
//! a machine without `python3` or without PyPI fails the tests, loudly, saying
//! which step failed. `WAYMARK_PYTHON` names the base interpreter (default
//! `python3`).
//!
//! [`run_script`] runs a script with that interpreter and hands back stdout.

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::cluster::target_dir;

/// What pip installs: the SDK with its Postgres extra, its driver, and
/// OpenTelemetry's SDK (a traced Python client's spans and propagator).
pub const REQUIREMENTS: [&str; 3] = ["cairnq[postgres]==0.15.*", "asyncpg", "opentelemetry-sdk>=1.20,<2"];

/// The cairnq release line the interop tests are written against.
pub const CAIRNQ_SERIES: &str = "0.15.";

/// The venv's directory: `target/waymark-py`.
pub fn venv_dir() -> PathBuf {
    target_dir().join("waymark-py")
}

/// The directory of our Python scripts (`tests/python`).
pub fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python")
}

/// The venv's interpreter, with cairnq and asyncpg importable. Installs them
/// on first use; panics with the failing step's output if that is impossible.
pub fn venv_python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            ensure_venv().unwrap_or_else(|e| panic!("no Python with cairnq for the interop tests: {e}"))
        })
        .clone()
}

fn ensure_venv() -> Result<PathBuf, String> {
    let venv = venv_dir();
    let python = venv.join("bin").join("python");
    if installed(&python).is_ok() {
        return Ok(python);
    }
    let parent = venv.parent().ok_or_else(|| format!("{} has no parent directory", venv.display()))?;
    fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    // Outside the venv, so that a broken venv can be wiped while it is held.
    let lock_path = parent.join("waymark-py.lock");
    let lock = File::create(&lock_path).map_err(|e| format!("creating {}: {e}", lock_path.display()))?;
    lock.lock().map_err(|e| format!("locking {}: {e}", lock_path.display()))?;
    // Another process may have finished the install while we waited.
    let why = match installed(&python) {
        Ok(()) => return Ok(python),
        Err(why) => why,
    };
    if !runs(&python) {
        let base = std::env::var("WAYMARK_PYTHON").unwrap_or_else(|_| "python3".to_owned());
        let mut create = Command::new(&base);
        create.args(["-m", "venv", "--clear"]).arg(&venv);
        check(&mut create, "creating the venv (is python3 with the venv module installed?)")?;
    }
    let mut pip = Command::new(venv.join("bin").join("pip"));
    pip.args(["install", "-q", "--disable-pip-version-check"]).args(REQUIREMENTS);
    check(&mut pip, &format!("pip install {} (the venv was not usable: {why})", REQUIREMENTS.join(" ")))?;
    installed(&python).map_err(|e| format!("after pip install, {e}"))?;
    Ok(python)
}

/// Whether `python` starts at all.
fn runs(python: &Path) -> bool {
    python.exists() && Command::new(python).args(["-c", "pass"]).output().is_ok_and(|o| o.status.success())
}

/// Ok when `python` imports cairnq (of the expected series), asyncpg and
/// OpenTelemetry's SDK.
fn installed(python: &Path) -> Result<(), String> {
    if !python.exists() {
        return Err(format!("{} does not exist", python.display()));
    }
    let probe = "import sys, cairnq, asyncpg, opentelemetry.sdk.trace\nsys.stdout.write(cairnq.__version__)";
    let out = Command::new(python)
        .args(["-c", probe])
        .output()
        .map_err(|e| format!("running {}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "importing cairnq, asyncpg and opentelemetry failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if version.starts_with(CAIRNQ_SERIES) {
        Ok(())
    } else {
        Err(format!("cairnq {version} is installed, the tests need {CAIRNQ_SERIES}x"))
    }
}

fn check(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{what}: running {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{what}: {cmd:?} exited with {}\n{}", out.status, describe(&out)))
    }
}

fn describe(out: &Output) -> String {
    format!(
        "--- stdout ---\n{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout).trim_end(),
        String::from_utf8_lossy(&out.stderr).trim_end()
    )
}

/// Runs `script` with the venv's Python, `args` and the extra `env`, and
/// returns its stdout. Panics, showing stdout and stderr, when the script
/// exits non-zero or outlives `timeout` (it is killed then).
pub fn run_script<A: AsRef<std::ffi::OsStr>>(
    script: &Path,
    args: &[A],
    env: &[(&str, &str)],
    timeout: Duration,
) -> String {
    let python = venv_python();
    let mut cmd = Command::new(&python);
    cmd.arg(script).args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let shown = format!("{} {}", python.display(), script.display());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("starting {shown}: {e}"));
    // Drained on threads, so a chatty script never blocks on a full pipe.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = crate::poll_blocking(timeout, || match child.try_wait() {
        Ok(done) => done,
        Err(e) => panic!("waiting for {shown}: {e}"),
    });
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let out = Output {
        status: status.unwrap_or_default(),
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    match status {
        None => panic!("{shown} {:?} ran past {timeout:?} and was killed\n{}", args_of(&cmd), describe(&out)),
        Some(s) if !s.success() => panic!("{shown} {:?} exited with {s}\n{}", args_of(&cmd), describe(&out)),
        Some(_) => {
            String::from_utf8(out.stdout).unwrap_or_else(|e| panic!("{shown} wrote non-UTF-8 to stdout: {e}"))
        }
    }
}

fn args_of(cmd: &Command) -> Vec<String> {
    cmd.get_args().skip(1).map(|a| a.to_string_lossy().into_owned()).collect()
}

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        buf
    })
}

/// Runs `tests/python/interop.py` against the database at `url` and parses
/// the JSON it prints; panics, with what it printed, when it fails.
pub fn interop(url: &str, args: Vec<String>) -> serde_json::Value {
    let script = scripts_dir().join("interop.py");
    let out = run_script(&script, &args, &[("CAIRNQ_DSN", url)], Duration::from_secs(120));
    serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("interop.py {args:?} printed something that is not JSON ({e}):\n{out}"))
}
