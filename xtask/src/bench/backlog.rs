//! A large backlog: the first 100,000 of 1,000,000 queued tasks drained,
//! beside the first 100,000 of 120,000 on the same settings. Both backlogs
//! are filled the same way (one `insert ... select`, then `analyze`) and
//! both drains stop with work still queued, so neither has the tail of a
//! queue running dry: what differs is the 880,000 rows more that the claim
//! and the settlement work among. Reported as the large backlog's rate over
//! the small one's.

use std::sync::Arc;

use super::measure::Round;
use super::scenarios::{drain_until, fresh, worker};
use super::{rounds, RoundFn, Row, CONCURRENCY, SETTLE};

const QUEUED: i64 = 1_000_000;
const SMALL: i64 = 120_000;
const DRAINED: usize = 100_000;

async fn drain_of(server: &str, queued: i64, drained: usize) -> Result<Round, String> {
    let (url, store) = fresh(server, "waymark_bench_backlog").await?;
    let client = waymark_tests::db::admin_client(&url).await;
    waymark_tests::plans::queued_backlog(&client, queued, "bench", "bench.noop").await;
    drop(client);
    drain_until(worker(&store, "bench", CONCURRENCY, SETTLE, Arc::new(|_| {}))?, drained).await
}

pub(super) async fn backlog_cost(server: &str, n: usize) -> Result<Vec<Row>, String> {
    let mut rows = vec![
        Row::new(
            "waymark",
            "backlog-drain",
            format!("first {DRAINED} of {SMALL} queued, concurrency {CONCURRENCY}"),
        ),
        Row::new(
            "waymark",
            "backlog-drain",
            format!("first {DRAINED} of {QUEUED} queued, concurrency {CONCURRENCY}"),
        ),
    ];
    let runs: [RoundFn<'_>; 2] = [
        Box::new(move || Box::pin(drain_of(server, SMALL, DRAINED))),
        Box::new(move || Box::pin(drain_of(server, QUEUED, DRAINED))),
    ];
    rounds(n, &mut rows, &runs).await?;
    println!(
        "backlog-drain: the first {DRAINED} of {QUEUED} at {:.3} of the rate on {SMALL}; cpu {:.2} us/task against {:.2}",
        rows[1].tasks_per_s() / rows[0].tasks_per_s(),
        rows[1].cpu_per_task_us(),
        rows[0].cpu_per_task_us()
    );
    Ok(rows)
}
