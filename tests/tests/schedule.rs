//! Periodic tasks on a real PostgreSQL: three scheduler processes run one
//! fast schedule (every 50 ms) for a few hundred slots; one is killed with
//! SIGKILL mid-run and started again, and the server restarts under them.
//! Every slot from the first to the last has exactly one task, and a
//! cairnq Python worker runs them all. Prints how late slots fired.

use std::collections::BTreeMap;
use std::time::Duration;

use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, Store};
use waymark_tests::private_cluster::PrivateCluster;
use waymark_tests::{python, until_some};

const PERIOD_MS: i64 = 50;
const CATCH_UP: &str = "100";

async fn scheduler(url: &str) -> tokio::process::Child {
    let period = PERIOD_MS.to_string();
    waymark_tests::child::start_ready(env!("CARGO_BIN_EXE_schedule_process"), &[url, &period, CATCH_UP])
        .await
        .0
}

/// The slot tasks so far: slot (epoch ms) -> (task ids, created_at_ms of each).
async fn slots(client: &tokio_postgres::Client) -> Option<BTreeMap<i64, Vec<(String, i64)>>> {
    let rows = client
        .query(
            "select id, created_at_ms, \
                    (extract(epoch from (metadata->>'waymark.slot')::timestamptz) * 1000)::bigint \
               from cairnq_tasks where metadata->>'waymark.schedule' = 'fast'",
            &[],
        )
        .await
        .ok()?;
    let mut out: BTreeMap<i64, Vec<(String, i64)>> = BTreeMap::new();
    for r in rows {
        out.entry(r.get(2)).or_default().push((r.get(0), r.get(1)));
    }
    Some(out)
}

/// Waits until at least `n` slots have tasks (the server may be away
/// meanwhile: a failed read is tried again).
async fn until_slots(url: &str, n: usize) {
    until_some(Duration::from_secs(60), &format!("{n} slots with tasks"), || async move {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.ok()?;
        tokio::spawn(conn);
        slots(&client).await.filter(|s| s.len() >= n).map(|_| ())
    })
    .await;
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_schedulers_give_one_task_per_slot_through_a_kill_and_a_server_restart() {
    tokio::task::spawn_blocking(python::venv_python).await.expect("setting up the Python venv");
    let cluster = tokio::task::spawn_blocking(|| PrivateCluster::start("schedule")).await.expect("cluster");
    let url = cluster.url("postgres");
    let pool = PgPool::builder(&url).max_size(2).build().expect("pool");
    let store = Store::connect(pool, ConnectOptions::default()).await.expect("connect");
    let started_ms = store.database_time_ms().await.expect("clock");

    let mut fleet = vec![scheduler(&url).await, scheduler(&url).await, scheduler(&url).await];
    until_slots(&url, 120).await;
    // One scheduler dies outright, mid-run, and comes back (catching up).
    fleet[0].kill().await.expect("SIGKILL");
    until_slots(&url, 180).await;
    fleet[0] = scheduler(&url).await;
    until_slots(&url, 240).await;
    // The server goes away under all three and comes back.
    let restart_at = store.database_time_ms().await.expect("clock");
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.restart();
        cluster
    })
    .await
    .expect("restart");
    until_slots(&url, 400).await;
    for child in &mut fleet {
        if let Some(pid) = child.id() {
            let _ = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
    }

    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    let all = slots(&client).await.expect("slots");
    let (first, last) = (*all.keys().next().expect("a slot"), *all.keys().last().expect("a slot"));
    let doubled: Vec<_> = all.iter().filter(|(_, tasks)| tasks.len() != 1).collect();
    assert!(doubled.is_empty(), "slots with more than one task: {doubled:?}");
    let expected = usize::try_from((last - first) / PERIOD_MS + 1).expect("slots");
    let missing: Vec<i64> =
        (0..expected as i64).map(|i| first + i * PERIOD_MS).filter(|s| !all.contains_key(s)).collect();
    assert!(missing.is_empty(), "{} of {expected} slots have no task: {missing:?}", missing.len());
    assert!(all.len() >= 400, "a few hundred slots: {}", all.len());

    // Lateness: slot to the task's insert, for slots after the schedulers
    // started (earlier ones are the first start's catch-up).
    let late = |keep: &dyn Fn(i64) -> bool| {
        let mut v: Vec<i64> = all
            .iter()
            .filter(|(slot, _)| **slot >= started_ms && keep(**slot))
            .map(|(slot, tasks)| tasks[0].1 - slot)
            .collect();
        v.sort_unstable();
        v
    };
    let every = late(&|_| true);
    let calm = late(&|slot| !(restart_at - 1_000..restart_at + 10_000).contains(&slot));
    println!(
        "schedule every {PERIOD_MS} ms, 3 schedulers: {} slots, each one task; lateness p50 {} ms, p99 {} ms \
         (all {} slots after start); away from the server restart p50 {} ms, p99 {} ms ({} slots)",
        all.len(),
        percentile(&every, 0.5),
        percentile(&every, 0.99),
        every.len(),
        percentile(&calm, 0.5),
        percentile(&calm, 0.99),
        calm.len()
    );
    assert!(every.iter().all(|&l| l >= 0), "no slot fires early");

    // A cairnq Python worker runs every slot's task.
    let ids: Vec<String> = all.values().map(|tasks| tasks[0].0.clone()).collect();
    let mut args = vec!["work".to_owned(), "--timeout-s".to_owned(), "120".to_owned(), "--until".to_owned()];
    args.extend(ids.iter().cloned());
    let worked = {
        let url = url.clone();
        tokio::task::spawn_blocking(move || python::interop(&url, args)).await.expect("python worker")
    };
    let ran = worked["runs"].as_array().expect("runs").len();
    assert!(ran >= ids.len(), "the Python worker ran {ran} of {} tasks", ids.len());
    let succeeded: i64 = client
        .query_one(
            "select count(*) from cairnq_tasks where metadata->>'waymark.schedule' = 'fast' and status = 'succeeded'",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(succeeded, i64::try_from(ids.len()).unwrap(), "every slot's task succeeded under Python");
    drop(cluster);
}
