//! Driver-neutral parameter values and result rows.

use serde_json::Value as Json;

/// A parameter value or a column value, independent of any driver.
///
/// Executors map these to their driver's types. Results must come back with
/// `int8` as [`Value::Int8`] and `jsonb` as [`Value::Jsonb`], not as text;
/// the store's decoders also accept `Int4` for integer columns and JSON text
/// for `jsonb`, so a thin adapter over a driver that normalises less still works.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL `NULL`.
    Null,
    /// `boolean`
    Bool(bool),
    /// `integer`
    Int4(i32),
    /// `bigint`
    Int8(i64),
    /// `double precision`
    Float8(f64),
    /// `text`
    Text(String),
    /// `text[]`
    TextArray(Vec<String>),
    /// `jsonb`
    Jsonb(Json),
}

impl Value {
    /// Whether this is [`Value::Null`].
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// A short name of the variant, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Int4(_) => "int4",
            Value::Int8(_) => "int8",
            Value::Float8(_) => "float8",
            Value::Text(_) => "text",
            Value::TextArray(_) => "text[]",
            Value::Jsonb(_) => "jsonb",
        }
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}
impl From<i32> for Value {
    fn from(v: i32) -> Self {
        Value::Int4(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int8(v)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float8(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}
impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Value::Text(v.clone())
    }
}
impl From<Vec<String>> for Value {
    fn from(v: Vec<String>) -> Self {
        Value::TextArray(v)
    }
}
impl From<&[String]> for Value {
    fn from(v: &[String]) -> Self {
        Value::TextArray(v.to_vec())
    }
}
impl From<Json> for Value {
    fn from(v: Json) -> Self {
        Value::Jsonb(v)
    }
}
impl From<&Json> for Value {
    fn from(v: &Json) -> Self {
        Value::Jsonb(v.clone())
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

/// One result row: column names with their values, in the statement's order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    columns: Vec<(String, Value)>,
}

impl Row {
    /// A row from `(column, value)` pairs.
    pub fn new(columns: Vec<(String, Value)>) -> Self {
        Row { columns }
    }

    /// The value of `column`, if the row has it.
    pub fn get(&self, column: &str) -> Option<&Value> {
        self.columns.iter().find(|(name, _)| name == column).map(|(_, v)| v)
    }

    /// Columns in order.
    pub fn columns(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.columns.iter().map(|(n, v)| (n.as_str(), v))
    }

    /// Takes `column` out of the row, leaving `Null` behind.
    pub fn take(&mut self, column: &str) -> Option<Value> {
        self.columns
            .iter_mut()
            .find(|(name, _)| name == column)
            .map(|(_, v)| std::mem::replace(v, Value::Null))
    }
}

impl FromIterator<(String, Value)> for Row {
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(iter: I) -> Self {
        Row::new(iter.into_iter().collect())
    }
}
