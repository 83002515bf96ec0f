//! Why a pool could not be built.

/// Why a pool could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The URL did not parse.
    #[error("invalid database url: {0}")]
    InvalidUrl(String),
    /// A setting is out of range.
    #[error("invalid pool setting: {0}")]
    InvalidSetting(String),
    /// Built outside a tokio runtime: the pool's idle reaper runs as a
    /// task of the runtime it is built in.
    #[error("a pool must be built inside a tokio runtime (its idle reaper runs as a task there)")]
    NoRuntime,
}
