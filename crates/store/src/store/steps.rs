//! A run's durable steps (the bodies of `WorkerProtocol::steps` and
//! `record_step`; see their docs).

use std::time::Duration;

use serde_json::Value as Json;
use waymark_protocol::Statement;

use super::{finish, owned, Store};
use crate::error::{Error, Result};
use crate::executor::{Lane, PgExecutor};
use crate::lease::Lease;
use crate::options::{millis, non_empty};
use crate::statements::{run, run_opt, Binds};
use crate::steps::{EventWait, StepHistory, StepKind, StepRecord};
use crate::value::Value;
use crate::worker_protocol::MAX_SNOOZE;

/// `WorkerProtocol::steps`.
pub(super) async fn steps<E: PgExecutor>(store: &Store<E>, task_id: &str) -> Result<StepHistory> {
    let rows = run(&mut store.session()?, Statement::StepList, vec![("task_id", task_id.into())]).await?;
    let mut records = Vec::with_capacity(rows.len());
    let mut now_ms = None;
    for row in rows {
        let (record, now) = StepRecord::from_row(row)?;
        now_ms = Some(now);
        records.push(record);
    }
    Ok(StepHistory { records, now_ms })
}

/// `WorkerProtocol::record_step`.
pub(super) async fn record_step<E: PgExecutor>(
    store: &Store<E>,
    lease: &Lease,
    seq: i32,
    name: &str,
    kind: StepKind,
    result: Option<Json>,
    sleep: Duration,
) -> Result<(StepRecord, i64)> {
    let binds = step_binds(lease, seq, name, kind, result, sleep)?;
    let row = run_opt(&mut store.session()?, Statement::StepRecord, binds).await.map_err(name_taken)?;
    recorded(row, lease)
}

/// The binds of `step_record`, each checked.
fn step_binds(
    lease: &Lease,
    seq: i32,
    name: &str,
    kind: StepKind,
    result: Option<Json>,
    sleep: Duration,
) -> Result<Binds> {
    lease.check()?;
    non_empty("step name", name)?;
    if name.contains('\0') {
        return Err(Error::invalid("step name holds a NUL character"));
    }
    if result.as_ref().is_some_and(|r| r.to_string().contains("\\u0000")) {
        return Err(Error::invalid(format!(
            "step {name:?}: its result holds a NUL character, which jsonb cannot"
        )));
    }
    if seq < 0 {
        return Err(Error::invalid(format!("step place must not be negative, got {seq}")));
    }
    if sleep > MAX_SNOOZE {
        return Err(Error::invalid(format!("a sleep of {sleep:?} is longer than the most, {MAX_SNOOZE:?}")));
    }
    Ok(vec![
        ("task_id", lease.task_id().into()),
        ("worker_id", lease.worker_id().into()),
        ("seq", Value::Int4(seq)),
        ("name", name.into()),
        ("kind", kind.as_str().into()),
        ("result", result.map_or(Value::Null, Value::Jsonb)),
        ("sleep_ms", millis("sleep", sleep)?.into()),
    ])
}

/// `WorkerProtocol::record_step_in`.
pub(super) async fn record_step_in<E: PgExecutor>(
    store: &Store<E>,
    tx: &mut E::Transaction,
    lease: &Lease,
    seq: i32,
    name: &str,
    result: Json,
) -> Result<(StepRecord, i64)> {
    store.life.check()?;
    let binds = step_binds(lease, seq, name, StepKind::Step, Some(result), Duration::ZERO)?;
    let row = run_opt(tx, Statement::StepRecord, binds).await.map_err(name_taken)?;
    recorded(row, lease)
}

/// The record a `step_record` answered, or the lost lease its silence means.
fn recorded(row: Option<crate::value::Row>, lease: &Lease) -> Result<(StepRecord, i64)> {
    match row {
        Some(row) => StepRecord::from_row(row),
        None => Err(Error::LostLease {
            task_id: lease.task_id().to_owned(),
            worker_id: lease.worker_id().to_owned(),
        }),
    }
}

/// The recorded steps of purged tasks, forgotten (the retention sweep).
pub(crate) async fn forget<E: PgExecutor>(store: &Store<E>, ids: &[String]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    run(&mut store.session()?, Statement::StepForget, vec![("ids", ids.to_vec().into())]).await?;
    Ok(())
}

/// `WorkerProtocol::wait_for_event`.
pub(super) async fn wait_for_event<E: PgExecutor>(
    store: &Store<E>,
    lease: &Lease,
    seq: i32,
    event: &str,
    timeout: Duration,
) -> Result<EventWait> {
    lease.check()?;
    non_empty("event name", event)?;
    if event.contains('\0') {
        return Err(Error::invalid("event name holds a NUL character"));
    }
    if timeout > MAX_SNOOZE {
        return Err(Error::invalid(format!("a wait of {timeout:?} is longer than the most, {MAX_SNOOZE:?}")));
    }
    let lost =
        || Error::LostLease { task_id: lease.task_id().to_owned(), worker_id: lease.worker_id().to_owned() };
    let mut tx = store.begin(Lane::Critical).await?;
    let out = async {
        // The event's lock, shared (waits do not wait for each other; emit
        // takes it exclusively): an emit lands before the check or after
        // the snooze, never between.
        let key = format!("waymark_event:{event}");
        run(&mut tx, Statement::LockKeyShared, vec![("key", key.into())]).await?;
        let binds: Binds = vec![
            ("task_id", lease.task_id().into()),
            ("worker_id", lease.worker_id().into()),
            ("seq", Value::Int4(seq)),
            ("event", event.into()),
            ("timeout_ms", millis("timeout", timeout)?.into()),
        ];
        let row = run_opt(&mut tx, Statement::StepWait, binds).await.map_err(name_taken)?.ok_or_else(lost)?;
        let (record, now) = StepRecord::from_row(row)?;
        if record.kind != StepKind::Wait || record.name != event {
            return Err(Error::invalid(format!(
                "place {seq} of the run recorded {} {:?}, not a wait for {event:?}",
                record.kind.as_str(),
                record.name
            )));
        }
        if record.done && !record.timed_out {
            return Ok(EventWait::Received(record.result.unwrap_or(Json::Null)));
        }
        if record.timed_out {
            return Ok(EventWait::TimedOut);
        }
        let left = record.wake_at_ms.unwrap_or(now) - now;
        if left <= 0 {
            // Closed under the lock: no emit after this changes the answer.
            let binds: Binds = vec![("task_id", lease.task_id().into()), ("seq", Value::Int4(seq))];
            run(&mut tx, Statement::StepWaitClose, binds).await?;
            return Ok(EventWait::TimedOut);
        }
        let binds: Binds = vec![("delay_ms", left.into())];
        let task = owned(&mut tx, Statement::Release, binds, lease).await?;
        Ok(EventWait::Parked { left: Duration::from_millis(left as u64), status: task.status })
    }
    .await;
    finish(tx, out, "wait for event").await
}

/// 23505 on the step's name: the task's history holds the name at another
/// place, which the code does not match.
fn name_taken(e: Error) -> Error {
    if e.sqlstate() == Some("23505") {
        Error::invalid(format!("the task's history holds this step name at another place: {e}"))
    } else {
        e
    }
}
