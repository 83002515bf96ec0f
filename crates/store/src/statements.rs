//! From the catalogue to the wire: named binds become `$n` SQL, specialised
//! for the optional filters that are on, cached per shape.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use waymark_dialect::Rewritten;
use waymark_protocol::{ParamType, Statement};

use crate::error::{Error, Result};
use crate::executor::{Lane, PgSession, Sql};
use crate::value::{Row, Value};

/// One statement's SQL for one combination of optional filters.
#[derive(Debug)]
pub(crate) struct Prepared {
    rewritten: Rewritten,
    types: Vec<ParamType>,
}

/// Rewritten statements by (statement, which optional filters are on).
type Cache = Mutex<HashMap<(Statement, u32), Arc<Prepared>>>;

/// Named values for one call.
pub(crate) type Binds = Vec<(&'static str, Value)>;

/// Runs `stmt` on `session` with `binds` (every declared parameter, by name).
pub(crate) async fn run<S>(session: &mut S, stmt: Statement, binds: Binds) -> Result<Vec<Row>>
where
    S: PgSession + ?Sized,
{
    let (prepared, params) = bound(stmt, binds)?;
    let (lane, repeatable) = intent(stmt);
    let sql = Sql { text: prepared.rewritten.sql(), types: &prepared.types, lane, repeatable };
    Ok(session.query(sql, &params).await?)
}

/// `stmt` rewritten for `binds`, and their values in its `$n` order. Each
/// bind is checked against the statement's header (its name, its type),
/// and every name the SQL uses must be bound, each bind used.
pub(crate) fn bound(stmt: Statement, binds: Binds) -> Result<(Arc<Prepared>, Vec<Value>)> {
    let prepared = prepared(stmt, &binds)?;
    let names: Vec<&str> = binds.iter().map(|(n, _)| *n).collect();
    let order = prepared
        .rewritten
        .bind_order(&names)
        .map_err(|e| Error::invalid(format!("binding {}: {e}", stmt.name())))?;
    let mut slots: Vec<Option<Value>> = binds.into_iter().map(|(_, v)| Some(v)).collect();
    let params: Vec<Value> = order.iter().map(|&i| slots[i].take().unwrap_or(Value::Null)).collect();
    Ok((prepared, params))
}

/// Runs a statement that returns at most one row.
pub(crate) async fn run_opt<S>(session: &mut S, stmt: Statement, binds: Binds) -> Result<Option<Row>>
where
    S: PgSession + ?Sized,
{
    Ok(run(session, stmt, binds).await?.into_iter().next())
}

/// The lane of each statement, and whether sending it twice is safe: the
/// executor may retry a repeatable statement after a lost connection.
///
/// Reads, heartbeats and progress change nothing on a second run (or only
/// extend a lease again). `insert_task` is repeatable because the task id is
/// made by the client, and so are the batched inserts: a second insert of
/// a committed task fails on the primary key and the store answers with
/// the row (or the batch's ids) already there. Everything
/// else would answer wrongly on a second run (a settlement would report a
/// lost lease, a cancel "nothing to cancel"), so it is never resent.
pub(crate) fn intent(stmt: Statement) -> (Lane, bool) {
    use Statement::*;
    let lane = match stmt {
        Heartbeat
        | HeartbeatBatch
        | HeartbeatBatchSkipLocked
        | Succeed
        | Complete
        | CompleteBatch
        | Fail
        | Release
        | LockTasks
        | HeldSettled
        | StepRecord
        | StepWait
        | StepWaitClose => Lane::Critical,
        _ => Lane::Ordinary,
    };
    let repeatable = matches!(
        stmt,
        ProtocolVersion
            | Installations
            | Get
            | GetByKey
            | GetStatus
            | GetStatusByKey
            | GetKey
            | List
            | Stats
            | QueueDepth
            | ClaimableProbe
            | InsertTask
            | InsertTaskBatch
            | InsertTaskBatchAlike
            | Heartbeat
            | HeartbeatBatch
            | HeartbeatBatchSkipLocked
            | Progress
            | LedgerCreate
            | LedgerExists
            | LedgerList
            | SetLockTimeout
            | SetTimeouts
            | LockKey
            | LockKeyShared
            | Clock
            | WaymarkLedgerCreate
            | WaymarkLedgerExists
            | WaymarkLedgerList
            | HeldList
            | StepList
    );
    (lane, repeatable)
}

fn prepared(stmt: Statement, binds: &Binds) -> Result<Arc<Prepared>> {
    let def = stmt.def();
    for (name, value) in binds {
        let param = def
            .param(name)
            .ok_or_else(|| Error::invalid(format!("binding {}: no parameter named {name}", stmt.name())))?;
        if !fits(param.ty, value) {
            return Err(Error::invalid(format!(
                "binding {}: parameter {name} is {}, got {}",
                stmt.name(),
                param.ty.sql_name(),
                value.kind()
            )));
        }
    }
    let optional = optional_params(stmt);
    let mut mask = 0u32;
    for (bit, name) in optional.iter().enumerate() {
        if binds.iter().any(|(n, v)| n == name && !v.is_null()) {
            mask |= 1 << bit;
        }
    }

    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(hit) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&(stmt, mask)) {
        return Ok(hit.clone());
    }

    let on: Vec<&str> =
        optional.iter().enumerate().filter(|(bit, _)| mask & (1 << bit) != 0).map(|(_, n)| *n).collect();
    let invalid =
        |e: waymark_dialect::DialectError| Error::invalid(format!("rewriting {}: {e}", stmt.name()));
    let specialised = waymark_dialect::specialise(def.sql, &on).map_err(invalid)?;
    let rewritten = waymark_dialect::rewrite(&specialised).map_err(invalid)?;
    let types = rewritten
        .names()
        .iter()
        .map(|n| def.param(n).map(|p| p.ty))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Error::invalid(format!("{}: sql uses an undeclared parameter", stmt.name())))?;
    let prepared = Arc::new(Prepared { rewritten, types });
    cache.lock().unwrap_or_else(|p| p.into_inner()).insert((stmt, mask), prepared.clone());
    Ok(prepared)
}

/// The parameters of `stmt` that appear as optional filters
/// (`(:p::t is null or ...)`), found by asking the dialect which ones
/// specialisation changes.
fn optional_params(stmt: Statement) -> &'static [&'static str] {
    static OPTIONAL: OnceLock<HashMap<Statement, Vec<&'static str>>> = OnceLock::new();
    OPTIONAL
        .get_or_init(|| {
            Statement::ALL
                .iter()
                .map(|&s| {
                    let def = s.def();
                    let names = def
                        .params
                        .iter()
                        .filter(|p| {
                            waymark_dialect::specialise(def.sql, &[p.name]).is_ok_and(|out| out != def.sql)
                        })
                        .map(|p| p.name)
                        .collect();
                    (s, names)
                })
                .collect()
        })
        .get(&stmt)
        .map_or(&[], Vec::as_slice)
}

fn fits(ty: ParamType, value: &Value) -> bool {
    matches!(
        (ty, value),
        (_, Value::Null)
            | (ParamType::Bool, Value::Bool(_))
            | (ParamType::Int4, Value::Int4(_))
            | (ParamType::Int8, Value::Int8(_))
            | (ParamType::Float8, Value::Float8(_))
            | (ParamType::Text, Value::Text(_))
            | (ParamType::TextArray, Value::TextArray(_) | Value::NullableTextArray(_))
            | (ParamType::Jsonb, Value::Jsonb(_))
            | (ParamType::Int4Array, Value::Int4Array(_))
            | (ParamType::Int8Array, Value::Int8Array(_))
            | (ParamType::JsonbArray, Value::JsonbArray(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optional_filters_are_found_from_the_sql() {
        assert_eq!(
            optional_params(Statement::List),
            ["status", "queue", "name", "root_id", "correlation_id"]
        );
        assert_eq!(optional_params(Statement::Claim), ["names"]);
        assert!(optional_params(Statement::InsertTask).is_empty());
    }

    #[test]
    fn a_filter_that_is_on_becomes_a_plain_predicate() {
        let binds: Binds = vec![
            ("status", Value::Null),
            ("queue", Value::from("q")),
            ("name", Value::Null),
            ("root_id", Value::Null),
            ("correlation_id", Value::Null),
            ("limit", Value::Int8(10)),
            ("offset", Value::Int8(0)),
        ];
        let p = prepared(Statement::List, &binds).expect("prepares");
        assert!(!p.rewritten.sql().contains("::text is null or queue"), "{}", p.rewritten.sql());
        assert!(p.rewritten.sql().contains("::text is null or status"));
        assert_eq!(p.types.len(), p.rewritten.names().len());
    }

    #[test]
    fn wrong_types_and_unknown_names_are_refused() {
        let err = prepared(Statement::Get, &vec![("id", Value::Int8(1))]).expect_err("type");
        assert!(err.to_string().contains("parameter id is text, got int8"), "{err}");
        let err = prepared(Statement::Get, &vec![("nope", Value::Null)]).expect_err("name");
        assert!(err.to_string().contains("no parameter named nope"), "{err}");
    }
}
