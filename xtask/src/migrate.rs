//! `cargo xtask migrate`.

use waymark_pool::PgPool;
use waymark_store::{ConnectOptions, Store};

pub async fn run(args: &[String]) -> Result<(), String> {
    let mut url = std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty());
    let mut schema = None;
    let mut status_only = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--database-url" => url = Some(it.next().ok_or("--database-url needs a value")?.clone()),
            "--schema" => schema = Some(it.next().ok_or("--schema needs a value")?.clone()),
            "--status" => status_only = true,
            other => return Err(format!("migrate: unknown argument {other:?}")),
        }
    }
    let url = url.ok_or("migrate: no database: pass --database-url URL or set DATABASE_URL")?;
    let mut builder = PgPool::builder(&url).max_size(2).application_name("waymark-migrate");
    if let Some(s) = &schema {
        builder = builder.schema(s);
    }
    let pool = builder.build().map_err(|e| e.to_string())?;

    if status_only {
        let states = Store::new(pool).migration_status().await.map_err(|e| e.to_string())?;
        let applied = states.iter().filter(|m| m.applied_at_ms.is_some()).count();
        for m in &states {
            let state = if m.applied_at_ms.is_some() { "applied" } else { "pending" };
            println!("{state:<8} {}", m.name);
        }
        println!("applied: {applied}, pending: {}", states.len() - applied);
        return Ok(());
    }

    let options = match schema {
        Some(schema) => ConnectOptions::new().schema(schema),
        None => ConnectOptions::new(),
    };
    let store = Store::with_options(pool, options).map_err(|e| e.to_string())?;
    let report = store.prepare().await.map_err(|e| e.to_string())?;
    for name in &report.applied {
        println!("applied  {name}");
    }
    println!("applied: {}, already applied: {}", report.applied.len(), report.skipped);
    Ok(())
}
