//! `cargo xtask test`: ensure the tools and a PostgreSQL, then run every test.
//!
//! The suite runs with `--no-fail-fast`, so one failing binary does not hide
//! the others; its output passes through line by line, and what failed is
//! listed again at the end.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use crate::prereqs;

pub fn run(args: &[String]) -> Result<(), String> {
    prereqs::ensure("xtask test")?;
    let url = match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => {
            println!("xtask test: using DATABASE_URL");
            url
        }
        _ => {
            let url = waymark_tests::cluster::ensure_throwaway()?;
            println!("xtask test: using the throwaway cluster at {url}");
            url
        }
    };
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    cmd.arg("test");
    // --workspace would override a -p (cargo runs every package then), and the
    // reruns listed at the end are -p ones.
    if !selects_packages(args) {
        cmd.arg("--workspace");
    }
    cmd.arg("--no-fail-fast").args(args).env("DATABASE_URL", &url).current_dir(crate::workspace_root());
    let mut skipped = None;
    if std::env::var_os("WAYMARK_CONFORMANCE_DIR").is_none() {
        let scenarios = crate::workspace_root().join("../shared/conformance/scenarios");
        if scenarios.is_dir() {
            let dir = scenarios.canonicalize().map_err(|e| format!("{}: {e}", scenarios.display()))?;
            println!("xtask test: conformance scenarios from {}", dir.display());
            cmd.env("WAYMARK_CONFORMANCE_DIR", dir);
        } else {
            let note = |verb: &str| {
                format!(
                    "SKIPPING conformance: {} not found; the conformance scenarios {verb} run, \
                     on either executor or through PgBouncer (set WAYMARK_CONFORMANCE_DIR to run them)",
                    scenarios.display()
                )
            };
            println!("xtask test: {}", note("will not"));
            skipped = Some(note("did not"));
        }
    }
    let (status, failures) = run_and_collect(&mut cmd)?;
    // Said again after the suite's output, where it cannot be missed.
    if let Some(note) = &skipped {
        println!("\nxtask test: {note}");
    }
    if status.success() {
        println!("xtask test: all tests passed");
        return Ok(());
    }
    if failures.failed.is_empty() {
        return Err(format!(
            "cargo test failed ({status}) before naming a failing test; see its output above"
        ));
    }
    let n = failures.failed.len();
    println!("\nxtask test: {n} failure{}:", if n == 1 { "" } else { "s" });
    for failure in &failures.failed {
        println!("  {failure}");
    }
    if !failures.reruns.is_empty() {
        println!("xtask test: to rerun one target, `cargo xtask test <args>` with its args:");
        for rerun in &failures.reruns {
            println!("  {rerun}");
        }
    }
    Err(format!("cargo test failed ({status}): {n} failure{}, listed above", if n == 1 { "" } else { "s" }))
}

/// Whether cargo test's args (before any `--`) name packages.
fn selects_packages(args: &[String]) -> bool {
    args.iter().take_while(|a| *a != "--").any(|a| {
        a == "-p" || a == "--package" || a.starts_with("--package=") || (a.starts_with("-p") && a.len() > 2)
    })
}

/// Runs `cmd` with its stdout and stderr on one pipe (so cargo's `Running`
/// lines and the tests' verdicts arrive in the order they were written),
/// echoing it line by line as it comes, and collects what failed.
fn run_and_collect(cmd: &mut Command) -> Result<(ExitStatus, Failures), String> {
    let (reader, writer) = std::io::pipe().map_err(|e| format!("a pipe for cargo test: {e}"))?;
    let writer2 = writer.try_clone().map_err(|e| format!("a pipe for cargo test: {e}"))?;
    let mut child = cmd
        .stdout(Stdio::from(writer))
        .stderr(Stdio::from(writer2))
        .spawn()
        .map_err(|e| format!("running cargo test: {e}"))?;
    // Drop the command's copies of the write end, so that the reader ends
    // when the child and whatever it started have closed theirs.
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let (tx, rx) = mpsc::channel();
    let echoing = echo(reader, std::io::stdout(), tx);
    let mut failures = Failures::default();
    let status = loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => failures.read(&line),
            Err(RecvTimeoutError::Disconnected) => {
                break child.wait().map_err(|e| format!("waiting for cargo test: {e}"))?;
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Some(status) = child.try_wait().map_err(|e| format!("waiting for cargo test: {e}"))? {
                    break status;
                }
            }
        }
    };
    // A process a test left running may hold the pipe open for ever: once
    // cargo has exited, take what is still coming, and do not wait for the end.
    let drained = std::time::Instant::now();
    while let Ok(line) = rx.recv_timeout(Duration::from_millis(500)) {
        failures.read(&line);
        if drained.elapsed() > Duration::from_secs(5) {
            break;
        }
    }
    failures.finish();
    failures.cross_check();
    if echoing.is_finished() {
        echoing.join().map_err(|_| "echoing cargo test's output panicked".to_owned())?;
    }
    Ok((status, failures))
}

/// Copies `from` to `to` a line at a time, handing each line on to be read.
fn echo(
    from: impl Read + Send + 'static,
    mut to: impl Write + Send + 'static,
    tx: mpsc::Sender<String>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut from = BufReader::new(from);
        let mut line = Vec::new();
        loop {
            line.clear();
            match from.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            // Bytes as they came (test output need not be UTF-8); the reader gets text.
            let _ = to.write_all(&line).and_then(|()| to.flush());
            let _ = tx.send(strip_ansi(&String::from_utf8_lossy(&line)));
        }
    })
}

/// What failed, read from cargo test's output: cargo names each target it
/// runs and each that fails on stderr; libtest names failing tests on stdout,
/// and a harness=false binary (the conformance runner) prints `FAIL <label>: <why>`.
#[derive(Debug, Default)]
struct Failures {
    failed: Vec<String>,
    /// The args of each failed target, from cargo's closing "N targets failed:" block.
    reruns: Vec<String>,
    /// The target running now, from cargo's `Running` or `Doc-tests` line.
    target: String,
    /// Whether it is libtest's: there a `FAIL` line is a failed test's captured output, named already.
    libtest: bool,
    /// Failures named by the target running now.
    named: usize,
    /// A target cargo said failed, with its cause when cargo gives one: listed
    /// only if it named no failure itself (it crashed, or exited non-zero).
    unnamed: Option<(String, Option<String>)>,
    in_closing_block: bool,
}

impl Failures {
    /// Reads one line of the merged output: cargo's lines and libtest's
    /// never look alike, so each is read for both.
    fn read(&mut self, line: &str) {
        let line = line.trim_end();
        self.read_libtest(line);
        self.read_cargo(line);
    }

    fn read_libtest(&mut self, line: &str) {
        if line.starts_with("running ") && (line.ends_with(" test") || line.ends_with(" tests")) {
            self.libtest = true;
        } else if let Some(name) = line.strip_prefix("test ").and_then(|l| l.strip_suffix(" ... FAILED")) {
            self.failed.push(format!("{}: {name}", self.target));
            self.named += 1;
        } else if let Some(what) = line.strip_prefix("FAIL ").filter(|_| !self.libtest) {
            self.failed.push(format!("{}: {what}", self.target));
            self.named += 1;
        }
    }

    fn read_cargo(&mut self, line: &str) {
        let trimmed = line.trim_start();
        if self.in_closing_block {
            if let Some(args) = trimmed.strip_prefix('`').and_then(|l| l.strip_suffix('`')) {
                self.reruns.push(args.to_owned());
                return;
            }
            self.in_closing_block = false;
        }
        // Only cargo's own line: a test's output may start with "Running " too.
        if let Some(rest) =
            trimmed.strip_prefix("Running ").filter(|r| r.ends_with(')') && r.contains("deps/"))
        {
            self.start(target_name(rest));
        } else if let Some(krate) = trimmed.strip_prefix("Doc-tests ") {
            self.start(format!("{krate} doc-tests"));
        } else if trimmed.starts_with("error: test failed, to rerun pass")
            || trimmed.starts_with("error: doctest failed, to rerun pass")
        {
            if self.named == 0 {
                self.unnamed = Some((self.target.clone(), None));
            }
        } else if let Some(cause) = trimmed.strip_prefix("process didn't exit successfully: ") {
            if let Some((_, why)) = &mut self.unnamed {
                // "`/path/to/binary` (signal: 6, SIGABRT: process abort signal)"
                *why = cause.rsplit_once("` (").map(|(_, c)| c.trim_end_matches(')').to_owned());
            }
        } else if trimmed.starts_with("error: ")
            && trimmed.ends_with(" failed:")
            && trimmed.contains(" target")
        {
            self.finish();
            self.in_closing_block = true;
        }
    }

    /// A new target starts: the last one's unnamed failure, if any, is listed.
    fn start(&mut self, target: String) {
        self.finish();
        self.target = target;
        self.libtest = false;
        self.named = 0;
    }

    /// Each target cargo's closing block names as failed has a failure
    /// listed under its name, even if its output was not read as one.
    fn cross_check(&mut self) {
        for args in self.reruns.clone() {
            let target = rerun_target(&args);
            if !self.failed.iter().any(|f| f.starts_with(&format!("{target}:"))) {
                self.failed.push(format!("{target}: failed, says cargo; see its output above"));
            }
        }
    }

    fn finish(&mut self) {
        if let Some((target, why)) = self.unnamed.take() {
            let why = why.map(|w| format!(" ({w})")).unwrap_or_default();
            self.failed
                .push(format!("{target}: failed{why} without naming a failing test; see its output above"));
        }
    }
}

/// The target a rerun's args name, as [`target_name`] names it:
/// "-p waymark-tests --test pool_tls" -> "pool_tls"; "-p waymark-store --lib"
/// -> "waymark_store"; "-p waymark-store --doc" -> "waymark_store doc-tests"
/// (cargo names doc-tests by crate, `Doc-tests waymark_store`).
fn rerun_target(args: &str) -> String {
    let words: Vec<&str> = args.split_whitespace().collect();
    let after = |flag: &str| words.windows(2).find(|w| w[0] == flag).map(|w| w[1]);
    let package = after("-p").unwrap_or("");
    if let Some(test) = after("--test").or_else(|| after("--bin")) {
        test.to_owned()
    } else if words.contains(&"--doc") {
        format!("{} doc-tests", package.replace('-', "_"))
    } else {
        package.replace('-', "_")
    }
}

/// "tests/pool_tls.rs (target/debug/deps/pool_tls-1a2b3c)" -> "pool_tls";
/// "unittests src/lib.rs (target/debug/deps/waymark_store-1a2b3c)" -> "waymark_store".
fn target_name(running: &str) -> String {
    let binary = running.rsplit_once('(').map_or(running, |(_, b)| b.trim_end_matches(')'));
    let file = binary.rsplit('/').next().unwrap_or(binary);
    file.rsplit_once('-').map_or(file, |(name, _hash)| name).to_owned()
}

/// `text` without terminal colour codes (CARGO_TERM_COLOR=always puts them in a pipe too).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, ended by a letter.
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(lines: &[&str]) -> Failures {
        let mut f = Failures::default();
        for line in lines {
            f.read(line);
        }
        f.finish();
        f.cross_check();
        f
    }

    #[test]
    fn failures_are_named_under_the_target_that_ran_them() {
        let f = read_all(&[
            "     Running tests/a.rs (target/debug/deps/a-0123)",
            "running 2 tests",
            "test one ... ok",
            "test two ... FAILED",
            "error: test failed, to rerun pass `-p waymark-tests --test a`",
            "     Running tests/b.rs (target/debug/deps/b-4567)",
            "running 1 test",
            "test three ... ok",
            "     Running tests/c.rs (target/debug/deps/c-89ab)",
            "error: test failed, to rerun pass `-p waymark-tests --test c`",
            "process didn't exit successfully: `target/debug/deps/c-89ab` (signal: 6, SIGABRT: process abort signal)",
            "Running a fake step (not cargo's line)",
            "   Doc-tests waymark_store",
            "test crates/store/src/lib.rs - (line 10) ... FAILED",
            "error: doctest failed, to rerun pass `-p waymark-store --doc`",
            "error: 4 targets failed:",
            "    `-p waymark-tests --test a`",
            "    `-p waymark-tests --test c`",
            "    `-p waymark-tests --test d`",
            "    `-p waymark-store --doc`",
        ]);
        assert_eq!(
            f.failed,
            [
                "a: two",
                "c: failed (signal: 6, SIGABRT: process abort signal) without naming a failing test; see its output above",
                "waymark_store doc-tests: crates/store/src/lib.rs - (line 10)",
                "d: failed, says cargo; see its output above",
            ]
        );
        assert_eq!(f.reruns.len(), 4);
    }

    #[test]
    fn rerun_args_name_their_target() {
        assert_eq!(rerun_target("-p waymark-tests --test pool_tls"), "pool_tls");
        assert_eq!(rerun_target("-p waymark-store --lib"), "waymark_store");
        assert_eq!(rerun_target("-p waymark-store --doc"), "waymark_store doc-tests");
    }
}
