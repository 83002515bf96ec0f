//! Helpers shared by the notify tests: unique names, waiting on hub states
//! and on `pg_stat_activity`, sending notifications from outside.
//!
//! Channels are database-wide and the shared server runs other tests at the
//! same time, so every test uses channel and `application_name` values of
//! its own.

#![allow(dead_code)]

use std::time::Duration;

use rand::Rng;
use tokio::sync::watch;
use tokio_postgres::types::Type;
use waymark_notify::{Connector, Event, HubState, Subscription};
use waymark_tests::db::admin_client;

/// Generous bound for anything that involves connecting on a busy 2-core machine.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// `prefix_` and 12 random hex digits: a channel or application name of
/// this test's own.
pub fn unique(prefix: &str) -> String {
    let n: u64 = rand::thread_rng().gen();
    format!("{prefix}_{:012x}", n & 0xffff_ffff_ffff)
}

pub fn connector(url: &str) -> Connector {
    Connector::no_tls(url.parse().unwrap_or_else(|e| panic!("parsing {url}: {e}")))
}

/// Waits (at most `within`) until the state satisfies `pred`; panics with
/// the state it is in otherwise, or if the hub ended first.
pub async fn wait_state(
    state: &mut watch::Receiver<HubState>,
    what: &str,
    within: Duration,
    pred: impl FnMut(&HubState) -> bool,
) -> HubState {
    let outcome = match tokio::time::timeout(within, state.wait_for(pred)).await {
        Ok(Ok(s)) => Ok(s.clone()),
        Ok(Err(_)) => Err("the hub ended in"),
        Err(_) => Err("after the wait, still"),
    };
    outcome.unwrap_or_else(|why| panic!("waiting {within:?} for {what}: {why} {:?}", *state.borrow()))
}

pub async fn wait_listening(state: &mut watch::Receiver<HubState>) {
    wait_state(state, "listening", PATIENCE, |s| *s == HubState::Listening).await;
}

/// The next event, at most `within`; panics on a timeout.
pub async fn next_event(sub: &mut Subscription, within: Duration) -> Option<Event> {
    tokio::time::timeout(within, sub.recv()).await.unwrap_or_else(|_| panic!("no event within {within:?}"))
}

/// Panics if an event arrives within `quiet`.
pub async fn assert_quiet(sub: &mut Subscription, quiet: Duration) {
    if let Ok(event) = tokio::time::timeout(quiet, sub.recv()).await {
        panic!("expected no event, got {event:?}");
    }
}

pub fn note(channel: &str, payload: &str) -> Event {
    Event::Notification { channel: channel.to_owned(), payload: payload.to_owned() }
}

/// `pg_notify(channel, payload)` from a session of its own (in one round
/// trip, so that it works through a transaction-mode pooler too).
pub async fn notify(url: &str, channel: &str, payload: &str) {
    admin_client(url)
        .await
        .query_typed("select pg_notify($1, $2)", &[(&channel, Type::TEXT), (&payload, Type::TEXT)])
        .await
        .unwrap_or_else(|e| panic!("notify {channel}: {e}"));
}

/// Sessions named `application_name` on the server of `url`.
pub async fn sessions(url: &str, application_name: &str) -> i64 {
    admin_client(url)
        .await
        .query_one("select count(*) from pg_stat_activity where application_name = $1", &[&application_name])
        .await
        .expect("pg_stat_activity")
        .get(0)
}

/// Waits (polling, at most `within`) until `sessions` is `n`.
pub async fn wait_sessions(url: &str, application_name: &str, n: i64, within: Duration) {
    let what = format!("{n} sessions named {application_name}");
    waymark_testing::eventually(within, &what, || async { sessions(url, application_name).await == n }).await;
}

/// Ends the backends named `application_name`; how many there were.
pub async fn terminate(url: &str, application_name: &str) -> i64 {
    admin_client(url)
        .await
        .query_one(
            "select count(pg_terminate_backend(pid)) from pg_stat_activity where application_name = $1",
            &[&application_name],
        )
        .await
        .expect("terminate")
        .get(0)
}

/// Polls `check` every 10 ms until it is true, at most `within`.
pub async fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    waymark_testing::eventually(within, what, || {
        let holds = check();
        async move { holds }
    })
    .await;
}
