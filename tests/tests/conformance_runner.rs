//! The conformance runner itself, on a scenario of our own written to
//! `../shared/conformance/FORMAT.md`: a `heartbeat_batch` row is
//! `{id, cancel_requested}` with a boolean, in the order the ids were given.

use std::path::PathBuf;

use serde_json::json;
use waymark_tests::conformance::{run_scenario, Scenario};
use waymark_tests::{pool_store, TestSchema};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_batch_rows_follow_the_format() {
    let steps = json!([
        {"op": "submit", "args": {"name": "hb", "payload": {}}, "save": "a"},
        {"op": "submit", "args": {"name": "hb", "payload": {}}, "save": "b"},
        {"op": "claim", "args": {"worker_id": "w1", "queues": ["default"], "limit": 2}, "expect": {"length": 2}},
        {"op": "cancel", "args": {"id": "$b.id"}},
        {"op": "heartbeat_batch", "args": {"ids": ["$b.id", "$a.id"], "worker_id": "w1"}, "save": "beats",
         "expect": {"length": 2}},
        {"op": "expect", "target": "$beats.0.id", "equalsRef": "$b.id"},
        {"op": "expect", "target": "$beats.0", "equals": {"cancel_requested": true}},
        {"op": "expect", "target": "$beats.1", "equals": {"cancel_requested": false}},
        {"op": "expect", "target": "$beats.1.id", "equalsRef": "$a.id"}
    ]);
    let scenario = Scenario {
        name: "heartbeat_batch_rows".to_owned(),
        path: PathBuf::from("tests/tests/conformance_runner.rs"),
        steps: steps.as_array().expect("steps").clone(),
    };
    let schema = TestSchema::new().await;
    let store = pool_store(&schema).await;
    run_scenario(&store, &scenario).await.expect("the scenario passes");

    // The old shape (cancel_requested_at_ms, no boolean) fails the check.
    let mut wrong = scenario.clone();
    wrong.steps.push(json!({"op": "expect", "target": "$beats.0", "notNull": ["cancel_requested_at_ms"]}));
    let other = TestSchema::new().await;
    let err = run_scenario(&pool_store(&other).await, &wrong).await.expect_err("no such field");
    assert!(err.contains("cancel_requested_at_ms"), "{err}");
    other.drop().await;
    schema.drop().await;
}
