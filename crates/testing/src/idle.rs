//! Running a worker until there is nothing left for it to do.

use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use waymark_store::{ListFilter, PgExecutor, TaskStatus};
use waymark_worker::Worker;

/// What [`run_until_idle`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleReport {
    /// Tasks the worker settled (completed, failed, or gave back).
    pub settled: u64,
    /// How long it ran.
    pub took: Duration,
}

/// The worker was still busy when the time ran out. It has been shut down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotIdle {
    /// How long it ran.
    pub waited: Duration,
    /// Tasks running in its queues at the last look.
    pub running: usize,
    /// Tasks due in its queues at the last look.
    pub due: usize,
}

impl fmt::Display for NotIdle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the worker was not idle after {:?}: {} running and {} due in its queues",
            self.waited, self.running, self.due
        )
    }
}

impl std::error::Error for NotIdle {}

/// Runs `worker` until its queues hold nothing running and nothing due
/// (a task due later, such as a retry after its backoff, does not count),
/// then shuts it down gracefully. Fails with [`NotIdle`] past `limit`,
/// after shutting it down all the same.
pub async fn run_until_idle<E: PgExecutor + 'static>(
    worker: Worker<E>,
    limit: Duration,
) -> Result<IdleReport, NotIdle> {
    let store = worker.store().clone();
    let queues: Vec<String> = worker.queues().to_vec();
    let handle = worker.handle();
    let started = Instant::now();
    let run = tokio::spawn(worker.run());
    // Idle twice in a row, 20 ms apart: a settlement in flight shows as
    // running in the table, and a child submit as due, in between.
    let mut idle_looks = 0;
    let mut last = (0, 0);
    while idle_looks < 2 {
        if started.elapsed() > limit {
            handle.shutdown();
            let _ = run.await;
            return Err(NotIdle { waited: started.elapsed(), running: last.0, due: last.1 });
        }
        // The pause between two looks.
        tokio::time::sleep(Duration::from_millis(20)).await;
        last = match busy_in(&store, &queues).await {
            Ok(counts) => counts,
            Err(_) => (usize::MAX, usize::MAX), // a passing error: look again
        };
        let idle = last == (0, 0) && handle.running() == 0;
        idle_looks = if idle { idle_looks + 1 } else { 0 };
    }
    handle.shutdown();
    let _ = run.await;
    Ok(IdleReport { settled: handle.settled(), took: started.elapsed() })
}

/// Tasks running, and tasks queued and due, in `queues`.
async fn busy_in<E: PgExecutor>(
    store: &waymark_store::Store<E>,
    queues: &[String],
) -> Result<(usize, usize), waymark_store::Error> {
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let (mut running, mut due) = (0, 0);
    for queue in queues {
        let counts = store.stats(Some(queue)).await?;
        running += counts.get(queue).map_or(0, |c| c.running as usize);
        let queued = ListFilter {
            status: Some(TaskStatus::Queued),
            queue: Some(queue.clone()),
            limit: 10_000,
            ..ListFilter::default()
        };
        due += store.list(&queued).await?.iter().filter(|t| t.run_at_ms <= now_ms).count();
    }
    Ok((running, due))
}
