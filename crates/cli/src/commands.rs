//! Each command: its input checked first (a bad one changes nothing), then
//! the store's own operations, then tables or JSON. The store's statements
//! are the only SQL; no filter reaches the database but as a bound value.

use serde_json::{json, Value as Json};
use waymark_pool::PgPool;
use waymark_store::{Store, Task, TaskStatus};

use crate::args::{Cli, Command, ListArgs, RetryArgs, Target};
use crate::error::{CliError, Kind};
use crate::render;
use crate::shared::{doc, list_filter, open, open_sized, options, pool, Out};

pub async fn run(cli: Cli) -> Out {
    let url = cli
        .database_url
        .clone()
        .ok_or_else(|| CliError::usage("no database: pass --database-url or set DATABASE_URL"))?;
    // Every check of the input happens before the first connection.
    let json = cli.json;
    // An empty schema is a mistake (an unset variable), not "the default".
    if cli.schema.as_deref() == Some("") {
        return Err(CliError::usage(
            "--schema (or WAYMARK_SCHEMA) is empty: name a schema, or leave it unset",
        ));
    }
    match cli.command {
        Command::Migrate { status } => migrate(&url, cli.schema.as_deref(), status, json).await,
        Command::Stats { queue } => {
            let store = open(&url, cli.schema.as_deref()).await?;
            let counts = store.stats(queue.as_deref()).await?;
            Ok(if json { doc(&counts) } else { render::stats(&counts) })
        }
        Command::List(args) => list(&url, cli.schema.as_deref(), args, json).await,
        Command::Get(target) => {
            let store = open(&url, cli.schema.as_deref()).await?;
            let task = find(&store, &target).await?;
            Ok(if json { doc(&task) } else { render::task(&task) })
        }
        Command::Cancel(target) => cancel(&url, cli.schema.as_deref(), target, json).await,
        Command::Retry(args) => retry(&url, cli.schema.as_deref(), args, json).await,
        Command::Purge(args) => crate::bulk::purge(&url, cli.schema.as_deref(), args, json).await,
        Command::Watch(args) => crate::watch::watch(&url, cli.schema.as_deref(), args, json).await,
        Command::Ui(args) => ui(&url, cli.schema.as_deref(), args).await,
        Command::Held { command } => crate::held::held(&url, cli.schema.as_deref(), command, json).await,
        Command::Emit(args) => crate::held::emit(&url, cli.schema.as_deref(), args, json).await,
    }
}

async fn migrate(url: &str, schema: Option<&str>, status: bool, json: bool) -> Out {
    let store = Store::with_options(pool(url, schema, 2)?, options(schema))?;
    if status {
        let states = store.migration_status().await?;
        let rows: Vec<Vec<String>> = states
            .iter()
            .map(|m| {
                let state = m
                    .applied_at_ms
                    .map_or_else(|| "pending".to_owned(), |at| format!("applied {}", render::utc(at)));
                vec![m.name.to_owned(), state]
            })
            .collect();
        return Ok(if json {
            doc(&states
                .iter()
                .map(|m| json!({"name": m.name, "applied_at_ms": m.applied_at_ms}))
                .collect::<Vec<_>>())
        } else {
            render::table(&["migration", "state (UTC)"], &rows)
        });
    }
    let report = store.prepare().await?;
    Ok(if json {
        doc(&json!({"applied": report.applied}))
    } else if report.applied.is_empty() {
        "up to date: no migration to apply\n".to_owned()
    } else {
        report.applied.iter().map(|m| format!("applied {m}\n")).collect()
    })
}

async fn list(url: &str, schema: Option<&str>, args: ListArgs, json: bool) -> Out {
    let filter = list_filter(&args.filters, args.limit, args.offset)?;
    let store = open(url, schema).await?;
    let tasks = store.list(&filter).await?;
    Ok(if json { doc(&tasks) } else { render::tasks(&tasks) })
}

async fn find(store: &Store<PgPool>, target: &Target) -> Result<Task, CliError> {
    let found = match (&target.id, &target.key) {
        (Some(id), _) => store.get(id).await?,
        (None, Some(key)) => store.get_by_key(key).await?,
        (None, None) => return Err(CliError::usage("name a task: an id, or --key")),
    };
    found.ok_or_else(|| CliError::not_found(format!("no task {}", describe(target))))
}

fn describe(target: &Target) -> String {
    match (&target.id, &target.key) {
        (Some(id), _) => id.clone(),
        (None, Some(key)) => format!("under key {key:?}"),
        _ => String::new(),
    }
}

async fn cancel(url: &str, schema: Option<&str>, target: Target, json: bool) -> Out {
    let store = open(url, schema).await?;
    let done = match (&target.id, &target.key) {
        (Some(id), _) => store.cancel(id).await?,
        (None, Some(key)) => store.cancel_by_key(key).await?,
        (None, None) => return Err(CliError::usage("name a task: an id, or --key")),
    };
    match done {
        Some(t) => Ok(if json {
            doc(&t)
        } else if t.status == TaskStatus::Canceled {
            format!("canceled {}\n", t.id)
        } else {
            format!(
                "asked {} to stop: it is running, and its worker cancels it at its next heartbeat\n",
                t.id
            )
        }),
        None => Err(match find(&store, &target).await {
            Ok(t) => CliError::not_found(format!("task {} is {} already: nothing to cancel", t.id, t.status)),
            Err(e) => e,
        }),
    }
}

async fn retry(url: &str, schema: Option<&str>, args: RetryArgs, json: bool) -> Out {
    if args.filter {
        return crate::bulk::retry_matching(url, schema, args, json).await;
    }
    if args.id.is_none() && args.key.is_none() {
        return Err(CliError::usage("name a task (an id, or --key), or pass --filter with filters"));
    }
    let f = &args.filters;
    if [&f.status, &f.queue, &f.name, &f.root, &f.correlation].iter().any(|v| v.is_some()) {
        return Err(CliError::usage("filters go with --filter, not with one task"));
    }
    let target = Target { id: args.id, key: args.key };
    let store = open(url, schema).await?;
    let done = match (&target.id, &target.key) {
        (Some(id), _) => store.retry(id, args.reset_attempt).await?,
        (_, key) => store.retry_by_key(key.as_deref().unwrap_or_default(), args.reset_attempt).await?,
    };
    match done {
        Some(t) => Ok(if json { doc(&t) } else { format!("queued {} again\n", t.id) }),
        None => Err(match find(&store, &target).await {
            Ok(t) => CliError::not_found(format!(
                "task {} is {}: only failed or canceled tasks can be retried",
                t.id, t.status
            )),
            Err(e) => e,
        }),
    }
}

/// Serves the dashboard until Ctrl-C.
async fn ui(url: &str, schema: Option<&str>, args: crate::args::UiArgs) -> Out {
    let addr: std::net::SocketAddr = args.bind.parse().map_err(|_| {
        CliError::usage(format!(
            "--bind must be an address and port, such as 127.0.0.1:8080; got {:?}",
            args.bind
        ))
    })?;
    waymark_ui::check_bind(addr, args.token.as_deref()).map_err(|e| CliError::usage(e.to_string()))?;
    let store = open_sized(url, schema, 8).await?;
    let mut dashboard = waymark_ui::Dashboard::new(store);
    if let Some(token) = args.token {
        dashboard = dashboard.token(token);
    }
    let listener = dashboard.bind(addr).await.map_err(|e| match e {
        waymark_ui::BindError::Io(..) => CliError::failed(e.to_string()),
        _ => CliError::usage(e.to_string()),
    })?;
    let at = listener.local_addr().map_err(|e| CliError::failed(e.to_string()))?;
    // Said before serving, so a script (or a test) can read where.
    println!("waymark ui: serving on http://{at}/ (Ctrl-C to stop)");
    tokio::select! {
        out = dashboard.serve(listener) => out.map_err(|e| CliError::failed(format!("serving the dashboard: {e}")))?,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(String::new())
}

/// A JSON document of an error, for `--json` callers.
pub fn error_doc(e: &CliError) -> Json {
    let code = match e.kind {
        Kind::Failed => 1,
        Kind::Usage => 2,
        Kind::NotFound => 3,
        Kind::NeedsYes => 4,
    };
    let mut doc = json!({"error": e.message, "exit_code": code});
    if let Some(n) = e.matched {
        doc["matched"] = json!(n);
    }
    doc
}
