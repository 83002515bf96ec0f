//! Named `:name` parameters to positional `$n` slots.

use std::collections::HashMap;

use crate::error::DialectError;
use crate::lexer::{tokenize, Kind};

/// SQL rewritten to `$n` slots. `names()[i]` is the parameter bound to
/// `$(i+1)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    sql: String,
    names: Vec<String>,
}

impl Rewritten {
    /// The rewritten SQL, with `$1`, `$2`, ... in place of `:name`s.
    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// The parameter names by slot: `names()[i]` is bound to `$(i+1)`.
    /// Distinct, in order of first appearance in the original SQL.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// For each slot, the index in `bound` of the value to send.
    ///
    /// `bound` lists the names of the values the caller holds, in the order
    /// it holds them; the result `order` says to send `values[order[i]]` as
    /// `$(i+1)`.
    ///
    /// # Errors
    ///
    /// - [`DialectError::DuplicateBinding`] when a name appears twice in
    ///   `bound`;
    /// - [`DialectError::Unbound`] when the SQL uses a name absent from
    ///   `bound` (the first such name, in slot order);
    /// - [`DialectError::Unused`] when `bound` holds a name the SQL never
    ///   uses (the first such name, in `bound` order).
    ///
    /// Checks run in that order.
    pub fn bind_order(&self, bound: &[&str]) -> Result<Vec<usize>, DialectError> {
        let mut position: HashMap<&str, usize> = HashMap::with_capacity(bound.len());
        for (i, &name) in bound.iter().enumerate() {
            if position.insert(name, i).is_some() {
                return Err(DialectError::DuplicateBinding { name: name.to_owned() });
            }
        }
        let order = self
            .names
            .iter()
            .map(|name| {
                position
                    .get(name.as_str())
                    .copied()
                    .ok_or_else(|| DialectError::Unbound { name: name.clone() })
            })
            .collect::<Result<Vec<usize>, DialectError>>()?;
        if order.len() != bound.len() {
            // Every slot found a distinct bound name, so some bound name is
            // left over.
            let mut used = vec![false; bound.len()];
            for &i in &order {
                used[i] = true;
            }
            if let Some(i) = used.iter().position(|&u| !u) {
                return Err(DialectError::Unused { name: bound[i].to_owned() });
            }
        }
        Ok(order)
    }
}

/// Lex `sql` and replace every `:name` by `$n`, each distinct name one slot,
/// numbered in order of first appearance.
///
/// Quoted strings, quoted identifiers, dollar-quoted bodies and comments are
/// copied untouched, and so is every other byte that is not a parameter; see
/// the [crate docs](crate) for the lexing rules.
///
/// # Errors
///
/// [`DialectError::Unterminated`] when a quote, dollar-quoted body or block
/// comment never ends.
pub fn rewrite(sql: &str) -> Result<Rewritten, DialectError> {
    let tokens = tokenize(sql)?;
    let mut out = String::with_capacity(sql.len());
    let mut names: Vec<String> = Vec::new();
    let mut slots: HashMap<&str, usize> = HashMap::new();
    let mut copied = 0;
    for token in tokens.iter().filter(|t| t.kind == Kind::Param) {
        let name = token.param_name(sql);
        let slot = *slots.entry(name).or_insert_with(|| {
            names.push(name.to_owned());
            names.len()
        });
        out.push_str(&sql[copied..token.start]);
        out.push('$');
        out.push_str(&slot.to_string());
        copied = token.end;
    }
    out.push_str(&sql[copied..]);
    Ok(Rewritten { sql: out, names })
}

/// Distinct parameter names in order of first appearance, without rewriting.
///
/// The same names, in the same order, as [`rewrite`]`(sql)?.names()`.
///
/// # Errors
///
/// [`DialectError::Unterminated`], as for [`rewrite`].
pub fn parameter_names(sql: &str) -> Result<Vec<String>, DialectError> {
    let mut names: Vec<String> = Vec::new();
    for token in tokenize(sql)?.iter().filter(|t| t.kind == Kind::Param) {
        let name = token.param_name(sql);
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}
