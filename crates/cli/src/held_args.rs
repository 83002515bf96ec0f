//! The arguments of `waymark held ...` and `waymark emit`, as clap parses
//! them (run by `held.rs`).

use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum HeldCommand {
    /// Held-ledger tasks, newest first, with what each waits for.
    List(HeldListArgs),
    /// One task of the held ledger in full.
    Show {
        /// The task id.
        id: String,
    },
    /// Release a held task now, whatever it waits for.
    Release {
        /// The task id.
        id: String,
    },
    /// Skip a held task (or a failed head that holds its key): what waits
    /// on it goes on as if it had succeeded.
    Skip {
        /// The task id.
        id: String,
    },
    /// Drop a held task, with every task held behind it (or let a key go on
    /// past its failed head).
    Drop {
        /// The task id.
        id: String,
    },
}

#[derive(Debug, Args)]
pub struct HeldListArgs {
    /// Only this state: held, released, done, canceled, or all.
    #[arg(long, default_value = "held")]
    pub state: String,
    /// Only this key.
    #[arg(long)]
    pub key: Option<String>,
    /// Only this flow.
    #[arg(long)]
    pub flow: Option<String>,
    /// Most rows.
    #[arg(long, default_value_t = 50)]
    pub limit: i64,
}

#[derive(Debug, Args)]
pub struct EmitArgs {
    /// The event's name.
    pub name: String,
    /// Its payload, as JSON.
    #[arg(long, default_value = "null")]
    pub payload: String,
}
