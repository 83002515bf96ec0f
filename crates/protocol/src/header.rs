//! The `-- params:` header that opens every statement file: the parameters
//! it declares, their types, and its parsing.

/// The PostgreSQL type of a statement parameter, as the statement's header
/// declares it. Executors bind with these types, so no round trip is needed to
/// learn them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParamType {
    /// `boolean`
    Bool,
    /// `integer`
    Int4,
    /// `bigint`
    Int8,
    /// `double precision`
    Float8,
    /// `text`
    Text,
    /// `text[]`
    TextArray,
    /// `jsonb`
    Jsonb,
    /// `int4[]`
    Int4Array,
    /// `int8[]`
    Int8Array,
    /// `jsonb[]`
    JsonbArray,
}

impl ParamType {
    /// The spelling used in `-- params:` headers (and in SQL casts).
    pub fn sql_name(self) -> &'static str {
        match self {
            ParamType::Bool => "bool",
            ParamType::Int4 => "int4",
            ParamType::Int8 => "int8",
            ParamType::Float8 => "float8",
            ParamType::Text => "text",
            ParamType::TextArray => "text[]",
            ParamType::Jsonb => "jsonb",
            ParamType::Int4Array => "int4[]",
            ParamType::Int8Array => "int8[]",
            ParamType::JsonbArray => "jsonb[]",
        }
    }

    /// Parses a header spelling.
    pub fn from_sql_name(name: &str) -> Option<ParamType> {
        [
            ParamType::Bool,
            ParamType::Int4,
            ParamType::Int8,
            ParamType::Float8,
            ParamType::Text,
            ParamType::TextArray,
            ParamType::Jsonb,
            ParamType::Int4Array,
            ParamType::Int8Array,
            ParamType::JsonbArray,
        ]
        .into_iter()
        .find(|ty| ty.sql_name() == name)
    }
}

/// A named, typed statement parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    /// The name used as `:name` in the SQL.
    pub name: &'static str,
    /// The declared type.
    pub ty: ParamType,
}

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
