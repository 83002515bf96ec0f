//! waymark-otel on a real PostgreSQL, read back through the OpenTelemetry
//! SDK's in-memory exporters: the metrics count exactly what the test did
//! (submits, claims, settlements by outcome, retries, a lost lease, a
//! give-back, queue depths, pool stats), and the spans link a submitter to
//! the run of its task, also when a traced cairnq Python client submitted.
//! And through a real exporter: OpenTelemetry's Prometheus exporter,
//! scraped by a real Prometheus server, whose queries give the same counts.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::{FutureExt, SpanKind, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, Metric, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::{json, Value as Json};
use waymark_otel::Telemetry;
use waymark_pool::PgPool;
use waymark_store::{NewTask, Store, TaskStatus};
use waymark_tests::{eventually, python, test_worker, until_status, TestSchema, TestWorker};
use waymark_worker::TaskError;

/// An SDK set-up of the test's own (never the global one), with the
/// telemetry made on it.
struct Otel {
    meters: SdkMeterProvider,
    metrics: InMemoryMetricExporter,
    tracers: SdkTracerProvider,
    spans: InMemorySpanExporter,
    telemetry: Telemetry,
}

fn otel() -> Otel {
    let metrics = InMemoryMetricExporter::default();
    let meters =
        SdkMeterProvider::builder().with_reader(PeriodicReader::builder(metrics.clone()).build()).build();
    let spans = InMemorySpanExporter::default();
    let tracers = SdkTracerProvider::builder().with_simple_exporter(spans.clone()).build();
    let telemetry = Telemetry::new(&meters, &tracers);
    Otel { meters, metrics, tracers, spans, telemetry }
}

impl Otel {
    /// A store in `schema` that reports to this telemetry, and its pool.
    async fn store(&self, url: &str, schema: Option<&str>) -> (Arc<Store<PgPool>>, PgPool) {
        let mut pool = PgPool::builder(url).max_size(4);
        if let Some(schema) = schema {
            pool = pool.schema(schema);
        }
        let pool = pool.build().expect("pool");
        let mut options = waymark_store::ConnectOptions::new().observer(Arc::new(self.telemetry.clone()));
        if let Some(schema) = schema {
            options = options.schema(schema);
        }
        let store = Store::connect(pool.clone(), options).await.expect("connect");
        (Arc::new(store), pool)
    }

    /// Every metric as of now (cumulative: the export holds the totals).
    fn collect(&self) -> Metrics {
        self.metrics.reset();
        self.meters.force_flush().expect("flush the meters");
        Metrics(self.metrics.get_finished_metrics().expect("metrics"))
    }

    fn spans(&self) -> Vec<SpanData> {
        self.tracers.force_flush().expect("flush the tracers");
        self.spans.get_finished_spans().expect("spans")
    }
}

/// One export of every metric.
struct Metrics(Vec<opentelemetry_sdk::metrics::data::ResourceMetrics>);

/// Whether a data point's attributes hold every `(key, value)` of `want`.
fn matches<'a>(attributes: impl Iterator<Item = &'a KeyValue>, want: &[(&str, &str)]) -> bool {
    let attributes: Vec<&KeyValue> = attributes.collect();
    want.iter().all(|(k, v)| attributes.iter().any(|a| a.key.as_str() == *k && a.value.as_str() == *v))
}

fn metric<'m>(metrics: &'m Metrics, name: &str) -> Option<&'m Metric> {
    let last = metrics.0.last()?;
    let found = last.scope_metrics().flat_map(|s| s.metrics()).find(|m| m.name() == name);
    found
}

/// The sum of a counter's points that match `want`; 0 when none was recorded.
fn count(metrics: &Metrics, name: &str, want: &[(&str, &str)]) -> u64 {
    match metric(metrics, name).map(Metric::data) {
        None => 0,
        Some(AggregatedMetrics::U64(MetricData::Sum(sum))) => {
            sum.data_points().filter(|p| matches(p.attributes(), want)).map(|p| p.value()).sum()
        }
        Some(other) => panic!("{name} is not a u64 sum: {other:?}"),
    }
}

/// How many measurements a histogram's matching points hold, and their sum.
fn histogram(metrics: &Metrics, name: &str, want: &[(&str, &str)]) -> (u64, f64) {
    match metric(metrics, name).map(Metric::data) {
        None => (0, 0.0),
        Some(AggregatedMetrics::F64(MetricData::Histogram(h))) => h
            .data_points()
            .filter(|p| matches(p.attributes(), want))
            .fold((0, 0.0), |(n, s), p| (n + p.count(), s + p.sum())),
        Some(AggregatedMetrics::U64(MetricData::Histogram(h))) => h
            .data_points()
            .filter(|p| matches(p.attributes(), want))
            .fold((0, 0.0), |(n, s), p| (n + p.count(), s + p.sum() as f64)),
        Some(other) => panic!("{name} is not a histogram: {other:?}"),
    }
}

/// The one value of an i64 gauge's point that matches `want`.
fn gauge(metrics: &Metrics, name: &str, want: &[(&str, &str)]) -> Option<i64> {
    match metric(metrics, name)?.data() {
        AggregatedMetrics::I64(MetricData::Gauge(g)) => {
            let mut points = g.data_points().filter(|p| matches(p.attributes(), want));
            let value = points.next().map(|p| p.value());
            assert!(points.next().is_none(), "{name} {want:?} matched more than one point");
            value
        }
        AggregatedMetrics::I64(MetricData::Sum(s)) => {
            s.data_points().filter(|p| matches(p.attributes(), want)).map(|p| p.value()).next()
        }
        other => panic!("{name} is not an i64 gauge: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_count_what_the_test_did() {
    let schema = TestSchema::new().await;
    let otel = otel();
    let (store, pool) = otel.store(&schema.url, Some(&schema.schema)).await;
    let depths = otel.telemetry.observe_queues((*store).clone(), Duration::from_secs(3600));
    let _pool_metrics = otel.telemetry.observe_pool("tests", &pool);
    let worker = test_worker(&store, "tm")
        .concurrency(8)
        .beating_lease(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(200))
        .retry_backoff(Duration::from_millis(10), Duration::from_millis(10))
        .shutdown_grace(Duration::from_millis(200))
        .task("ok", |_ctx, p: Json| async move { Ok(p) })
        .task("flaky", |ctx, _p: Json| async move {
            if ctx.attempt() == 1 {
                return Err(TaskError::new("not yet").kind("Flaky"));
            }
            Ok(json!("second time"))
        })
        .task("bad", |_ctx, _p: Json| async move { Err::<(), _>(TaskError::new("never").retryable(false)) })
        .task("hold", |ctx, _p: Json| async move {
            // Until the token fires: a lost lease, or shutdown.
            ctx.cancelled().await;
            Ok(())
        })
        .start();

    let task = |name: &str, n: i32| NewTask::new(name, json!({"n": n})).queue("tm").max_attempts(3);
    for n in 0..10 {
        store.submit(task("ok", n)).await.expect("submit");
    }
    store.submit_batch((10..30).map(|n| task("ok", n))).await.expect("submit a batch");
    for n in 0..5 {
        store.submit(task("flaky", n)).await.expect("submit");
    }
    for n in 0..3 {
        store.submit(task("bad", n)).await.expect("submit");
    }
    eventually(Duration::from_secs(60), "38 tasks settled for good", || {
        let store = store.clone();
        async move {
            let c = store.stats(Some("tm")).await.expect("stats")["tm"];
            c.succeeded + c.failed == 38
        }
    })
    .await;

    // A lease lost: another worker takes the task mid-run.
    let stolen = store.submit(task("hold", 0)).await.expect("submit");
    until_status(Duration::from_secs(20), "the held task running", &store, &stolen.id, TaskStatus::Running)
        .await;
    schema.steal_lease(&stolen.id, "thief").await;
    eventually(Duration::from_secs(20), "the lost lease counted", || {
        let m = otel.collect();
        async move { count(&m, "waymark.leases.lost", &[]) == 1 }
    })
    .await;

    // A give-back: shutdown stops a run.
    let held = store.submit(task("hold", 1)).await.expect("submit");
    until_status(
        Duration::from_secs(20),
        "the second held task running",
        &store,
        &held.id,
        TaskStatus::Running,
    )
    .await;
    worker.stop().await;
    depths.refresh().await.expect("read the depths");

    let m = otel.collect();
    let sent = |name: &str| count(&m, "messaging.client.sent.messages", &[("waymark.task.name", name)]);
    assert_eq!((sent("ok"), sent("flaky"), sent("bad"), sent("hold")), (30, 5, 3, 2), "submitted");
    assert_eq!(
        count(
            &m,
            "messaging.client.sent.messages",
            &[("messaging.destination.name", "tm"), ("messaging.operation.type", "send")]
        ),
        40
    );
    let consumed =
        |name: &str| count(&m, "messaging.client.consumed.messages", &[("waymark.task.name", name)]);
    assert_eq!(
        (consumed("ok"), consumed("flaky"), consumed("bad"), consumed("hold")),
        (30, 10, 3, 2),
        "claimed"
    );
    let settled = |outcome: &str| count(&m, "waymark.tasks.settled", &[("waymark.task.outcome", outcome)]);
    assert_eq!(
        (settled("succeeded"), settled("retried"), settled("failed"), settled("canceled")),
        (35, 5, 3, 0),
        "settled by outcome"
    );
    assert_eq!(
        count(
            &m,
            "waymark.tasks.settled",
            &[("waymark.task.name", "flaky"), ("waymark.task.outcome", "retried")]
        ),
        5
    );
    assert_eq!(count(&m, "waymark.leases.lost", &[("waymark.task.name", "hold")]), 1, "the stolen lease");
    assert_eq!(
        count(&m, "waymark.tasks.given_back", &[("waymark.task.status", "queued")]),
        1,
        "the give-back"
    );
    assert_eq!(count(&m, "waymark.runs.unconfirmed", &[]), 0, "every end was confirmed");

    // Every run's end reported once: 45 claims, 45 ends, 45 run spans.
    let ends = settled("succeeded")
        + settled("retried")
        + settled("failed")
        + count(&m, "waymark.leases.lost", &[])
        + count(&m, "waymark.tasks.given_back", &[])
        + count(&m, "waymark.runs.unconfirmed", &[]);
    assert_eq!(ends, 45, "one end per run");
    let run_spans = otel.spans().iter().filter(|s| s.name == "run tm").count();
    assert_eq!(run_spans, 45, "every run's span ended");

    // Handler time: one measurement per run that answered, failures by
    // their type (the run stopped at shutdown answers only if it stops
    // within the stop grace, which a loaded machine may not give it).
    let runs = |want: &[(&str, &str)]| histogram(&m, "messaging.process.duration", want).0;
    let timed = |name: &str| runs(&[("waymark.task.name", name)]);
    assert_eq!((timed("ok"), timed("flaky"), timed("bad")), (30, 10, 3), "every run timed");
    assert!((1..=2).contains(&timed("hold")), "the held runs timed: {}", timed("hold"));
    assert_eq!(runs(&[("waymark.task.name", "flaky"), ("error.type", "Flaky")]), 5);
    assert_eq!(runs(&[("waymark.task.name", "bad"), ("error.type", "TaskError")]), 3);
    assert_eq!(histogram(&m, "waymark.task.pickup.duration", &[]).0, 45, "a pickup per claim");
    // Each settlement was written once: the batch sizes add up to them.
    let (writes, settlements) = histogram(&m, "waymark.settle.batch.size", &[]);
    assert_eq!(settlements, 43.0, "43 settlements in {writes} writes");
    assert_eq!(
        histogram(&m, "messaging.client.operation.duration", &[("messaging.operation.name", "submit")]).0,
        21,
        "20 single submits and one batch"
    );

    // Depths by status, as the table holds them: the thief's task runs.
    let depth = |status: &str| {
        gauge(
            &m,
            "waymark.queue.depth",
            &[("messaging.destination.name", "tm"), ("waymark.task.status", status)],
        )
    };
    assert_eq!(
        (depth("succeeded"), depth("failed"), depth("queued"), depth("running"), depth("canceled")),
        (Some(35), Some(3), Some(1), Some(1), Some(0))
    );
    // The pool: it was used, its breaker is closed, nothing waits now.
    let pool_name = ("db.client.connection.pool.name", "tests");
    assert!(count(&m, "waymark.pool.acquires", &[pool_name]) > 45, "the pool counted its acquires");
    assert_eq!(
        gauge(&m, "waymark.pool.breaker.state", &[pool_name, ("waymark.pool.breaker.state", "closed")]),
        Some(1)
    );
    assert_eq!(
        gauge(&m, "waymark.pool.breaker.state", &[pool_name, ("waymark.pool.breaker.state", "open")]),
        Some(0)
    );
    assert_eq!(gauge(&m, "db.client.connection.pending_requests", &[pool_name]), Some(0));

    // Dropped, the depths' handle reports nothing more.
    drop(depths);
    assert_eq!(gauge(&otel.collect(), "waymark.queue.depth", &[("waymark.task.status", "succeeded")]), None);
    schema.drop().await;
}

fn attribute<'s>(span: &'s SpanData, key: &str) -> Option<&'s Value> {
    span.attributes.iter().find(|a| a.key.as_str() == key).map(|a| &a.value)
}

/// The one span named `name` whose `messaging.message.id` (or, without
/// an id, whose parent) is as given.
fn span_of<'s>(spans: &'s [SpanData], name: &str, pick: impl Fn(&SpanData) -> bool) -> &'s SpanData {
    let found: Vec<&SpanData> = spans.iter().filter(|s| s.name == name && pick(s)).collect();
    assert_eq!(
        found.len(),
        1,
        "spans named {name:?} that match: {:#?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitters_span_is_the_parent_of_its_tasks_run_and_of_what_the_run_does() {
    let schema = TestSchema::new().await;
    let otel = otel();
    let (store, _pool) = otel.store(&schema.url, Some(&schema.schema)).await;
    let handler_tracer = otel.tracers.tracer("handler");
    let worker = test_worker(&store, "tr")
        .settle_batch(1, Duration::ZERO)
        .task("parent", move |ctx, _p: Json| {
            let tracer = handler_tracer.clone();
            async move {
                // The handler's own span is a child of the run's.
                tracer.in_span("handler work", |_cx| ());
                let child = ctx
                    .submit(NewTask::new("child", json!({})).queue("tr"))
                    .await
                    .map_err(|e| TaskError::new(e.to_string()))?;
                Ok(json!({"child": child.id}))
            }
        })
        .task("child", |_ctx, _p: Json| async move { Ok(json!("done")) })
        .start();

    let request = otel.tracers.tracer("test").start("incoming request");
    let request_cx = Context::current_with_span(request);
    let parent = store
        .submit(NewTask::new("parent", json!({})).queue("tr"))
        .with_context(request_cx.clone())
        .await
        .expect("submit");
    let traceparent =
        parent.metadata["traceparent"].as_str().expect("the metadata carries the context").to_owned();
    let answer = store.wait(&parent.id, Duration::from_secs(30)).await.expect("the parent finishes");
    let child_id =
        answer.result.as_ref().and_then(|r| r["child"].as_str()).expect("the child's id").to_owned();
    assert_eq!(
        store.wait(&child_id, Duration::from_secs(30)).await.expect("the child finishes").status,
        TaskStatus::Succeeded
    );
    request_cx.span().end();
    worker.stop().await;

    let spans = otel.spans();
    let trace = request_cx.span().span_context().trace_id();
    let request_id = request_cx.span().span_context().span_id();
    let id_is = |id: &str| {
        let id = id.to_owned();
        move |s: &SpanData| {
            attribute(s, "messaging.message.id").map(Value::as_str).as_deref() == Some(id.as_str())
        }
    };
    let submit = span_of(&spans, "submit tr", |s| s.parent_span_id == request_id);
    assert_eq!(submit.span_kind, SpanKind::Producer);
    assert_eq!(
        traceparent,
        format!("00-{}-{}-01", trace, submit.span_context.span_id()),
        "the task carries the submit's span"
    );
    let parent_run = span_of(&spans, "run tr", id_is(&parent.id));
    assert_eq!(parent_run.span_kind, SpanKind::Consumer);
    assert_eq!(
        (parent_run.span_context.trace_id(), parent_run.parent_span_id),
        (trace, submit.span_context.span_id())
    );
    assert!(parent_run.parent_span_is_remote, "the run's parent came through the row");
    assert_eq!(
        attribute(parent_run, "waymark.task.outcome").map(Value::as_str).as_deref(),
        Some("succeeded")
    );
    let work = span_of(&spans, "handler work", |_| true);
    assert_eq!(
        work.parent_span_id,
        parent_run.span_context.span_id(),
        "the handler's span is the run's child"
    );
    let child_submit =
        span_of(&spans, "submit tr", |s| s.parent_span_id == parent_run.span_context.span_id());
    let child_run = span_of(&spans, "run tr", id_is(&child_id));
    assert_eq!(
        (child_run.span_context.trace_id(), child_run.parent_span_id),
        (trace, child_submit.span_context.span_id())
    );
    // Unbatched, each settlement is a child of its run.
    span_of(&spans, "settle", |s| s.parent_span_id == parent_run.span_context.span_id());
    span_of(&spans, "settle", |s| s.parent_span_id == child_run.span_context.span_id());
    assert!(
        spans.iter().any(|s| s.name == "claim tr" && s.span_kind == SpanKind::Client),
        "claims that claimed are spans"
    );
    assert!(
        spans.iter().all(|s| s.span_context.trace_id() == trace || s.name == "claim tr"),
        "one trace, but for the claims"
    );
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traced_python_clients_task_runs_in_its_trace() {
    tokio::task::spawn_blocking(python::venv_python).await.expect("setting up the Python venv");
    let db = waymark_tests::TestDatabase::new().await;
    let otel = otel();
    let (store, _pool) = otel.store(&db.url, None).await;
    let worker = test_worker(&store, "py").task("from.python", |_ctx, p: Json| async move { Ok(p) }).start();

    let url = db.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        let script = python::scripts_dir().join("interop.py");
        let args = ["submit-traced", "from.python", "py"];
        python::run_script(&script, &args, &[("CAIRNQ_DSN", url.as_str())], Duration::from_secs(120))
    })
    .await
    .expect("python");
    let out: Json = serde_json::from_str(out.trim()).expect("interop.py printed JSON");
    let id = out["id"].as_str().expect("id");
    assert!(out["metadata"]["traceparent"].is_string(), "Python's propagator wrote the key: {out}");
    assert_eq!(store.wait(id, Duration::from_secs(30)).await.expect("the run").status, TaskStatus::Succeeded);
    worker.stop().await;

    let spans = otel.spans();
    let run_span = span_of(&spans, "run py", |s| {
        attribute(s, "messaging.message.id").map(Value::as_str).as_deref() == Some(id)
    });
    assert_eq!(run_span.span_context.trace_id().to_string(), out["trace_id"].as_str().expect("trace id"));
    assert_eq!(run_span.parent_span_id.to_string(), out["span_id"].as_str().expect("span id"));
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_the_counts_the_test_made() {
    let schema = TestSchema::new().await;
    let registry = prometheus::Registry::new();
    let exporter =
        opentelemetry_prometheus::exporter().with_registry(registry.clone()).build().expect("the exporter");
    let meters = SdkMeterProvider::builder().with_reader(exporter).build();
    let telemetry = Telemetry::new(&meters, &SdkTracerProvider::builder().build());
    let target = waymark_tests::prometheus::serve_metrics(move || {
        let mut text = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&registry.gather(), &mut text)
            .expect("encode the metrics");
        text
    })
    .await;
    let server = tokio::task::spawn_blocking(move || waymark_tests::prometheus::Prometheus::start(&target))
        .await
        .expect("Prometheus starts");

    let pool = PgPool::builder(&schema.url).max_size(4).schema(&schema.schema).build().expect("pool");
    let options = waymark_store::ConnectOptions::new().schema(&schema.schema).observer(Arc::new(telemetry));
    let store = Arc::new(Store::connect(pool, options).await.expect("connect"));
    let worker = test_worker(&store, "prom")
        .task("ok", |_ctx, p: Json| async move { Ok(p) })
        .task("bad", |_ctx, _p: Json| async move { Err::<(), _>(TaskError::new("never").retryable(false)) })
        .start();
    store
        .submit_batch((0..25).map(|n| NewTask::new("ok", json!({"n": n})).queue("prom")))
        .await
        .expect("submit");
    for n in 0..4 {
        store.submit(NewTask::new("bad", json!({"n": n})).queue("prom")).await.expect("submit");
    }
    eventually(Duration::from_secs(60), "29 tasks settled", || {
        let store = store.clone();
        async move {
            let c = store.stats(Some("prom")).await.expect("stats")["prom"];
            c.succeeded + c.failed == 29
        }
    })
    .await;
    worker.stop().await;

    // What Prometheus scraped and stored, read through its query API.
    let want = [
        ("sum(messaging_client_sent_messages_total{waymark_task_name=\"ok\"})", 25.0),
        ("sum(messaging_client_sent_messages_total{waymark_task_name=\"bad\"})", 4.0),
        ("sum(messaging_client_consumed_messages_total{messaging_destination_name=\"prom\"})", 29.0),
        ("sum(waymark_tasks_settled_total{waymark_task_outcome=\"succeeded\"})", 25.0),
        ("sum(waymark_tasks_settled_total{waymark_task_outcome=\"failed\"})", 4.0),
        ("sum(messaging_process_duration_seconds_count{error_type=\"TaskError\"})", 4.0),
        ("sum(messaging_process_duration_seconds_count)", 29.0),
        ("sum(waymark_task_pickup_duration_seconds_count)", 29.0),
        ("sum(waymark_settle_batch_size_sum)", 29.0),
    ];
    let server = Arc::new(server);
    eventually(Duration::from_secs(30), "Prometheus holds the test's counts", || {
        let server = server.clone();
        async move {
            tokio::task::spawn_blocking(move || want.iter().all(|(q, v)| server.value(q) == Some(*v)))
                .await
                .expect("query")
        }
    })
    .await;
    let health = tokio::task::spawn_blocking(move || server.target_health()).await.expect("targets");
    assert_eq!(health.as_deref(), Some("up"), "Prometheus scraped the exporter");
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_whose_answer_was_lost_counts_as_settled_not_as_a_lost_lease() {
    use waymark_tests::proxy::{pool_through, proxy_for};
    let schema = TestSchema::new().await;
    let otel = otel();
    // The pool resends the complete whose answer the proxy cuts; the resend
    // finds the lease gone (its first run committed) and answers so.
    let proxy = proxy_for(&schema.url).await;
    let pool = pool_through(&proxy, &schema).max_size(4).listen_url(&schema.url).build().expect("pool");
    let options = waymark_store::ConnectOptions::new()
        .schema(&schema.schema)
        .observer(Arc::new(otel.telemetry.clone()));
    let store = Arc::new(Store::connect(pool, options).await.expect("connect"));
    let worker = test_worker(&store, "cut")
        .settle_batch(1, Duration::ZERO)
        .task("ok", |_ctx, p: Json| async move { Ok(p) })
        .start();
    proxy.arm("then 'succeeded' else 'canceled'");
    let task = store.submit(NewTask::new("ok", json!({})).queue("cut")).await.expect("submit");
    assert_eq!(
        store.wait(&task.id, Duration::from_secs(30)).await.expect("the run").status,
        TaskStatus::Succeeded
    );
    eventually(Duration::from_secs(20), "the run's end reported", || {
        let m = otel.collect();
        async move {
            count(&m, "waymark.tasks.settled", &[])
                + count(&m, "waymark.leases.lost", &[])
                + count(&m, "waymark.runs.unconfirmed", &[])
                == 1
        }
    })
    .await;
    worker.stop().await;
    assert_eq!(proxy.cuts(), 1, "the complete's answer was cut");
    let m = otel.collect();
    assert_eq!(
        count(&m, "waymark.tasks.settled", &[("waymark.task.outcome", "succeeded")]),
        1,
        "read from the row"
    );
    assert_eq!(count(&m, "waymark.leases.lost", &[]), 0, "no lease was lost");
    schema.drop().await;
}
