//! What a scheduler submits after an outage, on a real PostgreSQL behind a
//! proxy, the outage placed by the scheduler's own clock reads: the server
//! is taken away just after the read at a chosen slot answers (so that
//! slot's submit fails, and it is pending while the outage lasts), and
//! brought back inside the first clock read that fails once the outage
//! has lasted a few seconds (so the next thing the scheduler sends, were
//! it to submit before it looked at the clock again, would go through).
//! Then:
//!
//! - `CatchUp::Skip` submits no slot that fell during the outage, the one
//!   pending when it began included;
//! - `CatchUp::Missed(n)` submits the newest `n` of them, no more, then
//!   every slot on time.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use waymark_schedule::{CatchUp, Every, Fired, Periodic, Scheduler};
use waymark_store::protocol::Statement;
use waymark_store::{ConnectOptions, NewTask, Store};
use waymark_tests::fault_executor::{sql_of, tapped, Hook, Tap};
use waymark_tests::proxy::{pool_through, proxy_for};
use waymark_tests::TestSchema;

const PERIOD_MS: i64 = 1_000;
/// How long the server stays away, at least.
const OUTAGE_MS: i64 = 3_500;
/// Not yet armed.
const NOT_YET: i64 = i64::MAX;

async fn recv(fired: &mut mpsc::UnboundedReceiver<Fired>) -> Fired {
    tokio::time::timeout(Duration::from_secs(30), fired.recv())
        .await
        .expect("a slot reported within 30 s")
        .expect("the scheduler runs")
}

fn wall_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    i64::try_from(since.as_millis()).expect("ms")
}

/// Takes `armed` (a wall time) if it has come: once.
fn take_if_due(armed: &AtomicI64) -> bool {
    let at = armed.load(Ordering::SeqCst);
    at != NOT_YET
        && wall_ms() >= at
        && armed.compare_exchange(at, NOT_YET, Ordering::SeqCst, Ordering::SeqCst).is_ok()
}

/// Runs a one-second schedule with `policy` through an outage that begins
/// just after the clock read at a slot two slots ahead answers. Answers
/// that slot, when the server came back (wall clock, ms), and the slots
/// reported from that slot on, until one well after.
async fn through_an_outage(policy: CatchUp) -> (i64, i64, Vec<i64>) {
    let schema = TestSchema::new().await;
    let proxy = Arc::new(proxy_for(&schema.url).await);
    // No breaker: the first call after the server is back goes through.
    let pool = pool_through(&proxy, &schema).max_size(4).breaker_threshold(u32::MAX).build().expect("pool");
    let plain = Store::connect(pool, ConnectOptions::new().schema(&schema.schema)).await.expect("connect");
    let (down_at, up_at) = (Arc::new(AtomicI64::new(NOT_YET)), Arc::new(AtomicI64::new(NOT_YET)));
    let (went_up, came_back) = oneshot::channel::<i64>();
    let went_up = Mutex::new(Some(went_up));
    let clock = sql_of(Statement::Clock, &[]);
    let store = {
        let (down_at, up_at, proxy) = (down_at.clone(), up_at.clone(), proxy.clone());
        tapped(&plain, move |text: &str, at: Tap, _run: u64| -> Option<Hook> {
            if text != clock || at != Tap::After {
                return None;
            }
            if take_if_due(&down_at) {
                let proxy = proxy.clone();
                up_at.store(wall_ms() + OUTAGE_MS, Ordering::SeqCst);
                return Some(Box::pin(async move { proxy.take_down().await }));
            }
            if take_if_due(&up_at) {
                proxy.set_down(false);
                if let Some(told) = went_up.lock().expect("lock").take() {
                    let _ = told.send(wall_ms());
                }
            }
            None
        })
    };
    let every = Every::interval(Duration::from_millis(PERIOD_MS as u64)).expect("interval");
    let periodic = Periodic::new("outage", every, NewTask::new("periodic.noop", json!({}))).catch_up(policy);
    let (fired_tx, mut fired) = mpsc::unbounded_channel::<Fired>();
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(Scheduler::new(Arc::new(store)).schedule(periodic).on_fired(fired_tx).run_until(
        async {
            let _ = stopped.await;
        },
    ));
    // On time first.
    let first = recv(&mut fired).await;
    let target = (first.slot_ms / PERIOD_MS + 2) * PERIOD_MS;
    down_at.store(target, Ordering::SeqCst);
    let up = tokio::time::timeout(Duration::from_secs(30), came_back)
        .await
        .expect("the server is back within 30 s")
        .expect("told");
    let mut after = Vec::new();
    loop {
        let f = recv(&mut fired).await;
        if f.slot_ms < target {
            continue;
        }
        assert!(f.submitted, "{f:?}");
        after.push(f.slot_ms);
        if f.slot_ms >= up + 3 * PERIOD_MS {
            break;
        }
    }
    drop(stop);
    run.await.expect("scheduler task").expect("scheduler");
    schema.drop().await;
    (target, up, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_submits_no_slot_that_fell_during_an_outage() {
    let (target, up, after) = through_an_outage(CatchUp::Skip).await;
    let stale: Vec<_> = after.iter().filter(|&&slot| slot <= up).collect();
    assert!(
        stale.is_empty(),
        "Skip submitted slots that fell during the outage ({target} to {up}): {stale:?} (all after it: {after:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_n_submits_the_newest_n_slots_of_an_outage_and_no_more() {
    let (target, up, after) = through_an_outage(CatchUp::Missed(2)).await;
    // The outage held more than two slots: the one pending as it began is
    // not among the newest two.
    assert!(
        !after.contains(&target),
        "the slot pending as the outage began is past the bound of 2: {after:?}"
    );
    let expected: Vec<i64> = (0..after.len() as i64).map(|i| after[0] + i * PERIOD_MS).collect();
    assert_eq!(
        after, expected,
        "the newest slots of the outage, then every slot: from {target}, back at {up}"
    );
}
