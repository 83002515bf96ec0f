//! The scheduler's policies on a real PostgreSQL, in one process: what a
//! scheduler catches up at its start (`CatchUp::Missed(n)` and `Skip`), a
//! changed schedule run beside the old one under the same id (a rolling
//! deploy) giving one task per slot, and a schedule the store refuses, or
//! whose queue is full, which must not stop the others. Each test waits on
//! the scheduler's `on_fired` reports, never on a fixed pause.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use waymark_pool::PgPool;
use waymark_schedule::{CatchUp, Every, Fired, Periodic, Scheduler, MAX_CATCH_UP, SLOT_KEY};
use waymark_store::{Backpressure, ListFilter, NewTask, Store};
use waymark_tests::TestSchema;

type Stop = oneshot::Sender<()>;

/// Starts a scheduler of `schedules` on `store`; its reports come on the
/// receiver, and it runs until the sender is sent to or dropped.
fn start(
    store: &Arc<Store<PgPool>>,
    schedules: Vec<Periodic>,
) -> (Stop, mpsc::UnboundedReceiver<Fired>, tokio::task::JoinHandle<waymark_store::Result<()>>) {
    let (fired_tx, fired) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let scheduler = schedules.into_iter().fold(Scheduler::new(store.clone()), Scheduler::schedule);
    let run = tokio::spawn(scheduler.on_fired(fired_tx).run_until(async {
        let _ = stopped.await;
    }));
    (stop, fired, run)
}

async fn next(fired: &mut mpsc::UnboundedReceiver<Fired>, what: &str) -> Fired {
    tokio::time::timeout(Duration::from_secs(20), fired.recv())
        .await
        .unwrap_or_else(|_| panic!("{what}: no slot reported within 20 s"))
        .unwrap_or_else(|| panic!("{what}: the scheduler stopped"))
}

fn noop(schedule: &str) -> NewTask {
    NewTask::new("periodic.noop", json!({ "schedule": schedule }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_missed_submits_the_last_slots_at_its_start_and_skip_none() {
    let schema = TestSchema::new().await;
    let store = Arc::new(schema.0.pool_store().await);

    // A long period, so every slot caught up lies well before the start.
    let ten_s = Every::interval(Duration::from_secs(10)).expect("interval");
    let before = store.database_time_ms().await.expect("clock");
    let (stop, mut fired, run) =
        start(&store, vec![Periodic::new("late", ten_s.clone(), noop("late")).catch_up(CatchUp::Missed(3))]);
    let mut caught_up = Vec::new();
    for _ in 0..3 {
        let f = next(&mut fired, "catch-up").await;
        assert!(f.submitted, "a free slot is submitted: {f:?}");
        caught_up.push(f.slot_ms);
    }
    let after = store.database_time_ms().await.expect("clock");
    let expected: Vec<Vec<i64>> = [before, after].iter().map(|&t| ten_s.last_at_or_before(t, 3)).collect();
    assert!(
        expected.contains(&caught_up),
        "the catch-up submits the last 3 slots at or before its start, oldest first: got {caught_up:?}, \
         expected one of {expected:?}"
    );
    drop(stop);
    run.await.expect("scheduler task").expect("scheduler");

    // A second scheduler over the same slots finds their keys taken.
    let (stop, mut fired, run) =
        start(&store, vec![Periodic::new("late", ten_s, noop("late")).catch_up(CatchUp::Missed(3))]);
    for &slot in &caught_up[caught_up.len() - 2..] {
        // The first slot may have dropped out of the window by now.
        let f = loop {
            let f = next(&mut fired, "the second catch-up").await;
            if f.slot_ms == slot {
                break f;
            }
        };
        assert!(!f.submitted, "a slot whose task exists is never submitted again: {f:?}");
    }
    drop(stop);
    run.await.expect("scheduler task").expect("scheduler");
    let tasks = store.list(&ListFilter { name: Some("periodic.noop".into()), ..ListFilter::default() }).await;
    let slots: Vec<i64> = tasks.expect("list").iter().filter_map(|t| slot_of(&t.metadata)).collect();
    assert_eq!(slots.len(), slots.iter().collect::<std::collections::BTreeSet<_>>().len(), "one task a slot");

    // Skip: nothing from before the start; the first slot is one to come.
    let second = Every::interval(Duration::from_millis(500)).expect("interval");
    let before = store.database_time_ms().await.expect("clock");
    let (stop, mut fired, run) =
        start(&store, vec![Periodic::new("skipper", second, noop("skipper")).catch_up(CatchUp::Skip)]);
    let f = next(&mut fired, "skip").await;
    assert!(f.slot_ms > before, "Skip submits no slot from before its start: {f:?}, started at {before}");
    assert!(f.submitted);
    drop(stop);
    run.await.expect("scheduler task").expect("scheduler");
    schema.drop().await;
}

fn slot_of(metadata: &serde_json::Value) -> Option<i64> {
    let label = metadata.get(SLOT_KEY)?.as_str()?;
    Some(chrono::DateTime::parse_from_rfc3339(label).ok()?.timestamp_millis())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_and_new_schedules_under_one_id_give_one_task_per_slot() {
    let schema = TestSchema::new().await;
    let store = Arc::new(schema.0.pool_store().await);
    // The old schedule every 100 ms, its replacement every 150 ms: they share
    // every 300 ms slot, which must get one task between them.
    let old = Periodic::new("rollout", Every::interval(Duration::from_millis(100)).unwrap(), noop("rollout"));
    let new = Periodic::new("rollout", Every::interval(Duration::from_millis(150)).unwrap(), noop("rollout"));
    let (stop_old, mut fired_old, run_old) = start(&store, vec![old]);
    let (stop_new, mut fired_new, run_new) = start(&store, vec![new]);

    // Both report every slot they deal with; run until the new one has
    // dealt with 20 slots shared with the old one.
    let mut reports: BTreeMap<i64, Vec<bool>> = BTreeMap::new();
    let mut shared = 0;
    while shared < 20 {
        tokio::select! {
            f = fired_old.recv() => {
                let f = f.expect("old scheduler reports");
                reports.entry(f.slot_ms).or_default().push(f.submitted);
            }
            f = fired_new.recv() => {
                let f = f.expect("new scheduler reports");
                if f.slot_ms % 300 == 0 {
                    shared += 1;
                }
                reports.entry(f.slot_ms).or_default().push(f.submitted);
            }
            () = tokio::time::sleep(Duration::from_secs(20)) => panic!("no slot reported within 20 s"),
        }
    }
    drop((stop_old, stop_new));
    run_old.await.expect("old scheduler task").expect("old scheduler");
    run_new.await.expect("new scheduler task").expect("new scheduler");
    // Their reports after stopping are not needed: the table is the truth.
    let tasks = store
        .list(&ListFilter { name: Some("periodic.noop".into()), limit: 10_000, ..ListFilter::default() })
        .await
        .expect("list");
    let mut per_slot: BTreeMap<i64, usize> = BTreeMap::new();
    for t in &tasks {
        *per_slot.entry(slot_of(&t.metadata).expect("a slot in the metadata")).or_default() += 1;
    }
    let doubled: Vec<_> = per_slot.iter().filter(|(_, &n)| n > 1).collect();
    assert!(doubled.is_empty(), "slots with more than one task: {doubled:?}");
    for (slot, submitted) in &reports {
        assert_eq!(per_slot.get(slot), Some(&1), "slot {slot} was reported ({submitted:?}) and has one task");
        assert!(
            submitted.iter().filter(|&&s| s).count() <= 1,
            "slot {slot}: at most one scheduler inserted it: {submitted:?}"
        );
        if slot % 300 == 0 && submitted.len() == 2 {
            assert_eq!(
                submitted.iter().filter(|&&s| s).count(),
                1,
                "a shared slot: one inserts, one finds it"
            );
        }
    }
    let shared_with_both = reports.iter().filter(|(s, r)| *s % 300 == 0 && r.len() == 2).count();
    assert!(shared_with_both >= 10, "both schedulers dealt with the shared slots: {shared_with_both}");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_schedule_does_not_stop_the_others_and_bad_schedules_are_named() {
    let schema = TestSchema::new().await;
    let store = Arc::new(schema.0.pool_store().await);
    let every = || Every::interval(Duration::from_millis(100)).unwrap();

    // Refused before anything is submitted, each naming what is wrong.
    let refused = |schedules: Vec<Periodic>| {
        let store = store.clone();
        async move {
            let scheduler = schedules.into_iter().fold(Scheduler::new(store), Scheduler::schedule);
            scheduler
                .run_until(std::future::pending())
                .await
                .expect_err("a bad schedule is refused")
                .to_string()
        }
    };
    let twice =
        refused(vec![Periodic::new("a", every(), noop("a")), Periodic::new("a", every(), noop("a"))]).await;
    assert!(twice.contains("\"a\" is given twice"), "{twice}");
    let colon = refused(vec![Periodic::new("a:b", every(), noop("a"))]).await;
    assert!(colon.contains("without ':'") && colon.contains("a:b"), "{colon}");
    let unnamed = refused(vec![Periodic::new("c", every(), NewTask::new("", json!({})))]).await;
    assert!(unnamed.contains("needs a name"), "{unnamed}");
    assert!(Every::cron("not cron", "UTC").unwrap_err().to_string().contains("not cron"));
    assert!(Every::cron("0 * * * * *", "Mars/Olympus").unwrap_err().to_string().contains("Mars/Olympus"));

    let many =
        refused(vec![Periodic::new("d", every(), noop("d")).catch_up(CatchUp::Missed(MAX_CATCH_UP + 1))])
            .await;
    assert!(many.contains("more than 10000"), "{many}");

    // A template the store refuses (max_attempts 0), and one the server
    // refuses (jsonb cannot hold a NUL character), drop their slots,
    // logged; the good schedule after them goes on submitting.
    let bad = Periodic::new("bad", every(), noop("bad").max_attempts(0)).catch_up(CatchUp::Skip);
    let nul = NewTask::new("periodic.noop", json!({ "schedule": "nul", "text": "a\u{0}b" }));
    let unstorable = Periodic::new("unstorable", every(), nul).catch_up(CatchUp::Skip);
    let good = Periodic::new("good", every(), noop("good")).catch_up(CatchUp::Skip);
    let (stop, mut fired, run) = start(&store, vec![bad, unstorable, good]);
    for _ in 0..5 {
        let f = next(&mut fired, "the good schedule").await;
        assert_eq!(f.schedule, "good", "only the good schedule's slots are dealt with: {f:?}");
        assert!(f.submitted);
    }
    drop(stop);
    run.await.expect("scheduler task").expect("scheduler");
    let tasks = store.list(&ListFilter::default()).await.expect("list");
    assert!(tasks.iter().all(|t| t.payload["schedule"] == "good"), "no task of the refused schedule");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_holds_up_only_its_own_schedule() {
    let schema = TestSchema::new().await;
    // Queue `a` holds one task at most, and has one; no worker drains it.
    let limits = Backpressure::per_queue([("a", 1)]);
    let options = waymark_store::ConnectOptions::new().backpressure(limits);
    let store =
        Arc::new(Store::with_options(schema.0.pool_store().await.into_executor(), options).expect("limits"));
    store.submit(NewTask::new("periodic.noop", json!({})).queue("a")).await.expect("room for one");
    let every = || Every::interval(Duration::from_secs(1)).unwrap();
    // A, on the full queue, comes first.
    let a = Periodic::new("a", every(), noop("a").queue("a"));
    let b = Periodic::new("b", every(), noop("b").queue("b"));
    let (stop, mut fired, run) = start(&store, vec![a, b]);
    let started = std::time::Instant::now();
    let mut slots = Vec::new();
    while slots.len() < 5 {
        let f = next(&mut fired, "schedule b, beside a full queue").await;
        assert_eq!(f.schedule, "b", "queue a is full: {f:?}");
        assert!(f.submitted, "{f:?}");
        slots.push(f.slot_ms);
    }
    // Its catch-up slot, then one a second, each on time.
    let steps: Vec<i64> = slots.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(steps.iter().all(|&s| s == 1_000), "b fires every second: slots {slots:?}");
    assert!(started.elapsed() < Duration::from_secs(8), "five slots of b took {:?}", started.elapsed());
    drop(stop);
    run.await.expect("scheduler task").expect("scheduler");
    assert_eq!(store.stats(Some("a")).await.expect("stats")["a"].queued, 1, "nothing more in the full queue");
    schema.drop().await;
}

/// A slot whose key another session holds locked (another scheduler
/// stalled mid-submit) holds up no newer slot of its schedule: those are
/// submitted while it is held, and it is submitted once the lock goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_held_by_another_submit_holds_up_no_newer_slot() {
    let schema = TestSchema::new().await;
    let store = Arc::new(schema.0.pool_store().await);
    let every = || Every::interval(Duration::from_secs(1)).unwrap();
    let periodic = Periodic::new("held", every(), noop("held")).catch_up(CatchUp::Missed(20));
    // The slot two seconds on, its key locked as a keyed submit locks it.
    let now = store.database_time_ms().await.expect("clock");
    let held = (now / 1_000 + 2) * 1_000;
    let mut holder = waymark_tests::db::admin_client(&schema.url).await;
    let tx = holder.transaction().await.expect("begin");
    tx.execute("select pg_advisory_xact_lock(hashtextextended($1, 0))", &[&periodic.slot_key(held)])
        .await
        .expect("hold the slot's key");
    let (stop, mut fired, run) = start(&store, vec![periodic]);
    let mut newer = Vec::new();
    while newer.len() < 2 {
        let f = next(&mut fired, "a slot after the held one").await;
        assert_ne!(f.slot_ms, held, "the held slot cannot be submitted yet: {f:?}");
        if f.slot_ms > held {
            newer.push(f.slot_ms);
        }
    }
    tx.rollback().await.expect("let the key go");
    loop {
        let f = next(&mut fired, "the held slot, once its key is free").await;
        if f.slot_ms == held {
            assert!(f.submitted, "{f:?}");
            break;
        }
    }
    drop(stop);
    run.await.expect("scheduler task").expect("scheduler");
    schema.drop().await;
}
