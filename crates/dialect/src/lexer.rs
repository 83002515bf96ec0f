//! A PostgreSQL-flavoured lexer that knows just enough to tell code from
//! quoted text and comments.
//!
//! Every byte of the input belongs to exactly one token, so concatenating the
//! tokens' texts gives the input back. Token boundaries always fall on ASCII
//! bytes (or the ends of the input), so slicing a `&str` at them is safe.

use crate::error::DialectError;

/// What a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A run of whitespace.
    Space,
    /// `-- ...` up to, not including, the line break.
    LineComment,
    /// `/* ... */`, nested comments included.
    BlockComment,
    /// `'...'`, or `E'...'` with its prefix.
    StringLiteral,
    /// `"..."`.
    QuotedIdent,
    /// `$tag$ ... $tag$`, both delimiters included.
    DollarBody,
    /// An identifier or keyword.
    Word,
    /// A numeric literal (loosely: a digit and what follows it).
    Number,
    /// `:name`, colon included.
    Param,
    /// `::`.
    Cast,
    /// `$` followed by digits: an existing positional parameter.
    Positional,
    /// `(`.
    Open,
    /// `)`.
    Close,
    /// Any other single byte.
    Punct,
}

/// One token: its kind and its byte range in the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token {
    /// What the token is.
    pub(crate) kind: Kind,
    /// Byte offset of its first byte.
    pub(crate) start: usize,
    /// Byte offset just past its last byte.
    pub(crate) end: usize,
}

impl Token {
    /// The token's text within `sql`, the string it was lexed from.
    pub(crate) fn text<'a>(&self, sql: &'a str) -> &'a str {
        &sql[self.start..self.end]
    }

    /// Whitespace and comments: tokens with no meaning to the grammar.
    pub(crate) fn is_trivia(&self) -> bool {
        matches!(self.kind, Kind::Space | Kind::LineComment | Kind::BlockComment)
    }

    /// For a [`Kind::Param`] token, the parameter name without its colon.
    pub(crate) fn param_name<'a>(&self, sql: &'a str) -> &'a str {
        debug_assert_eq!(self.kind, Kind::Param);
        &sql[self.start + 1..self.end]
    }
}

/// PostgreSQL identifier start: letters, `_`, and any non-ASCII byte.
fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b >= 0x80
}

/// PostgreSQL identifier continuation: also digits and `$`.
fn is_ident_cont(b: u8) -> bool {
    is_ident_start(b) || b.is_ascii_digit() || b == b'$'
}

/// Dollar-quote tag continuation: like an identifier, but never `$`.
fn is_tag_cont(b: u8) -> bool {
    is_ident_start(b) || b.is_ascii_digit()
}

/// First character of a parameter name (ASCII only).
fn is_param_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

/// Later characters of a parameter name (ASCII only).
fn is_param_cont(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// PostgreSQL whitespace.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// The offset of the first byte at or after `from` failing `keep`.
fn scan_while(b: &[u8], from: usize, keep: impl Fn(u8) -> bool) -> usize {
    b[from..].iter().position(|&c| !keep(c)).map_or(b.len(), |n| from + n)
}

/// Splits `sql` into tokens.
///
/// Fails with [`DialectError::Unterminated`] when a quoted string, quoted
/// identifier, dollar-quoted body or block comment has no end.
pub(crate) fn tokenize(sql: &str) -> Result<Vec<Token>, DialectError> {
    let b = sql.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        let (kind, end) = match c {
            c if is_space(c) => (Kind::Space, scan_while(b, i, is_space)),
            b'-' if next == Some(b'-') => (Kind::LineComment, scan_while(b, i, |c| c != b'\n' && c != b'\r')),
            b'/' if next == Some(b'*') => (Kind::BlockComment, block_comment(b, i)?),
            b'\'' => (Kind::StringLiteral, quoted(b, i + 1, b'\'', false, "string literal", i)?),
            b'"' => (Kind::QuotedIdent, quoted(b, i + 1, b'"', false, "quoted identifier", i)?),
            b'$' => dollar(b, i)?,
            b':' => match next {
                Some(b':') => (Kind::Cast, i + 2),
                Some(n) if is_param_start(n) => (Kind::Param, scan_while(b, i + 1, is_param_cont)),
                _ => (Kind::Punct, i + 1),
            },
            b'(' => (Kind::Open, i + 1),
            b')' => (Kind::Close, i + 1),
            c if is_ident_start(c) => {
                let end = scan_while(b, i, is_ident_cont);
                if end == i + 1 && (c == b'e' || c == b'E') && b.get(end) == Some(&b'\'') {
                    // E'...': backslash escapes, reported from the `E`.
                    (Kind::StringLiteral, quoted(b, end + 1, b'\'', true, "string literal", i)?)
                } else {
                    (Kind::Word, end)
                }
            }
            c if c.is_ascii_digit() => {
                (Kind::Number, scan_while(b, i, |c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.'))
            }
            _ => (Kind::Punct, i + 1),
        };
        tokens.push(Token { kind, start: i, end });
        i = end;
    }
    Ok(tokens)
}

/// Scans a quoted run whose body starts at `from`, closed by `quote` (a
/// doubled quote is an escaped quote; with `backslash`, so is `\` followed by
/// anything). Returns the offset just past the closing quote.
fn quoted(
    b: &[u8],
    from: usize,
    quote: u8,
    backslash: bool,
    what: &'static str,
    began: usize,
) -> Result<usize, DialectError> {
    let mut i = from;
    while i < b.len() {
        let c = b[i];
        if backslash && c == b'\\' {
            i += 2;
        } else if c == quote {
            if b.get(i + 1) == Some(&quote) {
                i += 2;
            } else {
                return Ok(i + 1);
            }
        } else {
            i += 1;
        }
    }
    Err(DialectError::Unterminated { what, offset: began })
}

/// Scans a block comment opening at `start`, honouring nesting. Returns the
/// offset just past its final `*/`.
fn block_comment(b: &[u8], start: usize) -> Result<usize, DialectError> {
    let mut depth = 1usize;
    let mut i = start + 2;
    while i < b.len() {
        match (b[i], b.get(i + 1)) {
            (b'/', Some(b'*')) => {
                depth += 1;
                i += 2;
            }
            (b'*', Some(b'/')) => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return Ok(i);
                }
            }
            _ => i += 1,
        }
    }
    Err(DialectError::Unterminated { what: "block comment", offset: start })
}

/// Lexes what starts with the `$` at `start`: a dollar-quoted body, a
/// positional parameter `$n`, or a lone `$`.
fn dollar(b: &[u8], start: usize) -> Result<(Kind, usize), DialectError> {
    let after = start + 1;
    let tag_end = match b.get(after) {
        Some(b'$') => after,
        Some(&c) if is_ident_start(c) => scan_while(b, after, is_tag_cont),
        Some(c) if c.is_ascii_digit() => {
            return Ok((Kind::Positional, scan_while(b, after, |c| c.is_ascii_digit())));
        }
        _ => return Ok((Kind::Punct, after)),
    };
    if b.get(tag_end) != Some(&b'$') {
        // `$abc` with no closing `$`: not a dollar quote.
        return Ok((Kind::Punct, after));
    }
    let delimiter = &b[start..=tag_end];
    let body = tag_end + 1;
    match b[body..].windows(delimiter.len()).position(|w| w == delimiter) {
        Some(n) => Ok((Kind::DollarBody, body + n + delimiter.len())),
        None => Err(DialectError::Unterminated { what: "dollar-quoted body", offset: start }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(sql: &str) -> Vec<(Kind, &str)> {
        tokenize(sql).unwrap().into_iter().map(|t| (t.kind, t.text(sql))).collect()
    }

    fn significant(sql: &str) -> Vec<(Kind, &str)> {
        tokenize(sql).unwrap().into_iter().filter(|t| !t.is_trivia()).map(|t| (t.kind, t.text(sql))).collect()
    }

    #[test]
    fn tokens_cover_the_input() {
        let sql = "select 'a''b', E'c\\'d', \"x\"\"y\", $t$ :z $t$, $1 -- c\n/* /* n */ */ :p::text[] é";
        let text: String = tokenize(sql).unwrap().iter().map(|t| t.text(sql)).collect();
        assert_eq!(text, sql);
    }

    #[test]
    fn params_casts_and_colons() {
        use Kind::{Cast, Number, Param, Punct, Word};
        let (kinds, texts): (Vec<Kind>, Vec<&str>) =
            significant(":id::text a[1:2] := :_x9").into_iter().unzip();
        assert_eq!(texts, [":id", "::", "text", "a", "[", "1", ":", "2", "]", ":", "=", ":_x9"]);
        assert_eq!(
            kinds,
            [Param, Cast, Word, Word, Punct, Number, Punct, Number, Punct, Punct, Punct, Param]
        );
    }

    #[test]
    fn words_absorb_dollars_but_lone_dollars_do_not_quote() {
        assert_eq!(significant("x$y$ z"), vec![(Kind::Word, "x$y$"), (Kind::Word, "z")]);
        assert_eq!(
            significant("$abc + $12"),
            vec![(Kind::Punct, "$"), (Kind::Word, "abc"), (Kind::Punct, "+"), (Kind::Positional, "$12"),]
        );
    }

    #[test]
    fn e_prefix_only_when_alone() {
        assert_eq!(significant(r"E'\''"), vec![(Kind::StringLiteral, r"E'\''")]);
        assert_eq!(
            significant(r"me'\' x"),
            vec![(Kind::Word, "me"), (Kind::StringLiteral, r"'\'"), (Kind::Word, "x")]
        );
    }

    #[test]
    fn line_comment_stops_before_the_line_break() {
        assert_eq!(
            kinds("-- a\r\nb"),
            vec![(Kind::LineComment, "-- a"), (Kind::Space, "\r\n"), (Kind::Word, "b"),]
        );
        assert_eq!(kinds("x --"), vec![(Kind::Word, "x"), (Kind::Space, " "), (Kind::LineComment, "--"),]);
    }

    #[test]
    fn block_comment_edge_cases() {
        assert_eq!(kinds("/**/"), vec![(Kind::BlockComment, "/**/")]);
        assert_eq!(kinds("/*/ */"), vec![(Kind::BlockComment, "/*/ */")]);
        assert!(tokenize("/*/*/").is_err());
    }
}
