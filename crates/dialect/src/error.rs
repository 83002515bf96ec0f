//! The crate's error type.

/// Everything that can go wrong while lexing, rewriting, specialising or
/// binding.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DialectError {
    /// A name the SQL uses was not among the bound names.
    #[error("parameter `{name}` is used in the sql but not bound")]
    Unbound {
        /// The parameter name, without the leading `:`.
        name: String,
    },
    /// A bound name that the SQL never uses.
    #[error("parameter `{name}` is bound but the sql never uses it")]
    Unused {
        /// The parameter name, without the leading `:`.
        name: String,
    },
    /// A name bound more than once.
    #[error("parameter `{name}` is bound more than once")]
    DuplicateBinding {
        /// The parameter name, without the leading `:`.
        name: String,
    },
    /// A quoted string, quoted identifier, dollar-quoted body or block
    /// comment that runs off the end of the SQL.
    #[error("unterminated {what} starting at byte {offset}")]
    Unterminated {
        /// What was left open: `"string literal"`, `"quoted identifier"`,
        /// `"dollar-quoted body"` or `"block comment"`.
        what: &'static str,
        /// The byte offset in the input where it began (for an `E'...'`
        /// string, the offset of the `E`).
        offset: usize,
    },
}
