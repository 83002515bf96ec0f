//! `cargo xtask bench binding` answers one design question of the pool: bind every statement
//! in one round trip with `query_typed` (an unnamed statement, parsed and
//! planned per call, safe behind a pooler in transaction mode), or prepare
//! each statement once per connection and reuse it (parse and plan once).
//! It runs protocol statements both ways on one connection, in alternating
//! rounds so that drift on a shared machine hits both alike, and prints a
//! table plus one JSON line per statement.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;
use waymark_pool::codec::{pg_type, Param};
use waymark_store::protocol::Statement;
use waymark_store::{new_task_id, Value};

const ROUNDS: usize = 6;
const CALLS_PER_ROUND: usize = 500;

/// A statement as the store sends it: `$n` text, slot types, and a way to
/// make one call's parameters in slot order.
struct Case {
    label: &'static str,
    sql: String,
    types: Vec<Type>,
    params: Box<dyn Fn() -> Vec<Value>>,
}

fn case(
    label: &'static str,
    stmt: Statement,
    bind: impl Fn() -> Vec<(&'static str, Value)> + 'static,
) -> Result<Case, String> {
    let def = stmt.def();
    let rewritten = waymark_dialect::rewrite(def.sql).map_err(|e| format!("{}: {e}", def.name()))?;
    let types = rewritten
        .names()
        .iter()
        .map(|n| {
            def.param(n).map(|p| pg_type(p.ty)).ok_or_else(|| format!("{}: no type for {n}", def.name()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let names: Vec<String> = rewritten.names().to_vec();
    Ok(Case {
        label,
        sql: rewritten.sql().to_owned(),
        types,
        params: Box::new(move || {
            let bound = bind();
            names
                .iter()
                .map(|n| bound.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone()).unwrap_or(Value::Null))
                .collect()
        }),
    })
}

pub async fn binding() -> Result<(), String> {
    let server = crate::demo::find_postgres().await?;
    let url = crate::demo::fresh_database(&server, "waymark_bench_binding").await?;
    let store = waymark_store::Store::connect(
        waymark_pool::PgPool::builder(&url).max_size(1).build().map_err(|e| e.to_string())?,
        waymark_store::ConnectOptions::default(),
    )
    .await
    .map_err(|e| e.to_string())?;
    // A backlog so that reads touch an index of realistic size.
    for i in 0..2_000 {
        store
            .submit(waymark_store::NewTask::new("bench.noop", json!({ "i": i })).queue("bench"))
            .await
            .map_err(|e| e.to_string())?;
    }
    let known = store
        .list(&waymark_store::ListFilter { limit: 1, ..Default::default() })
        .await
        .map_err(|e| e.to_string())?
        .pop()
        .ok_or("no task")?
        .id;

    let cases = vec![
        case("get_status", Statement::GetStatus, move || vec![("id", Value::from(known.as_str()))])?,
        case("claimable_probe", Statement::ClaimableProbe, || {
            vec![("queues", Value::TextArray(vec!["bench".into()])), ("names", Value::Null)]
        })?,
        case("insert_task", Statement::InsertTask, || {
            vec![
                ("id", Value::from(new_task_id().as_str())),
                ("name", "bench.noop".into()),
                ("queue", "bench-insert".into()),
                ("payload", Value::Jsonb(json!({}))),
                ("metadata", Value::Jsonb(json!({}))),
                ("max_attempts", Value::Int4(3)),
                ("priority", Value::Int4(0)),
                ("delay_ms", Value::Int8(0)),
            ]
        })?,
    ];

    let (client, conn) =
        tokio_postgres::connect(&url, tokio_postgres::NoTls).await.map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    println!("binding: {ROUNDS} alternating rounds of {CALLS_PER_ROUND} calls per statement, one connection");
    println!(
        "{:<18} {:>14} {:>14} {:>16}",
        "statement", "typed us/call", "prepared us/call", "prepared/typed"
    );
    for c in &cases {
        let stmt = client.prepare_typed(&c.sql, &c.types).await.map_err(|e| format!("{}: {e}", c.label))?;
        let (mut typed, mut prepared) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            typed.push(round(&client, c, None).await?);
            prepared.push(round(&client, c, Some(&stmt)).await?);
        }
        let (t, p) = (median(&mut typed), median(&mut prepared));
        let ratio = p.as_secs_f64() / t.as_secs_f64();
        println!("{:<18} {:>14.1} {:>16.1} {:>16.2}", c.label, us(t), us(p), ratio);
        println!(
            "{}",
            json!({"scenario": "binding", "statement": c.label, "typed_us": us(t), "prepared_us": us(p), "ratio": ratio})
        );
    }
    Ok(())
}

/// The mean time per call over one round.
async fn round(
    client: &Client,
    c: &Case,
    prepared: Option<&tokio_postgres::Statement>,
) -> Result<Duration, String> {
    let started = Instant::now();
    for _ in 0..CALLS_PER_ROUND {
        let values = (c.params)();
        let params: Vec<Param<'_>> = values.iter().map(Param).collect();
        let result = match prepared {
            Some(stmt) => {
                let refs: Vec<&(dyn ToSql + Sync)> =
                    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
                client.query(stmt, &refs).await
            }
            None => {
                let refs: Vec<(&(dyn ToSql + Sync), Type)> =
                    params.iter().zip(&c.types).map(|(p, t)| (p as &(dyn ToSql + Sync), t.clone())).collect();
                client.query_typed(&c.sql, &refs).await
            }
        };
        result.map_err(|e| format!("{}: {e}", c.label))?;
    }
    Ok(started.elapsed() / CALLS_PER_ROUND as u32)
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
