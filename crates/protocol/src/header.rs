//! Parsing of the `-- params:` header that opens every statement file.

use crate::catalogue::{Param, ParamType};

/// Reads `-- params: a text, b int8` from the first line of `sql`.
///
/// Panics with the file name on a malformed header: the files are compiled
/// into the binary, so a bad header is a build defect caught by the tests.
pub(crate) fn parse_params(file: &str, sql: &str) -> Vec<Param> {
    let first = sql.lines().next().unwrap_or_default();
    let Some(list) = first.strip_prefix("-- params:") else {
        panic!("{file}: first line must be a `-- params:` header, found {first:?}");
    };
    list.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            let mut parts = item.split_whitespace();
            let (Some(name), Some(ty), None) = (parts.next(), parts.next(), parts.next()) else {
                panic!("{file}: parameter {item:?} must be `name type`");
            };
            let ty = ParamType::from_sql_name(ty)
                .unwrap_or_else(|| panic!("{file}: parameter {name} has unknown type {ty:?}"));
            Param { name: leak(name), ty }
        })
        .collect()
}

// Headers are parsed once per process into 'static definitions.
fn leak(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}
