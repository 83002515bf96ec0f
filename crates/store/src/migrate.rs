//! Installing and checking the schema: the ledger, the schema guard and the
//! protocol version check, in the connect order of protocol v1.

use std::collections::BTreeSet;

use waymark_protocol::{ledger_migrations, migrations, Migration, Statement, PROTOCOL_VERSION};

use crate::cells::{int8, opt_bool, opt_text, text};
use crate::error::{Error, Result};
use crate::executor::{Autocommit, ExecError, PgExecutor, PgSession, PgTransaction};
use crate::statements::{run, run_opt};
use crate::value::Value;

/// One migration file and whether the ledger records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationState {
    /// The file name, such as `0003_notify.sql`.
    pub name: &'static str,
    /// When it was applied (epoch ms), or `None` while pending.
    pub applied_at_ms: Option<i64>,
}

/// Bounds on one migration's transaction, as PostgreSQL durations (`30000ms`).
#[derive(Debug, Clone)]
pub(crate) struct MigrationTimeouts {
    pub(crate) lock: String,
    pub(crate) statement: String,
}

/// What `migrate` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrationReport {
    /// Files applied by this call, in order.
    pub applied: Vec<&'static str>,
    /// Files the ledger already recorded.
    pub skipped: usize,
}

pub(crate) fn check_schema_name(schema: &str) -> Result<()> {
    if waymark_protocol::is_valid_schema_name(schema) {
        Ok(())
    } else {
        Err(Error::invalid(format!("schema name {schema:?} must match ^[A-Za-z_][A-Za-z0-9_$]*$")))
    }
}

/// Creates `schema` if absent.
pub(crate) async fn create_schema<E: PgExecutor>(exec: &E, schema: &str) -> Result<()> {
    check_schema_name(schema)?;
    let script = waymark_protocol::create_schema_script(schema)
        .ok_or_else(|| Error::invalid(format!("schema name {schema:?} is not valid")))?;
    exec.execute_script(&script).await?;
    Ok(())
}

/// The schema guard: refuses a connection that would see a different
/// installation than intended.
pub(crate) async fn guard_schema<E: PgExecutor>(exec: &E, schema: Option<&str>) -> Result<()> {
    let rows = run(&mut Autocommit(exec), Statement::Installations, vec![]).await?;
    let mut current = None;
    let mut found = BTreeSet::new();
    for mut row in rows {
        current = opt_text(&mut row, "current_schema")?;
        if let Some(s) = opt_text(&mut row, "schema_name")? {
            found.insert(s);
        }
    }
    let elsewhere = || found.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ");
    match (schema, current.as_deref()) {
        (Some(want), Some(cur)) if want == cur => Ok(()),
        (Some(want), cur) => Err(Error::SchemaMismatch(format!(
            "schema {want:?} was asked for but the connection's current schema is {}; \
             every connection must set search_path to it",
            cur.map_or("none".to_owned(), |c| format!("{c:?}"))
        ))),
        (None, None) => Err(Error::SchemaMismatch(
            "the connection's search_path names no existing schema; pass a schema or fix search_path"
                .to_owned(),
        )),
        (None, Some(cur)) if !found.is_empty() && !found.contains(cur) => {
            Err(Error::SchemaMismatch(format!(
                "no installation in the current schema {cur:?}, but one exists in {}; \
             pass that schema explicitly (or set search_path) so that every process agrees",
                elsewhere()
            )))
        }
        (None, Some(_)) => Ok(()),
    }
}

/// A migration ledger: cairnq's (`cairnq_migrations`, shared with every
/// cairnq SDK) or waymark's own (`waymark_migrations`, for the ledgers of
/// held tasks and events), with its statements and its files.
struct Ledger {
    create: Statement,
    exists: Statement,
    lock: Statement,
    list: Statement,
    record: Statement,
    files: fn() -> &'static [Migration],
}

/// cairnq's first, then waymark's, whose tables may name cairnq's.
const LEDGERS: [Ledger; 2] = [
    Ledger {
        create: Statement::LedgerCreate,
        exists: Statement::LedgerExists,
        lock: Statement::LedgerLock,
        list: Statement::LedgerList,
        record: Statement::LedgerRecord,
        files: migrations,
    },
    Ledger {
        create: Statement::WaymarkLedgerCreate,
        exists: Statement::WaymarkLedgerExists,
        lock: Statement::WaymarkLedgerLock,
        list: Statement::WaymarkLedgerList,
        record: Statement::WaymarkLedgerRecord,
        files: ledger_migrations,
    },
];

/// Applies every pending migration, one transaction each, under its
/// ledger's exclusive lock, so concurrent migrators (waymark or any cairnq
/// SDK) apply each file exactly once: cairnq's files, then waymark's.
pub(crate) async fn migrate<E: PgExecutor>(exec: &E, limits: &MigrationTimeouts) -> Result<MigrationReport> {
    let mut report = MigrationReport::default();
    for ledger in &LEDGERS {
        create_ledger(exec, ledger.create).await?;
        for m in (ledger.files)() {
            let mut tx = exec.begin().await?;
            let outcome = apply_one(&mut tx, ledger, m, limits).await;
            match outcome {
                Ok(applied) => {
                    tx.commit()
                        .await
                        .map_err(|source| Error::Migration { name: m.name.to_owned(), source })?;
                    if applied {
                        tracing::info!(migration = m.name, "applied migration");
                        report.applied.push(m.name);
                    } else {
                        report.skipped += 1;
                    }
                }
                Err(e) => {
                    // The error is what matters; a failed rollback only means the
                    // connection is gone, which rolls back as well.
                    let _ = tx.rollback().await;
                    return Err(e);
                }
            }
        }
    }
    Ok(report)
}

/// `create table if not exists` is not atomic against a concurrent creator:
/// the loser of the race gets a unique violation (23505), "relation already
/// exists" (42P07) or "type already exists" (42710). Each means a concurrent
/// migrator created the ledger, which is all we need.
async fn create_ledger<E: PgExecutor>(exec: &E, create: Statement) -> Result<()> {
    match run(&mut Autocommit(exec), create, vec![]).await {
        Err(e) if matches!(e.sqlstate(), Some("23505" | "42P07" | "42710")) => Ok(()),
        other => other.map(|_| ()),
    }
}

async fn apply_one<S: PgSession + ?Sized>(
    tx: &mut S,
    ledger: &Ledger,
    m: &Migration,
    limits: &MigrationTimeouts,
) -> Result<bool> {
    let name = m.name;
    // 55P03: lock_timeout passed; 57014: statement_timeout passed.
    let wrap = |source: ExecError| match source.sqlstate() {
        Some("55P03") => Error::MigrationTimeout {
            name: name.to_owned(),
            waited_for_lock: true,
            limit: limits.lock.clone(),
        },
        Some("57014") => Error::MigrationTimeout {
            name: name.to_owned(),
            waited_for_lock: false,
            limit: limits.statement.clone(),
        },
        _ => Error::Migration { name: name.to_owned(), source },
    };
    let fail = |e: Error| match e {
        Error::Executor(source) => wrap(source),
        other => other,
    };
    let bounds = vec![
        ("lock_timeout", Value::from(limits.lock.as_str())),
        ("statement_timeout", Value::from(limits.statement.as_str())),
    ];
    run(tx, Statement::SetTimeouts, bounds).await.map_err(fail)?;
    run(tx, ledger.lock, vec![]).await.map_err(fail)?;
    let applied = applied_names(tx, ledger).await.map_err(fail)?;
    if applied.iter().any(|(n, _)| n == name) {
        return Ok(false);
    }
    tx.execute_script(m.sql).await.map_err(wrap)?;
    run(tx, ledger.record, vec![("name", Value::from(name))]).await.map_err(fail)?;
    Ok(true)
}

async fn applied_names<S: PgSession + ?Sized>(s: &mut S, ledger: &Ledger) -> Result<Vec<(String, i64)>> {
    run(s, ledger.list, vec![])
        .await?
        .into_iter()
        .map(|mut row| Ok((text(&mut row, "name")?, int8(&mut row, "applied_at_ms")?)))
        .collect()
}

/// Every embedded migration with its ledger state (cairnq's files, then
/// waymark's); changes nothing.
pub(crate) async fn status<E: PgExecutor>(exec: &E) -> Result<Vec<MigrationState>> {
    let mut session = Autocommit(exec);
    let mut out = Vec::new();
    for ledger in &LEDGERS {
        let present = match run_opt(&mut session, ledger.exists, vec![]).await? {
            Some(mut row) => opt_bool(&mut row, "present")?.unwrap_or(false),
            None => false,
        };
        let applied = if present { applied_names(&mut session, ledger).await? } else { Vec::new() };
        out.extend((ledger.files)().iter().map(|m| MigrationState {
            name: m.name,
            applied_at_ms: applied.iter().find(|(n, _)| n == m.name).map(|(_, at)| *at),
        }));
    }
    Ok(out)
}

/// The protocol version check; a missing meta row reads as 0.
pub(crate) async fn check_protocol_version<E: PgExecutor>(exec: &E) -> Result<()> {
    let found = match run_opt(&mut Autocommit(exec), Statement::ProtocolVersion, vec![]).await? {
        Some(mut row) => {
            let v = text(&mut row, "value")?;
            v.trim()
                .parse::<i64>()
                .map_err(|_| Error::Decode(format!("protocol_version {v:?} is not a number")))?
        }
        None => 0,
    };
    if found == PROTOCOL_VERSION {
        Ok(())
    } else {
        Err(Error::ProtocolVersionMismatch { found, expected: PROTOCOL_VERSION })
    }
}
