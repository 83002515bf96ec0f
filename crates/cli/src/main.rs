//! `waymark`: the operator's command line for a waymark queue (cairnq
//! protocol v1) on PostgreSQL. Every command runs the store's own
//! operations, so it reads and changes the tables exactly as workers and
//! clients of either SDK do. Human tables by default, `--json` for
//! scripts; the exit codes are listed in `--help`.

mod args;
mod bulk;
mod commands;
mod error;
mod held;
mod held_args;
mod render;
mod shared;
mod watch;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    let json = cli.json;
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("waymark: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(out) => {
            // A closed pipe (`waymark list | head`) is not a failure.
            let _ = std::io::stdout().lock().write_all(out.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            if json {
                let _ = writeln!(std::io::stdout().lock(), "{}", commands::error_doc(&e));
            }
            eprintln!("waymark: {e}");
            e.code()
        }
    }
}
