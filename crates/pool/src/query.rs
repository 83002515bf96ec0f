//! One statement on one connection, shared by the pool's calls and its
//! transactions.

use tokio_postgres::types::{ToSql, Type};
use waymark_store::{ExecError, Row, Sql, Value};

use crate::codec::{map_error, typed_params, RowDecoder};
use crate::manager::Conn;

/// Runs one statement on a connection: bound in one round trip with
/// `query_typed`, or, when the connection caches statements, prepared once
/// and reused. Shared by the pool and its transactions.
pub(crate) async fn query_on(conn: &mut Conn, sql: Sql<'_>, params: &[Value]) -> Result<Vec<Row>, ExecError> {
    let typed = typed_params(sql.types, params);
    let refs = typed.iter().map(|(p, t)| (p as &(dyn ToSql + Sync), t));
    match conn.statements.as_mut() {
        None => {
            let stream = conn.client.query_typed_raw(sql.text, refs.map(|(p, t)| (p, t.clone())));
            decode_stream(stream.await).await.map_err(map_error)?
        }
        Some(cache) => {
            let stmt = match cache.get(sql.text) {
                Some(stmt) => stmt.clone(),
                None => {
                    let types: Vec<Type> = typed.iter().map(|(_, t)| t.clone()).collect();
                    let stmt = conn.client.prepare_typed(sql.text, &types).await.map_err(map_error)?;
                    cache.insert(sql.text.to_owned(), stmt.clone());
                    stmt
                }
            };
            let rows = decode_stream(conn.client.query_raw(&stmt, refs.map(|(p, _)| p)).await).await;
            if rows.is_err() {
                // A statement the server failed may be stale (a migration
                // changed a table under its plan): prepare it afresh next
                // time. (A row we could not decode is no reason to.)
                cache.remove(sql.text);
            }
            rows.map_err(map_error)?
        }
    }
}

/// A statement's rows, decoded as they arrive: a claim's hundreds of rows
/// are never all held twice, as the driver's and as ours. The outer error
/// is the driver's; a row we cannot decode is the inner one, answered only
/// once the statement has ended, so that the server's own outcome (an
/// error after the rows, a lost connection) wins, as it did when all rows
/// were collected before decoding, and the connection goes back idle.
async fn decode_stream(
    stream: Result<tokio_postgres::RowStream, tokio_postgres::Error>,
) -> Result<Result<Vec<Row>, ExecError>, tokio_postgres::Error> {
    use futures::TryStreamExt;
    let mut stream = std::pin::pin!(stream?);
    let mut decoder = RowDecoder::default();
    let mut rows = Ok(Vec::new());
    while let Some(row) = stream.try_next().await? {
        if let Ok(decoded) = &mut rows {
            match decoder.decode(&row) {
                Ok(r) => decoded.push(r),
                Err(e) => rows = Err(e),
            }
        }
    }
    Ok(rows)
}
