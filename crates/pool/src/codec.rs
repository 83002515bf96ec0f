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
    RowDecoder::default().decode(row)
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
/// of column names, and how each column is decoded is told once, from the
/// first row's column types.
#[derive(Debug, Default)]
pub struct RowDecoder {
    columns: Option<(std::sync::Arc<[String]>, Vec<CellKind>)>,
}

impl RowDecoder {
    /// Decodes one row of the result.
    pub fn decode(&mut self, row: &tokio_postgres::Row) -> Result<Row, ExecError> {
        let (names, kinds) = match &mut self.columns {
            Some(columns) => columns,
            None => self.columns.insert((column_names(row), column_kinds(row)?)),
        };
        Ok(Row::with_names(names.clone(), decode_values(row, kinds)?))
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

/// How each column of a result is decoded. A column of a type not read
/// here fails the result, whether or not its cells are null, so that a
/// query cannot pass while its data happens to be.
fn column_kinds(row: &tokio_postgres::Row) -> Result<Vec<CellKind>, ExecError> {
    row.columns()
        .iter()
        .map(|col| {
            CellKind::of(col.type_().oid()).ok_or_else(|| {
                ExecError::new(
                    ExecErrorKind::Query,
                    format!("column {} has type {}, which waymark does not decode", col.name(), col.type_()),
                )
            })
        })
        .collect()
}

/// The values of one row, each column decoded as `kinds` says.
fn decode_values(row: &tokio_postgres::Row, kinds: &[CellKind]) -> Result<Vec<Value>, ExecError> {
    let columns = row.columns();
    let mut values = Vec::with_capacity(columns.len());
    for (i, (col, kind)) in columns.iter().zip(kinds).enumerate() {
        let decode_err = |e: BoxError| {
            ExecError::new(ExecErrorKind::Query, format!("decoding column {}: {e}", col.name()))
        };
        // The cell's bytes, decoded by its column's kind: `try_get` with the
        // value's own type would check, per cell, that the type accepts the
        // column (for scalar text, comparing type names too) before decoding.
        let value = match row.try_get::<_, RawCell<'_>>(i) {
            Ok(RawCell(Some(raw))) => kind.decode(col.type_(), raw).map_err(decode_err)?,
            Ok(RawCell(None)) => Value::Null,
            Err(e) => return Err(decode_err(e.into())),
        };
        values.push(value);
    }
    Ok(values)
}

type BoxError = Box<dyn std::error::Error + Sync + Send>;

/// The column types `decode_values` reads, grouped by how.
#[derive(Debug, Clone, Copy)]
enum CellKind {
    Void,
    Bool,
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    Json,
    TextArray,
    Text,
}

impl CellKind {
    /// The kind of a column of the type `type_oid`; `None` for a type not
    /// read here.
    fn of(type_oid: u32) -> Option<CellKind> {
        Some(match type_oid {
            oid::VOID => CellKind::Void,
            oid::BOOL => CellKind::Bool,
            oid::INT2 => CellKind::Int2,
            oid::INT4 => CellKind::Int4,
            oid::INT8 => CellKind::Int8,
            oid::FLOAT4 => CellKind::Float4,
            oid::FLOAT8 => CellKind::Float8,
            oid::JSONB | oid::JSON => CellKind::Json,
            oid::TEXT_ARRAY | oid::VARCHAR_ARRAY | oid::NAME_ARRAY => CellKind::TextArray,
            oid::TEXT | oid::VARCHAR | oid::NAME | oid::BPCHAR => CellKind::Text,
            _ => return None,
        })
    }

    /// A non-null cell's value.
    fn decode(self, ty: &Type, raw: &[u8]) -> Result<Value, BoxError> {
        Ok(match self {
            CellKind::Void => Value::Null,
            CellKind::Bool => Value::Bool(bool::from_sql(ty, raw)?),
            CellKind::Int2 => Value::Int4(i32::from(i16::from_sql(ty, raw)?)),
            CellKind::Int4 => Value::Int4(i32::from_sql(ty, raw)?),
            CellKind::Int8 => Value::Int8(i64::from_sql(ty, raw)?),
            CellKind::Float4 => Value::Float8(f64::from(f32::from_sql(ty, raw)?)),
            CellKind::Float8 => Value::Float8(f64::from_sql(ty, raw)?),
            CellKind::Json => JsonCell::from_sql(ty, raw)?.0,
            CellKind::TextArray => Value::TextArray(Vec::<String>::from_sql(ty, raw)?),
            // Sent as their text, whatever the encoding.
            CellKind::Text => Value::Text(std::str::from_utf8(raw)?.to_owned()),
        })
    }
}

/// A cell as it came: its bytes, or `None` for SQL NULL. It accepts any
/// column type; `decode_values` decodes it by the column's OID.
struct RawCell<'a>(Option<&'a [u8]>);

impl<'a> FromSql<'a> for RawCell<'a> {
    fn from_sql(_ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        Ok(RawCell(Some(raw)))
    }

    fn from_sql_null(_ty: &Type) -> Result<Self, BoxError> {
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
