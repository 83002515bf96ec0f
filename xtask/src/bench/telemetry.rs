//! The cost of waymark-otel at full drain: the same drain without an
//! observer, with metrics only (no tracer provider), and with metrics and
//! every span sampled,
//! on the OpenTelemetry SDK with exporters that drop what they are given
//! (the instrumentation's cost, not an exporter's). Reported as each
//! variant's throughput over the plain drain's, and CPU per task.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, SpanData, SpanExporter};
use waymark_otel::Telemetry;

use super::scenarios::observed_drain;
use super::{rounds, RoundFn, Row, CONCURRENCY, SETTLE};

#[derive(Debug, Clone, Copy)]
struct Drop;

impl PushMetricExporter for Drop {
    async fn export(&self, _metrics: &ResourceMetrics) -> OTelSdkResult {
        Ok(())
    }
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}

impl SpanExporter for Drop {
    async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
        Ok(())
    }
}

/// Telemetry on a fresh SDK set-up: metrics read every 10 s; with `spans`,
/// every span sampled and batched, else the API's no-op tracer (what a
/// program that installs no tracer provider gets).
fn telemetry(spans: bool) -> (Telemetry, SdkMeterProvider, Option<SdkTracerProvider>) {
    let meters = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(Drop).with_interval(Duration::from_secs(10)).build())
        .build();
    if !spans {
        let noop = opentelemetry::trace::noop::NoopTracerProvider::new();
        return (Telemetry::new(&meters, &noop), meters, None);
    }
    let tracers =
        SdkTracerProvider::builder().with_sampler(Sampler::AlwaysOn).with_batch_exporter(Drop).build();
    (Telemetry::new(&meters, &tracers), meters, Some(tracers))
}

pub(super) async fn telemetry_cost(server: &str, n: usize) -> Result<Vec<Row>, String> {
    let detail = |what: &str| format!("{what}, concurrency {CONCURRENCY}, settle batch {SETTLE}");
    let mut rows = vec![
        Row::new("waymark", "otel-drain", detail("no observer")),
        Row::new("waymark", "otel-drain", detail("waymark-otel, metrics")),
        Row::new("waymark", "otel-drain", detail("waymark-otel, metrics + spans")),
    ];
    let plain: RoundFn<'_> = Box::new(|| Box::pin(observed_drain(server, CONCURRENCY, SETTLE, None)));
    let observed = |spans: bool| -> RoundFn<'_> {
        Box::new(move || {
            Box::pin(async move {
                let (t, meters, tracers) = telemetry(spans);
                let round = observed_drain(server, CONCURRENCY, SETTLE, Some(Arc::new(t))).await;
                // Off the clock: the SDK's own threads end with the round.
                let _ = meters.shutdown();
                if let Some(tracers) = tracers {
                    let _ = tracers.shutdown();
                }
                round
            })
        })
    };
    rounds(n, &mut rows, &[plain, observed(false), observed(true)]).await?;
    let base = rows[0].tasks_per_s();
    for r in &rows[1..] {
        let ratio = r.tasks_per_s() / base;
        println!(
            "otel-drain: {} at {ratio:.3} of the drain without (cost {:+.1} %); cpu {:.2} us/task against {:.2}",
            r.detail,
            (1.0 - ratio) * 100.0,
            r.cpu_per_task_us(),
            rows[0].cpu_per_task_us()
        );
    }
    Ok(rows)
}
