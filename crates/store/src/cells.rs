//! Column decoders: one typed value from a row's cell, each error naming
//! the column; and a status read from its stored spelling.

use std::str::FromStr;

use serde_json::Value as Json;

use crate::error::{Error, Result};
use crate::task::TaskStatus;
use crate::value::{Row, Value};

impl FromStr for TaskStatus {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        TaskStatus::ALL.into_iter().find(|st| st.as_str() == s).ok_or_else(|| {
            Error::invalid(format!(
                "unknown task status {s:?}: expected queued, running, succeeded, failed or canceled"
            ))
        })
    }
}

/// Where the decoders take a row's cells from: a [`Row`], by name, or the
/// cells of a row known to hold `TASK_COLUMNS`, in order.
pub(crate) trait Cells {
    /// Takes `col`'s cell.
    fn cell(&mut self, col: &str) -> Option<Value>;
}

impl Cells for Row {
    fn cell(&mut self, col: &str) -> Option<Value> {
        self.take(col)
    }
}

fn take(row: &mut impl Cells, col: &str) -> Result<Value> {
    row.cell(col).ok_or_else(|| Error::Decode(format!("column {col}: missing from the row")))
}

fn wrong(col: &str, want: &str, got: &Value) -> Error {
    Error::Decode(format!("column {col}: expected {want}, got {}", got.kind()))
}

/// Takes a cell, `None` for a null one. A null, and a number or a bool in
/// [`scalar`], is let go without the enum's drop glue: an out-of-line call
/// per cell otherwise, and most of a claimed row's cells are these.
fn take_non_null(row: &mut impl Cells, col: &str) -> Result<Option<Value>> {
    let v = take(row, col)?;
    if matches!(v, Value::Null) {
        std::mem::forget(v); // nothing to free
        return Ok(None);
    }
    Ok(Some(v))
}

/// A scalar column's cell: `pick` reads the variants it allows, which must
/// hold no heap data (a number or a bool), else they would leak.
fn scalar<T>(
    row: &mut impl Cells,
    col: &str,
    want: &str,
    pick: impl FnOnce(&Value) -> Option<T>,
) -> Result<Option<T>> {
    let Some(v) = take_non_null(row, col)? else { return Ok(None) };
    match pick(&v) {
        Some(x) => {
            debug_assert!(
                matches!(v, Value::Int4(_) | Value::Int8(_) | Value::Float8(_) | Value::Bool(_)),
                "only a heap-free cell may be forgotten"
            );
            std::mem::forget(v); // a number or a bool: nothing to free
            Ok(Some(x))
        }
        None => Err(wrong(col, want, &v)),
    }
}

pub(crate) fn opt_text(row: &mut impl Cells, col: &str) -> Result<Option<String>> {
    match take_non_null(row, col)? {
        None => Ok(None),
        Some(Value::Text(s)) => Ok(Some(s)),
        Some(other) => Err(wrong(col, "text", &other)),
    }
}

pub(crate) fn text(row: &mut impl Cells, col: &str) -> Result<String> {
    opt_text(row, col)?.ok_or_else(|| Error::Decode(format!("column {col}: unexpected null")))
}

pub(crate) fn text_array(row: &mut impl Cells, col: &str) -> Result<Vec<String>> {
    match take(row, col)? {
        Value::TextArray(v) => Ok(v),
        other => Err(wrong(col, "text[]", &other)),
    }
}

pub(crate) fn opt_int8(row: &mut impl Cells, col: &str) -> Result<Option<i64>> {
    scalar(row, col, "int8", |v| match v {
        Value::Int8(n) => Some(*n),
        Value::Int4(n) => Some(i64::from(*n)),
        _ => None,
    })
}

pub(crate) fn int8(row: &mut impl Cells, col: &str) -> Result<i64> {
    opt_int8(row, col)?.ok_or_else(|| Error::Decode(format!("column {col}: unexpected null")))
}

pub(crate) fn int4(row: &mut impl Cells, col: &str) -> Result<i32> {
    let n = int8(row, col)?;
    i32::try_from(n).map_err(|_| Error::Decode(format!("column {col}: {n} does not fit int4")))
}

pub(crate) fn opt_f64(row: &mut impl Cells, col: &str) -> Result<Option<f64>> {
    scalar(row, col, "float8", |v| match v {
        Value::Float8(f) => Some(*f),
        Value::Int4(n) => Some(f64::from(*n)),
        _ => None,
    })
}

pub(crate) fn opt_bool(row: &mut impl Cells, col: &str) -> Result<Option<bool>> {
    scalar(row, col, "bool", |v| match v {
        Value::Bool(b) => Some(*b),
        _ => None,
    })
}

/// A JSON column: the outer error is a broken row (missing, wrong type);
/// the inner one is JSON text serde_json cannot hold, with the reason.
pub(crate) fn json_cell(
    row: &mut impl Cells,
    col: &str,
) -> Result<std::result::Result<Option<Json>, String>> {
    match take_non_null(row, col)? {
        None => Ok(Ok(None)),
        Some(Value::Jsonb(j)) => Ok(Ok(Some(j))),
        // An executor hands back as text the JSON that serde_json cannot
        // hold (see `Value`); JSON text from a thin adapter parses here.
        Some(Value::Text(s)) => {
            Ok(serde_json::from_str(&s).map(Some).map_err(|e| format!("its JSON cannot be read here ({e})")))
        }
        Some(other) => Err(wrong(col, "jsonb", &other)),
    }
}

pub(crate) fn status(row: &mut impl Cells, col: &str) -> Result<TaskStatus> {
    let s = text(row, col)?;
    s.parse().map_err(|_| Error::Decode(format!("column {col}: unknown status {s:?}")))
}
