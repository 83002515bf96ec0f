//! A notify hub on a real PostgreSQL: delivery to every subscriber, the
//! probe kept to itself, a killed backend and a restarted server survived
//! with "may have missed", ListenUnavailable through a real PgBouncer in
//! transaction mode, the leader lock, capacity errors.

mod notify_support;

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use notify_support::*;
use tokio::sync::mpsc;
use tokio_postgres::types::Type;
use tokio_postgres::AsyncMessage;
use waymark_notify::{Event, Hub, HubError, HubOptions, HubState, PROBE_PREFIX};
use waymark_tests::cluster::server_url;
use waymark_tests::db::admin_client;
use waymark_tests::pgbouncer::{host_and_port, PgBouncer};
use waymark_tests::private_cluster::PrivateCluster;
use waymark_tests::TestDatabase;

/// A plain LISTEN session of its own (not a hub) that reports every
/// notification it hears, as any other listener on the database would.
async fn observer(
    url: &str,
    channel: &str,
) -> (tokio_postgres::Client, mpsc::UnboundedReceiver<(String, String)>) {
    let (client, mut messages) = connector(url).connect().await.expect("observer session");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(n) = message {
                let _ = tx.send((n.channel().to_owned(), n.payload().to_owned()));
            }
        }
    });
    client.batch_execute(&format!("listen \"{channel}\"")).await.expect("observer listen");
    (client, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_reach_every_subscriber_and_the_probe_reaches_none() {
    let url = server_url();
    let (queued, done) = (unique("wmq"), unique("wmd"));
    let app = unique("wm-notify-t1");
    let (_observer, mut observed) = observer(&url, &queued).await;

    let hub = Hub::spawn(connector(&url), [&queued, &done], HubOptions::new().application_name(&app))
        .expect("spawn");
    // Subscribed before the hub listens: the probe happens while they wait.
    let (mut a, mut b) = (hub.subscribe(), hub.subscribe());
    let started = Instant::now();
    wait_listening(&mut hub.state()).await;
    println!("listening {:?} after spawn (probe included)", started.elapsed());
    let stats = hub.stats();
    assert_eq!((stats.connect_attempts, stats.listens), (1, 1), "{stats:?}");

    notify(&url, &queued, "emails").await;
    notify(&url, &done, "task-1").await;
    for sub in [&mut a, &mut b] {
        assert_eq!(next_event(sub, PATIENCE).await, Some(note(&queued, "emails")), "the probe came first?");
        assert_eq!(next_event(sub, PATIENCE).await, Some(note(&done, "task-1")));
    }
    assert_quiet(&mut a, Duration::from_millis(300)).await;
    assert_eq!(hub.stats().notifications, 2);

    // Other listeners do see the probe, under its prefix, on the first channel.
    let (channel, payload) =
        tokio::time::timeout(PATIENCE, observed.recv()).await.expect("probe").expect("open");
    assert_eq!(channel, queued);
    assert!(payload.starts_with(PROBE_PREFIX) && payload.len() > PROBE_PREFIX.len() + 16, "{payload}");

    // One listener session, named as asked; the probe session is gone.
    assert_eq!(sessions(&url, &app).await, 1);
    wait_sessions(&url, &format!("{app}:probe"), 0, PATIENCE).await;

    hub.close();
    tokio::time::timeout(PATIENCE, hub.finished()).await.expect("the task ends");
    assert_eq!(hub.current_state(), HubState::Closed);
    assert_eq!(next_event(&mut a, PATIENCE).await, None, "closed for good");
    assert_eq!(next_event(&mut b, PATIENCE).await, None);
    assert!(hub.subscribe().recv().await.is_none(), "a late subscriber of a closed hub ends at once");
    wait_sessions(&url, &app, 0, PATIENCE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_falls_behind_hears_it_may_have_missed() {
    let url = server_url();
    let channel = unique("wmc");
    let hub = Hub::spawn(connector(&url), [&channel], HubOptions::new().event_buffer(2)).expect("spawn");
    wait_listening(&mut hub.state()).await;
    let mut slow = hub.subscribe();
    for n in 1..=5 {
        notify(&url, &channel, &n.to_string()).await;
    }
    eventually("all five reached the hub", PATIENCE, || hub.stats().notifications == 5).await;
    // As a Stream this time: the same events as recv.
    let first_three: Vec<Event> = slow.by_ref().take(3).collect().await;
    assert_eq!(first_three, [Event::MayHaveMissed, note(&channel, "4"), note(&channel, "5")]);
    hub.close();
    assert_eq!(slow.next().await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_closes_the_hub_and_its_session() {
    let url = server_url();
    let app = unique("wm-notify-drop");
    let hub = Hub::spawn(connector(&url), [unique("wmc")], HubOptions::new().application_name(&app))
        .expect("spawn");
    let mut state = hub.state();
    wait_listening(&mut state).await;
    let sub = hub.subscribe();
    drop(hub);
    // The subscription still holds the hub open.
    assert_eq!(*state.borrow(), HubState::Listening);
    assert_eq!(sessions(&url, &app).await, 1);
    drop(sub);
    wait_state(&mut state, "closed", PATIENCE, |s| *s == HubState::Closed).await;
    wait_sessions(&url, &app, 0, PATIENCE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_backend_is_replaced_and_subscribers_hear_they_may_have_missed() {
    // A database of its own, so that it can refuse connections for a while:
    // that keeps the hub Down long enough to be seen.
    let db = TestDatabase::new().await;
    let channel = unique("wmc");
    let app = unique("wm-notify-kill");
    let options = HubOptions::new()
        .application_name(&app)
        .backoff_base(Duration::from_millis(50))
        .backoff_max(Duration::from_millis(400));
    let hub = Hub::spawn(connector(&db.url), [&channel], options).expect("spawn");
    let mut state = hub.state();
    wait_listening(&mut state).await;
    let mut sub = hub.subscribe();

    let admin = admin_client(&server_url()).await;
    admin
        .batch_execute(&format!("alter database {} allow_connections false", db.name))
        .await
        .expect("refuse");
    let killed_at = Instant::now();
    assert_eq!(terminate(&server_url(), &app).await, 1);
    let down = wait_state(&mut state, "down", PATIENCE, |s| matches!(s, HubState::Down { .. })).await;
    println!("down {:?} after the kill: {down:?}", killed_at.elapsed());
    // It keeps trying by itself, and stays Down or Connecting meanwhile.
    eventually("several reconnect attempts", PATIENCE, || hub.stats().failed_attempts >= 2).await;
    assert!(matches!(hub.current_state(), HubState::Down { .. } | HubState::Connecting));

    admin.batch_execute(&format!("alter database {} allow_connections true", db.name)).await.expect("allow");
    let allowed_at = Instant::now();
    assert_eq!(next_event(&mut sub, PATIENCE).await, Some(Event::MayHaveMissed));
    assert_eq!(hub.current_state(), HubState::Listening);
    println!("listening again {:?} after connections were allowed", allowed_at.elapsed());
    let stats = hub.stats();
    assert_eq!((stats.listens, stats.disconnects), (2, 1), "{stats:?}");

    notify(&db.url, &channel, "after").await;
    assert_eq!(next_event(&mut sub, PATIENCE).await, Some(note(&channel, "after")));

    // A kill with nothing in the way: back by itself, and told again.
    assert_eq!(terminate(&server_url(), &app).await, 1);
    assert_eq!(next_event(&mut sub, PATIENCE).await, Some(Event::MayHaveMissed));
    notify(&db.url, &channel, "again").await;
    assert_eq!(next_event(&mut sub, PATIENCE).await, Some(note(&channel, "again")));
    assert_eq!(hub.stats().disconnects, 2);

    hub.close();
    hub.finished().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_comes_back_by_itself_after_a_server_restart() {
    let cluster = std::sync::Arc::new(
        tokio::task::spawn_blocking(|| PrivateCluster::start("notify")).await.expect("cluster"),
    );
    let url = cluster.url("postgres");
    let channel = unique("wmc");
    let options =
        HubOptions::new().backoff_base(Duration::from_millis(50)).backoff_max(Duration::from_millis(500));
    let hub = Hub::spawn(connector(&url), [&channel], options).expect("spawn");
    let mut state = hub.state();
    wait_listening(&mut state).await;
    let mut sub = hub.subscribe();

    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.stop()).await.expect("stop");
    let down = wait_state(&mut state, "down", PATIENCE, |s| matches!(s, HubState::Down { .. })).await;
    println!("server stopped: {down:?}");

    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.start_again()).await.expect("start again");
    let back_at = Instant::now();
    assert_eq!(next_event(&mut sub, PATIENCE).await, Some(Event::MayHaveMissed));
    assert_eq!(hub.current_state(), HubState::Listening);
    println!("listening {:?} after the server came back; {:?}", back_at.elapsed(), hub.stats());

    notify(&url, &channel, "hello").await;
    assert_eq!(next_event(&mut sub, PATIENCE).await, Some(note(&channel, "hello")));
    hub.close();
    hub.finished().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_in_transaction_mode_listen_is_unavailable_for_good() {
    let (host, port) = host_and_port(&server_url());
    let bouncer = tokio::task::spawn_blocking(move || PgBouncer::start(&host, port, "transaction"))
        .await
        .expect("pgbouncer");
    let channel = unique("wmc");
    let hub = Hub::spawn(connector(&bouncer.url("postgres")), [&channel], HubOptions::new()).expect("spawn");
    let mut sub = hub.subscribe();
    let mut state = hub.state();
    let started = Instant::now();
    let verdict =
        wait_state(&mut state, "unavailable", PATIENCE, |s| matches!(s, HubState::Unavailable { .. })).await;
    println!("unavailable {:?} after spawn: {verdict:?}", started.elapsed());
    let HubState::Unavailable { reason } = verdict else { unreachable!() };
    assert!(reason.contains("direct URL") && reason.contains("PgBouncer"), "{reason}");

    assert_eq!(next_event(&mut sub, PATIENCE).await, None, "subscribers are told to poll");
    tokio::time::timeout(PATIENCE, hub.finished()).await.expect("the task ends: no reconnect loop");

    // Nothing more happens: one listener session and one probe session
    // reached PgBouncer, and no attempt after them. A negative check needs
    // real time: longer than the reconnect backoff would wait.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(matches!(hub.current_state(), HubState::Unavailable { .. }));
    let stats = hub.stats();
    assert_eq!((stats.connect_attempts, stats.listens), (1, 0), "{stats:?}");
    let logins = bouncer.log().matches("login attempt").count();
    assert_eq!(logins, 2, "PgBouncer saw {logins} logins:\n{}", bouncer.log());
}

/// Why the hub's probe is sent from a second session: through PgBouncer in
/// transaction mode a session that notifies itself does hear the echo
/// (an idle client gets the same server connection back), while a
/// notification from any other session never reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_a_self_notification_echoes_but_others_never_arrive() {
    let (host, port) = host_and_port(&server_url());
    let bouncer = tokio::task::spawn_blocking(move || PgBouncer::start(&host, port, "transaction"))
        .await
        .expect("pgbouncer");
    let url = bouncer.url("postgres");
    let channel = unique("wmc");
    let (client, mut heard) = observer(&url, &channel).await;
    client.query_typed("select pg_notify($1, 'self')", &[(&channel, Type::TEXT)]).await.expect("self notify");
    let echo = tokio::time::timeout(PATIENCE, heard.recv()).await.expect("the self-notification echoes");
    assert_eq!(echo, Some((channel.clone(), "self".to_owned())));

    notify(&url, &channel, "other").await;
    if let Ok(got) = tokio::time::timeout(Duration::from_secs(2), heard.recv()).await {
        panic!("a notification from another session arrived through PgBouncer: {got:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_leader_lock_one_hub_listens_and_the_standby_takes_over() {
    let url = server_url();
    let channel = unique("wmc");
    let key: i64 = rand::random();
    let retry = Duration::from_millis(300);
    let options = |app: &str| HubOptions::new().application_name(app).leader_lock(key).standby_retry(retry);
    let (app_a, app_b) = (unique("wm-leader-a"), unique("wm-leader-b"));

    let a = Hub::spawn(connector(&url), [&channel], options(&app_a)).expect("spawn a");
    wait_listening(&mut a.state()).await;
    let b = Hub::spawn(connector(&url), [&channel], options(&app_b)).expect("spawn b");
    let mut b_state = b.state();
    wait_state(&mut b_state, "standby", PATIENCE, |s| *s == HubState::Standby).await;
    eventually("b tried the lock twice", PATIENCE, || b.stats().standbys >= 2).await;
    assert_eq!(a.current_state(), HubState::Listening);
    let (mut sub_a, mut sub_b) = (a.subscribe(), b.subscribe());

    notify(&url, &channel, "one").await;
    assert_eq!(next_event(&mut sub_a, PATIENCE).await, Some(note(&channel, "one")));
    assert_quiet(&mut sub_b, Duration::from_millis(300)).await;
    assert_eq!(sessions(&url, &app_a).await, 1);

    a.close();
    a.finished().await;
    let closed_at = Instant::now();
    assert_eq!(next_event(&mut sub_b, PATIENCE).await, Some(Event::MayHaveMissed), "out of standby");
    let took = closed_at.elapsed();
    println!("standby took over {took:?} after the leader closed (retry interval {retry:?})");
    assert!(took < retry + Duration::from_secs(10), "{took:?}");
    assert_eq!(b.current_state(), HubState::Listening);
    notify(&url, &channel, "two").await;
    assert_eq!(next_event(&mut sub_b, PATIENCE).await, Some(note(&channel, "two")));

    // A killed leader loses the lock with its backend; a standby or the
    // leader itself (reconnecting) takes it: one of them listens again.
    let c = Hub::spawn(connector(&url), [&channel], options(&unique("wm-leader-c"))).expect("spawn c");
    wait_state(&mut c.state(), "standby", PATIENCE, |s| *s == HubState::Standby).await;
    assert_eq!(terminate(&url, &app_b).await, 1);
    eventually("a new leader", PATIENCE, || {
        let states = [b.current_state(), c.current_state()];
        states.contains(&HubState::Listening) && states.contains(&HubState::Standby)
    })
    .await;
    b.close();
    c.close();
    b.finished().await;
    c.finished().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_is_a_capacity_error() {
    let admin = admin_client(&server_url()).await;
    let role = unique("wm_notify_cap");
    admin.batch_execute(&format!("create role {role} login connection limit 0")).await.expect("role");
    let url = server_url().replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    let hub = Hub::spawn(connector(&url), [unique("wmc")], HubOptions::new()).expect("spawn");
    let mut state = hub.state();
    let down = wait_state(&mut state, "down", PATIENCE, |s| matches!(s, HubState::Down { .. })).await;
    let HubState::Down { reason } = down else { unreachable!() };
    assert!(reason.contains("too many connections"), "{reason}");
    eventually("a capacity error counted", PATIENCE, || hub.stats().capacity_errors >= 1).await;
    hub.close();
    hub.finished().await;
    let _ = admin.batch_execute(&format!("drop role if exists {role}")).await;
}

#[tokio::test]
async fn bad_channels_are_refused_by_name_before_any_connection() {
    let c = connector("postgres://nobody@127.0.0.1:1/none");
    let err = Hub::spawn(c.clone(), ["ok", ""], HubOptions::new()).unwrap_err();
    assert!(matches!(err, HubError::InvalidChannel { .. }), "{err}");
    assert_eq!(err.to_string(), "invalid channel \"\": it is empty");
    let long = "c".repeat(64);
    let err = Hub::spawn(c.clone(), [long.as_str()], HubOptions::new()).unwrap_err();
    assert!(err.to_string().contains(&long) && err.to_string().contains("63 bytes"), "{err}");
    assert_eq!(Hub::spawn(c, Vec::<String>::new(), HubOptions::new()).unwrap_err(), HubError::NoChannels);
}

#[test]
fn a_hub_needs_a_runtime() {
    let c = connector("postgres://nobody@127.0.0.1:1/none");
    assert_eq!(Hub::spawn(c, ["x"], HubOptions::new()).unwrap_err(), HubError::NoRuntime);
}
