//! A claim under a fleet limit: its turn (the limit's advisory lock, waited
//! for a short while only) and its statement.

use waymark_protocol::Statement;

use crate::error::{Error, Result};
use crate::executor::{Lane, PgExecutor, PgSession, PgTransaction};
use crate::fleet::{FleetLimit, GroupKey, FLEET_LIMIT_TURN_WAIT};
use crate::options::{lease_millis, ClaimRequest};
use crate::statements::{run, Binds};
use crate::store::{format_ms, Store};
use crate::task::Task;

impl<E: PgExecutor> Store<E> {
    /// A transaction that holds `limit`'s turn: the limit's advisory lock,
    /// taken after a wait of [`FLEET_LIMIT_TURN_WAIT`] at most (the
    /// transaction's `lock_timeout`, so a claimer frozen inside its turn
    /// holds the others up that long and no longer). Past it, nothing is
    /// open and the claim fails with [`Error::LockTimeout`]; the caller
    /// tries again later. The claim after it never waits on a lock (it
    /// skips locked rows), so the bound costs it nothing.
    pub(super) async fn begin_turn(&self, limit: &FleetLimit) -> Result<E::Transaction> {
        let wait = format_ms(FLEET_LIMIT_TURN_WAIT);
        let bound: Binds = vec![("lock_timeout", wait.as_str().into())];
        let mut tx = self.begin_bounded(Lane::Ordinary, Statement::SetLockTimeout, bound).await?;
        match run(&mut tx, Statement::LockKey, vec![("key", limit.lock_key().into())]).await {
            Ok(_) => Ok(tx),
            Err(e) => {
                let _ = tx.rollback().await;
                Err(if e.sqlstate() == Some("55P03") {
                    Error::LockTimeout { operation: "claim (its turn under a fleet limit)" }
                } else {
                    e
                })
            }
        }
    }
}

/// How many due rows per queue a limited claim looks at: enough to fill
/// the claim, and, with groups, some more for groups that have fewer free
/// slots than rows in the scan (the rows of groups at their limit are
/// passed over by the statement, so they never fill the scan).
fn limited_scan(limit: i64, grouped: bool) -> i64 {
    if grouped {
        limit.saturating_mul(2).clamp(256, 4096)
    } else {
        limit
    }
}

/// The claim statement under `limit`, in the transaction that holds its
/// turn.
pub(super) async fn claim_limited<S: PgSession + ?Sized>(
    s: &mut S,
    req: &ClaimRequest,
    limit: &FleetLimit,
) -> Result<Vec<Task>> {
    let group = limit.group();
    let binds: Binds = vec![
        ("worker_id", req.worker_id.as_str().into()),
        ("lease_ms", lease_millis(req.lease)?.into()),
        ("queues", req.queues.clone().into()),
        ("names", req.names.clone().into()),
        ("limit", req.limit.into()),
        ("limit_queue", limit.scope_queue().into()),
        ("limit_name", limit.scope_name().into()),
        ("group_in", group.map(GroupKey::column).into()),
        ("group_path", group.map(|g| g.path().to_vec()).into()),
        ("max_running", limit.max_running().into()),
        ("scan", limited_scan(req.limit, group.is_some()).into()),
    ];
    super::claimed(s, Statement::ClaimLimited, binds, &req.worker_id).await
}
