//! The cost of a fleet-wide limit at full drain: the same backlog drained
//! with no limit, under a queue limit, and under a per-tenant limit, each
//! set high enough never to bind (a worker of `CONCURRENCY` slots, a limit
//! of as many), so the difference is the limited claim's own price: its
//! transaction, the limit's advisory lock, and the count of running rows.
//! Reported as each limited drain's throughput over the unlimited one's.

use std::sync::Arc;

use serde_json::json;
use waymark_store::{FleetLimit, GroupKey, NewTask};

use super::scenarios::{backlog_of, drain_with, fresh, worker_builder};
use super::{rounds, RoundFn, Row, CONCURRENCY, SETTLE, TASKS};

/// Tenants the backlog spreads over, round robin.
const TENANTS: usize = 16;

#[derive(Debug, Clone, Copy)]
enum Limit {
    None,
    Queue,
    PerTenant,
}

impl Limit {
    fn fleet_limit(self) -> Option<FleetLimit> {
        let max = i64::try_from(CONCURRENCY).expect("concurrency fits i64");
        match self {
            Limit::None => None,
            Limit::Queue => Some(FleetLimit::queue("bench", max)),
            Limit::PerTenant => {
                Some(FleetLimit::queue("bench", max).per_group(GroupKey::payload(["tenant"])))
            }
        }
    }
}

async fn limited_drain(server: &str, limit: Limit) -> Result<super::measure::Round, String> {
    let (_url, store) = fresh(server, "waymark_bench_limits").await?;
    // TASKS no-op tasks, each with a tenant of TENANTS, round robin.
    backlog_of(&store, TASKS, |i| {
        NewTask::new("bench.noop", json!({ "n": i, "tenant": i % TENANTS })).queue("bench")
    })
    .await?;
    let mut builder = worker_builder(&store, "bench", CONCURRENCY, SETTLE, Arc::new(|_| {}));
    if let Some(l) = limit.fleet_limit() {
        builder = builder.fleet_limit(l);
    }
    drain_with(builder.build().map_err(|e| e.to_string())?).await
}

pub(super) async fn limit_cost(server: &str, n: usize) -> Result<Vec<Row>, String> {
    let detail = |what: &str| format!("{what}, concurrency {CONCURRENCY}");
    let mut rows = vec![
        Row::new("waymark", "limits-drain", detail("no limit")),
        Row::new("waymark", "limits-drain", detail(&format!("queue limit {CONCURRENCY}"))),
        Row::new("waymark", "limits-drain", detail(&format!("{CONCURRENCY} per tenant of {TENANTS}"))),
    ];
    let run = |limit: Limit| -> RoundFn<'_> { Box::new(move || Box::pin(limited_drain(server, limit))) };
    rounds(n, &mut rows, &[run(Limit::None), run(Limit::Queue), run(Limit::PerTenant)]).await?;
    let base = rows[0].tasks_per_s();
    for r in &rows[1..] {
        let ratio = r.tasks_per_s() / base;
        println!(
            "limits-drain: {} at {ratio:.3} of the unlimited drain (cost {:+.1} %); cpu {:.2} us/task against {:.2}; \
             db {:.2} cores against {:.2}",
            r.detail,
            (1.0 - ratio) * 100.0,
            r.cpu_per_task_us(),
            rows[0].cpu_per_task_us(),
            r.cpu().1,
            rows[0].cpu().1
        );
    }
    Ok(rows)
}
