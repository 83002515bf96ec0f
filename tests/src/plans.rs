//! Query plans of the hot statements on a large backlog: the test that the
//! claim, the probe and the batched writes stay on indexes whatever the
//! table's statistics say, and `cargo xtask bench explain`, which prints
//! them with their timings.
//!
//! The backlog is made stale on purpose: analysed while every row was
//! queued, then most of it settled and a batch claimed by each of two
//! workers, so the statistics say every row is queued and none running.
//! That is the state of a queue just drained, until autovacuum analyses it
//! again, and the one where a join on the picked rows became a hash over
//! the whole table, a plain `exists` probe a sequential scan, and one
//! worker's heartbeat a read of every worker's running rows.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;
use waymark_store::protocol::Statement;

/// The worker whose running batch the backlog holds.
pub const WORKER: &str = "plans-worker";
/// The queue and the handler name of the backlog.
pub const QUEUE: &str = "plans";
const NAME: &str = "plans.noop";

/// Parameters by name, as the statement's header names them.
type Binds<'a> = Vec<(&'static str, &'a (dyn ToSql + Sync))>;

/// One explained statement.
#[derive(Debug)]
pub struct Plan {
    /// The statement's catalogue name, and how it was called.
    pub statement: String,
    /// `EXPLAIN`'s text.
    pub text: String,
}

impl Plan {
    /// Scans of the task table that read rows only to drop them by a
    /// filter, with the count dropped: a batched write of one worker's
    /// tasks that reads every running row (through the status or lease
    /// index) shows here, since the backlog holds another worker's too.
    pub fn filtered_table_scans(&self) -> Vec<String> {
        let mut found = Vec::new();
        let mut scan: Option<&str> = None;
        for line in self.text.lines().map(str::trim) {
            if line.starts_with("->") || (scan.is_none() && line.contains(" on cairnq_tasks")) {
                let table_scan = line.contains(" on cairnq_tasks") && line.contains("Scan");
                scan = table_scan.then_some(line);
            } else if let (Some(node), true) = (scan, line.starts_with("Rows Removed by Filter")) {
                found.push(format!("{node} / {line}"));
            }
        }
        found
    }

    /// The task table's indexes the plan reads.
    pub fn indexes(&self) -> Vec<&str> {
        let mut found: Vec<&str> = Vec::new();
        for line in self.text.lines() {
            for marker in [" using ", "Bitmap Index Scan on "] {
                if let Some((_, rest)) = line.split_once(marker) {
                    let name = rest.split_whitespace().next().unwrap_or("");
                    if name.starts_with("cairnq_tasks_") && !found.contains(&name) {
                        found.push(name);
                    }
                }
            }
        }
        found
    }

    /// Plan nodes that read or join the whole table.
    pub fn whole_table_nodes(&self) -> Vec<&str> {
        self.text
            .lines()
            .map(str::trim)
            .filter(|l| {
                l.contains("Seq Scan") || l.contains("Hash Join") || l.contains("Rows Removed by Join")
            })
            .collect()
    }
}

/// Another worker, whose running tasks the batched writes of [`WORKER`]
/// must not read.
pub const NEIGHBOUR: &str = "plans-neighbour";

/// Fills the installation `client` sees with `total` due tasks and
/// analyses it; then settles all but `queued` of them, and claims `running`
/// of those for [`WORKER`] and as many for [`NEIGHBOUR`] (statistics not
/// refreshed). Returns [`WORKER`]'s running ids.
pub async fn stale_backlog(client: &Client, total: i64, queued: i64, running: i64) -> Vec<String> {
    queued_backlog(client, total, QUEUE, NAME).await;
    client
        .execute(
            "update cairnq_tasks set status = 'succeeded', attempt = 1, worker_id = 'plans-done', \
                    result = '{}', progress = 1.0, completed_at_ms = 2000, updated_at_ms = 2000 \
              where id in (select id from cairnq_tasks order by id limit $1)",
            &[&(total - queued)],
        )
        .await
        .expect("settling most of it");
    let rows = client
        .query(
            "update cairnq_tasks set status = 'running', worker_id = $1, attempt = 1, \
                    lease_until_ms = 9000000000000 \
              where id in (select id from cairnq_tasks where status = 'queued' order by id limit $2) \
             returning id",
            &[&WORKER, &running],
        )
        .await
        .expect("claiming a batch");
    client
        .execute(
            "update cairnq_tasks set status = 'running', worker_id = $1, attempt = 1, \
                    lease_until_ms = 9000000000000 \
              where id in (select id from cairnq_tasks where status = 'queued' order by id desc limit $2)",
            &[&NEIGHBOUR, &running],
        )
        .await
        .expect("claiming a batch for another worker");
    rows.iter().map(|r| r.get(0)).collect()
}

/// `EXPLAIN` of the statements a worker runs at full speed, on the backlog
/// of [`stale_backlog`]. With `analyze`, each runs for real (with buffers
/// and timings) inside a transaction that is rolled back.
pub async fn explain_hot_statements(client: &mut Client, running: &[String], analyze: bool) -> Vec<Plan> {
    let ids: Vec<String> = running.to_vec();
    let results = serde_json::Value::Object(
        ids.iter().map(|id| (id.clone(), serde_json::json!({"ok": true}))).collect(),
    );
    // The worker's fence: each id's claim attempt (see complete_batch.sql),
    // and a few leases with none (-1), so both fence tests are planned.
    // Each id's owner, as the worker binds them (one claim's id each).
    let owners: Vec<String> = ids.iter().map(|_| WORKER.to_owned()).collect();
    let no_owners: Option<Vec<String>> = None;
    let no_worker: Option<String> = None;
    let queues = vec![QUEUE.to_owned()];
    let two_queues = vec![QUEUE.to_owned(), "plans-other".to_owned()];
    let names = vec![NAME.to_owned()];
    let two_names = vec![NAME.to_owned(), "plans.other".to_owned()];
    let any_name: Option<Vec<String>> = None;
    let lease_ms = 30_000_i64;
    let limit = 512_i64;
    let other = "plans-other";
    let envelope = serde_json::json!({"type": "LeaseExpired", "code": "lease_expired"});
    let cases = vec![
        Case {
            stmt: Statement::ClaimableProbe,
            how: "names given",
            binds: vec![("queues", &queues), ("names", &names)],
        },
        Case {
            stmt: Statement::ClaimableProbe,
            how: "any name",
            binds: vec![("queues", &queues), ("names", &any_name)],
        },
        Case {
            stmt: Statement::ClaimOneQueueOneName,
            how: "",
            binds: vec![
                ("worker_id", &other),
                ("lease_ms", &lease_ms),
                ("queue", &QUEUE),
                ("name", &NAME),
                ("limit", &limit),
            ],
        },
        Case {
            stmt: Statement::ClaimOneQueue,
            how: "two names",
            binds: vec![
                ("worker_id", &other),
                ("lease_ms", &lease_ms),
                ("queue", &QUEUE),
                ("names", &two_names),
                ("limit", &limit),
            ],
        },
        Case {
            stmt: Statement::Claim,
            how: "two queues, any name",
            binds: vec![
                ("worker_id", &other),
                ("lease_ms", &lease_ms),
                ("queues", &two_queues),
                ("names", &any_name),
                ("limit", &limit),
            ],
        },
        Case {
            stmt: Statement::CompleteBatch,
            how: "",
            binds: vec![("results", &results), ("ids", &ids), ("worker_ids", &owners)],
        },
        Case {
            stmt: Statement::HeartbeatBatch,
            how: "",
            binds: vec![
                ("lease_ms", &lease_ms),
                ("ids", &ids),
                ("worker_id", &WORKER),
                ("worker_ids", &no_owners),
            ],
        },
        Case {
            stmt: Statement::HeartbeatBatch,
            how: "an owner per id",
            binds: vec![
                ("lease_ms", &lease_ms),
                ("ids", &ids),
                ("worker_id", &no_worker),
                ("worker_ids", &owners),
            ],
        },
        Case {
            stmt: Statement::HeartbeatBatchSkipLocked,
            how: "an owner per id",
            binds: vec![
                ("lease_ms", &lease_ms),
                ("ids", &ids),
                ("worker_id", &no_worker),
                ("worker_ids", &owners),
            ],
        },
        Case { stmt: Statement::RecoverLeases, how: "", binds: vec![("lease_expired_error", &envelope)] },
    ];
    let mut plans = Vec::new();
    for case in cases {
        let statement = if case.how.is_empty() {
            case.stmt.name().to_owned()
        } else {
            format!("{} ({})", case.stmt.name(), case.how)
        };
        // The store specialises the optional filters of the values bound
        // non-null; here that is every one but the `any name` cases.
        let null = if case.how.contains("any name") { &["names"][..] } else { &[] };
        plans.push(Plan { statement, text: explain(client, case.stmt, &case.binds, null, analyze).await });
    }
    plans
}

/// One statement to explain, and the values to bind.
struct Case<'a> {
    stmt: Statement,
    how: &'static str,
    binds: Binds<'a>,
}

async fn explain(
    client: &mut Client,
    stmt: Statement,
    binds: &Binds<'_>,
    null: &[&str],
    analyze: bool,
) -> String {
    let def = stmt.def();
    let bound: Vec<&str> = binds.iter().map(|(n, _)| *n).collect();
    let non_null: Vec<&str> = bound.iter().copied().filter(|n| !null.contains(n)).collect();
    let sql = waymark_dialect::specialise(def.sql, &non_null).expect("specialise");
    let rewritten = waymark_dialect::rewrite(&sql).expect("rewrite");
    let order = rewritten.bind_order(&bound).expect("every parameter bound");
    let types: Vec<Type> = rewritten
        .names()
        .iter()
        .map(|n| waymark_pool::codec::pg_type(def.param(n).expect("declared").ty))
        .collect();
    let params: Vec<(&(dyn ToSql + Sync), Type)> =
        order.iter().zip(types).map(|(&i, ty)| (binds[i].1, ty)).collect();
    let options = if analyze { "analyze, buffers, costs off" } else { "costs off" };
    let tx = client.transaction().await.expect("begin");
    let rows = tx
        .query_typed(&format!("explain ({options}) {}", rewritten.sql()), &params)
        .await
        .unwrap_or_else(|e| panic!("explain {}: {e}", stmt.name()));
    tx.rollback().await.expect("rollback");
    rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>().join("\n")
}

/// Fills the installation `client` sees with `total` due tasks of `name`
/// in `queue`, in one statement (a million take seconds, not the minutes
/// of a million submits), and analyses the table. Each row is what
/// `insert_task` makes, with ids in order and payloads `{"n": i}`.
pub async fn queued_backlog(client: &Client, total: i64, queue: &str, name: &str) {
    client
        .execute(
            "insert into cairnq_tasks (id, name, queue, status, payload, metadata, attempt, max_attempts, \
             priority, run_at_ms, root_id, created_at_ms, updated_at_ms) \
             select 'task_' || lpad(g::text, 26, '0'), $2, $3, 'queued', jsonb_build_object('n', g), '{}', \
                    0, 3, 0, 1000, 'task_' || lpad(g::text, 26, '0'), 1000, 1000 \
               from generate_series(1, $1::bigint) g",
            &[&total, &name, &queue],
        )
        .await
        .expect("filling the backlog");
    client.batch_execute("analyze cairnq_tasks").await.expect("analyze");
}

/// A table of `total` tasks as a long-lived installation holds them, for
/// the dashboard's queries (`cargo xtask bench dashboard`): ten queues,
/// twenty names; 80 % succeeded, 10 % queued, 8 % failed, 1 % running, 1 %
/// canceled; every tenth task a child of the one before; vacuumed and
/// analyzed.
pub async fn mixed_table(client: &Client, total: i64) {
    client
        .execute(
            "insert into cairnq_tasks (id, name, queue, status, payload, metadata, attempt, max_attempts, \
             priority, run_at_ms, root_id, parent_id, created_at_ms, updated_at_ms, completed_at_ms, error) \
             select 'task_' || lpad(g::text, 26, '0'), 'name' || (g % 20), 'q' || (g % 10), s.status, \
                    jsonb_build_object('n', g), '{}', 1, 3, 0, 1000 + g, \
                    'task_' || lpad((case when g % 10 = 0 then g - 1 else g end)::text, 26, '0'), \
                    case when g % 10 = 0 then 'task_' || lpad((g - 1)::text, 26, '0') end, \
                    1000 + g, 1000 + g, \
                    case when s.status in ('succeeded', 'failed', 'canceled') then 2000 + g end, \
                    case when s.status = 'failed' then '{\"message\": \"boom\"}'::jsonb end \
               from generate_series(1, $1::bigint) g, \
                    lateral (select case when g % 100 < 80 then 'succeeded' when g % 100 < 90 then 'queued' \
                                         when g % 100 < 98 then 'failed' when g % 100 < 99 then 'running' \
                                         else 'canceled' end as status) s",
            &[&total],
        )
        .await
        .expect("filling the table");
    client.batch_execute("vacuum analyze cairnq_tasks").await.expect("vacuum analyze");
}
