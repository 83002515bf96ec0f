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
    let mut decoder = RowDecoder::default();
    // Sized once (collecting results would grow it step by step).
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        out.push(decoder.decode(row)?);
    }
    Ok(out)
}

/// Decodes the rows of one result one at a time, as they arrive (from a
/// `RowStream`), so that each driver row is dropped once decoded rather
/// than all of them held until the last has come; the rows share one list
/// of column names.
#[derive(Debug, Default)]
pub struct RowDecoder {
    names: Option<std::sync::Arc<[String]>>,
}

impl RowDecoder {
    /// Decodes one row of the result.
    pub fn decode(&mut self, row: &tokio_postgres::Row) -> Result<Row, ExecError> {
        let names = self.names.get_or_insert_with(|| column_names(row)).clone();
        Ok(Row::with_names(names, decode_values(row)?))
    }
}

fn column_names(row: &tokio_postgres::Row) -> std::sync::Arc<[String]> {
    row.columns().iter().map(|c| c.name().to_owned()).collect()
}

/// The built-in type OIDs decoded here: fixed in PostgreSQL's catalogue
/// (`pg_type.dat`) since types had OIDs. Matching the number spares a
/// comparison (and a drop) of a `Type` per type tried per cell.
mod oid {
    pub const BOOL: u32 = 16;
    pub const NAME: u32 = 19;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const JSON: u32 = 114;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const NAME_ARRAY: u32 = 1003;
    pub const TEXT_ARRAY: u32 = 1009;
    pub const VARCHAR_ARRAY: u32 = 1015;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const VOID: u32 = 2278;
    pub const JSONB: u32 = 3802;
}

/// The values of one row, by each column's type.
fn decode_values(row: &tokio_postgres::Row) -> Result<Vec<Value>, ExecError> {
    let columns = row.columns();
    let mut values = Vec::with_capacity(columns.len());
    for (i, col) in columns.iter().enumerate() {
        let decode_err = |e: Box<dyn std::error::Error + Sync + Send>| {
            ExecError::new(ExecErrorKind::Query, format!("decoding column {}: {e}", col.name()))
        };
        let ty = col.type_();
        // A column of a type not read here fails whether or not this cell
        // is null: a query must not pass while its data happens to be.
        if !decoded(ty.oid()) {
            return Err(ExecError::new(
                ExecErrorKind::Query,
                format!("column {} has type {ty}, which waymark does not decode", col.name()),
            ));
        }
        // The cell's bytes, read by its column's OID: `try_get` with the
        // value's own type would check, per cell, that the type accepts the
        // column (for scalar text, comparing type names too) before decoding.
        let raw = match row.try_get::<_, RawCell<'_>>(i) {
            Ok(RawCell(Some(raw))) => raw,
            Ok(RawCell(None)) => {
                values.push(Value::Null);
                continue;
            }
            Err(e) => return Err(decode_err(e.into())),
        };
        let value = match ty.oid() {
            oid::VOID => Value::Null,
            oid::BOOL => Value::Bool(bool::from_sql(ty, raw).map_err(decode_err)?),
            oid::INT2 => Value::Int4(i32::from(i16::from_sql(ty, raw).map_err(decode_err)?)),
            oid::INT4 => Value::Int4(i32::from_sql(ty, raw).map_err(decode_err)?),
            oid::INT8 => Value::Int8(i64::from_sql(ty, raw).map_err(decode_err)?),
            oid::FLOAT8 => Value::Float8(f64::from_sql(ty, raw).map_err(decode_err)?),
            oid::FLOAT4 => Value::Float8(f64::from(f32::from_sql(ty, raw).map_err(decode_err)?)),
            oid::JSONB | oid::JSON => JsonCell::from_sql(ty, raw).map_err(decode_err)?.0,
            oid::TEXT_ARRAY | oid::VARCHAR_ARRAY | oid::NAME_ARRAY => {
                Value::TextArray(Vec::<String>::from_sql(ty, raw).map_err(decode_err)?)
            }
            // These four are sent as their text, whatever the encoding.
            oid::TEXT | oid::VARCHAR | oid::NAME | oid::BPCHAR => {
                Value::Text(std::str::from_utf8(raw).map_err(|e| decode_err(e.into()))?.to_owned())
            }
            _ => unreachable!("`decoded` lists the types matched here"),
        };
        values.push(value);
    }
    Ok(values)
}

/// Whether `decode_values` reads a column of this type.
fn decoded(type_oid: u32) -> bool {
    use oid::*;
    matches!(
        type_oid,
        VOID | BOOL
            | INT2
            | INT4
            | INT8
            | FLOAT4
            | FLOAT8
            | JSON
            | JSONB
            | TEXT_ARRAY
            | VARCHAR_ARRAY
            | NAME_ARRAY
            | TEXT
            | VARCHAR
            | NAME
            | BPCHAR
    )
}

/// A cell as it came: its bytes, or `None` for SQL NULL. It accepts any
/// column type; `decode_values` decodes it by the column's OID.
struct RawCell<'a>(Option<&'a [u8]>);

impl<'a> FromSql<'a> for RawCell<'a> {
    fn from_sql(_ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(RawCell(Some(raw)))
    }

    fn from_sql_null(_ty: &Type) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(RawCell(None))
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }
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
        // The empty object (every task's metadata by default) needs no parse.
        if text == b"{}" {
            return Ok(JsonCell(Value::Jsonb(serde_json::Value::Object(Default::default()))));
        }
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
    fn decoded_oids_are_the_catalogues() {
        let pairs = [
            (oid::BOOL, Type::BOOL),
            (oid::NAME, Type::NAME),
            (oid::INT8, Type::INT8),
            (oid::INT2, Type::INT2),
            (oid::INT4, Type::INT4),
            (oid::TEXT, Type::TEXT),
            (oid::JSON, Type::JSON),
            (oid::FLOAT4, Type::FLOAT4),
            (oid::FLOAT8, Type::FLOAT8),
            (oid::NAME_ARRAY, Type::NAME_ARRAY),
            (oid::TEXT_ARRAY, Type::TEXT_ARRAY),
            (oid::VARCHAR_ARRAY, Type::VARCHAR_ARRAY),
            (oid::BPCHAR, Type::BPCHAR),
            (oid::VARCHAR, Type::VARCHAR),
            (oid::VOID, Type::VOID),
            (oid::JSONB, Type::JSONB),
        ];
        for (number, ty) in pairs {
            assert_eq!(number, ty.oid(), "{ty}");
        }
    }

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
