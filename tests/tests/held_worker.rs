//! Held tasks on a worker: many producers on the same keys at once get
//! their tasks run one at a time per key, in the order their submits
//! committed (each producer's own in the order it made them), and a
//! dependent starts right after its predecessor's settlement.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value as Json};
use waymark_store::{HeldFilter, HeldState, NewTask};
use waymark_tests::{eventually, pool_store, test_worker, TestSchema, TestWorker};

const PRODUCERS: usize = 8;
const EACH: usize = 25;
const KEYS: usize = 2;

/// Per key: each run's task id as it started (true) and ended (false).
type RunLog = Arc<Mutex<HashMap<String, Vec<(String, bool)>>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_producers_on_one_key_get_commit_order_one_task_at_a_time() {
    let schema = TestSchema::new().await;
    let store = Arc::new(pool_store(&schema).await);
    // Per key: the tasks as they ran (start, then end), by producer and index.
    let log: RunLog = Arc::default();
    let seen = log.clone();
    let worker = test_worker(&store, "ordered")
        .concurrency(16)
        .task("ordered.step", move |ctx, p: Json| {
            let seen = seen.clone();
            async move {
                let key = p["key"].as_str().unwrap().to_owned();
                seen.lock().unwrap().entry(key.clone()).or_default().push((ctx.id().to_owned(), true));
                tokio::task::yield_now().await;
                seen.lock().unwrap().entry(key).or_default().push((ctx.id().to_owned(), false));
                Ok(json!({}))
            }
        })
        .start();

    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                for i in 0..EACH {
                    let key = format!("account:{}", i % KEYS);
                    let task = NewTask::new("ordered.step", json!({"key": key, "producer": p, "i": i}))
                        .queue("ordered")
                        .ordered_by(key);
                    mine.push(store.hold(task).await.expect("hold").id);
                }
                mine
            })
        })
        .collect();
    let mut submitted = Vec::new();
    for p in producers {
        submitted.push(p.await.expect("producer"));
    }
    let total = PRODUCERS * EACH;
    eventually(Duration::from_secs(60), "every ordered task succeeded", || async {
        store.stats(Some("ordered")).await.expect("stats")["ordered"].succeeded == total as i64
    })
    .await;
    worker.stop().await;

    let log = log.lock().unwrap().clone();
    for k in 0..KEYS {
        let key = format!("account:{k}");
        let filter = HeldFilter {
            state: Some(HeldState::Done),
            order_key: Some(key.clone()),
            limit: 1000,
            ..Default::default()
        };
        let mut rows = store.list_held(&filter).await.expect("ledger");
        rows.sort_by_key(|r| r.order_seq);
        let commit_order: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        let events = &log[&key];
        // Start, end, start, end: never two at once.
        for pair in events.chunks(2) {
            assert!(
                pair[0].1 && !pair[1].1 && pair[0].0 == pair[1].0,
                "key {key}: overlapping runs {pair:?}"
            );
        }
        let run_order: Vec<&str> = events.iter().filter(|e| e.1).map(|e| e.0.as_str()).collect();
        assert_eq!(run_order, commit_order, "key {key}: runs in the order the submits committed");
    }
    // Each producer's own tasks of a key ran in the order it submitted them.
    let position: HashMap<&str, usize> = log
        .values()
        .flat_map(|e| e.iter().filter(|x| x.1).enumerate().map(|(i, x)| (x.0.as_str(), i)))
        .collect();
    for mine in &submitted {
        for k in 0..KEYS {
            let of_key: Vec<usize> =
                mine.iter().skip(k).step_by(KEYS).map(|id| position[id.as_str()]).collect();
            assert!(
                of_key.windows(2).all(|w| w[0] < w[1]),
                "a producer's tasks ran out of its order: {of_key:?}"
            );
        }
    }
    schema.drop().await;
}
