//! The cairnq protocol v1 for PostgreSQL, as data.
//!
//! Every statement and migration lives as a `.sql` file under `protocol-sql/`
//! and is embedded here with `include_str!`; no other crate holds SQL text.
//! This crate performs no I/O: it only says what to send.
//!
//! ```
//! use waymark_protocol::{Statement, ParamType};
//!
//! let claim = Statement::Claim.def();
//! assert_eq!(claim.file_name(), "claim.sql");
//! assert_eq!(claim.param("queues").map(|p| p.ty), Some(ParamType::TextArray));
//! assert_eq!(waymark_protocol::migrations().len(), 10);
//! ```

mod catalogue;
mod header;
pub mod listener;
mod migrations;
mod scripts;

pub use catalogue::{Statement, StatementDef};
pub use header::{Param, ParamType};
pub use migrations::{ledger_migrations, migrations, Migration};
pub use scripts::{create_schema_script, is_valid_schema_name, set_search_path_script};

/// The protocol version this crate speaks (the `protocol_version` meta row).
pub const PROTOCOL_VERSION: i64 = 1;

/// The `schema_version` the last embedded migration sets.
pub const SCHEMA_VERSION: i64 = 10;

/// Channel the trigger notifies, with the queue name, when a row becomes queued.
pub const CHANNEL_QUEUED: &str = "cairnq_queued";

/// Channel the trigger notifies, with the task id, when a row becomes terminal.
pub const CHANNEL_DONE: &str = "cairnq_done";
