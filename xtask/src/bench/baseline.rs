//! The raw-SQL baseline: a queue written directly against the same tables
//! with tokio-postgres, tuned as any contestant would be (claims of
//! hundreds with `FOR UPDATE SKIP LOCKED`, settlement of a whole claim in
//! one statement, a few connections). It is a contestant of the bench, not
//! part of waymark, so its SQL lives here and not in `protocol-sql/`.

use std::sync::Arc;
use tokio_postgres::{Client, NoTls};

pub const SYSTEM: &str = "raw-sql";

const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

pub async fn connect(url: &str) -> Result<Client, String> {
    let (client, conn) =
        tokio_postgres::connect(url, NoTls).await.map_err(|e| format!("baseline connect: {e}"))?;
    tokio::spawn(conn);
    Ok(client)
}

/// One row per statement, like a plain client.
pub async fn insert_one(
    client: &Client,
    id: &str,
    name: &str,
    queue: &str,
    payload: &serde_json::Value,
) -> Result<(), String> {
    let sql = format!(
        "insert into cairnq_tasks (id, name, queue, status, payload, metadata, attempt, max_attempts, priority, \
         run_at_ms, root_id, created_at_ms, updated_at_ms) \
         select $1, $2, $3, 'queued', $4, '{{}}'::jsonb, 0, 3, 0, n, $1, n, n from (select {NOW_MS} as n) c"
    );
    client
        .execute(&sql, &[&id, &name, &queue, payload])
        .await
        .map_err(|e| format!("baseline insert: {e}"))?;
    Ok(())
}

/// Many rows in one statement (arrays of ids and payloads).
pub async fn insert_many(
    client: &Client,
    ids: &[String],
    name: &str,
    queue: &str,
    payloads: &[serde_json::Value],
) -> Result<(), String> {
    let sql = format!(
        "insert into cairnq_tasks (id, name, queue, status, payload, metadata, attempt, max_attempts, priority, \
         run_at_ms, root_id, created_at_ms, updated_at_ms) \
         select r.id, $3, $4, 'queued', r.payload, '{{}}'::jsonb, 0, 3, 0, c.n, r.id, c.n, c.n \
           from (select {NOW_MS} as n) c, unnest($1::text[], $2::jsonb[]) as r(id, payload)"
    );
    client
        .execute(&sql, &[&ids, &payloads, &name, &queue])
        .await
        .map_err(|e| format!("baseline batch insert: {e}"))?;
    Ok(())
}

/// Claims up to `limit` due tasks of `queue`; returns (id, payload).
pub async fn claim(
    client: &Client,
    worker: &str,
    queue: &str,
    limit: i64,
) -> Result<Vec<(String, serde_json::Value)>, String> {
    // The picked ids go to the update as one array: a join on them can be
    // planned as a hash over the whole table (see protocol-sql/statements/claim.sql).
    let sql = format!(
        "update cairnq_tasks t set status = 'running', worker_id = $1, attempt = t.attempt + 1, \
                lease_until_ms = {NOW_MS} + 30000, updated_at_ms = {NOW_MS} \
          where t.id = any(array(select id from cairnq_tasks where queue = $2 and status = 'queued' \
                and run_at_ms <= (select {NOW_MS}) order by priority desc, run_at_ms, id limit $3 for update skip locked)) \
          returning t.id, t.payload"
    );
    let rows =
        client.query(&sql, &[&worker, &queue, &limit]).await.map_err(|e| format!("baseline claim: {e}"))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Settles a whole claim as succeeded in one statement, owner-checked.
pub async fn complete_all(client: &Client, worker: &str, ids: &[String]) -> Result<u64, String> {
    let sql = format!(
        "update cairnq_tasks set status = 'succeeded', result = '{{}}'::jsonb, progress = 1.0, lease_until_ms = null, \
                completed_at_ms = {NOW_MS}, updated_at_ms = {NOW_MS} \
          where id = any($1) and status = 'running' and worker_id = $2"
    );
    client.execute(&sql, &[&ids, &worker]).await.map_err(|e| format!("baseline settle: {e}"))
}

/// Drains `queue` with `connections` claim loops of `batch`; returns when
/// `total` tasks are settled. `on_start` sees each claimed task's payload.
pub async fn drain(
    url: &str,
    queue: &str,
    total: usize,
    connections: usize,
    batch: i64,
    on_start: Arc<dyn Fn(&serde_json::Value) + Send + Sync>,
    wake: Option<Arc<tokio::sync::Notify>>,
) -> Result<(), String> {
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut loops = Vec::new();
    for c in 0..connections {
        let client = connect(url).await?;
        let (queue, done, on_start, wake) = (queue.to_owned(), done.clone(), on_start.clone(), wake.clone());
        loops.push(tokio::spawn(async move {
            let worker = format!("raw-{c}");
            while done.load(std::sync::atomic::Ordering::Relaxed) < total {
                let claimed = claim(&client, &worker, &queue, batch).await?;
                if claimed.is_empty() {
                    match &wake {
                        Some(w) => {
                            let _ = tokio::time::timeout(std::time::Duration::from_millis(50), w.notified())
                                .await;
                        }
                        None => tokio::time::sleep(std::time::Duration::from_millis(2)).await,
                    }
                    continue;
                }
                let ids: Vec<String> = claimed
                    .iter()
                    .map(|(id, p)| {
                        on_start(p);
                        id.clone()
                    })
                    .collect();
                complete_all(&client, &worker, &ids).await?;
                done.fetch_add(ids.len(), std::sync::atomic::Ordering::Relaxed);
            }
            Ok::<_, String>(())
        }));
    }
    for l in loops {
        l.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// A LISTEN session on `cairnq_queued` that wakes `notify` on each signal.
pub async fn listen(url: &str, notify: Arc<tokio::sync::Notify>) -> Result<Client, String> {
    let (client, mut conn) =
        tokio_postgres::connect(url, NoTls).await.map_err(|e| format!("baseline listen: {e}"))?;
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        use futures::StreamExt;
        while let Some(Ok(_)) = messages.next().await {
            notify.notify_waiters();
        }
    });
    client.batch_execute("listen cairnq_queued").await.map_err(|e| format!("baseline listen: {e}"))?;
    Ok(client)
}

/// The baseline's consumer of the latency and mixed scenarios: `loops`
/// claim loops on queue `raw`, woken by a LISTEN session on
/// `cairnq_queued`, until `total` tasks are settled. Returns the listener
/// (keep it alive) and the consumer's task.
pub async fn woken_drain(
    url: &str,
    total: usize,
    loops: usize,
    on_start: Arc<dyn Fn(&serde_json::Value) + Send + Sync>,
) -> Result<(Client, tokio::task::JoinHandle<Result<(), String>>), String> {
    let wake = Arc::new(tokio::sync::Notify::new());
    let listener = listen(url, wake.clone()).await?;
    let url = url.to_owned();
    let consumer =
        tokio::spawn(async move { drain(&url, "raw", total, loops, 500, on_start, Some(wake)).await });
    Ok((listener, consumer))
}

/// Turns every task into one that succeeded `age_ms` ago: the backlog a
/// retention sweep finds.
pub async fn age_all(client: &Client, age_ms: i64) -> Result<u64, String> {
    let sql = format!(
        "update cairnq_tasks set status = 'succeeded', result = 'null'::jsonb, \
         completed_at_ms = {NOW_MS} - $1, updated_at_ms = {NOW_MS} - $1"
    );
    client.execute(&sql, &[&age_ms]).await.map_err(|e| format!("baseline age: {e}"))
}

/// Deletes terminal tasks older than `older_than_ms`, `limit` per statement
/// (oldest first, skipping locked rows), until a statement comes back
/// short; returns how many went.
pub async fn purge_all(client: &Client, older_than_ms: i64, limit: i64) -> Result<u64, String> {
    let sql = format!(
        "delete from cairnq_tasks where id in ( \
           select id from cairnq_tasks \
            where status in ('succeeded', 'failed', 'canceled') and completed_at_ms < {NOW_MS} - $1 \
            order by completed_at_ms limit $2 for update skip locked) \
         returning id"
    );
    let mut deleted = 0;
    loop {
        let rows = client
            .query(&sql, &[&older_than_ms, &limit])
            .await
            .map_err(|e| format!("baseline purge: {e}"))?;
        deleted += rows.len() as u64;
        if (rows.len() as i64) < limit {
            return Ok(deleted);
        }
    }
}

/// The server's write-ahead log position, in bytes from its origin.
pub async fn wal_position(client: &Client) -> Result<i64, String> {
    let row = client
        .query_one("select (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint", &[])
        .await
        .map_err(|e| format!("reading the WAL position: {e}"))?;
    Ok(row.get(0))
}

/// Takes the notify trigger off the task table (`bench server` only: what
/// a task costs without it; cairnq's schema always has it).
pub async fn disable_notify_trigger(client: &Client) -> Result<(), String> {
    client
        .batch_execute("alter table cairnq_tasks disable trigger cairnq_tasks_notify")
        .await
        .map_err(|e| format!("disabling the notify trigger: {e}"))
}

/// Drops every index of the task table but the primary key, the two claim
/// indexes and the lease index (`bench server` only: what the listing,
/// tree and retention indexes cost each task).
pub async fn drop_secondary_indexes(client: &Client) -> Result<(), String> {
    client
        .batch_execute(
            "drop index cairnq_tasks_completed_idx, cairnq_tasks_correlation_idx, \
                        cairnq_tasks_name_idx, cairnq_tasks_queue_completed_idx, cairnq_tasks_root_idx, \
                        cairnq_tasks_status_completed_idx",
        )
        .await
        .map_err(|e| format!("dropping the secondary indexes: {e}"))
}

/// Commits on this session return before their WAL is flushed (`bench
/// server` only: what the wait for the disk costs each task).
pub async fn no_commit_wait(client: &Client) -> Result<(), String> {
    client.batch_execute("set synchronous_commit = off").await.map_err(|e| format!("synchronous_commit: {e}"))
}

/// The process id of the session's backend (`bench server` reads its CPU
/// time from `/proc` when the server runs on this machine).
pub async fn backend_pid(client: &Client) -> Result<u32, String> {
    let row = client
        .query_one("select pg_backend_pid()", &[])
        .await
        .map_err(|e| format!("reading the backend's pid: {e}"))?;
    Ok(u32::try_from(row.get::<_, i32>(0)).unwrap_or(0))
}
