//! The hub registry on a real PostgreSQL: one session per key however many
//! leases, an idle close after the timeout (and none before it when a lease
//! comes back), the cap on hubs, a closing hub that keeps its slot until
//! its connection is gone, and a hub that outlives the runtime of the
//! caller that leased it first.

mod notify_support;

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use notify_support::*;
use tokio_postgres::{AsyncMessage, NoTls};
use waymark_notify::{
    message_stream, Connector, HubOptions, HubState, Registry, RegistryError, RegistryOptions,
};
use waymark_tests::cluster::server_url;

fn registry(max_hubs: usize, idle_timeout: Duration) -> Registry {
    Registry::new(RegistryOptions { max_hubs, idle_timeout })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_of_one_key_share_one_session() {
    let url = server_url();
    let reg = registry(8, Duration::from_secs(30));
    let (x, y) = (unique("wmx"), unique("wmy"));
    let app = unique("wm-reg-share");
    let c = connector(&url);
    let options = || HubOptions::new().application_name(&app);

    let first = reg.acquire(&c, [&x, &y], options()).expect("first");
    let second = reg.acquire(&c, [&y, &x, &x], options()).expect("second");
    assert!(first.is_same_hub(&second), "same connector, same channel set: one hub");
    // Another connector value with the same label is the same key too.
    let third = reg.acquire(&connector(&url), [&x, &y], options()).expect("third");
    assert!(third.is_same_hub(&first));
    wait_listening(&mut first.state()).await;
    assert_eq!(sessions(&url, &app).await, 1, "one backend for three leases");

    let other = reg.acquire(&c, [&x], options()).expect("another channel set");
    assert!(!other.is_same_hub(&first));
    let with_lock = reg.acquire(&c, [&x, &y], options().leader_lock(rand::random())).expect("leader lock");
    assert!(!with_lock.is_same_hub(&first), "the leader lock key is part of the key");
    let stats = reg.stats();
    assert_eq!((stats.hubs, stats.leased, stats.idle, stats.closing), (3, 3, 0, 0), "{stats:?}");

    // Every lease's subscribers hear the shared session.
    let (mut a, mut b) = (first.subscribe(), second.subscribe());
    wait_listening(&mut other.state()).await;
    notify(&url, &x, "q").await;
    assert_eq!(next_event(&mut a, PATIENCE).await, Some(note(&x, "q")));
    assert_eq!(next_event(&mut b, PATIENCE).await, Some(note(&x, "q")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_hub_closes_after_the_timeout_and_a_new_lease_gets_a_new_hub() {
    let url = server_url();
    let idle = Duration::from_secs(2);
    let reg = registry(8, idle);
    let channel = unique("wmc");
    let app = unique("wm-reg-idle");
    let c = connector(&url);

    let lease = reg.acquire(&c, [&channel], HubOptions::new().application_name(&app)).expect("acquire");
    let id = lease.hub_id();
    let mut state = lease.state();
    wait_listening(&mut state).await;
    let sub = lease.subscribe();
    drop(lease);
    // A subscription holds its lease: still in use.
    assert_eq!(reg.stats().leased, 1);
    drop(sub);
    let released = Instant::now();
    assert_eq!((reg.stats().leased, reg.stats().idle), (0, 1));

    // Real time under test: the idle timeout has not run out yet.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(sessions(&url, &app).await, 1, "open while the idle timeout runs");
    wait_state(&mut state, "closed", PATIENCE, |s| *s == HubState::Closed).await;
    let closed_after = released.elapsed();
    let early = idle - Duration::from_millis(50);
    assert!(closed_after >= early, "closed {closed_after:?} after the release, before the idle timeout");
    wait_sessions(&url, &app, 0, PATIENCE).await;
    eventually("the slot freed", PATIENCE, || reg.stats().hubs == 0).await;
    println!("idle hub closed {closed_after:?} after its last lease went (idle timeout {idle:?})");

    let again = reg.acquire(&c, [&channel], HubOptions::new().application_name(&app)).expect("again");
    assert_ne!(again.hub_id(), id, "a closed hub is never handed out again");
    wait_listening(&mut again.state()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_taken_before_the_idle_timeout_reuses_the_hub() {
    let url = server_url();
    let idle = Duration::from_millis(1000);
    let reg = registry(8, idle);
    let channel = unique("wmc");
    let app = unique("wm-reg-reuse");
    let c = connector(&url);

    let first = reg.acquire(&c, [&channel], HubOptions::new().application_name(&app)).expect("first");
    let id = first.hub_id();
    wait_listening(&mut first.state()).await;
    drop(first);
    let second = reg.acquire(&c, [&channel], HubOptions::new().application_name(&app)).expect("second");
    assert_eq!(second.hub_id(), id, "the idle hub is reused");
    assert_eq!(second.current_state(), HubState::Listening, "and listens without reconnecting");

    // Past the first idle deadline: the timer of the first release must not
    // close a hub that is leased again (real time under test).
    tokio::time::sleep(idle + Duration::from_millis(500)).await;
    assert_eq!(second.current_state(), HubState::Listening);
    assert_eq!(second.stats().connect_attempts, 1);
    assert_eq!(sessions(&url, &app).await, 1);
    let stats = reg.stats();
    assert_eq!((stats.hubs, stats.leased), (1, 1), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_hubs_acquire_is_full_and_the_caller_polls() {
    let url = server_url();
    let reg = registry(2, Duration::from_secs(30));
    let c = connector(&url);
    let (k1, k2, k3) = (unique("wm1"), unique("wm2"), unique("wm3"));
    let _l1 = reg.acquire(&c, [&k1], HubOptions::new()).expect("first slot");
    let _l2 = reg.acquire(&c, [&k2], HubOptions::new()).expect("second slot");
    let err = reg.acquire(&c, [&k3], HubOptions::new()).unwrap_err();
    assert_eq!(err, RegistryError::Full { max: 2 });
    assert_eq!(err.to_string(), "the notify registry is full (2 hubs); poll instead");
    // A key that has a hub still gets a lease on it.
    let shared = reg.acquire(&c, [&k1], HubOptions::new()).expect("an open key is never full");
    assert!(shared.is_same_hub(&_l1));
    assert_eq!(reg.open_hubs(), 2);
    // Bad input is refused before the cap is looked at.
    assert!(matches!(reg.acquire(&c, [""], HubOptions::new()), Err(RegistryError::Hub(_))));
}

/// A connector whose sessions take `linger` to shut down after their client
/// goes: the stream ends `linger` after the real connection has closed.
fn lingering(url: &str, linger: Duration) -> Connector {
    Connector::from_fn(url.parse().expect("url"), move |config| async move {
        let (client, connection) = config.connect(NoTls).await?;
        // Real time under test: a session slow to shut down.
        let then_linger = futures::stream::once(async move { tokio::time::sleep(linger).await })
            .filter_map(|()| async { None::<Result<AsyncMessage, tokio_postgres::Error>> });
        Ok((client, Box::pin(message_stream(connection).chain(then_linger)) as waymark_notify::MessageStream))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_hub_keeps_its_slot_until_its_task_has_ended() {
    let url = server_url();
    let reg = registry(1, Duration::from_millis(200));
    let app = unique("wm-reg-closing");
    // Long enough that a loaded machine notices Closed well before the
    // slot frees.
    let linger = Duration::from_secs(5);
    let slow = lingering(&url, linger);
    let (a, b) = (unique("wma"), unique("wmb"));

    let lease = reg.acquire(&slow, [&a], HubOptions::new().application_name(&app)).expect("a");
    let mut state = lease.state();
    wait_listening(&mut state).await;
    // Timed from the drop, not from when Closed was noticed (which a
    // loaded machine may notice late): timers never fire early.
    let dropped_at = Instant::now();
    drop(lease);
    wait_state(&mut state, "closed", PATIENCE, |s| *s == HubState::Closed).await;

    // Closed, but its task is still shutting its connection down: the slot
    // is taken.
    let stats = reg.stats();
    assert_eq!((stats.hubs, stats.closing, stats.idle), (1, 1, 0), "{stats:?}");
    let err = reg.acquire(&connector(&url), [&b], HubOptions::new()).unwrap_err();
    assert_eq!(err, RegistryError::Full { max: 1 });

    eventually("the slot freed", PATIENCE, || reg.stats().hubs == 0).await;
    let held = dropped_at.elapsed();
    println!("the closing hub held its slot {held:?} after its lease went (its stream lingers {linger:?})");
    assert!(held >= linger, "freed after {held:?}");
    // Freed only once the task ended, so the session is gone (the backend
    // exits a moment after its socket closes).
    wait_sessions(&url, &app, 0, Duration::from_secs(5)).await;

    let lease = reg.acquire(&connector(&url), [&b], HubOptions::new()).expect("the slot is free again");
    wait_listening(&mut lease.state()).await;
}

/// A full registry makes room: its longest-idle hub is closed for the
/// caller who found it full, whose later try gets the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_registry_closes_its_longest_idle_hub_for_a_new_key() {
    let url = server_url();
    let reg = registry(1, Duration::from_secs(600));
    let c = connector(&url);
    let (a, b) = (unique("wmidle"), unique("wmnew"));
    let lease = reg.acquire(&c, [&a], HubOptions::new()).expect("a");
    wait_listening(&mut lease.state()).await;
    drop(lease);
    assert_eq!(reg.stats().idle, 1, "kept warm for its idle timeout");
    let err = reg.acquire(&c, [&b], HubOptions::new()).unwrap_err();
    assert_eq!(err, RegistryError::Full { max: 1 });
    let lease = waymark_tests::until_some(PATIENCE, "a slot for the new key", || async {
        match reg.acquire(&c, [&b], HubOptions::new()) {
            Ok(lease) => Some(lease),
            Err(RegistryError::Full { .. }) => None,
            Err(e) => panic!("no slot for the new key: {e}"),
        }
    })
    .await;
    wait_listening(&mut lease.state()).await;
    assert_eq!(reg.stats().hubs, 1);
}

/// A hub is shared by key, so it must not end with the runtime of its first
/// caller: an app with several runtimes (or a test suite, one per test)
/// would otherwise lose every other lease's stream when that runtime ends.
#[test]
fn a_hub_outlives_the_runtime_of_its_first_lease() {
    let url = server_url();
    let reg = registry(8, Duration::from_secs(30));
    let channel = unique("wmrt");
    let app = unique("wm-reg-runtime");
    let options = || HubOptions::new().application_name(&app);
    let runtime = || tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");

    // The first lease, taken and listening on a runtime that then ends.
    let first_runtime = runtime();
    let first = first_runtime.block_on(async {
        let lease = reg.acquire(&connector(&url), [&channel], options()).expect("first");
        wait_listening(&mut lease.state()).await;
        lease
    });
    drop(first_runtime);
    // Taken outside any runtime: the registry needs none.
    let second = reg.acquire(&connector(&url), [&channel], options()).expect("second, outside a runtime");
    assert!(second.is_same_hub(&first));

    runtime().block_on(async {
        let mut events = second.subscribe();
        notify(&url, &channel, "after").await;
        assert_eq!(next_event(&mut events, PATIENCE).await, Some(note(&channel, "after")));
        assert_eq!(second.current_state(), HubState::Listening);
        let stats = second.stats();
        assert_eq!((stats.listens, stats.disconnects), (1, 0), "the first session lived on: {stats:?}");
        assert_eq!(sessions(&url, &app).await, 1);
    });
}
