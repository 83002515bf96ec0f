//! The heartbeat loop: renews every held lease in one statement per tick,
//! then the rows another transaction held locked, together and if need be
//! one by one (`WorkerProtocol::renew_leases`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::{Lease, PgExecutor};

use crate::shared::{CancelReason, Running, Shared};

/// The longest a beat waits for the rows another transaction held.
const HELD_ROWS_WAIT: Duration = Duration::from_secs(5);

/// Renews every unsettled lease once per interval (see `WorkerProtocol::renew_leases`);
/// a task missing from the answer lost its lease, a cancel request fires
/// its token.
pub(crate) async fn heartbeat_loop<E: PgExecutor + 'static>(shared: Arc<Shared<E>>) {
    let mut tick = tokio::time::interval(shared.settings.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; claims are fresh
    loop {
        tick.tick().await;
        #[cfg(feature = "test-hooks")]
        if shared.state.heartbeats_paused.load(std::sync::atomic::Ordering::SeqCst) {
            continue;
        }
        let held: Vec<Arc<Running>> = shared
            .state
            .running
            .lock()
            .expect("running lock")
            .values()
            .filter(|r| !r.is_lost())
            .cloned()
            .collect();
        if held.is_empty() {
            continue;
        }
        let leases: Vec<Lease> = held.iter().map(|r| r.lease.clone()).collect();
        // The rows another transaction holds locked are waited for,
        // together and then if need be one by one, within half an interval
        // in all and at most 5 s (well under the pool's query timeout); the
        // others are renewed first, without waiting. One still locked then
        // stays ours, and the next beat tries again.
        let wait = (shared.settings.heartbeat / 2).min(HELD_ROWS_WAIT);
        match shared.store.renew_leases(&leases, shared.settings.lease, wait).await {
            Ok(renewal) => {
                let owned: HashMap<&str, Option<i64>> = renewal
                    .renewed
                    .iter()
                    .chain(&renewal.held)
                    .map(|b| (b.id.as_str(), b.cancel_requested_at_ms))
                    .collect();
                for r in &held {
                    match owned.get(r.id()) {
                        // A settlement committed meanwhile also leaves the
                        // answer; marking it lost then changes nothing.
                        None if !r.is_settled() => r.mark_lost(),
                        Some(Some(_)) => r.cancel(CancelReason::Requested),
                        _ => {}
                    }
                }
            }
            Err(e) => shared.report("heartbeat", e),
        }
    }
}
