//! The held ledger's upkeep beside the stages: every interval, one
//! `Store::sweep_held` (ends no settlement passed on, event deadlines,
//! expired events). Other workers run it too; each pass locks what it
//! changes, so they share the work.

use std::sync::Arc;
use std::time::Duration;

use waymark_store::PgExecutor;

use crate::shared::Shared;

/// Rows a pass takes at most, per part.
const PASS_LIMIT: i64 = 500;

pub(crate) async fn held_sweep_loop<E: PgExecutor + 'static>(shared: Arc<Shared<E>>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match shared.store.sweep_held(PASS_LIMIT).await {
            Ok(pass) if !pass.is_empty() => tracing::debug!(?pass, "held ledger upkeep"),
            Ok(_) => {}
            Err(e) if e.is_store_closed() => return,
            // 42883, 42P01: the ledger was never migrated (a store made
            // without migrations, over an older database): nothing is held.
            Err(e) if matches!(e.sqlstate(), Some("42883" | "42P01")) => {
                tracing::warn!(error = %e, "the held ledger is not installed; its upkeep stops (run `cargo xtask migrate`)");
                return;
            }
            Err(e) => shared.report("held ledger upkeep", e),
        }
    }
}
