//! The worker's side before settlement: the claim pass and progress
//! (lease renewal is `renew.rs`).

use waymark_protocol::Statement;

use super::settle::fail_owned;
use super::{finish, owned, Store};
use crate::cells::opt_bool;
use crate::error::{Error, Result};
use crate::executor::{Lane, PgExecutor, PgSession};
use crate::lease::Lease;
use crate::observe;
use crate::options::{lease_millis, non_empty, ClaimRequest, Failure};
use crate::statements::{run, run_opt, Binds};
use crate::task::{ErrorEnvelope, Task};

mod limited;

/// `WorkerProtocol::claim`.
pub(super) async fn claim<E: PgExecutor>(store: &Store<E>, req: &ClaimRequest) -> Result<Vec<Task>> {
    non_empty("worker_id", &req.worker_id)?;
    lease_millis(req.lease)?;
    if let Some(limit) = &req.fleet_limit {
        limit.check()?;
    }
    if req.limit <= 0 || req.queues.is_empty() || req.names.as_ref().is_some_and(Vec::is_empty) {
        return Ok(Vec::new());
    }
    let scope = observe::start(store.observer(), |o| o.claim(&req.queues));
    let out = store.claim_observed(req).await;
    observe::end(scope, out.as_deref());
    out
}

/// `WorkerProtocol::progress`.
pub(super) async fn progress<E: PgExecutor>(
    store: &Store<E>,
    lease: &Lease,
    progress: Option<f64>,
    message: Option<&str>,
) -> Result<Task> {
    if let Some(p) = progress.filter(|p| !(0.0..=1.0).contains(p)) {
        return Err(Error::invalid(format!("progress must be within [0, 1], got {p}")));
    }
    let binds: Binds = vec![("progress", progress.into()), ("message", message.into())];
    owned(&mut store.session()?, Statement::Progress, binds, lease).await
}

impl<E: PgExecutor> Store<E> {
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
                    opt_bool(&mut row, "due")?.unwrap_or(false),
                    opt_bool(&mut row, "expired")?.unwrap_or(false),
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
                (Ok(lease), Ok(mut session)) => fail_owned(&mut session, &lease, &failure).await,
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
