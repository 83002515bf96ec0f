//! What a command ends with when it does not end well, and its exit code.

use std::fmt;
use std::process::ExitCode;

/// A command's failure: what kind (its exit code) and what to tell.
#[derive(Debug)]
pub struct CliError {
    pub kind: Kind,
    pub message: String,
    /// For a bulk retry or a purge without --yes: how many tasks matched.
    pub matched: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Exit 1: the database could not be reached, an operation failed.
    Failed,
    /// Exit 2: bad usage or input; nothing was changed.
    Usage,
    /// Exit 3: no such task, or not in a state the command acts on.
    NotFound,
    /// Exit 4: a bulk action that needs --yes.
    NeedsYes,
}

impl CliError {
    pub fn usage(message: impl Into<String>) -> Self {
        CliError { kind: Kind::Usage, message: message.into(), matched: None }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        CliError { kind: Kind::NotFound, message: message.into(), matched: None }
    }

    pub fn failed(message: impl Into<String>) -> Self {
        CliError { kind: Kind::Failed, message: message.into(), matched: None }
    }

    pub fn code(&self) -> ExitCode {
        ExitCode::from(match self.kind {
            Kind::Failed => 1,
            Kind::Usage => 2,
            Kind::NotFound => 3,
            Kind::NeedsYes => 4,
        })
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A store error, said for an operator: a bad argument is bad input, the
/// rest failed.
impl From<waymark_store::Error> for CliError {
    fn from(e: waymark_store::Error) -> Self {
        match &e {
            waymark_store::Error::InvalidArgument(why) => CliError::usage(why.clone()),
            // No meta row, or no tables at all (undefined_table).
            waymark_store::Error::ProtocolVersionMismatch { found: 0, .. } => not_installed(),
            _ if e.sqlstate() == Some("42P01") => not_installed(),
            _ if e.exec_kind() == Some(waymark_store::ExecErrorKind::Connection) => {
                CliError::failed(format!("cannot reach the database: {e}"))
            }
            _ => CliError::failed(e.to_string()),
        }
    }
}

fn not_installed() -> CliError {
    CliError::failed("no waymark installation here: run `waymark migrate` first, or check --schema")
}
