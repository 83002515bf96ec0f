//! Held tasks beside the cairnq Python SDK on one database: waymark's
//! ledger leaves cairnq's tables, ledger and versions as they were; a held
//! task is invisible to a Python client until its release; a Python worker
//! runs released tasks (its metadata carries the mark and the event); and a
//! Python client's plain task, settled by a Python worker, releases the
//! waymark task held after it through the upkeep of a waymark worker that
//! shares the database.
//!
//! Without Python or PyPI this test fails; it never skips.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value as Json};
use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, Flow, HeldState, NewTask, Store, TaskStatus};
use waymark_tests::db::admin_client;
use waymark_tests::{python, test_worker, until_some, TestDatabase, TestWorker};

fn py(url: &str, args: Vec<String>) -> Json {
    python::interop(url, args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_clients_and_workers_see_released_tasks_only_and_run_them() {
    tokio::task::spawn_blocking(python::venv_python).await.expect("setting up the Python venv");
    let db = TestDatabase::new().await;
    let pool = PgPool::builder(&db.url).max_size(4).build().expect("pool");
    let store = Arc::new(Store::connect(pool, ConnectOptions::default()).await.expect("connect"));
    let admin = admin_client(&db.url).await;
    let one = |sql: &'static str| {
        let admin = &admin;
        async move { admin.query_one(sql, &[]).await.expect(sql).get::<_, String>(0) }
    };
    assert_eq!(one("select value from cairnq_meta where key = 'schema_version'").await, "10");
    assert_eq!(
        one("select count(*)::text from cairnq_migrations").await,
        "10",
        "waymark's files are not in cairnq's ledger"
    );
    let ledgers: Vec<&str> = waymark_store::protocol::ledger_migrations().iter().map(|m| m.name).collect();
    assert_eq!(
        one("select string_agg(name, ',' order by name) from waymark_migrations").await,
        ledgers.join(",")
    );

    // A flow: py.ok, then py.echo after it and after an event.
    let mut flow = Flow::new();
    let first = flow.add(NewTask::new("py.ok", json!({"x": 1})).queue("default"));
    let second = flow.add(NewTask::new("py.echo", json!({"n": 2})).after([&first]).on_event("ready:1"));
    store.submit_flow(&flow).await.expect("flow");
    // The Python client connects (its guard, ledger and version check pass
    // with waymark's tables beside its own) and cannot see the held task.
    let read = py(&db.url, vec!["read".into(), "--id".into(), second.clone(), "--id".into(), first.clone()]);
    assert_eq!(read["by_id"][&second], Json::Null, "a held task is invisible: {read}");
    assert_eq!(read["by_id"][&first]["status"], "queued", "{read}");

    // A plain task from a Python client, and a waymark task held after it.
    let submitted =
        py(&db.url, vec!["submit".into(), json!([{"name": "py.ok", "payload": {"x": 10}}]).to_string()]);
    let plain = submitted["submitted"][0]["task"]["id"].as_str().expect("python's task id").to_owned();
    let after_plain =
        store.hold(NewTask::new("py.echo", json!({"n": 3})).after([plain.clone()])).await.expect("hold");
    assert!(!after_plain.released);
    store.emit("ready:1", json!({"go": true})).await.expect("emit");

    // A waymark worker on another queue: its upkeep passes on the ends the
    // Python worker settles. The Python worker runs every task.
    let upkeep = test_worker(&store, "waymark-only")
        .held_sweep_interval(Some(Duration::from_millis(50)))
        .task("wm.only", |_ctx, p: Json| async move { Ok(p) })
        .start();
    let work = py(
        &db.url,
        vec![
            "work".into(),
            "--timeout-s".into(),
            "90".into(),
            "--until".into(),
            first.clone(),
            second.clone(),
            plain.clone(),
            after_plain.id.clone(),
        ],
    );
    upkeep.stop().await;
    let runs = work["runs"].as_array().expect("runs");
    let ran =
        |id: &str| runs.iter().find(|r| r["id"] == id).unwrap_or_else(|| panic!("{id} did not run: {work}"));
    let echoed = ran(&second);
    assert_eq!(echoed["metadata"]["waymark_held"], true, "{echoed}");
    assert_eq!(
        echoed["metadata"]["waymark_event"],
        json!({"name": "ready:1", "payload": {"go": true}}),
        "{echoed}"
    );
    let order = |id: &str| runs.iter().position(|r| r["id"] == id).unwrap();
    assert!(order(&first) < order(&second) && order(&plain) < order(&after_plain.id), "{work}");
    for id in [&first, &second, &plain, &after_plain.id] {
        assert_eq!(store.fetch(id).await.expect("fetch").status, TaskStatus::Succeeded, "{id}");
    }
    let passed = until_some(Duration::from_secs(10), "the last ends passed on", || {
        let store = store.clone();
        let id = after_plain.id.clone();
        async move { store.held(&id).await.expect("held").filter(|h| h.state == HeldState::Done) }
    })
    .await;
    assert_eq!(passed.outcome.as_deref(), Some("succeeded"));
    db.drop().await;
}
