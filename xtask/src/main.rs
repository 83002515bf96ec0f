//! `cargo xtask <command>`: the project's own tasks.
//!
//! - `migrate [--database-url URL] [--schema NAME] [--status]`
//! - `setup` : find or install what the tests need (PostgreSQL, PgBouncer, ...)
//! - `test` : setup, then ensure a PostgreSQL, then run the whole test suite
//! - `tidy` : SQL only in protocol-sql/, crates layered as documented, and
//!   inside each crate short files, no circle of imports, the documented module order
//! - `demo` : find or start PostgreSQL, migrate, submit and process tasks

mod bench;
mod demo;
mod migrate;
mod prereqs;
mod test;
mod tidy;

use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  migrate [--database-url URL] [--schema NAME] [--status]
          apply pending migrations (URL defaults to DATABASE_URL);
          --status lists each migration as applied or pending and changes nothing
  setup   find what the tests need (PostgreSQL server binaries, pgbouncer, openssl,
          python3 with venv, runuser when root); as root with apt-get, install
          what is missing, otherwise name it and the command that installs it
  test [ARGS]
          setup, then ensure a PostgreSQL (DATABASE_URL, else a throwaway cluster
          under target/), then run every test, conformance scenarios and cairnq
          interop included, without stopping at the first failing binary, and
          list the failures at the end; ARGS go to cargo test (-p narrows it
          from the whole workspace)
  tidy    check what a build cannot: SQL only in protocol-sql/ (and tests, and the
          bench baseline), crates layered as docs/architecture.md lists; inside each
          crate no source file over 400 lines, no circle of imports among its
          modules, and the module order docs/architecture.md declares for it
  demo    find or start PostgreSQL, migrate, submit a few thousand tasks and
          process them with visible progress
  bench [SCENARIO] [--peers] [--rounds N]
          all (default): every scenario (enqueue, drain, latency, mixed, sweep,
          otel, limits, spread, backlog; or name one), waymark beside a
          raw-SQL baseline in the same run (built in release mode); --peers
          adds graphile_worker and apalis-postgres to enqueue, drain, latency;
          --rounds N sets the rounds of every scenario and of budget;
          soak [--minutes N] [--tuned]: a steady load for 15 minutes (--tuned:
          more room for autovacuum); server: where
          the server's time per task goes; dashboard: the dashboard's
          queries timed on a table of a million tasks;
          binding: protocol statements bound with query_typed against
          prepared once per connection, side by side;
          budget: the drain at each worker statement budget beside the
          baseline at two and three connections;
          explain: EXPLAIN ANALYZE of the probe, the claim and the batched
          writes on a 100,000-task backlog with stale statistics";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("migrate") => runtime().block_on(migrate::run(&args[1..])),
        Some("setup") if args.len() == 1 => prereqs::ensure("xtask setup"),
        Some("setup") => Err(format!("setup takes no arguments\n\n{USAGE}")),
        Some("test") => test::run(&args[1..]),
        Some("tidy") => tidy::run(&args[1..]),
        Some("demo") => runtime().block_on(demo::run(&args[1..])),
        Some("bench") if cfg!(debug_assertions) => in_release(&args),
        Some("bench") => runtime().block_on(bench::run(&args[1..])),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command {other:?}\n\n{USAGE}")),
        None => Err(USAGE.to_owned()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Measures are taken on an optimised build: re-runs itself with --release.
fn in_release(args: &[String]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status = std::process::Command::new(cargo)
        .args(["run", "--quiet", "--release", "--package", "xtask", "--"])
        .args(args)
        .current_dir(workspace_root())
        .status()
        .map_err(|e| format!("running the release build: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("the release bench failed ({status})"))
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime")
}

/// The workspace root (the parent of `xtask/`).
pub(crate) fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}
