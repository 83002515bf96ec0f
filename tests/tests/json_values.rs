//! Any JSON value as a task's payload, metadata and result, as cairnq's SDKs
//! take them: written by waymark and read by the cairnq Python SDK, written
//! by Python and read by waymark, each run by the other side's worker and
//! its result read back; and trace context, which waymark writes into a
//! task's metadata only when that metadata is an object.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::trace::{FutureExt, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::Context;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use serde_json::{json, Value as Json};
use waymark_otel::Telemetry;
use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, NewTask, Store, TaskStatus};
use waymark_tests::{python, test_worker, Running, TestDatabase, TestSchema, TestWorker};

const WAIT: Duration = Duration::from_secs(30);

/// Every kind of JSON value, the look-alikes of other kinds among them.
fn values() -> Vec<Json> {
    waymark_testing::kit::every_json_kind()
}

async fn store_on(url: &str) -> Arc<Store<PgPool>> {
    let pool = PgPool::builder(url).max_size(4).build().expect("pool");
    Arc::new(Store::connect(pool, ConnectOptions::default()).await.expect("connect"))
}

/// A waymark worker, running, whose `rs.echo` answers its payload and
/// notes the metadata it saw, by task id.
fn echo_worker(store: &Arc<Store<PgPool>>, seen: Arc<Mutex<BTreeMap<String, Json>>>) -> Running {
    test_worker(store, "default")
        .poll_interval(Duration::from_millis(50))
        .task("rs.echo", move |ctx, payload: Json| {
            seen.lock().unwrap().insert(ctx.id().to_owned(), ctx.metadata().clone());
            async move { Ok(payload) }
        })
        .start()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_waymark_keep_every_json_value_as_written() {
    tokio::task::spawn_blocking(python::venv_python).await.expect("the Python venv");
    let db = TestDatabase::new().await;
    let store = store_on(&db.url).await;
    let values = values();
    let n = values.len();

    // waymark writes; Python reads the rows, runs them, and its results
    // read back here as it wrote them.
    let mut want: BTreeMap<String, (Json, Json)> = BTreeMap::new();
    for (i, metadata) in values.iter().enumerate() {
        let payload = values[n - 1 - i].clone();
        let task = NewTask::new("py.echo", payload.clone()).metadata(metadata.clone());
        let t = store.submit(task).await.expect("waymark takes any JSON value");
        want.insert(t.id, (payload, metadata.clone()));
    }
    let ids: Vec<String> = want.keys().cloned().collect();
    let mut args = vec!["read".to_owned()];
    args.extend(ids.iter().flat_map(|id| ["--id".to_owned(), id.clone()]));
    let read = python::interop(&db.url, args);
    for (id, (payload, metadata)) in &want {
        let row = &read["by_id"][id];
        assert_eq!((&row["payload"], &row["metadata"]), (payload, metadata), "Python reads {id}: {row}");
    }
    let mut args = vec!["work".to_owned(), "--timeout-s".into(), "60".into(), "--until".into()];
    args.extend(ids.iter().cloned());
    let report = python::interop(&db.url, args);
    assert_eq!(report["errors"], json!([]), "{report}");
    for run in report["runs"].as_array().expect("runs") {
        let (payload, metadata) = &want[run["id"].as_str().expect("id")];
        assert_eq!((&run["payload"], &run["metadata"]), (payload, metadata), "Python's handler saw {run}");
    }
    for (id, (payload, _)) in &want {
        let t = store.fetch(id).await.expect("get");
        assert_eq!(t.status, TaskStatus::Succeeded, "{t:?}");
        // Python writes a None result as SQL NULL; both mean no value.
        assert_eq!(t.result.as_ref().unwrap_or(&Json::Null), payload, "Python's result for {id}");
    }

    // Python writes; waymark reads the rows as Python answered them, runs
    // them, and Python reads the results as written.
    let specs: Vec<Json> = values
        .iter()
        .enumerate()
        .map(|(i, v)| json!({"name": "rs.echo", "payload": v, "metadata": values[n - 1 - i]}))
        .collect();
    let submitted = python::interop(&db.url, vec!["submit".into(), Json::Array(specs.clone()).to_string()]);
    let mut from_python: BTreeMap<String, (Json, Json)> = BTreeMap::new();
    for (spec, out) in specs.iter().zip(submitted["submitted"].as_array().expect("submitted")) {
        let task = &out["task"];
        // cairnq's own rule: a None payload is written as {}, a falsy
        // metadata (None, "", [], {}, 0, false) as {}; the rest as given.
        let falsy = |v: &Json| {
            matches!(v, Json::Null | Json::Bool(false))
                || *v == json!("")
                || *v == json!([])
                || *v == json!(0)
        };
        let payload = if spec["payload"].is_null() { json!({}) } else { spec["payload"].clone() };
        let metadata = if falsy(&spec["metadata"]) { json!({}) } else { spec["metadata"].clone() };
        assert_eq!((&task["payload"], &task["metadata"]), (&payload, &metadata), "{out}");
        from_python.insert(task["id"].as_str().expect("id").to_owned(), (payload, metadata));
    }
    for (id, (payload, metadata)) in &from_python {
        let t = store.fetch(id).await.expect("get");
        assert_eq!((&t.payload, &t.metadata), (payload, metadata), "waymark reads {id}");
        assert!(t.unreadable.is_empty(), "{:?}", t.unreadable);
    }
    let seen = Arc::new(Mutex::new(BTreeMap::new()));
    let worker = echo_worker(&store, seen.clone());
    for id in from_python.keys() {
        assert_eq!(store.wait(id, WAIT).await.expect("each ends").status, TaskStatus::Succeeded);
    }
    worker.stop().await;
    let seen = seen.lock().unwrap().clone();
    let mut args = vec!["wait".to_owned()];
    args.extend(from_python.keys().cloned());
    let finals = python::interop(&db.url, args);
    for (id, (payload, metadata)) in &from_python {
        assert_eq!(&seen[id], metadata, "the handler's metadata for {id}");
        let row = &finals["tasks"][id];
        assert_eq!(&row["result"], payload, "Python reads waymark's result for {id}: {row}");
    }
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_context_goes_only_into_metadata_that_is_an_object() {
    let schema = TestSchema::new().await;
    let spans = InMemorySpanExporter::default();
    let tracers = SdkTracerProvider::builder().with_simple_exporter(spans.clone()).build();
    let telemetry = Telemetry::new(&SdkMeterProvider::builder().build(), &tracers);
    let pool = PgPool::builder(&schema.url).schema(&schema.schema).max_size(4).build().expect("pool");
    let options = ConnectOptions::new().schema(&schema.schema).observer(Arc::new(telemetry));
    let store = Arc::new(Store::connect(pool, options).await.expect("connect"));

    let request = tracers.tracer("test").start("incoming request");
    let cx = Context::current_with_span(request);
    let trace = cx.span().span_context().trace_id();
    let mut ids = BTreeMap::new();
    for v in values() {
        let t = store
            .submit(NewTask::new("rs.echo", json!({})).metadata(v.clone()))
            .with_context(cx.clone())
            .await
            .expect("submit");
        ids.insert(t.id, v);
    }
    let batch = store
        .submit_batch(values().into_iter().map(|v| NewTask::new("rs.echo", json!(1)).metadata(v)))
        .with_context(cx.clone())
        .await
        .expect("a batch");
    ids.extend(batch.into_iter().zip(values()));
    for (id, written) in &ids {
        let metadata = store.fetch(id).await.expect("get").metadata;
        match written {
            Json::Object(own) => {
                let parent = metadata["traceparent"].as_str().expect("an object gains the context");
                assert!(parent.contains(&trace.to_string()), "{parent}");
                assert!(own.iter().all(|(k, v)| metadata[k] == *v), "its own keys are kept: {metadata}");
            }
            other => assert_eq!(&metadata, other, "left as written"),
        }
    }
    let seen = Arc::new(Mutex::new(BTreeMap::new()));
    let worker = echo_worker(&store, seen.clone());
    for id in ids.keys() {
        assert_eq!(store.wait(id, WAIT).await.expect("each ends").status, TaskStatus::Succeeded);
    }
    worker.stop().await;
    cx.span().end();
    tracers.force_flush().expect("flush");
    let spans = spans.get_finished_spans().expect("spans");
    for (id, written) in &ids {
        let run = spans
            .iter()
            .find(|s| {
                s.name == "run default"
                    && s.attributes
                        .iter()
                        .any(|a| a.key.as_str() == "messaging.message.id" && a.value.as_str() == id.as_str())
            })
            .unwrap_or_else(|| panic!("the run of {id} is a span"));
        // An object carried the submit's context to the run; a run of any
        // other metadata starts a trace of its own.
        assert_eq!(run.span_context.trace_id() == trace, written.is_object(), "{id}: {written}");
    }
    schema.drop().await;
}
