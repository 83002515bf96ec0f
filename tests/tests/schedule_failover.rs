//! Periodic tasks through a failover, on a real PostgreSQL: a database of
//! its own set read-only for a few seconds (`default_transaction_read_only`,
//! its sessions ended, as a failover ends them), every submit failing with
//! 25006 meanwhile. Every slot that fell in that window is submitted once
//! the database takes writes again; and the pool does not keep a session
//! that found the server read-only.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use waymark_pool::PgPool;
use waymark_schedule::{CatchUp, Every, Fired, Periodic, Scheduler};
use waymark_store::{ConnectOptions, NewTask, Store};
use waymark_tests::cluster::server_url;
use waymark_tests::db::admin_client;
use waymark_tests::TestDatabase;

/// Makes the database's new sessions read-only (`on`) or writable again;
/// with `end_sessions`, ends its sessions too, as a failover does.
async fn read_only(db: &TestDatabase, on: bool, end_sessions: bool) {
    let admin = admin_client(&server_url()).await;
    let value = if on { "on" } else { "off" };
    admin
        .batch_execute(&format!("alter database {} set default_transaction_read_only = {value}", db.name))
        .await
        .expect("alter database");
    if end_sessions {
        admin
            .execute(
                "select pg_terminate_backend(pid) from pg_stat_activity \
                  where datname = $1 and pid <> pg_backend_pid()",
                &[&db.name],
            )
            .await
            .expect("end the database's sessions");
    }
}

async fn store_on(db: &TestDatabase, max_size: u32) -> Arc<Store<PgPool>> {
    let pool = PgPool::builder(&db.url).max_size(max_size).build().expect("pool");
    Arc::new(Store::connect(pool, ConnectOptions::default()).await.expect("connect"))
}

/// Each slot of schedule `id` with a task: slot (epoch ms) -> the
/// created_at_ms of each of its tasks.
async fn slot_tasks(db: &TestDatabase, id: &str) -> BTreeMap<i64, Vec<i64>> {
    let rows = admin_client(&db.url)
        .await
        .query(
            "select (extract(epoch from (metadata->>'waymark.slot')::timestamptz) * 1000)::bigint, \
                    created_at_ms \
               from cairnq_tasks where metadata->>'waymark.schedule' = $1",
            &[&id],
        )
        .await
        .expect("read the slots' tasks");
    let mut out: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for r in rows {
        out.entry(r.get(0)).or_default().push(r.get(1));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_that_fall_while_the_database_is_read_only_are_submitted_once_it_takes_writes() {
    let db = TestDatabase::new().await;
    let store = store_on(&db, 4).await;
    let every = Every::interval(Duration::from_secs(1)).expect("interval");
    let task = NewTask::new("periodic.noop", json!({}));
    // Room for every slot of the window, and more.
    let periodic = Periodic::new("failover", every, task).catch_up(CatchUp::Missed(10));
    let begun = store.database_time_ms().await.expect("clock");
    let (fired_tx, mut fired) = mpsc::unbounded_channel::<Fired>();
    let (stop, stopped) = oneshot::channel::<()>();
    let run =
        tokio::spawn(Scheduler::new(store.clone()).schedule(periodic).on_fired(fired_tx).run_until(async {
            let _ = stopped.await;
        }));
    // Two slots on time submitted on the writable database first (the
    // catch-up's, from before the start, are not looked at).
    let mut on_time = 0;
    while on_time < 2 {
        let f =
            tokio::time::timeout(Duration::from_secs(20), fired.recv()).await.expect("a slot").expect("open");
        assert!(f.submitted, "{f:?}");
        on_time += usize::from(f.slot_ms > begun);
    }

    read_only(&db, true, true).await;
    let read_only_from = store.database_time_ms().await.expect("clock (a read works on a read-only server)");
    // Real time: the slots that fall meanwhile are what is tested.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let writable_from = store.database_time_ms().await.expect("clock");
    read_only(&db, false, true).await;

    // The scheduler submits pending slots oldest first: once a slot well
    // after the window has its task, every slot kept has its own.
    let target = writable_from + 2_000;
    let mut slots = waymark_tests::until_some(Duration::from_secs(30), "a slot after the window", || async {
        let slots = slot_tasks(&db, "failover").await;
        slots.keys().next_back().is_some_and(|&last| last >= target).then_some(slots)
    })
    .await;
    slots.retain(|&slot, _| slot > begun);
    let (&first, &last) = (slots.keys().next().expect("a slot"), slots.keys().next_back().expect("a slot"));
    let missing: Vec<i64> =
        (first / 1000..=last / 1000).map(|s| s * 1000).filter(|s| !slots.contains_key(s)).collect();
    assert!(
        missing.is_empty(),
        "slots with no task (read-only from {read_only_from} to {writable_from}): {missing:?}"
    );
    let doubled: Vec<_> = slots.iter().filter(|(_, tasks)| tasks.len() > 1).collect();
    assert!(doubled.is_empty(), "one task a slot: {doubled:?}");
    // The window's slots were held and submitted late, not before.
    let window: Vec<(&i64, &Vec<i64>)> = slots.range(read_only_from + 1..writable_from).collect();
    assert!(window.len() >= 2, "slots fell in the read-only window: {window:?}");
    for (slot, created) in &window {
        assert!(
            created[0] >= writable_from,
            "slot {slot} fell while the database was read-only, yet its task was made at {}",
            created[0]
        );
    }
    drop(stop);
    run.await.expect("scheduler task").expect("scheduler");
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_fails_a_write_as_passing_and_its_session_is_not_kept() {
    let db = TestDatabase::new().await;
    // One connection: the session that found the server read-only would be
    // the one the next write gets, if the pool kept it.
    let store = store_on(&db, 1).await;
    read_only(&db, true, true).await;
    let keyed = || NewTask::new("ro.write", json!({})).key("ro:1");
    let e = store.submit(keyed()).await.expect_err("a read-only server refuses the write");
    assert_eq!(e.sqlstate(), Some("25006"), "{e}");
    assert!(e.is_transient(), "a read-only server (a failover) passes: {e}");
    // An unkeyed submit (a statement the pool may repeat) is refused the
    // same way once the pool's retries are spent.
    let e = store.submit(NewTask::new("ro.write", json!({}))).await.expect_err("still read-only");
    assert_eq!(e.sqlstate(), Some("25006"), "{e}");

    // The failover is over: new sessions take writes. Nothing ends the
    // old one here; the pool must not have kept it.
    read_only(&db, false, false).await;
    store.submit(keyed()).await.expect("a fresh session takes the write");
    db.drop().await;
}
