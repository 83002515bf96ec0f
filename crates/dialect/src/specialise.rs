//! Optional-filter specialisation: dropping `:p::TYPE is null or` heads for
//! parameters known not to be null.

use crate::error::DialectError;
use crate::lexer::{tokenize, Kind, Token};

/// Source-to-source on `:name` SQL (before [`rewrite`](fn@crate::rewrite)):
/// every group of the shape `( :p::TYPE is null or REST )` whose `p` is in
/// `non_null` becomes `( REST )`, keeping the parentheses.
///
/// - `non_null` holds bare names, without the `:`. Names with no such group
///   (or not used at all) are fine and change nothing.
/// - `TYPE` is one or more words (`text`, `int8`, `double precision`,
///   `pg_catalog.text`), optionally with a modifier such as `(10)` and array
///   brackets such as `[]`.
/// - `is`, `null` and `or` match case-insensitively; any whitespace and
///   comments may sit between the tokens.
/// - `REST` must be non-empty and runs to the `)` matching the group's `(`;
///   quotes, dollar bodies and comments are skipped when looking for it. A
///   group without a matching `)` is left alone.
/// - What is removed is the head, from the `:` of `:p` through `or` and the
///   whitespace right after it; everything else, other groups included, is
///   byte-identical. Groups nest: one inside another's `REST` is handled on
///   its own.
///
/// Dropping the head is sound because `false or x` is `x` in SQL's
/// three-valued logic, and `or` binds more loosely than anything else that
/// can sit in `REST`.
///
/// # Errors
///
/// [`DialectError::Unterminated`] when a quote, dollar-quoted body or block
/// comment never ends (even when `non_null` is empty).
pub fn specialise(sql: &str, non_null: &[&str]) -> Result<String, DialectError> {
    let tokens = tokenize(sql)?;
    if non_null.is_empty() {
        return Ok(sql.to_owned());
    }
    let significant: Vec<usize> = (0..tokens.len()).filter(|&i| !tokens[i].is_trivia()).collect();
    let group = Group { sql, tokens: &tokens, significant: &significant };
    let mut out = String::with_capacity(sql.len());
    let mut copied = 0;
    for k in 0..significant.len() {
        if let Some((name, cut_start, cut_end)) = group.head_at(k) {
            if non_null.contains(&name) {
                out.push_str(&sql[copied..cut_start]);
                copied = cut_end;
            }
        }
    }
    out.push_str(&sql[copied..]);
    Ok(out)
}

/// The tokens of one input, with the indices of its non-trivia tokens.
struct Group<'a> {
    sql: &'a str,
    tokens: &'a [Token],
    significant: &'a [usize],
}

impl<'a> Group<'a> {
    /// The `k`th significant token, if any.
    fn sig(&self, k: usize) -> Option<&Token> {
        self.significant.get(k).map(|&i| &self.tokens[i])
    }

    /// Whether the `k`th significant token is the keyword `word`.
    fn is_keyword(&self, k: usize, word: &str) -> bool {
        self.sig(k).is_some_and(|t| t.kind == Kind::Word && t.text(self.sql).eq_ignore_ascii_case(word))
    }

    /// When the `k`th significant token opens a group
    /// `( :p::TYPE is null or REST )`, returns `p` and the byte range of the
    /// head to cut: from `:p` through `or` and the whitespace after it.
    fn head_at(&self, k: usize) -> Option<(&'a str, usize, usize)> {
        if self.sig(k)?.kind != Kind::Open {
            return None;
        }
        let param = self.sig(k + 1).filter(|t| t.kind == Kind::Param)?;
        if self.sig(k + 2)?.kind != Kind::Cast {
            return None;
        }
        let is = self.type_end(k + 3)?;
        if !(self.is_keyword(is + 1, "null") && self.is_keyword(is + 2, "or")) {
            return None;
        }
        let or = is + 2;
        let rest = or + 1;
        if self.sig(rest)?.kind == Kind::Close {
            return None;
        }
        self.matching_close(rest)?;
        let or_index = self.significant[or];
        let mut cut_end = self.tokens[or_index].end;
        if let Some(t) = self.tokens.get(or_index + 1).filter(|t| t.kind == Kind::Space) {
            cut_end = t.end;
        }
        Some((param.param_name(self.sql), param.start, cut_end))
    }

    /// Parses a type name starting at significant token `k`; returns the
    /// index of the `is` that follows it.
    fn type_end(&self, k: usize) -> Option<usize> {
        let first = self.sig(k)?;
        if !matches!(first.kind, Kind::Word | Kind::QuotedIdent) || self.is_keyword(k, "is") {
            return None;
        }
        let mut depth = 0usize;
        let mut k = k + 1;
        loop {
            let t = self.sig(k)?;
            match t.kind {
                Kind::Word if depth == 0 && self.is_keyword(k, "is") => return Some(k),
                Kind::Word | Kind::QuotedIdent | Kind::Number => {}
                Kind::Punct if matches!(t.text(self.sql), "." | "[" | "]" | ",") => {}
                Kind::Open => depth += 1,
                Kind::Close => depth = depth.checked_sub(1)?,
                _ => return None,
            }
            k += 1;
        }
    }

    /// Finds the `)` closing a group whose content starts at significant
    /// token `k`.
    fn matching_close(&self, k: usize) -> Option<usize> {
        let mut depth = 0usize;
        for j in k..self.significant.len() {
            match self.tokens[self.significant[j]].kind {
                Kind::Open => depth += 1,
                Kind::Close if depth == 0 => return Some(j),
                Kind::Close => depth -= 1,
                _ => {}
            }
        }
        None
    }
}
