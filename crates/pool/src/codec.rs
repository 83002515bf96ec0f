//! Between waymark's driver-neutral values and tokio-postgres. Public so that
//! an executor over any tokio-postgres based pool (deadpool-postgres, a bare
//! `Client`) can reuse it.

use bytes::BytesMut;
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};
use waymark_store::protocol::ParamType;
use waymark_store::{ExecError, ExecErrorKind, Row, Value};

/// The tokio-postgres type for a declared parameter type.
pub fn pg_type(ty: ParamType) -> Type {
    match ty {
        ParamType::Bool => Type::BOOL,
        ParamType::Int4 => Type::INT4,
        ParamType::Int8 => Type::INT8,
        ParamType::Float8 => Type::FLOAT8,
        ParamType::Text => Type::TEXT,
        ParamType::TextArray => Type::TEXT_ARRAY,
        ParamType::Jsonb => Type::JSONB,
        ParamType::Int4Array => Type::INT4_ARRAY,
        ParamType::Int8Array => Type::INT8_ARRAY,
        ParamType::JsonbArray => Type::JSONB_ARRAY,
    }
}

/// A [`Value`] as a tokio-postgres parameter. The statement's declared type
/// decides the wire type, so `accepts` trusts it.
#[derive(Debug)]
pub struct Param<'a>(pub &'a Value);

impl ToSql for Param<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self.0 {
            Value::Null => Ok(IsNull::Yes),
            Value::Bool(v) => v.to_sql(ty, out),
            Value::Int4(v) => v.to_sql(ty, out),
            Value::Int8(v) => v.to_sql(ty, out),
            Value::Float8(v) => v.to_sql(ty, out),
            Value::Text(v) => v.to_sql(ty, out),
            Value::TextArray(v) => v.to_sql(ty, out),
            Value::Jsonb(v) => v.to_sql(ty, out),
            Value::NullableTextArray(v) => v.to_sql(ty, out),
            Value::Int4Array(v) => v.to_sql(ty, out),
            Value::Int8Array(v) => v.to_sql(ty, out),
            Value::JsonbArray(v) => v.to_sql(ty, out),
        }
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// Pairs each value with its declared type, ready for `query_typed`.
pub fn typed_params<'a>(types: &[ParamType], params: &'a [Value]) -> Vec<(Param<'a>, Type)> {
    params.iter().zip(types).map(|(v, ty)| (Param(v), pg_type(*ty))).collect()
}

/// Decodes one tokio-postgres row into a [`Row`], by each column's type.
pub fn decode_row(row: &tokio_postgres::Row) -> Result<Row, ExecError> {
    Ok(Row::with_names(column_names(row), decode_values(row)?))
}

/// Decodes the rows of one result; they share one list of column names.
pub fn decode_rows(rows: &[tokio_postgres::Row]) -> Result<Vec<Row>, ExecError> {
    let Some(first) = rows.first() else { return Ok(Vec::new()) };
    let names = column_names(first);
    rows.iter().map(|row| Ok(Row::with_names(names.clone(), decode_values(row)?))).collect()
}

fn column_names(row: &tokio_postgres::Row) -> std::sync::Arc<[String]> {
    row.columns().iter().map(|c| c.name().to_owned()).collect()
}

/// The values of one row, by each column's type.
fn decode_values(row: &tokio_postgres::Row) -> Result<Vec<Value>, ExecError> {
    row.columns()
        .iter()
        .enumerate()
        .map(|(i, col)| {
            let decode_err = |e: tokio_postgres::Error| {
                ExecError::new(ExecErrorKind::Query, format!("decoding column {}: {e}", col.name()))
            };
            let ty = col.type_();
            let value = if *ty == Type::VOID {
                Value::Null
            } else if *ty == Type::BOOL {
                row.try_get::<_, Option<bool>>(i).map_err(decode_err)?.map_or(Value::Null, Value::Bool)
            } else if *ty == Type::INT2 {
                row.try_get::<_, Option<i16>>(i)
                    .map_err(decode_err)?
                    .map_or(Value::Null, |v| Value::Int4(i32::from(v)))
            } else if *ty == Type::INT4 {
                row.try_get::<_, Option<i32>>(i).map_err(decode_err)?.map_or(Value::Null, Value::Int4)
            } else if *ty == Type::INT8 {
                row.try_get::<_, Option<i64>>(i).map_err(decode_err)?.map_or(Value::Null, Value::Int8)
            } else if *ty == Type::FLOAT8 {
                row.try_get::<_, Option<f64>>(i).map_err(decode_err)?.map_or(Value::Null, Value::Float8)
            } else if *ty == Type::FLOAT4 {
                row.try_get::<_, Option<f32>>(i)
                    .map_err(decode_err)?
                    .map_or(Value::Null, |v| Value::Float8(f64::from(v)))
            } else if *ty == Type::JSONB || *ty == Type::JSON {
                row.try_get::<_, Option<JsonCell>>(i).map_err(decode_err)?.map_or(Value::Null, |c| c.0)
            } else if *ty == Type::TEXT_ARRAY || *ty == Type::VARCHAR_ARRAY || *ty == Type::NAME_ARRAY {
                row.try_get::<_, Option<Vec<String>>>(i)
                    .map_err(decode_err)?
                    .map_or(Value::Null, Value::TextArray)
            } else if [Type::TEXT, Type::VARCHAR, Type::NAME, Type::BPCHAR].contains(ty) {
                row.try_get::<_, Option<String>>(i).map_err(decode_err)?.map_or(Value::Null, Value::Text)
            } else {
                return Err(ExecError::new(
                    ExecErrorKind::Query,
                    format!("column {} has type {ty}, which waymark does not decode", col.name()),
                ));
            };
            Ok(value)
        })
        .collect()
}

/// A `json` or `jsonb` cell: [`Value::Jsonb`] when serde_json can hold it,
/// else [`Value::Text`] with its JSON text. Legal jsonb that serde_json
/// refuses exists (a number past f64's range such as `1e400`, nesting deeper
/// than 128): any client can write it, and one such cell must not fail the
/// whole result (a claim's rows are already committed as running). The
/// store turns the text into a per-row decode error that names the column.
struct JsonCell(Value);

impl<'a> FromSql<'a> for JsonCell {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let text = if *ty == Type::JSONB {
            match raw.split_first() {
                Some((1, text)) => text,
                Some((version, _)) => return Err(format!("unsupported jsonb version {version}").into()),
                None => return Err("empty jsonb value".into()),
            }
        } else {
            raw
        };
        Ok(JsonCell(match serde_json::from_slice(text) {
            Ok(json) => Value::Jsonb(json),
            Err(_) => Value::Text(String::from_utf8_lossy(text).into_owned()),
        }))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }
}

/// Classifies a tokio-postgres error: connection class (08*, 57P01-57P03,
/// closed or I/O), capacity (53300, "too many clients", reserved slots), or
/// a query error; the SQLSTATE is kept.
pub fn map_error(e: tokio_postgres::Error) -> ExecError {
    let code = e.code().map(|c| c.code().to_owned());
    let message = match e.as_db_error() {
        Some(db) => match db.detail() {
            Some(detail) => format!("{}: {detail}", db.message()),
            None => db.message().to_owned(),
        },
        // tokio-postgres keeps the cause (the TLS or I/O failure) apart from
        // its message: bring it along, so the error says what went wrong.
        None => {
            let mut message = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                message.push_str(": ");
                message.push_str(&c.to_string());
                cause = c.source();
            }
            message
        }
    };
    let kind = classify(code.as_deref(), &message, e.is_closed() || e.as_db_error().is_none());
    let mut err = ExecError::new(kind, message);
    if let Some(code) = code {
        err = err.with_sqlstate(code);
    }
    err.with_source(e)
}

/// The kind for a SQLSTATE and message; `transport` marks a failure with no
/// server error behind it (closed socket, I/O, protocol).
pub fn classify(sqlstate: Option<&str>, message: &str, transport: bool) -> ExecErrorKind {
    let lower = message.to_ascii_lowercase();
    match sqlstate {
        Some("53300") => ExecErrorKind::Capacity,
        _ if lower.contains("too many clients")
            || lower.contains("remaining connection slots are reserved") =>
        {
            ExecErrorKind::Capacity
        }
        Some(code) if code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03") => {
            ExecErrorKind::Connection
        }
        Some(_) => ExecErrorKind::Query,
        None if transport => ExecErrorKind::Connection,
        None => ExecErrorKind::Query,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_classes() {
        assert_eq!(
            classify(Some("53300"), "sorry, too many clients already", false),
            ExecErrorKind::Capacity
        );
        assert_eq!(
            classify(None, "FATAL: remaining connection slots are reserved", true),
            ExecErrorKind::Capacity
        );
        assert_eq!(classify(Some("08006"), "connection failure", false), ExecErrorKind::Connection);
        assert_eq!(classify(Some("57P01"), "terminating connection", false), ExecErrorKind::Connection);
        assert_eq!(classify(None, "connection closed", true), ExecErrorKind::Connection);
        assert_eq!(classify(Some("23505"), "duplicate key", false), ExecErrorKind::Query);
        assert_eq!(classify(Some("40001"), "could not serialize", false), ExecErrorKind::Query);
    }
}
