//! Lease renewal: one heartbeat, one worker id's batch (the protocol's
//! `heartbeat_batch`), and the worker's renewal of every lease it holds,
//! which a locked row cannot hold back.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use waymark_protocol::Statement;

use super::{finish, format_ms, owned, Store};
use crate::cells::{opt_bool, opt_int8, text};
use crate::error::{Error, Result};
use crate::executor::{Lane, PgExecutor};
use crate::lease::Lease;
use crate::options::{lease_millis, non_empty};
use crate::statements::{run, Binds};
use crate::task::{Beat, Renewal, Task};
use crate::value::Value;

/// `WorkerProtocol::heartbeat`.
pub(super) async fn heartbeat<E: PgExecutor>(
    store: &Store<E>,
    lease: &Lease,
    length: Duration,
) -> Result<Task> {
    let binds: Binds = vec![("lease_ms", lease_millis(length)?.into())];
    owned(&mut store.session()?, Statement::Heartbeat, binds, lease).await
}

/// `WorkerProtocol::heartbeat_batch`.
pub(super) async fn heartbeat_batch<E: PgExecutor>(
    store: &Store<E>,
    ids: &[String],
    worker_id: &str,
    length: Duration,
) -> Result<Vec<Beat>> {
    non_empty("worker_id", worker_id)?;
    let lease_ms = lease_millis(length)?;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let binds = beat_binds(ids, worker_id, lease_ms);
    let mut beats: Vec<Beat> = run(&mut store.session()?, Statement::HeartbeatBatch, binds)
        .await?
        .into_iter()
        .map(beat)
        .collect::<Result<_>>()?;
    let position = positions(ids);
    beats.sort_by_key(|b| position.get(b.id.as_str()).copied());
    Ok(beats)
}

/// `WorkerProtocol::renew_leases`.
pub(super) async fn renew_leases<E: PgExecutor>(
    store: &Store<E>,
    leases: &[Lease],
    length: Duration,
    wait: Duration,
) -> Result<Renewal> {
    let lease_ms = lease_millis(length)?;
    if leases.is_empty() {
        return Ok(Renewal::default());
    }
    // Each task's place in `leases` and its owner: the answer comes back in
    // that order, and the rows retried alone name their owners again.
    let mut known: HashMap<&str, (usize, &str)> = HashMap::with_capacity(leases.len());
    let (mut ids, mut owners) = (Vec::with_capacity(leases.len()), Vec::with_capacity(leases.len()));
    for (i, lease) in leases.iter().enumerate() {
        lease.check()?;
        if known.insert(lease.task_id(), (i, lease.worker_id())).is_some() {
            return Err(Error::invalid(format!(
                "renew_leases names task {} twice: one lease per task (its answer is by task id)",
                lease.task_id()
            )));
        }
        ids.push(lease.task_id().to_owned());
        owners.push(lease.worker_id().to_owned());
    }
    let owners_of = |ids: &[String]| -> Vec<String> {
        ids.iter().map(|id| known.get(id.as_str()).map_or("", |k| k.1).to_owned()).collect()
    };
    let position = |b: &Beat| known.get(b.id.as_str()).map(|k| k.0);
    let binds = owned_beat_binds(ids, owners, lease_ms);
    let mut renewal = Renewal::default();
    let mut owned = Vec::new();
    for mut row in run(&mut store.session()?, Statement::HeartbeatBatchSkipLocked, binds).await? {
        let renewed = opt_bool(&mut row, "renewed")? == Some(true);
        let beat = beat(row)?;
        if renewed {
            renewal.renewed.push(beat);
        } else {
            owned.push(beat);
        }
    }
    let done: std::collections::HashSet<&str> = renewal.renewed.iter().map(|b| b.id.as_str()).collect();
    let mut held: Vec<Beat> = owned.into_iter().filter(|b| !done.contains(b.id.as_str())).collect();
    if !held.is_empty() {
        held.sort_by_key(position);
        // Bounded so that any `wait` fits PostgreSQL's timeouts.
        let deadline = Instant::now() + wait.min(Duration::from_secs(3600));
        // All of them first, in one statement with a short wait: the
        // usual holder is the worker's own settlement batch, which
        // commits within milliseconds and holds hundreds of rows, too
        // many for a transaction each.
        let all: Vec<String> = held.iter().map(|b| b.id.clone()).collect();
        let mut stopped = false;
        let owners = owners_of(&all);
        match store.renew_waiting(all, owners, lease_ms, wait.min(SHORT_RENEWAL_WAIT)).await {
            Ok(beats) => {
                renewal.renewed.extend(beats); // the rest were lost meanwhile
                held.clear();
            }
            // A deadlock with another transaction's locks is as passing.
            Err(e) if waited_too_long(&e) || e.sqlstate() == Some("40P01") => {}
            Err(e) => {
                tracing::warn!(error = %e, "renewing the leases whose rows were held failed");
                stopped = true;
            }
        }
        // Then one row per transaction, so a row still locked at its
        // bound costs only itself. First a short wait for each (the lock
        // of a settlement or a progress write lasts about a commit),
        // then an equal share of what is left for each still held, so
        // one row locked for long cannot spend the others' wait.
        for short in [true, false] {
            let rows = std::mem::take(&mut held);
            let count = rows.len();
            for (i, was) in rows.into_iter().enumerate() {
                let left = deadline.saturating_duration_since(Instant::now());
                if stopped || left.is_zero() {
                    renewal.held.push(was);
                    continue;
                }
                let share = left / u32::try_from(count - i).unwrap_or(u32::MAX);
                let bound = if short { share.min(SHORT_RENEWAL_WAIT) } else { share };
                let one = vec![was.id.clone()];
                let owners = owners_of(&one);
                match store.renew_waiting(one, owners, lease_ms, bound).await {
                    Ok(beats) => renewal.renewed.extend(beats), // none: lost meanwhile
                    Err(e) if waited_too_long(&e) => held.push(was),
                    Err(e) => {
                        // Still owned as far as anyone knows; the next
                        // call tries again. The renewals made stand.
                        tracing::warn!(task = %was.id, error = %e, "renewing a lease whose row was held failed");
                        renewal.held.push(was);
                        stopped = true;
                    }
                }
            }
        }
        renewal.held.append(&mut held);
    }
    renewal.renewed.sort_by_key(position);
    renewal.held.sort_by_key(position);
    Ok(renewal)
}

impl<E: PgExecutor> Store<E> {
    /// `heartbeat_batch` of `ids`, each owned by its element of `owners`,
    /// in a transaction whose lock waits end after `wait`: the beats of
    /// those still owned.
    async fn renew_waiting(
        &self,
        ids: Vec<String>,
        owners: Vec<String>,
        lease_ms: i64,
        wait: Duration,
    ) -> Result<Vec<Beat>> {
        // `lock_timeout` bounds each lock wait, one per row at worst; the
        // statement bounds them together, with room (as much again, 100 ms
        // at least, 1 s at most) for a renewal slow for want of CPU.
        let lock = format_ms(wait.max(Duration::from_millis(1)));
        let statement = format_ms(wait + (wait + Duration::from_millis(100)).min(Duration::from_secs(1)));
        let timeouts: Binds =
            vec![("lock_timeout", lock.as_str().into()), ("statement_timeout", statement.as_str().into())];
        let binds = owned_beat_binds(ids, owners, lease_ms);
        let mut tx = self.begin_bounded(Lane::Critical, Statement::SetTimeouts, timeouts).await?;
        let out = match run(&mut tx, Statement::HeartbeatBatch, binds).await {
            Ok(rows) => rows.into_iter().map(beat).collect::<Result<Vec<Beat>>>(),
            Err(e) => Err(e),
        };
        finish(tx, out, "renewing held leases").await
    }
}

/// Each id's place in `ids`, to answer in the order asked.
fn positions(ids: &[String]) -> std::collections::HashMap<&str, usize> {
    ids.iter().enumerate().map(|(i, id)| (id.as_str(), i)).collect()
}

/// Whether a renewal of held rows ran out of its time: a lock wait past
/// `lock_timeout`, or the statement past `statement_timeout` (57014).
fn waited_too_long(e: &Error) -> bool {
    e.is_lock_timeout() || e.sqlstate() == Some("57014")
}

/// The binds of a batch heartbeat of one worker id (the caller has checked
/// it): the protocol's statement.
fn beat_binds(ids: &[String], worker_id: &str, lease_ms: i64) -> Binds {
    vec![
        ("lease_ms", lease_ms.into()),
        ("ids", ids.to_vec().into()),
        ("worker_id", worker_id.into()),
        ("worker_ids", Value::Null),
    ]
}

/// The binds of a batch heartbeat whose ids each name their owner.
fn owned_beat_binds(ids: Vec<String>, owners: Vec<String>, lease_ms: i64) -> Binds {
    vec![
        ("lease_ms", lease_ms.into()),
        ("ids", ids.into()),
        ("worker_id", Value::Null),
        ("worker_ids", owners.into()),
    ]
}

/// How long `renew_leases` first waits for each held row's lock.
const SHORT_RENEWAL_WAIT: Duration = Duration::from_millis(100);

/// A lease renewal's row: the task and its cancel request.
fn beat(mut row: crate::value::Row) -> Result<Beat> {
    Ok(Beat {
        id: text(&mut row, "id")?,
        cancel_requested_at_ms: opt_int8(&mut row, "cancel_requested_at_ms")?,
    })
}
