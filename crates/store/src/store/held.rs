//! Held tasks and events: submitting them (alone, or a flow at once),
//! emitting events, reading the ledger, an operator's release, skip and
//! drop, and the ledger's upkeep. Every write runs in one transaction, in
//! autocommit or, as `*_in`, inside the caller's.

use std::time::Duration;

use serde_json::Value as Json;
use waymark_protocol::Statement;

use super::{finish, Store};
use crate::cells::{int8, json_cell, text};
use crate::error::{Error, Result};
use crate::executor::{Lane, PgExecutor, PgSession};
use crate::held::{longest_wait, submit_rows, Flow, Held};
use crate::held_view::{HeldFilter, HeldReceipt, HeldState, HeldSweep, HeldTask};
use crate::options::{millis, non_empty};
use crate::statements::{run, run_opt, Binds};
use crate::value::Value;

/// How long [`Store::emit`] keeps an event for tasks held for it later.
pub const EVENT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

impl<E: PgExecutor> Store<E> {
    /// Submits one held task (see [`Held`]) and answers whether nothing
    /// held it, so it went into `cairnq_tasks` at once.
    pub async fn hold(&self, task: impl Into<Held>) -> Result<HeldReceipt> {
        let mut out = self.hold_all(&[task.into()]).await?;
        Ok(out.remove(0))
    }

    /// [`Store::hold`] inside the caller's transaction.
    pub async fn hold_in(&self, tx: &mut E::Transaction, task: impl Into<Held>) -> Result<HeldReceipt> {
        self.life.check()?;
        let mut out = submit(tx, &[task.into()]).await?;
        Ok(out.remove(0))
    }

    /// Submits every task of `flow` in one transaction, or none: a cycle,
    /// an id that exists nowhere in this database, or a dependency that
    /// already ended without success is refused with
    /// [`Error::InvalidArgument`] naming it, and nothing is written.
    pub async fn submit_flow(&self, flow: &Flow) -> Result<Vec<HeldReceipt>> {
        self.hold_all(flow.tasks()).await
    }

    /// [`Store::submit_flow`] inside the caller's transaction.
    pub async fn submit_flow_in(&self, tx: &mut E::Transaction, flow: &Flow) -> Result<Vec<HeldReceipt>> {
        self.life.check()?;
        submit(tx, flow.tasks()).await
    }

    async fn hold_all(&self, tasks: &[Held]) -> Result<Vec<HeldReceipt>> {
        submit_rows(tasks)?;
        for attempt in 1.. {
            let mut tx = self.begin(Lane::Ordinary).await?;
            let out = submit(&mut tx, tasks).await;
            match finish(tx, out, "hold").await {
                Err(e) if deadlocked(&e) && attempt < DEADLOCK_TRIES => continue,
                other => return other,
            }
        }
        unreachable!("the loop returns")
    }

    /// Emits the event `name` with `payload`: every task held for it gets
    /// the payload and goes, if nothing else holds it, in this transaction;
    /// the event is kept for [`EVENT_RETENTION`] so that a task held for it
    /// later goes at once. Answers how many held tasks it reached.
    pub async fn emit(&self, name: &str, payload: Json) -> Result<u64> {
        self.emit_kept(name, payload, EVENT_RETENTION).await
    }

    /// [`Store::emit`], keeping the event for `keep` (zero: only tasks held
    /// for it now get it).
    pub async fn emit_kept(&self, name: &str, payload: Json, keep: Duration) -> Result<u64> {
        for attempt in 1.. {
            let mut tx = self.begin(Lane::Ordinary).await?;
            let out = emit(&mut tx, name, payload.clone(), keep).await;
            match finish(tx, out, "emit").await {
                Err(e) if deadlocked(&e) && attempt < DEADLOCK_TRIES => continue,
                other => return other,
            }
        }
        unreachable!("the loop returns")
    }

    /// [`Store::emit`] inside the caller's transaction: the event exists,
    /// and the tasks it reaches go, only if the caller commits.
    pub async fn emit_in(&self, tx: &mut E::Transaction, name: &str, payload: Json) -> Result<u64> {
        self.life.check()?;
        emit(tx, name, payload, EVENT_RETENTION).await
    }

    /// The ledger's row of task `id`, if it has one (a held task, one
    /// released from it, or a plain task a held task depends on).
    pub async fn held(&self, id: &str) -> Result<Option<HeldTask>> {
        let binds: Binds = vec![
            ("id", id.into()),
            ("state", Value::Null),
            ("order_key", Value::Null),
            ("flow_id", Value::Null),
            ("limit", 1i64.into()),
        ];
        let row = run_opt(&mut self.session()?, Statement::HeldList, binds).await;
        row.map_err(ledger_error)?.map(HeldTask::from_row).transpose()
    }

    /// The ledger's rows under `filter`, newest first.
    pub async fn list_held(&self, filter: &HeldFilter) -> Result<Vec<HeldTask>> {
        if filter.limit < 1 {
            return Err(Error::invalid(format!("limit must be at least 1, got {}", filter.limit)));
        }
        let binds: Binds = vec![
            ("id", Value::Null),
            ("state", filter.state.map(HeldState::as_str).into()),
            ("order_key", filter.order_key.as_deref().into()),
            ("flow_id", filter.flow_id.as_deref().into()),
            ("limit", filter.limit.into()),
        ];
        let rows = run(&mut self.session()?, Statement::HeldList, binds).await.map_err(ledger_error)?;
        rows.into_iter().map(HeldTask::from_row).collect()
    }

    /// An operator's release of a held task: it goes now, whatever it waits
    /// for (out of its key's turn, if it had not come).
    pub async fn release_held(&self, id: &str) -> Result<HeldState> {
        self.operate(id, "release").await
    }

    /// An operator's skip: a held task never runs, and what waits on it
    /// goes on as if it had succeeded; a released task that ended without
    /// success and holds its key lets the key go on.
    pub async fn skip_held(&self, id: &str) -> Result<HeldState> {
        self.operate(id, "skip").await
    }

    /// An operator's drop: a held task is canceled, with every task held
    /// behind it (its key goes on past it); a released task that ended
    /// without success and holds its key lets the key go on, and what
    /// depended on it stays canceled.
    pub async fn drop_held(&self, id: &str) -> Result<HeldState> {
        self.operate(id, "drop").await
    }

    async fn operate(&self, id: &str, action: &'static str) -> Result<HeldState> {
        non_empty("task id", id)?;
        for attempt in 1.. {
            let mut tx = self.begin(Lane::Ordinary).await?;
            let out = async {
                let binds: Binds = vec![("id", id.into()), ("action", action.into())];
                let mut row = run_opt(&mut tx, Statement::HeldOperate, binds)
                    .await
                    .map_err(ledger_error)?
                    .ok_or_else(|| Error::Decode("held_operate answered no row".to_owned()))?;
                HeldState::parse(&text(&mut row, "state")?)
            }
            .await;
            match finish(tx, out, "held operation").await {
                Err(e) if deadlocked(&e) && attempt < DEADLOCK_TRIES => continue,
                other => return other,
            }
        }
        unreachable!("the loop returns")
    }

    /// One pass of the held ledger's upkeep, up to `limit` rows a part:
    /// passes on the ends of released tasks that no settlement passed on,
    /// applies event deadlines, forgets expired events. A waymark worker
    /// runs it every second; run it where no worker does.
    pub async fn sweep_held(&self, limit: i64) -> Result<HeldSweep> {
        if limit < 1 {
            return Err(Error::invalid(format!("limit must be at least 1, got {limit}")));
        }
        let mut tx = self.begin(Lane::Ordinary).await?;
        let out = async {
            let mut row = run_opt(&mut tx, Statement::HeldSweep, vec![("limit", limit.into())])
                .await
                .map_err(ledger_error)?
                .ok_or_else(|| Error::Decode("held_sweep answered no row".to_owned()))?;
            let counts = json_cell(&mut row, "counts")?.map_err(Error::Decode)?;
            Ok(HeldSweep::from_json(&counts.unwrap_or(Json::Null)))
        }
        .await;
        finish(tx, out, "held sweep").await
    }

    /// Forgets ended ledger rows (done or canceled longer ago than
    /// `older_than`), oldest first, up to `limit`, and keys that hold
    /// nothing; answers the ids forgotten. The retention sweeper runs it
    /// with the task table's purge.
    pub async fn purge_held(&self, older_than: Duration, limit: i64) -> Result<Vec<String>> {
        if limit < 1 {
            return Err(Error::invalid(format!("limit must be at least 1, got {limit}")));
        }
        let binds: Binds =
            vec![("older_than_ms", millis("older_than", older_than)?.into()), ("limit", limit.into())];
        let rows = run(&mut self.session()?, Statement::HeldPurge, binds).await.map_err(ledger_error)?;
        rows.into_iter().map(|mut r| text(&mut r, "id")).collect()
    }
}

async fn submit<S: PgSession + ?Sized>(s: &mut S, tasks: &[Held]) -> Result<Vec<HeldReceipt>> {
    let rows = submit_rows(tasks)?;
    let answered =
        run(s, Statement::HeldSubmit, vec![("rows", Value::Jsonb(rows))]).await.map_err(ledger_error)?;
    answered
        .into_iter()
        .map(|mut row| {
            Ok(HeldReceipt { id: text(&mut row, "id")?, released: text(&mut row, "state")? == "released" })
        })
        .collect()
}

async fn emit<S: PgSession + ?Sized>(s: &mut S, name: &str, payload: Json, keep: Duration) -> Result<u64> {
    non_empty("event name", name)?;
    if name.contains('\0') {
        return Err(Error::invalid("event name holds a NUL character"));
    }
    let binds: Binds = vec![
        ("name", name.into()),
        ("payload", payload.into()),
        ("keep_ms", longest_wait("keep", keep)?.into()),
    ];
    let mut row = run_opt(s, Statement::HeldEmit, binds)
        .await
        .map_err(ledger_error)?
        .ok_or_else(|| Error::Decode("held_emit answered no row".to_owned()))?;
    Ok(u64::try_from(int8(&mut row, "reached")?).unwrap_or(0))
}

/// Passes on the ends of `ids` (released held tasks just settled) in the
/// settlement's own transaction: see `held_settled.sql`.
pub(super) async fn settled<S: PgSession + ?Sized>(s: &mut S, ids: Vec<String>) -> Result<()> {
    run(s, Statement::HeldSettled, vec![("ids", Value::TextArray(ids))]).await.map_err(ledger_error)?;
    Ok(())
}

/// How many times an operation of the ledger that runs in a transaction of
/// its own is tried when the server breaks a deadlock by rolling it back
/// (40P01: two transactions took the same rows and keys in different
/// orders; the one rolled back wrote nothing). The `*_in` forms leave that
/// to the caller, whose transaction the server rolled back.
const DEADLOCK_TRIES: u32 = 3;

fn deadlocked(e: &Error) -> bool {
    e.sqlstate() == Some("40P01")
}

/// The ledger's refusals: WM400 names bad input, WM404 a missing task.
fn ledger_error(e: Error) -> Error {
    let message = e.exec_error().map(|x| x.message().to_owned());
    match (e.sqlstate(), message) {
        (Some("WM400"), Some(m)) => Error::InvalidArgument(m),
        (Some("WM404"), Some(m)) => Error::NotFound { what: m },
        _ => e,
    }
}
