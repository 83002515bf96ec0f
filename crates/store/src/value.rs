//! Driver-neutral parameter values and result rows.

use std::sync::Arc;

use serde_json::Value as Json;

/// A parameter value or a column value, independent of any driver.
///
/// Executors map these to their driver's types. Results must come back with
/// `int8` as [`Value::Int8`] and `jsonb` as [`Value::Jsonb`], not as text;
/// the store's decoders also accept `Int4` for integer columns and JSON text
/// for `jsonb`, so a thin adapter over a driver that normalises less still works.
///
/// A `jsonb` cell that serde_json cannot hold (legal in PostgreSQL: a number
/// such as `1e400`, nesting deeper than 128) must come back as
/// [`Value::Text`] with its JSON text, never as an error of the whole
/// result: the store then reads that one row as unreadable and every other
/// row as usual. The executor kit checks this.
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
    /// `text[]` whose elements may be `NULL` (a batch's optional column).
    NullableTextArray(Vec<Option<String>>),
    /// `int4[]`
    Int4Array(Vec<i32>),
    /// `int8[]`
    Int8Array(Vec<i64>),
    /// `jsonb[]`
    JsonbArray(Vec<Json>),
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
            Value::NullableTextArray(_) => "text[] with nulls",
            Value::Int4Array(_) => "int4[]",
            Value::Int8Array(_) => "int8[]",
            Value::JsonbArray(_) => "jsonb[]",
        }
    }
}

/// `From<T> for Value` for each `(v: T) => value` given.
macro_rules! value_from {
    ($(($v:ident: $from:ty) => $make:expr,)*) => {$(
        impl From<$from> for Value {
            fn from($v: $from) -> Self {
                $make
            }
        }
    )*};
}

value_from! {
    (v: bool) => Value::Bool(v),
    (v: i32) => Value::Int4(v),
    (v: i64) => Value::Int8(v),
    (v: f64) => Value::Float8(v),
    (v: &str) => Value::Text(v.to_owned()),
    (v: String) => Value::Text(v),
    (v: &String) => Value::Text(v.clone()),
    (v: Vec<String>) => Value::TextArray(v),
    (v: &[String]) => Value::TextArray(v.to_vec()),
    (v: Json) => Value::Jsonb(v),
    (v: &Json) => Value::Jsonb(v.clone()),
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

/// One result row: column names with their values, in the statement's order.
///
/// The rows of one result can share one list of names
/// ([`Row::with_names`]), so a batch of rows costs no name per cell.
#[derive(Debug, Clone, Default)]
pub struct Row {
    names: Arc<[String]>,
    values: Vec<Value>,
    /// Where [`Row::take`] looks first: just past the column it last took.
    /// Decoders take the columns in the statement's order, so each lookup
    /// is one comparison rather than a scan of every name.
    next: usize,
}

impl PartialEq for Row {
    fn eq(&self, other: &Row) -> bool {
        self.names == other.names && self.values == other.values
    }
}

impl Row {
    /// A row from `(column, value)` pairs.
    pub fn new(columns: Vec<(String, Value)>) -> Self {
        let (names, values): (Vec<String>, Vec<Value>) = columns.into_iter().unzip();
        Row { names: names.into(), values, next: 0 }
    }

    /// A row of `values` under `names`, which the rows of one result may
    /// share. Extra names or values past the shorter list are ignored.
    pub fn with_names(names: Arc<[String]>, mut values: Vec<Value>) -> Self {
        values.truncate(names.len());
        Row { names, values, next: 0 }
    }

    fn position(&self, column: &str) -> Option<usize> {
        self.names.iter().take(self.values.len()).position(|name| name == column)
    }

    /// The value of `column`, if the row has it.
    pub fn get(&self, column: &str) -> Option<&Value> {
        self.position(column).map(|i| &self.values[i])
    }

    /// Columns in order.
    pub fn columns(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.names.iter().map(String::as_str).zip(&self.values)
    }

    /// The column names, shared by the rows of one result.
    pub(crate) fn names(&self) -> &Arc<[String]> {
        &self.names
    }

    /// Whether this row's names are `names` itself (the same list, shared),
    /// not only equal to it.
    pub(crate) fn shares_names(&self, names: &Arc<[String]>) -> bool {
        Arc::ptr_eq(&self.names, names)
    }

    /// Whether the row's columns are exactly `names`, in order.
    pub(crate) fn named(&self, names: &[&str]) -> bool {
        self.values.len() == names.len() && self.names.len() == names.len() && self.names.iter().eq(names)
    }

    /// The values, in the columns' order.
    pub(crate) fn into_values(self) -> Vec<Value> {
        self.values
    }

    /// Takes `column` out of the row, leaving `Null` behind.
    pub fn take(&mut self, column: &str) -> Option<Value> {
        let next = self.next;
        let i = if self.names.get(next).is_some_and(|n| n == column) && next < self.values.len() {
            next
        } else {
            self.position(column)?
        };
        self.next = i + 1;
        Some(std::mem::replace(&mut self.values[i], Value::Null))
    }
}

impl FromIterator<(String, Value)> for Row {
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(iter: I) -> Self {
        Row::new(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_share_names_and_take_by_name() {
        let names: Arc<[String]> = vec!["id".to_owned(), "n".to_owned()].into();
        let mut a = Row::with_names(names.clone(), vec![Value::from("a"), Value::Int8(1)]);
        let b = Row::with_names(names, vec![Value::from("b"), Value::Int8(2), Value::Bool(true)]);
        assert_eq!(b.columns().count(), 2, "a value past the names is dropped");
        assert_eq!(a.take("n"), Some(Value::Int8(1)));
        assert_eq!(a.get("n"), Some(&Value::Null), "taken leaves null");
        assert_eq!(a.take("missing"), None);
        assert_eq!(b.get("id"), Some(&Value::from("b")));
        let short = Row::with_names(vec!["x".to_owned(), "y".to_owned()].into(), vec![Value::Int4(1)]);
        assert_eq!(short.get("y"), None, "a name without a value is not a column");
        let pairs: Row =
            [("id".to_owned(), Value::from("a")), ("n".to_owned(), Value::Int8(1))].into_iter().collect();
        assert_eq!(pairs.columns().map(|(n, _)| n).collect::<Vec<_>>(), ["id", "n"]);
    }
}
