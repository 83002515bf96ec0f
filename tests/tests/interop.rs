//! waymark and the cairnq Python SDK on one database, nothing translated in
//! between: Python submits and waymark works, then waymark submits and a
//! Python worker works. The Python side is `tests/python/interop.py`, run in
//! the venv that `waymark_tests::python` keeps (cairnq 0.15 from PyPI).
//!
//! Without Python or PyPI these tests fail; they never skip.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};
use waymark_pool::PgPool;
use waymark_store::worker_protocol::WorkerProtocol;
use waymark_store::Lease;
use waymark_store::{ClaimRequest, ConnectOptions, Failure, NewTask, Store, Task, TaskStatus};
use waymark_tests::db::admin_client;
use waymark_tests::{eventually, python, test_worker, until_some, TestDatabase, TestWorker};

/// The ledger rows every installation of protocol v1 ends with.
const MIGRATIONS: [&str; 10] = [
    "0001_init.sql",
    "0002_purge_index.sql",
    "0003_notify.sql",
    "0004_lease_index.sql",
    "0005_clear_terminal_lease.sql",
    "0006_claim_name_index.sql",
    "0007_purge_status_index.sql",
    "0008_claim_due_index.sql",
    "0009_purge_queue_index.sql",
    "0010_drop_status_index.sql",
];

const RUST_WORKER: &str = "wm-rust-worker-1";

/// Runs `interop.py` against `url` and parses the JSON it prints.
fn py(url: &str, args: Vec<String>) -> Json {
    python::interop(url, args)
}

/// [`py`] on a blocking thread, so the test can carry on meanwhile.
fn py_in_background(url: &str, args: Vec<String>) -> tokio::task::JoinHandle<Json> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || py(&url, args))
}

async fn ensure_python() {
    tokio::task::spawn_blocking(python::venv_python).await.expect("setting up the Python venv");
}

async fn store_on(url: &str) -> Store<PgPool> {
    let pool = PgPool::builder(url).max_size(4).build().expect("pool");
    Store::connect(pool, ConnectOptions::default())
        .await
        .expect("waymark connects (and migrates) a fresh database")
}

/// The migration ledger: (name, applied_at_ms), by name.
async fn ledger(url: &str) -> Vec<(String, i64)> {
    admin_client(url)
        .await
        .query("select name, applied_at_ms from cairnq_migrations order by name", &[])
        .await
        .expect("reading cairnq_migrations")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

async fn meta(url: &str) -> BTreeMap<String, String> {
    admin_client(url)
        .await
        .query("select key, value from cairnq_meta", &[])
        .await
        .expect("reading cairnq_meta")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// A task as JSON with the table's column names, the shape cairnq's
/// `dataclasses.asdict(Task)` prints.
fn as_json(task: &Task) -> Json {
    serde_json::to_value(task).expect("task to JSON")
}

fn is_task_id(id: &str) -> bool {
    const CROCKFORD: &str = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    id.strip_prefix("task_")
        .is_some_and(|ulid| ulid.len() == 26 && ulid.chars().all(|c| CROCKFORD.contains(c)))
}

fn str_of<'a>(doc: &'a Json, what: &str) -> &'a str {
    doc.as_str().unwrap_or_else(|| panic!("{what}: expected a string, got {doc}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_rust_worker() {
    let started = Instant::now();
    ensure_python().await;
    let db = TestDatabase::new().await;
    let url = db.url.clone();
    let store = store_on(&url).await;

    // waymark migrated: the ledger holds the ten files, keyed by file name.
    let ledger_before = ledger(&url).await;
    let names: Vec<&str> = ledger_before.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, MIGRATIONS, "waymark's ledger rows");
    assert!(
        ledger_before.iter().all(|(_, at)| *at > 1_600_000_000_000),
        "applied_at_ms is epoch ms: {ledger_before:?}"
    );
    let meta_before = meta(&url).await;
    assert_eq!(meta_before.get("protocol_version").map(String::as_str), Some("1"));
    assert_eq!(meta_before.get("schema_version").map(String::as_str), Some("10"));

    // Python connects (schema guard, ledger, protocol check) and submits.
    let specs = json!([
        {"name": "rs.double", "payload": {"n": 21}},
        {"name": "rs.double", "payload": {"n": 5}, "key": "order-7",
         "metadata": {"source": "python"}, "priority": 5},
        {"name": "rs.double", "payload": {"n": 999}, "key": "order-7"},
        {"name": "rs.explode", "payload": {"why": "bad input"}, "max_attempts": 5},
        {"name": "rs.flaky", "payload": {}, "max_attempts": 2},
        {"name": "rs.echo", "payload": {"text": "h\u{e9}llo \u{2713}"}, "key": "order-8"},
        {"name": "rs.echo", "payload": {"text": "other"}, "key": "order-8", "conflict": "reject"},
    ]);
    let submitted = py(&url, vec!["submit".into(), specs.to_string()]);
    assert!(
        str_of(&submitted["sdk_version"], "sdk_version").starts_with(python::CAIRNQ_SERIES),
        "{submitted}"
    );
    assert_eq!(
        submitted["protocol_version"],
        json!(1),
        "cairnq reads protocol_version 1 from waymark's meta row"
    );
    let rows = submitted["submitted"].as_array().expect("submitted is a list");
    assert_eq!(rows.len(), 7, "{submitted}");
    let task = |i: usize| -> &Json {
        rows[i].get("task").unwrap_or_else(|| panic!("submit #{i} failed: {}", rows[i]))
    };
    let id = |i: usize| str_of(&task(i)["id"], "id").to_owned();
    let (plain, keyed, explode, flaky, echo) = (id(0), id(1), id(3), id(4), id(5));
    assert_eq!(id(2), keyed, "a keyed resubmit under reuse dedupes to the live task");
    assert_eq!(task(2)["payload"], json!({"n": 5}), "the dedupe returned the first submit's row");
    assert_eq!(rows[6]["error"], json!("AlreadyExists"), "conflict=reject on a taken key: {}", rows[6]);

    // Python connecting changed nothing in the ledger or the meta rows.
    assert_eq!(ledger(&url).await, ledger_before, "cairnq re-ran or re-recorded a migration");
    assert_eq!(meta(&url).await, meta_before, "cairnq rewrote cairnq_meta");

    // Python's rows read the same through waymark, field for field.
    for i in [0, 1, 3, 4, 5] {
        let id = id(i);
        assert!(is_task_id(&id), "cairnq's id {id}");
        let seen = store.fetch(&id).await.expect("waymark reads a cairnq row");
        assert_eq!(as_json(&seen), *task(i), "the row cairnq returned vs what waymark reads");
        assert_eq!(seen.status, TaskStatus::Queued);
        assert_eq!(seen.attempt, 0);
        assert_eq!(seen.root_id.as_deref(), Some(id.as_str()), "a top-level task is its own root");
        assert_eq!(seen.lease_until_ms, None);
    }
    let seen_keyed = store.fetch(&keyed).await.unwrap();
    assert_eq!(seen_keyed.priority, 5);
    assert_eq!(seen_keyed.metadata, json!({"source": "python"}));
    assert_eq!(store.fetch(&explode).await.unwrap().max_attempts, 5);
    assert_eq!(store.fetch(&plain).await.unwrap().max_attempts, 3, "cairnq's default");
    let by_key = store.get_by_key("order-7").await.unwrap().expect("order-7 is keyed");
    assert_eq!(by_key.id, keyed, "cairnq's key row, read by waymark");

    // A Python client waits on them while waymark works them.
    let all = [&plain, &keyed, &explode, &flaky, &echo];
    let mut wait_args = vec!["wait".to_owned(), "--timeout-ms".into(), "60000".into()];
    wait_args.extend(all.iter().map(|s| s.to_string()));
    let waiter = py_in_background(&url, wait_args);

    let claimed = store
        .claim(&ClaimRequest::new(RUST_WORKER, ["default"]).limit(50))
        .await
        .expect("waymark claims cairnq's tasks");
    let claimed_ids: BTreeSet<&str> = claimed.iter().map(|t| t.id.as_str()).collect();
    let expected: BTreeSet<&str> = all.iter().map(|s| s.as_str()).collect();
    assert_eq!(claimed_ids, expected, "every distinct task, once");
    for t in &claimed {
        assert_eq!(t.status, TaskStatus::Running, "{t:?}");
        assert_eq!(t.attempt, 1, "{t:?}");
        assert_eq!(t.worker_id.as_deref(), Some(RUST_WORKER));
        assert!(t.lease_until_ms.is_some());
    }
    let payload_of = |id: &str| claimed.iter().find(|t| t.id == id).unwrap().payload.clone();
    assert_eq!(payload_of(&plain), json!({"n": 21}));
    assert_eq!(payload_of(&echo), json!({"text": "h\u{e9}llo \u{2713}"}));

    let explode_error = json!({
        "type": "InvalidInput",
        "code": "bad_input",
        "message": "cannot explode: bad input",
        "retryable": false,
        "details": {"field": "why", "seen": "bad input"},
    });
    let flaky_error = json!({
        "type": "Transient",
        "code": "handler_error",
        "message": "the first attempt always fails",
        "retryable": true,
        "details": {},
    });
    store.complete(&Lease::new(&plain, RUST_WORKER), json!({"doubled": 42})).await.unwrap();
    store.complete(&Lease::new(&keyed, RUST_WORKER), json!({"doubled": 10})).await.unwrap();
    // A top-level JSON string as a result: cairnq must not parse it twice.
    store.complete(&Lease::new(&echo, RUST_WORKER), json!("h\u{e9}llo \u{2713}")).await.unwrap();
    let failed = store
        .fail(&Lease::new(&explode, RUST_WORKER), &Failure::new(explode_error.clone()).retryable(false))
        .await
        .unwrap();
    assert_eq!(failed.status, TaskStatus::Failed, "permanent, though attempts remain");
    let requeued =
        store.fail(&Lease::new(&flaky, RUST_WORKER), &Failure::new(flaky_error.clone())).await.unwrap();
    assert_eq!(requeued.status, TaskStatus::Queued, "retryable with an attempt left");
    let again = store.claim(&ClaimRequest::new(RUST_WORKER, ["default"]).limit(50)).await.unwrap();
    assert_eq!(again.len(), 1, "only the requeued task is due: {again:?}");
    assert_eq!((again[0].id.as_str(), again[0].attempt), (flaky.as_str(), 2));
    store.complete(&Lease::new(&flaky, RUST_WORKER), json!({"ok": true})).await.unwrap();

    // What the Python client's wait() saw.
    let waited = waiter.await.expect("the Python waiter");
    let finals = &waited["tasks"];
    let expect = |id: &str, status: &str, attempt: i64, result: Json, error: Json| {
        let t = &finals[id];
        assert_eq!(t["status"], json!(status), "{id}: {t}");
        assert_eq!(t["attempt"], json!(attempt), "{id}: {t}");
        assert_eq!(t["result"], result, "{id}: {t}");
        assert_eq!(t["error"], error, "{id}: {t}");
        assert_eq!(t["worker_id"], json!(RUST_WORKER), "{id}: kept on terminal rows: {t}");
        assert_eq!(t["lease_until_ms"], Json::Null, "{id}: {t}");
        assert!(t["completed_at_ms"].as_i64().is_some(), "{id}: {t}");
    };
    expect(&plain, "succeeded", 1, json!({"doubled": 42}), Json::Null);
    expect(&keyed, "succeeded", 1, json!({"doubled": 10}), Json::Null);
    expect(&echo, "succeeded", 1, json!("h\u{e9}llo \u{2713}"), Json::Null);
    expect(&explode, "failed", 1, Json::Null, explode_error.clone());
    // The first attempt's error stays on the row after the retry succeeds.
    expect(&flaky, "succeeded", 2, json!({"ok": true}), flaky_error.clone());
    assert_eq!(finals[&plain]["progress"], json!(1.0));
    assert_eq!(finals[&explode]["progress"], Json::Null);

    // And a fresh Python read, by id, by key, and the stats.
    let mut read_args = vec!["read".to_owned()];
    for id in all {
        read_args.extend(["--id".to_owned(), id.to_string()]);
    }
    read_args.extend(["--key".into(), "order-7".into(), "--key".into(), "order-8".into()]);
    let read = py(&url, read_args);
    for id in all {
        let mine = as_json(&store.fetch(id).await.unwrap());
        assert_eq!(read["by_id"][id], mine, "cairnq and waymark read {id} differently");
        assert_eq!(finals[id], mine, "what wait() returned for {id}");
    }
    assert_eq!(read["by_key"]["order-7"]["id"], json!(keyed));
    assert_eq!(read["by_key"]["order-8"]["id"], json!(echo));
    assert_eq!(
        read["stats"],
        json!({"default": {"queued": 0, "running": 0, "succeeded": 4, "failed": 1, "canceled": 0}})
    );

    assert_eq!(ledger(&url).await, ledger_before, "three cairnq connects later");
    db.drop().await;
    eprintln!("python_client_rust_worker took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_client_python_worker() {
    let started = Instant::now();
    ensure_python().await;
    let db = TestDatabase::new().await;
    let url = db.url.clone();
    let store = store_on(&url).await;

    let submit = |task: NewTask| {
        let store = &store;
        async move { store.submit(task).await.expect("waymark submits") }
    };
    let ok = submit(NewTask::new("py.ok", json!({"x": 3}))).await;
    let keyed = submit(NewTask::new("py.ok", json!({"x": 10})).key("rb-1")).await;
    let keyed_again = submit(NewTask::new("py.ok", json!({"x": 11})).key("rb-1")).await;
    assert_eq!(keyed_again.id, keyed.id, "a keyed resubmit dedupes");
    assert_eq!(keyed_again.payload, json!({"x": 10}));
    let boom = submit(NewTask::new("py.boom", json!({"reason": "no such account", "account": 42}))).await;
    let crash = submit(NewTask::new("py.crash", json!({"message": "kaput"})).max_attempts(1)).await;
    let slow = submit(NewTask::new("py.slow", json!({"give_up_s": 60}))).await;
    // No Python handler has this name: the worker must leave it alone.
    let orphan = submit(NewTask::new("rust.only", json!({}))).await;

    let mut work_args = vec![
        "work".to_owned(),
        "--timeout-s".into(),
        "90".into(),
        "--lease-ms".into(),
        "3000".into(),
        "--until".into(),
    ];
    work_args.extend([&ok, &keyed, &boom, &crash, &slow].map(|t| t.id.clone()));
    let worker = py_in_background(&url, work_args);

    // Wait until the Python handler runs py.slow and has reported progress.
    let running = until_some(Duration::from_secs(60), "py.slow running at half way", || async {
        let t = store.fetch(&slow.id).await.unwrap();
        assert!(!worker.is_finished(), "the Python worker ended before py.slow ran; row: {t:?}");
        (t.status == TaskStatus::Running && t.progress == Some(0.5)).then_some(t)
    })
    .await;
    assert_eq!(running.message.as_deref(), Some("halfway"));
    assert_eq!(running.attempt, 1);
    assert!(running.lease_until_ms.is_some());
    let py_worker = running.worker_id.clone().expect("a running row names its worker");
    assert!(py_worker.starts_with("worker_"), "cairnq's worker id: {py_worker}");

    let asked = store.cancel(&slow.id).await.unwrap().expect("a running task takes a cancel request");
    assert_eq!(asked.status, TaskStatus::Running, "a running task is only asked to stop");
    assert!(asked.cancel_requested_at_ms.is_some());

    let report = worker.await.expect("the Python worker");
    assert_eq!(report["worker_id"], json!(py_worker), "{report}");
    assert_eq!(report["errors"], json!([]), "the worker reported errors: {report}");
    assert_eq!(report["observed_cancel"], json!([slow.id]), "{report}");
    let mut runs: Vec<(String, String, i64, Json)> = report["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| {
            (
                str_of(&r["id"], "id").to_owned(),
                str_of(&r["name"], "name").to_owned(),
                r["attempt"].as_i64().expect("attempt"),
                r["payload"].clone(),
            )
        })
        .collect();
    runs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut expected_runs: Vec<(String, String, i64, Json)> = [&ok, &keyed, &boom, &crash, &slow]
        .iter()
        .map(|t| (t.id.clone(), t.name.clone(), 1, t.payload.clone()))
        .collect();
    expected_runs.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(runs, expected_runs, "each handler ran once, on waymark's payload");

    // What the Python worker stored, read by waymark.
    let settled = |t: &Task, status: TaskStatus| {
        assert_eq!(t.status, status, "{t:?}");
        assert_eq!(t.attempt, 1, "{t:?}");
        assert_eq!(t.worker_id.as_deref(), Some(py_worker.as_str()), "{t:?}");
        assert_eq!(t.lease_until_ms, None, "{t:?}");
        assert!(t.completed_at_ms.is_some(), "{t:?}");
    };
    for (task, x) in [(&ok, 3), (&keyed, 10)] {
        let t = store.fetch(&task.id).await.unwrap();
        settled(&t, TaskStatus::Succeeded);
        assert_eq!(t.result, Some(json!({"echo": {"x": x}, "sum": x + 1, "by": "python"})));
        assert_eq!((t.error.as_ref(), t.progress), (None, Some(1.0)), "{t:?}");
    }
    let by_key = store.get_by_key("rb-1").await.unwrap().expect("rb-1");
    assert_eq!(by_key.id, keyed.id);

    let t = store.fetch(&boom.id).await.unwrap();
    settled(&t, TaskStatus::Failed);
    assert_eq!(
        t.error,
        Some(json!({
            "type": "TaskError",
            "code": "account_missing",
            "message": "no such account",
            "retryable": false,
            "details": {"account": 42},
        })),
        "a TaskError's envelope, failed at once with attempts left"
    );
    assert_eq!(t.result, None);
    let envelope = t.error_envelope().expect("waymark parses cairnq's envelope");
    assert_eq!(
        (envelope.kind.as_str(), envelope.code.as_str(), envelope.retryable),
        ("TaskError", "account_missing", false)
    );

    let t = store.fetch(&crash.id).await.unwrap();
    settled(&t, TaskStatus::Failed);
    assert_eq!(
        t.error,
        Some(json!({
            "type": "ValueError",
            "code": "handler_error",
            "message": "kaput",
            "retryable": true,
            "details": {},
        })),
        "a plain exception is a retryable handler_error; max_attempts 1 ends it"
    );

    let t = store.fetch(&slow.id).await.unwrap();
    settled(&t, TaskStatus::Canceled);
    assert_eq!((t.result.as_ref(), t.error.as_ref()), (None, None), "{t:?}");
    assert_eq!(t.cancel_requested_at_ms, asked.cancel_requested_at_ms);
    assert_eq!(
        (t.progress, t.message.as_deref()),
        (Some(0.5), Some("halfway")),
        "a canceled settle keeps the last progress"
    );

    let t = store.fetch(&orphan.id).await.unwrap();
    assert_eq!(
        (t.status, t.attempt, t.worker_id.as_deref()),
        (TaskStatus::Queued, 0, None),
        "a name the Python worker has no handler for stays queued"
    );

    let stats = store.stats(Some("default")).await.unwrap()["default"];
    assert_eq!([stats.queued, stats.running, stats.succeeded, stats.failed, stats.canceled], [1, 0, 2, 2, 1]);

    db.drop().await;
    eprintln!("rust_client_python_worker took {:?}", started.elapsed());
}

/// A database the Python SDK installed reads as fully migrated to waymark:
/// `migration_status` (what `cargo xtask migrate --status` prints) shows every
/// cairnq file applied, connecting applies only waymark's own ledgers (in
/// a ledger of their own), and the two sides then share tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_installed_database_reads_as_migrated() {
    ensure_python().await;
    let db = TestDatabase::new().await;
    let read = py(&db.url, vec!["read".to_owned()]);
    assert!(read.get("stats").is_some(), "python connected and installed: {read}");
    let installed_by_python = ledger(&db.url).await;
    assert_eq!(installed_by_python.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), MIGRATIONS);

    let store = Store::new(PgPool::builder(&db.url).max_size(2).build().expect("pool"));
    let status = store.migration_status().await.expect("status");
    let (cairnq, waymark): (Vec<_>, Vec<_>) = status.iter().partition(|m| !m.name.starts_with("waymark_"));
    assert!(cairnq.iter().all(|m| m.applied_at_ms.is_some()), "every cairnq file reads applied: {status:?}");
    assert!(waymark.iter().all(|m| m.applied_at_ms.is_none()), "waymark's ledgers are its own: {status:?}");
    let report = store.prepare().await.expect("connect");
    let ledgers: Vec<&str> = waymark_store::protocol::ledger_migrations().iter().map(|m| m.name).collect();
    assert_eq!(report.applied, ledgers, "only waymark's ledgers applied: {report:?}");
    assert_eq!(report.skipped, 10);
    assert_eq!(ledger(&db.url).await, installed_by_python, "cairnq's ledger untouched");

    let task = store.submit(NewTask::new("py.ok", json!({"n": 7}))).await.expect("submit");
    let read = py(&db.url, vec!["read".to_owned(), "--id".to_owned(), task.id.clone()]);
    assert_eq!(read["by_id"][&task.id]["status"], json!("queued"), "{read}");
    assert_eq!(read["by_id"][&task.id]["payload"], json!({"n": 7}), "{read}");
    drop(store);
    db.drop().await;
}

/// One waymark worker and one cairnq Python worker on the same queue drain a
/// backlog submitted from both languages: every task runs exactly once, to
/// success, and both workers take part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_fleet_drains_a_shared_backlog_once() {
    ensure_python().await;
    let db = TestDatabase::new().await;
    let store = std::sync::Arc::new(store_on(&db.url).await);

    // Half the backlog from Python, half from Rust.
    let specs: Vec<Json> = (0..30).map(|n| json!({"name": "mixed.job", "payload": {"n": n}})).collect();
    let from_python = py(&db.url, vec!["submit".into(), Json::Array(specs).to_string()]);
    let mut ids: Vec<String> = from_python["submitted"]
        .as_array()
        .expect("submitted")
        .iter()
        .map(|s| s["task"]["id"].as_str().expect("id").to_owned())
        .collect();
    for n in 30..60 {
        ids.push(store.submit(NewTask::new("mixed.job", json!({ "n": n }))).await.expect("submit").id);
    }

    let rust_runs = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = rust_runs.clone();
    let worker = test_worker(&store, "default")
        .concurrency(4)
        .poll_interval(Duration::from_millis(100))
        .worker_id(RUST_WORKER)
        .task("mixed.job", move |ctx, payload: Json| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(ctx.id().to_owned());
                // Real time: 200 ms of work per task (as the Python
                // worker's), so the backlog lasts long enough for both
                // workers to share it on a loaded machine.
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok(json!({"by": "rust", "n": payload["n"]}))
            }
        });
    let mut args = vec!["work".to_owned(), "--timeout-s".into(), "90".into(), "--until".into()];
    args.extend(ids.iter().cloned());
    let python = py_in_background(&db.url, args);
    // The Rust worker starts once the Python one has claimed: a Python
    // process takes about a second to start, and in that time a Rust worker
    // alone would drain the whole backlog.
    let admin = admin_client(&db.url).await;
    eventually(Duration::from_secs(60), "the python worker's first claim", || async {
        let claimed_by_python: i64 = admin
            .query_one(
                "select count(*) from cairnq_tasks where worker_id is not null and worker_id <> $1",
                &[&RUST_WORKER],
            )
            .await
            .expect("count python's claims")
            .get(0);
        assert!(!python.is_finished(), "the python worker ended before it claimed anything");
        claimed_by_python > 0
    })
    .await;
    let rust = worker.start();
    let python = python.await.expect("python worker");
    rust.stop().await;

    let python_runs: Vec<String> = python["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| r["id"].as_str().expect("id").to_owned())
        .collect();
    let rust_runs = rust_runs.lock().unwrap().clone();
    assert!(python["errors"].as_array().is_some_and(|e| e.is_empty()), "python errors: {}", python["errors"]);
    let mut all: Vec<&String> = python_runs.iter().chain(rust_runs.iter()).collect();
    all.sort();
    let distinct: BTreeSet<&String> = all.iter().copied().collect();
    assert_eq!(all.len(), distinct.len(), "no task ran twice");
    assert_eq!(distinct, ids.iter().collect::<BTreeSet<_>>(), "every task ran");
    assert!(
        !python_runs.is_empty() && !rust_runs.is_empty(),
        "both workers took part: python {} rust {}",
        python_runs.len(),
        rust_runs.len()
    );
    for id in &ids {
        let t = store.fetch(id).await.expect("fetch");
        assert_eq!((t.status, t.attempt), (TaskStatus::Succeeded, 1), "task {id}");
        let by = t.result.as_ref().and_then(|r| r["by"].as_str()).expect("result").to_owned();
        let expected = if rust_runs.contains(id) { "rust" } else { "python" };
        assert_eq!(by, expected, "task {id} settled by the worker that ran it");
    }
    db.drop().await;
}

/// A task the cairnq Python client submits with a number no f64 holds
/// (Python's `10**400`, exact in jsonb), next to ordinary tasks, and one
/// written by plain SQL: a waymark worker fails those two alone, with an
/// envelope naming the column, runs every other task, and leaves the
/// payloads as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waymark_cannot_read_fails_alone_and_the_rest_run() {
    ensure_python().await;
    let db = TestDatabase::new().await;
    let store = std::sync::Arc::new(store_on(&db.url).await);
    let huge = format!("1{}", "0".repeat(400));
    let mut specs: Vec<String> =
        (0..20).map(|n| format!(r#"{{"name": "odd.job", "payload": {{"n": {n}}}}}"#)).collect();
    specs.insert(7, format!(r#"{{"name": "odd.job", "payload": {{"n": {huge}}}}}"#));
    let from_python =
        py(&db.url, vec!["submit".into(), format!("[{}]", specs.join(",")), "--ids-only".into()]);
    let ids: Vec<String> = from_python["submitted"]
        .as_array()
        .expect("submitted")
        .iter()
        .map(|s| s["task"]["id"].as_str().expect("id").to_owned())
        .collect();
    let python_bad = ids[7].clone();
    let admin = admin_client(&db.url).await;
    let sql_bad = "task_01SQLWROTEAHUGENUMBER000";
    admin
        .batch_execute(&format!(
            "insert into cairnq_tasks (id, name, queue, status, payload, run_at_ms, root_id, created_at_ms, updated_at_ms) \
             values ('{sql_bad}', 'odd.job', 'default', 'queued', '{{\"n\": 1e400}}', 0, '{sql_bad}', 0, 0)"
        ))
        .await
        .expect("plain SQL insert");

    let worker = test_worker(&store, "default")
        .concurrency(50)
        .poll_interval(Duration::from_millis(100))
        .task("odd.job", |_ctx, payload: Json| async move { Ok(json!({"n": payload["n"]})) })
        .start();
    let mut finals = BTreeMap::new();
    for id in ids.iter().map(String::as_str).chain([sql_bad]) {
        finals.insert(id.to_owned(), store.wait(id, Duration::from_secs(30)).await.expect("each task ends"));
    }
    worker.stop().await;

    for (id, t) in &finals {
        if id == &python_bad || id == sql_bad {
            assert_eq!((t.status, t.attempt), (TaskStatus::Failed, 1), "{id}");
            let envelope = t.error_envelope().expect("envelope");
            assert_eq!(envelope.kind, "UnreadableTask");
            assert!(envelope.message.contains("column payload"), "{}", envelope.message);
            assert!(!envelope.retryable);
        } else {
            assert_eq!(t.status, TaskStatus::Succeeded, "{id}");
        }
    }
    let kept: String = admin
        .query_one("select payload::text from cairnq_tasks where id = $1", &[&python_bad])
        .await
        .expect("payload")
        .get(0);
    assert!(kept.contains(&huge), "the payload stays as Python wrote it: {kept}");
    db.drop().await;
}

/// cairnq's Python client submits; a waymark worker runs the tasks with a
/// batch handler and two handlers sharing a resource of one; Python reads
/// every answer, and the resource never held two at once (sampled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_client_submits_to_a_waymark_worker_with_batch_handlers_and_resources() {
    use std::sync::Arc;
    use waymark_worker::{BatchItem, HandlerOptions};
    ensure_python().await;
    let db = TestDatabase::new().await;
    let url = db.url.clone();
    let store = Arc::new(store_on(&url).await);
    let mut specs = Vec::new();
    for n in 0..12 {
        specs.push(json!({"name": "rs.embed", "payload": {"n": n}, "queue": "mixed"}));
    }
    for n in 0..6 {
        let name = ["rs.gpu.a", "rs.gpu.b"][n % 2];
        specs.push(json!({"name": name, "payload": {"n": n}, "queue": "mixed"}));
    }
    let submitted = py(&url, vec!["submit".into(), Json::from(specs).to_string()]);
    let ids: Vec<String> = submitted["submitted"]
        .as_array()
        .expect("submitted")
        .iter()
        .map(|r| str_of(&r["task"]["id"], "id").to_owned())
        .collect();
    assert_eq!(ids.len(), 18);

    let batches = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = batches.clone();
    let gpu = || HandlerOptions::new().resource("gpu");
    let on_gpu = |_ctx, p: Json| async move {
        // Real time: each call holds the resource a while, so that two
        // at once would show in the samples below.
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(json!({"gpu": p["n"]}))
    };
    let worker = test_worker(&store, "mixed")
        .concurrency(8)
        .resource("gpu", 1)
        .batch_task("rs.embed", 5, move |items: Vec<BatchItem<PgPool, Json>>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(items.len());
                Ok(items
                    .iter()
                    .map(|i| (i.ctx.id().to_owned(), json!({"embedded": i.payload["n"]})))
                    .collect())
            }
        })
        .task_with("rs.gpu.a", gpu(), on_gpu)
        .task_with("rs.gpu.b", gpu(), on_gpu);
    let admin = admin_client(&url).await;
    let worker = worker.start();
    let most_on_gpu = std::sync::atomic::AtomicI64::new(0);
    eventually(Duration::from_secs(60), "every task done", || {
        let (store, admin, most_on_gpu) = (&store, &admin, &most_on_gpu);
        async move {
            let n: i64 = admin
                .query_one(
                    "select count(*) from cairnq_tasks where status = 'running' and name like 'rs.gpu.%'",
                    &[],
                )
                .await
                .expect("sample")
                .get(0);
            most_on_gpu.fetch_max(n, std::sync::atomic::Ordering::SeqCst);
            store.stats(Some("mixed")).await.expect("stats")["mixed"].succeeded == 18
        }
    })
    .await;
    worker.stop().await;
    let most_on_gpu = most_on_gpu.into_inner();
    assert!(most_on_gpu <= 1, "the resource held one at a time: {most_on_gpu}");
    let sizes = batches.lock().unwrap().clone();
    assert_eq!(sizes.iter().sum::<usize>(), 12);
    assert!(sizes.iter().all(|s| (1..=5).contains(s)), "{sizes:?}");

    // Python reads the answers waymark wrote.
    let mut args = vec!["wait".to_owned()];
    args.extend(ids.iter().cloned());
    let finals = py(&url, args);
    for (i, id) in ids.iter().enumerate() {
        let t = &finals["tasks"][id];
        assert_eq!(t["status"], json!("succeeded"), "{t}");
        assert!(str_of(&t["worker_id"], "worker_id").starts_with("waymark-"), "{t}");
        let expected = if i < 12 { json!({"embedded": i}) } else { json!({"gpu": i - 12}) };
        assert_eq!(t["result"], expected, "{t}");
    }
    db.drop().await;
}

/// A waymark retention sweeper and cairnq's Python one on one database,
/// while `retry` races them: together they delete every old terminal task,
/// nothing young or live, and never a task a retry made live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waymark_and_python_sweepers_share_a_database_without_conflict() {
    use std::sync::Arc;
    use waymark_store::{Retention, Sweeper};
    const OLD: i64 = 20_000;
    ensure_python().await;
    let db = TestDatabase::new().await;
    let url = db.url.clone();
    let store = Arc::new(store_on(&url).await);
    let admin = admin_client(&url).await;
    // Old successes and failures (two hours), young successes, live tasks.
    let backlog = |n: i64, status: &'static str, age_ms: i64, prefix: &'static str| {
        let admin = &admin;
        async move {
            admin
                .execute(
                    "insert into cairnq_tasks (id, name, queue, status, payload, attempt, max_attempts, run_at_ms, \
                     created_at_ms, updated_at_ms, completed_at_ms, error) \
                     select $3 || g, 'old', 'default', $1, '{}'::jsonb, 1, 3, t, t, t, t, \
                            case when $1 = 'failed' then '{\"message\": \"x\"}'::jsonb end \
                       from generate_series(1, $2::bigint) g, \
                            (select (extract(epoch from now()) * 1000)::bigint - $4::bigint as t) c",
                    &[&status, &n, &prefix, &age_ms],
                )
                .await
                .expect("backlog");
        }
    };
    backlog(OLD, "succeeded", 7_200_000, "old_ok_").await;
    backlog(300, "failed", 7_200_000, "old_failed_").await;
    backlog(200, "succeeded", 0, "young_").await;
    let live = store
        .submit_batch((0..50).map(|i| NewTask::new("live", json!({ "i": i }))))
        .await
        .expect("live tasks");
    store.claim(&ClaimRequest::new("w", ["default"]).names(["live"]).limit(10)).await.expect("some running");

    let python = py_in_background(
        &url,
        vec![
            "sweep".into(),
            "--older-than-ms".into(),
            "3600000".into(),
            "--limit".into(),
            "100".into(),
            "--for-s".into(),
            "5".into(),
        ],
    );
    // Python's sweeper is under way (rows are going) before waymark's starts.
    eventually(Duration::from_secs(60), "Python sweeping", || async {
        let n: i64 = admin.query_one("select count(*) from cairnq_tasks", &[]).await.expect("count").get(0);
        n < OLD + 550
    })
    .await;
    let (tx, mut reports) = tokio::sync::mpsc::unbounded_channel();
    let sweeper = Sweeper::start(
        store.clone(),
        Retention::older_than(Duration::from_secs(3600)).interval(Duration::from_millis(20)).batch(100),
        Arc::new(move |out| drop(tx.send(out.map_err(|e| e.to_string())))),
    )
    .expect("sweeper");
    // Retries race both sweepers over the old failures.
    let mut made_live = Vec::new();
    for i in 1..=300 {
        if let Some(t) = store.retry(&format!("old_failed_{i}"), false).await.expect("retry") {
            assert_eq!(t.status, TaskStatus::Queued);
            made_live.push(t.id);
        }
    }
    let python = python.await.expect("python");
    assert_eq!(python["errors"], json!([]), "cairnq's sweeper reported no error");
    eventually(Duration::from_secs(30), "the old successes gone", || async {
        let n: i64 = admin
            .query_one("select count(*) from cairnq_tasks where id like 'old_ok_%'", &[])
            .await
            .expect("count")
            .get(0);
        n == 0
    })
    .await;
    sweeper.stop();
    let mut swept = 0;
    while let Some(out) = reports.recv().await {
        swept += out.expect("waymark's sweeps all succeeded");
    }
    assert!(swept > 0, "waymark's sweeper deleted some too");
    let count = |sql: &'static str| {
        let admin = &admin;
        async move { admin.query_one(sql, &[]).await.expect("count").get::<_, i64>(0) }
    };
    assert_eq!(count("select count(*) from cairnq_tasks where id like 'young_%'").await, 200, "young kept");
    assert_eq!(
        count("select count(*) from cairnq_tasks where name = 'live'").await,
        live.len() as i64,
        "live kept"
    );
    for id in &made_live {
        let t = store.fetch(id).await.expect("a task made live is never deleted");
        assert_eq!(t.status, TaskStatus::Queued);
    }
    assert_eq!(
        count("select count(*) from cairnq_tasks where id like 'old_failed_%' and status = 'failed'").await,
        0,
        "the old failures not retried are gone"
    );
    eprintln!(
        "sweepers: waymark deleted {swept} of {} old rows; {} retried tasks kept",
        OLD + 300,
        made_live.len()
    );
    db.drop().await;
}
