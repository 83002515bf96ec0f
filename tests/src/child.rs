//! Worker processes of the tests' own binaries (`src/bin/`), started and
//! waited on until they say they are ready.

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// Starts `program` with `args`, its stdout piped, killed when dropped, and
/// waits for its first line, `ready`; answers the child and the rest of its
/// stdout.
pub async fn start_ready(program: &str, args: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new(program)
        .args(args)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start the worker process {program}: {e}"));
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert_eq!(
        lines.next_line().await.expect("read").as_deref(),
        Some("ready"),
        "{program} says it is ready"
    );
    (child, lines)
}

/// The `N` arguments a worker process was started with; any other count
/// prints `usage` and exits with code 2.
pub fn args<const N: usize>(usage: &str) -> [String; N] {
    let args: Vec<String> = std::env::args().skip(1).collect();
    args.try_into().unwrap_or_else(|_| {
        eprintln!("usage: {usage}");
        std::process::exit(2)
    })
}
