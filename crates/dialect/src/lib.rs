//! Rewrites SQL with named parameters (`:name`) into PostgreSQL's positional
//! `$n` slots, strictly, and specialises optional filters. No I/O.
//!
//! ```
//! use waymark_dialect::{rewrite, specialise};
//!
//! let sql = "select * from t \
//!            where (:name::text is null or name = :name) \
//!              and id = :id and note <> ':id' -- :ignored";
//!
//! let rewritten = rewrite(sql)?;
//! assert_eq!(
//!     rewritten.sql(),
//!     "select * from t \
//!      where ($1::text is null or name = $1) \
//!        and id = $2 and note <> ':id' -- :ignored",
//! );
//! assert_eq!(rewritten.names(), ["name", "id"]);
//! // The caller holds values for `id` then `name`: send values[1] as $1.
//! assert_eq!(rewritten.bind_order(&["id", "name"])?, [1, 0]);
//!
//! // `name` is known not to be null: drop the null check.
//! let specialised = specialise(sql, &["name"])?;
//! assert!(specialised.contains("where (name = :name)"));
//! # Ok::<(), waymark_dialect::DialectError>(())
//! ```
//!
//! # Lexing rules
//!
//! The SQL is lexed the way PostgreSQL lexes it, far enough to know which
//! bytes are code. Parameters are never found, and nothing is changed, inside:
//!
//! - string literals `'...'` (with `''` escapes), and `E'...'` / `e'...'`
//!   strings, where a backslash also escapes the next character. Plain strings
//!   are read as with `standard_conforming_strings = on`, PostgreSQL's
//!   default;
//! - quoted identifiers `"..."` (with `""` escapes);
//! - dollar-quoted bodies `$tag$ ... $tag$`, the tag empty or an identifier.
//!   A `$` followed by a digit (`$1`) is an existing positional parameter, not
//!   a dollar quote, and is left as it is (so mixing it with `:name`
//!   parameters is the caller's business); a `$` inside an identifier, as in
//!   `a$b$`, is part of that identifier;
//! - `-- ...` line comments and `/* ... */` block comments, which nest.
//!
//! A parameter is a `:` followed by `[A-Za-z_][A-Za-z0-9_]*`, taking the
//! longest such name: `:ids` is the parameter `ids`, never `:id` then `s`.
//! `::` is always a cast, so `:id::text` is the parameter `id` then a cast to
//! `text`. A `:` not followed by a name start, as in `a[1:2]` or `:=`, is left
//! alone.
//!
//! An identifier character right before the `:` does not stop a parameter:
//! `x:y` is `x` then the parameter `y`, and rewrites to `x$1`. Beware that
//! PostgreSQL reads `x$1` as a single identifier, so write `x :y` (or
//! `x[lo : hi]`) when that matters.
//!
//! A quote, dollar-quoted body or block comment that never ends is an error,
//! [`DialectError::Unterminated`], giving the byte offset where it began.

mod error;
mod lexer;
mod rewrite;
mod specialise;

pub use error::DialectError;
pub use rewrite::{parameter_names, rewrite, Rewritten};
pub use specialise::specialise;
