//! Running a worker until there is nothing left for it to do.

use std::fmt;
use std::time::{Duration, Instant};

use waymark_store::{Lane, PgExecutor, Sql, Value};
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

/// Runs `worker` until its queues hold, of the task names it handles,
/// nothing running and nothing due by the server's clock (a task due later,
/// such as a retry after its backoff, does not count), then shuts it down
/// gracefully. Fails with [`NotIdle`] past `limit`, after shutting it down
/// all the same. A panic of the worker's is passed on.
pub async fn run_until_idle<E: PgExecutor + 'static>(
    worker: Worker<E>,
    limit: Duration,
) -> Result<IdleReport, NotIdle> {
    let store = worker.store().clone();
    let look = busy_statement(worker.queues(), &worker.task_names());
    let handle = worker.handle();
    let started = Instant::now();
    let mut run = tokio::spawn(worker.run());
    // Idle twice in a row, 20 ms apart: a settlement in flight shows as
    // running in the table, and a child submit as due, in between.
    let mut idle_looks = 0;
    let mut last = (0, 0);
    while idle_looks < 2 {
        if started.elapsed() > limit {
            handle.shutdown();
            ended(&mut run).await;
            return Err(NotIdle { waited: started.elapsed(), running: last.0, due: last.1 });
        }
        if run.is_finished() {
            ended(&mut run).await;
        }
        // The pause between two looks.
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A look that fails (a passing error) counts as busy, and keeps the
        // last counts for the report.
        let idle = match busy(store.executor(), &look).await {
            Ok(counts) => {
                last = counts;
                counts == (0, 0) && handle.running() == 0
            }
            Err(_) => false,
        };
        idle_looks = if idle { idle_looks + 1 } else { 0 };
    }
    handle.shutdown();
    ended(&mut run).await;
    Ok(IdleReport { settled: handle.settled(), took: started.elapsed() })
}

/// Waits for the worker's task, passing on its panic.
async fn ended(run: &mut tokio::task::JoinHandle<()>) {
    if let Err(e) = run.await {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// One statement counting, in `queues` and of `names`, the running tasks
/// and the queued ones due by the server's clock. The names are quoted as
/// SQL literals (this is test code; the store never builds SQL this way).
fn busy_statement(queues: &[String], names: &[String]) -> String {
    let list = |items: &[String]| {
        items.iter().map(|s| format!("'{}'", s.replace('\'', "''"))).collect::<Vec<_>>().join(", ")
    };
    format!(
        "select count(*) filter (where status = 'running') as running, \
                count(*) filter (where status = 'queued' \
                    and run_at_ms <= (extract(epoch from clock_timestamp()) * 1000)::int8) as due \
           from cairnq_tasks \
          where queue = any(array[{}]::text[]) and name = any(array[{}]::text[])",
        list(queues),
        list(names)
    )
}

async fn busy<E: PgExecutor>(exec: &E, statement: &str) -> Result<(usize, usize), waymark_store::ExecError> {
    let sql = Sql { text: statement, types: &[], lane: Lane::Ordinary, repeatable: true };
    let rows = exec.query(sql, &[]).await?;
    let count = |column: &str| match rows.first().and_then(|r| r.get(column)) {
        Some(Value::Int8(n)) => usize::try_from(*n).unwrap_or(0),
        _ => 0,
    };
    Ok((count("running"), count("due")))
}
