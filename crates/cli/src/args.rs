//! The command line: every command, flag and default, as clap parses it.
//! Values clap cannot check by type (a status, a duration) are checked in
//! `commands.rs` before anything connects.

use clap::{Args, Parser, Subcommand};

/// Exit codes, for `--help` and the README.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  failed (the database could not be reached, an operation failed)
  2  bad usage or input (an unknown command, status or duration); nothing was changed
  3  no such task, or the task is not in a state the command acts on
  4  a bulk retry or a purge found tasks but was not told --yes; nothing was changed";

#[derive(Debug, Parser)]
#[command(
    name = "waymark",
    version,
    about = "Operate a waymark queue (cairnq protocol v1) on PostgreSQL",
    after_help = EXIT_CODES
)]
pub struct Cli {
    /// The database, as a libpq URL (postgres://user@host:port/db).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,

    /// The schema the installation lives in. Defaults to the connection's
    /// search_path.
    #[arg(long, env = "WAYMARK_SCHEMA", global = true, hide_env_values = true)]
    pub schema: Option<String>,

    /// Print JSON (one document, or one line per redraw for `watch`)
    /// instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply pending migrations, or with --status show each one's state.
    Migrate {
        /// Show which migrations are applied; change nothing.
        #[arg(long)]
        status: bool,
    },
    /// Task counts per queue and status.
    Stats {
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
    },
    /// List tasks, newest first.
    List(ListArgs),
    /// Show one task in full.
    Get(Target),
    /// Cancel a task: queued ones at once, running ones at their next
    /// heartbeat.
    Cancel(Target),
    /// Queue failed or canceled tasks again: one, or every match of a filter.
    Retry(RetryArgs),
    /// Delete terminal tasks that finished longer ago than an age. Shows
    /// the count; deletes only with --yes.
    Purge(PurgeArgs),
    /// Live counts per queue and status, redrawn on each change.
    Watch(WatchArgs),
    /// Serve the web dashboard.
    Ui(UiArgs),
    /// Held tasks (waiting for a key's turn, other tasks, or an event):
    /// list, show, release, skip, drop.
    Held {
        #[command(subcommand)]
        command: crate::held_args::HeldCommand,
    },
    /// Emit an event: the tasks held for it go.
    Emit(crate::held_args::EmitArgs),
}

/// One task: by id, or by key.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct Target {
    /// The task id.
    pub id: Option<String>,
    /// The key that names the task.
    #[arg(long)]
    pub key: Option<String>,
}

/// Filters over tasks.
#[derive(Debug, Args, Default)]
pub struct Filters {
    /// Only this status: queued, running, succeeded, failed or canceled.
    #[arg(long)]
    pub status: Option<String>,
    /// Only this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Only this task name.
    #[arg(long)]
    pub name: Option<String>,
    /// Only the tree of this root task.
    #[arg(long)]
    pub root: Option<String>,
    /// Only this correlation id.
    #[arg(long)]
    pub correlation: Option<String>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub filters: Filters,
    /// Tasks per page.
    #[arg(long, default_value_t = 50)]
    pub limit: i64,
    /// Tasks to skip.
    #[arg(long, default_value_t = 0)]
    pub offset: i64,
}

#[derive(Debug, Args)]
pub struct RetryArgs {
    /// The task id.
    #[arg(conflicts_with_all = ["key", "filter"])]
    pub id: Option<String>,
    /// The key that names the task.
    #[arg(long, conflicts_with = "filter")]
    pub key: Option<String>,
    /// Retry every task matching the filters below (status failed unless
    /// --status says canceled). Shows the count; retries only with --yes.
    #[arg(long)]
    pub filter: bool,
    #[command(flatten)]
    pub filters: Filters,
    /// Go ahead with a bulk retry.
    #[arg(long)]
    pub yes: bool,
    /// Start the attempts over (attempt 0).
    #[arg(long)]
    pub reset_attempt: bool,
}

#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Only tasks that finished longer ago than this (90s, 30m, 12h, 7d).
    #[arg(long)]
    pub older_than: String,
    /// Only this terminal status: succeeded, failed or canceled.
    #[arg(long)]
    pub status: Option<String>,
    /// Only this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Only this task name.
    #[arg(long)]
    pub name: Option<String>,
    /// Rows per delete statement.
    #[arg(long, default_value_t = 1000)]
    pub batch: i64,
    /// Go ahead and delete (without it: the count only, exit 4).
    #[arg(long)]
    pub yes: bool,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Only these queues (repeat the flag); defaults to every queue.
    #[arg(long)]
    pub queue: Vec<String>,
    /// Redraw at least this often, signal or not.
    #[arg(long, default_value = "5s")]
    pub every: String,
}

#[derive(Debug, Args)]
pub struct UiArgs {
    /// The address to serve on. Anything but loopback needs --token.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub bind: String,
    /// A token every request must carry (open /?token=... once in the
    /// browser, or send Authorization: Bearer).
    #[arg(long, env = "WAYMARK_UI_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}
