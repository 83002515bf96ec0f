//! The worker's side before settlement: the claim pass, heartbeats,
//! progress.

use std::time::{Duration, Instant};

use waymark_protocol::Statement;

use super::settle::fail;
use super::{finish, format_ms, owned, Store};
use crate::error::{Error, Result};
use crate::executor::{Lane, PgExecutor, PgSession};
use crate::lease::Lease;
use crate::observe;
use crate::options::{lease_millis, non_empty, ClaimRequest, Failure};
use crate::statements::{run, run_opt, Binds};
use crate::task::{opt_bool, opt_int8, text, Beat, ErrorEnvelope, Renewal, Task};

mod limited;

impl<E: PgExecutor> Store<E> {
    /// One claim pass: a cheap probe outside any transaction; if it finds an
    /// expired lease, one transaction that recovers expired leases and then
    /// claims (so the pass that recovers a task has the first pick of it);
    /// if it finds only due work, the claim statement alone in autocommit,
    /// which skips locked rows and so never waits on a lock. With
    /// [`ClaimRequest::probe`] off, the pass is that claim statement alone.
    /// Rows come back in no particular order.
    ///
    /// A claimed task whose payload or metadata cannot be read
    /// ([`Task::input_unreadable`]) is never handed out: it fails for good,
    /// and the pass claims again in its place (up to `limit` more such rows,
    /// within a quarter of the lease), so a short answer means the queues
    /// ran dry, short of a run of unreadable rows longer than that.
    ///
    /// Under a [`ClaimRequest::fleet_limit`], the claim waits for its turn
    /// [`FLEET_LIMIT_TURN_WAIT`](crate::FLEET_LIMIT_TURN_WAIT) at most:
    /// past it (another claimer holds the turn that long), it fails with
    /// [`Error::LockTimeout`], having claimed nothing, and may be tried
    /// again at once.
    pub async fn claim(&self, req: &ClaimRequest) -> Result<Vec<Task>> {
        non_empty("worker_id", &req.worker_id)?;
        lease_millis(req.lease)?;
        if let Some(limit) = &req.fleet_limit {
            limit.check()?;
        }
        if req.limit <= 0 || req.queues.is_empty() || req.names.as_ref().is_some_and(Vec::is_empty) {
            return Ok(Vec::new());
        }
        let scope = observe::start(self.observer(), |o| o.claim(&req.queues));
        let out = self.claim_observed(req).await;
        observe::end(scope, out.as_deref());
        out
    }

    async fn claim_observed(&self, req: &ClaimRequest) -> Result<Vec<Task>> {
        let started = std::time::Instant::now();
        let mut claimed = self.claim_pass(req).await?;
        let (mut readable, mut failed) = self.fail_unreadable(claimed).await;
        // Claim again in place of what was failed, while the leases already
        // taken are young (nobody renews them until this returns): at most
        // `limit` more unreadable rows, within a quarter of the lease. A
        // failure that did not land is not replaced.
        let budget = req.lease / 4;
        let mut refilled = 0i64;
        while failed > 0 && started.elapsed() < budget {
            // No more than the claim is short of, than were failed, or than
            // the refill's bound has left.
            let short = req.limit - i64::try_from(readable.len()).unwrap_or(req.limit);
            let want = short.min(i64::try_from(failed).unwrap_or(i64::MAX)).min(req.limit - refilled);
            if want <= 0 {
                break;
            }
            refilled += want;
            let refill = ClaimRequest { limit: want, probe: false, ..req.clone() };
            claimed = match self.draw(&refill, false).await {
                Ok(more) => more,
                // The tasks already claimed are this caller's now: hand them
                // out rather than strand them until their leases expire.
                Err(e) => {
                    tracing::warn!(error = %e, "claiming in place of unreadable tasks failed");
                    break;
                }
            };
            let (more, more_failed) = self.fail_unreadable(claimed).await;
            readable.extend(more);
            failed = more_failed;
        }
        Ok(readable)
    }

    async fn claim_pass(&self, req: &ClaimRequest) -> Result<Vec<Task>> {
        if req.probe {
            let binds: Binds =
                vec![("queues", req.queues.clone().into()), ("names", req.names.clone().into())];
            let (due, expired) = match run_opt(&mut self.session()?, Statement::ClaimableProbe, binds).await?
            {
                Some(mut row) => (
                    crate::task::opt_bool(&mut row, "due")?.unwrap_or(false),
                    crate::task::opt_bool(&mut row, "expired")?.unwrap_or(false),
                ),
                None => (false, false),
            };
            if !due && !expired {
                return Ok(Vec::new());
            }
            return self.draw(req, expired).await;
        }
        self.draw(req, false).await
    }

    /// The claim statement: alone in autocommit when it can be, in one
    /// transaction after lease recovery (`recover`) or after a fleet
    /// limit's lock (its turn, waited for a short while only), which must
    /// be held while the running rows are counted and the claim commits.
    async fn draw(&self, req: &ClaimRequest, recover: bool) -> Result<Vec<Task>> {
        if !recover && req.fleet_limit.is_none() {
            return claim_draw(&mut self.session()?, req).await;
        }
        let mut tx = match &req.fleet_limit {
            Some(limit) => self.begin_turn(limit).await?,
            None => self.begin(Lane::Ordinary).await?,
        };
        let out = async {
            if recover {
                recover_leases(&mut tx).await?;
            }
            claim_draw(&mut tx, req).await
        }
        .await;
        finish(tx, out, "claim").await
    }

    /// Fails for good each claimed task whose input cannot be read (no
    /// handler could see its payload as written), with an envelope naming
    /// the column. Returns the rest and how many were failed. If that write
    /// fails too, the task is left to its lease, which expires and brings it
    /// back here; it is not counted, so the caller does not claim again.
    async fn fail_unreadable(&self, claimed: Vec<Task>) -> (Vec<Task>, usize) {
        if !claimed.iter().any(Task::input_unreadable) {
            return (claimed, 0);
        }
        let mut readable = Vec::with_capacity(claimed.len());
        let mut failed = 0;
        for task in claimed {
            if !task.input_unreadable() {
                readable.push(task);
                continue;
            }
            let why = task.unreadable.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
            let envelope = ErrorEnvelope {
                details: serde_json::json!({ "unreadable": task.unreadable }),
                ..ErrorEnvelope::new(
                    "UnreadableTask",
                    crate::task::codes::TASK_ERROR,
                    format!("waymark cannot read this task's row: {why}"),
                    false,
                )
            };
            let failure = Failure::new(envelope.to_json()).retryable(false);
            tracing::warn!(task = %task.id, reason = %why, "claimed a task whose input cannot be read; failing it");
            let out = match (task.lease(), self.session()) {
                (Ok(lease), Ok(mut session)) => fail(&mut session, &lease, &failure).await,
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
            match out {
                Ok(_) => failed += 1,
                Err(e) => {
                    tracing::warn!(task = %task.id, error = %e, "failing an unreadable task failed; its lease will expire");
                }
            }
        }
        (readable, failed)
    }

    /// Extends a lease; [`Error::LostLease`] if the worker no longer holds it.
    pub async fn heartbeat(&self, lease: &Lease, length: Duration) -> Result<Task> {
        let binds: Binds = vec![("lease_ms", lease_millis(length)?.into())];
        owned(&mut self.session()?, Statement::Heartbeat, binds, lease).await
    }

    /// Extends every lease in `ids` at once. Returns the tasks still owned,
    /// in the order of `ids`; a missing id is a lost lease.
    pub async fn heartbeat_batch(
        &self,
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
        let mut beats: Vec<Beat> = run(&mut self.session()?, Statement::HeartbeatBatch, binds)
            .await?
            .into_iter()
            .map(beat)
            .collect::<Result<_>>()?;
        let position = positions(ids);
        beats.sort_by_key(|b| position.get(b.id.as_str()).copied());
        Ok(beats)
    }

    /// Extends every lease in `ids`, as [`Store::heartbeat_batch`] does,
    /// without letting a locked row hold back the others. One statement
    /// renews every owned row it can lock at once and skips the rows another
    /// transaction holds; those alone are then renewed in one statement
    /// waiting up to 100 ms for each lock (about 200 ms in all), and if
    /// that times out, one by one, in the order of `ids`, each waiting up to
    /// 100 ms, then those still locked each with an equal share of what is
    /// left of `wait` (all of them together take about `wait` at most, and
    /// at least the first statement's 200 ms; keep it under the executor's
    /// query timeout). A row still locked then, whose renewal failed, or
    /// not tried after an earlier one failed, is reported
    /// [`Renewal::held`], not lost: a later call renews it, and if its
    /// lease runs out first the row drops out of the owned set as any lost
    /// lease does. Both lists keep the order of `ids`; an id in neither has
    /// lost its lease.
    ///
    /// `heartbeat_batch` waits for every lock in its one statement: a
    /// transaction holding one task's row for long (an operator's update, a
    /// handler that locked its own row) keeps every lease in the batch from
    /// renewal meanwhile.
    pub async fn renew_leases(
        &self,
        ids: &[String],
        worker_id: &str,
        length: Duration,
        wait: Duration,
    ) -> Result<Renewal> {
        non_empty("worker_id", worker_id)?;
        let lease_ms = lease_millis(length)?;
        if ids.is_empty() {
            return Ok(Renewal::default());
        }
        let binds = beat_binds(ids, worker_id, lease_ms);
        let mut renewal = Renewal::default();
        let mut owned = Vec::new();
        for mut row in run(&mut self.session()?, Statement::HeartbeatBatchSkipLocked, binds).await? {
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
        let position = positions(ids);
        if !held.is_empty() {
            held.sort_by_key(|b| position.get(b.id.as_str()).copied());
            // Bounded so that any `wait` fits PostgreSQL's timeouts.
            let deadline = Instant::now() + wait.min(Duration::from_secs(3600));
            // All of them first, in one statement with a short wait: the
            // usual holder is the worker's own settlement batch, which
            // commits within milliseconds and holds hundreds of rows, too
            // many for a transaction each.
            let all: Vec<String> = held.iter().map(|b| b.id.clone()).collect();
            let mut stopped = false;
            match self.renew_waiting(&all, worker_id, lease_ms, wait.min(SHORT_RENEWAL_WAIT)).await {
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
                    match self.renew_waiting(std::slice::from_ref(&was.id), worker_id, lease_ms, bound).await
                    {
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
        renewal.renewed.sort_by_key(|b| position.get(b.id.as_str()).copied());
        renewal.held.sort_by_key(|b| position.get(b.id.as_str()).copied());
        Ok(renewal)
    }

    /// `heartbeat_batch` of `ids` in a transaction whose lock waits end
    /// after `wait`: the beats of those still owned.
    async fn renew_waiting(
        &self,
        ids: &[String],
        worker_id: &str,
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
        let binds = beat_binds(ids, worker_id, lease_ms);
        let mut tx = self.begin_bounded(Lane::Critical, Statement::SetTimeouts, timeouts).await?;
        let out = match run(&mut tx, Statement::HeartbeatBatch, binds).await {
            Ok(rows) => rows.into_iter().map(beat).collect::<Result<Vec<Beat>>>(),
            Err(e) => Err(e),
        };
        finish(tx, out, "renewing held leases").await
    }

    /// Records progress (`[0, 1]`) and/or a message; `None` keeps a field.
    pub async fn progress(
        &self,
        lease: &Lease,
        progress: Option<f64>,
        message: Option<&str>,
    ) -> Result<Task> {
        if let Some(p) = progress.filter(|p| !(0.0..=1.0).contains(p)) {
            return Err(Error::invalid(format!("progress must be within [0, 1], got {p}")));
        }
        let binds: Binds = vec![("progress", progress.into()), ("message", message.into())];
        owned(&mut self.session()?, Statement::Progress, binds, lease).await
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

/// The binds of a batch heartbeat (the caller has checked `worker_id`).
fn beat_binds(ids: &[String], worker_id: &str, lease_ms: i64) -> Binds {
    vec![("lease_ms", lease_ms.into()), ("ids", ids.to_vec().into()), ("worker_id", worker_id.into())]
}

/// How long [`Store::renew_leases`] first waits for each held row's lock.
const SHORT_RENEWAL_WAIT: Duration = Duration::from_millis(100);

/// A lease renewal's row: the task and its cancel request.
fn beat(mut row: crate::value::Row) -> Result<Beat> {
    Ok(Beat {
        id: text(&mut row, "id")?,
        cancel_requested_at_ms: opt_int8(&mut row, "cancel_requested_at_ms")?,
    })
}

async fn recover_leases<S: PgSession + ?Sized>(s: &mut S) -> Result<usize> {
    let envelope = ErrorEnvelope::lease_expired().to_json();
    let rows = run(s, Statement::RecoverLeases, vec![("lease_expired_error", envelope.into())]).await?;
    if !rows.is_empty() {
        tracing::info!(recovered = rows.len(), "recovered expired leases");
    }
    Ok(rows.len())
}

/// The claim draw, using the variant whose equality predicates let an index
/// serve the claim order.
async fn claim_draw<S: PgSession + ?Sized>(s: &mut S, req: &ClaimRequest) -> Result<Vec<Task>> {
    if let Some(limit) = &req.fleet_limit {
        return limited::claim_limited(s, req, limit).await;
    }
    let one_queue = match req.queues.as_slice() {
        [q] => Some(q.as_str()),
        _ => None,
    };
    let one_name = match req.names.as_deref() {
        Some([n]) => Some(n.as_str()),
        _ => None,
    };
    let mut binds: Binds = vec![
        ("worker_id", req.worker_id.as_str().into()),
        ("lease_ms", lease_millis(req.lease)?.into()),
        ("limit", req.limit.into()),
    ];
    let stmt = match (one_queue, one_name) {
        (Some(q), Some(n)) => {
            binds.extend([("queue", q.into()), ("name", n.into())]);
            Statement::ClaimOneQueueOneName
        }
        (Some(q), None) => {
            binds.extend([("queue", q.into()), ("names", req.names.clone().into())]);
            Statement::ClaimOneQueue
        }
        (None, Some(n)) => {
            binds.extend([("queues", req.queues.clone().into()), ("name", n.into())]);
            Statement::ClaimOneName
        }
        (None, None) => {
            binds.extend([("queues", req.queues.clone().into()), ("names", req.names.clone().into())]);
            Statement::Claim
        }
    };
    claimed(s, stmt, binds, &req.worker_id).await
}

/// Runs a claim statement, whose rows are `Task::from_claimed_rows`'.
async fn claimed<S: PgSession + ?Sized>(
    s: &mut S,
    stmt: Statement,
    binds: Binds,
    worker_id: &str,
) -> Result<Vec<Task>> {
    Task::from_claimed_rows(run(s, stmt, binds).await?, worker_id)
}
