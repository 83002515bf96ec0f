//! Held tasks through crashes: 300 keys of 20 ordered tasks and 200 small
//! graphs, run by worker processes that are SIGKILLed, and whose backends
//! are terminated, while they run. Every task succeeds, its effect (which
//! commits with its settlement) exists once, each key ran in order and one
//! task at a time, no dependent started before its predecessors' effects
//! committed, and nothing that should have gone is left held.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use waymark_store::{Flow, NewTask};
use waymark_tests::{eventually, pool_store, TestSchema};

const KEYS: usize = 300;
const PER_KEY: usize = 20;
const GRAPHS: usize = 200;

fn step() -> NewTask {
    NewTask::new("flow.step", json!({})).queue("flow").max_attempts(20)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_keys_and_graphs_survive_killed_workers_and_backends() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    schema
        .execute(
            "create table flow_runs (task_id text, attempt int, started_at timestamptz);
             create table flow_effects (task_id text, at timestamptz)",
        )
        .await;

    // The keys' tasks, each key's in order; and the graphs: a diamond
    // (a; b and c after a; d after both).
    let mut key_of: HashMap<String, (usize, usize)> = HashMap::new();
    let mut keyed = Vec::new();
    for k in 0..KEYS {
        for s in 0..PER_KEY {
            let held = step().ordered_by(format!("key:{k}"));
            key_of.insert(held.id().to_owned(), (k, s));
            keyed.push(held);
        }
    }
    let mut preds: HashMap<String, Vec<String>> = HashMap::new();
    let mut flows = Vec::new();
    for _ in 0..GRAPHS {
        let mut flow = Flow::new();
        let a = flow.add(step());
        let b = flow.add(step().after([&a]));
        let c = flow.add(step().after([&a]));
        let d = flow.add(step().after([&b, &c]));
        preds.insert(b.clone(), vec![a.clone()]);
        preds.insert(c.clone(), vec![a]);
        preds.insert(d, vec![b, c]);
        flows.push(flow);
    }
    let total = KEYS * PER_KEY + GRAPHS * 4;

    // Two workers start on what is submitted so far; the rest goes in
    // while they run, by several producers at once.
    let start = |name: &'static str| {
        let (url, schema) = (schema.url.clone(), schema.schema.clone());
        async move {
            waymark_tests::child::start_ready(env!("CARGO_BIN_EXE_flow_worker"), &[&url, &schema, name]).await
        }
    };
    let (mut first, _l1) = start("w1").await;
    let (mut second, _l2) = start("w2").await;
    let producers: Vec<_> = keyed
        .chunks(KEYS * PER_KEY / 4)
        .map(|chunk| {
            let store = store.clone();
            let chunk = chunk.to_vec();
            tokio::spawn(async move {
                for held in chunk {
                    store.hold(held).await.expect("hold");
                }
            })
        })
        .collect();
    for flow in &flows {
        store.submit_flow(flow).await.expect("flow");
    }
    for p in producers {
        p.await.expect("producer");
    }

    let effects = || async { schema.count("flow_effects").await as usize };
    eventually(Duration::from_secs(60), "a quarter of the effects", || async {
        effects().await >= total / 4
    })
    .await;
    first.start_kill().expect("SIGKILL w1");
    first.wait().await.expect("reaped");
    terminate_backends(&schema).await;
    let (mut third, _l3) = start("w3").await;
    eventually(Duration::from_secs(60), "half of the effects", || async { effects().await >= total / 2 })
        .await;
    second.start_kill().expect("SIGKILL w2");
    second.wait().await.expect("reaped");
    terminate_backends(&schema).await;
    let (_fourth, _l4) = start("w4").await;
    eventually(Duration::from_secs(120), "every effect", || async { effects().await >= total }).await;
    eventually(Duration::from_secs(30), "every task succeeded", || async {
        store.stats(Some("flow")).await.expect("stats")["flow"].succeeded == total as i64
    })
    .await;
    third.start_kill().ok();

    let admin = waymark_tests::db::admin_client(&schema.url).await;
    let table = |t: &str| format!("\"{}\".{t}", schema.schema);
    let rows = admin
        .query(&format!("select task_id, count(*), (extract(epoch from min(at)) * 1000000)::int8 from {} group by task_id", table("flow_effects")), &[])
        .await
        .expect("effects");
    assert_eq!(rows.len(), total, "every task's effect");
    let mut effect_at: HashMap<String, i64> = HashMap::new();
    for r in &rows {
        let (id, n, at): (String, i64, i64) = (r.get(0), r.get(1), r.get(2));
        assert_eq!(n, 1, "task {id}: its effect committed {n} times");
        effect_at.insert(id, at);
    }
    let runs = admin
        .query(
            &format!("select task_id, attempt, (extract(epoch from started_at) * 1000000)::int8 from {} order by started_at", table("flow_runs")),
            &[],
        )
        .await
        .expect("runs");
    let mut attempts: HashMap<String, Vec<i32>> = HashMap::new();
    let mut last_in_key: HashMap<usize, usize> = HashMap::new();
    for r in &runs {
        let (id, attempt, started): (String, i32, i64) = (r.get(0), r.get(1), r.get(2));
        attempts.entry(id.clone()).or_default().push(attempt);
        if let Some(&(k, s)) = key_of.get(&id) {
            let seen = last_in_key.entry(k).or_insert(s);
            assert!(s >= *seen, "key {k}: task {s} ran after task {seen}");
            *seen = s;
            if s > 0 {
                let before = keyed[k * PER_KEY + s - 1].id();
                assert!(
                    effect_at[before] < started,
                    "key {k}: task {s} started before task {}'s effect",
                    s - 1
                );
            }
        }
        for p in preds.get(&id).into_iter().flatten() {
            assert!(effect_at[p] < started, "task {id} started before its predecessor {p}'s effect");
        }
    }
    for (id, a) in &attempts {
        let mut sorted = a.clone();
        sorted.dedup();
        assert_eq!(&sorted, a, "task {id}: one run per attempt, in order: {a:?}");
    }
    assert_eq!(schema.count("waymark_held where state = 'held'").await, 0, "nothing left held");
    schema.drop().await;
}

async fn terminate_backends(schema: &TestSchema) {
    let admin = waymark_tests::db::admin_client(&schema.url).await;
    admin
        .execute(
            "select count(pg_terminate_backend(pid)) from pg_stat_activity \
             where datname = current_database() and pid <> pg_backend_pid() and backend_type = 'client backend'",
            &[],
        )
        .await
        .expect("terminate backends");
}
